"""Validation and defaults of the planner's arguments (every message names the argument).

Bounds (so that nothing narrows silently, nothing allocates without limit, and the kernels' int32/64-bit
fields hold every value; docs/design.md "Planner"):
- K in [1, 32] (5 position bits of the candidate key), R <= MAX_REQS (26 request bits); draft trees (parents
  given): N in [1, 63] (the anchor and every node fit a 64-bit mask), R <= MAX_TREE_REQS (21 request bits);
- extra_tokens, capacity, token_offset in [0, 2^31 - 1]; extra_emitting in [0, MAX_REQS] (requests: with R and
  the budget, Theta's numerator stays below 2^31 tokens, so its 32.32 fixed point fits 64 bits in the kernels
  and the reference alike); num_reqs_padded in [R, MAX_REQS];
  num_tokens_padded in [R, MAX_TOKENS] and token_offset + num_tokens_padded <= 2^31 - 1;
- block_size in [1, 2^31 - 1]; a fixed budget is any int >= 0 (clamped to [B_min, B_max]);
- greedy / global need the cost curve at every count up to R + extra_tokens + B_max: that must stay within
  the table's token_limit (its max_tokens, else cost.MAX_TOKENS_LIMIT = 2^24 less a shifted view's prompt
  tokens), else ValueError (the dense cost array would be unbounded);
- context_lens values in [0, MAX_CONTEXT_LEN] (positions and seq_lens are int32): read by the kernel, so the CPU
  kernel raises ValueError and the CUDA kernel makes the request's metadata padding-like and counts it.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .._checks import INT32_MAX, check_int, check_real
from .._validate import MAX_DRAFTS, check_device, check_tensor
from ..cost import MAX_TOKENS_LIMIT, CostTable
from .tree_plan import MAX_TREE_NODES, MAX_TREE_REQS, TreeVerifyPlan
from .verify_plan import MAX_REQS, MAX_TOKENS, VerifyPlan

MODES = {"greedy": 0, "global": 1, "fixed": 2, "all": 3}  # planner/params.h Mode
NO_STEP_CAP = 1 << 62  # planner/params.h kNoStepCap: no latency target


@dataclasses.dataclass
class PlanArgs:
    """Validated, defaulted planner arguments (host ints and checked tensors)."""

    survival: torch.Tensor  # [R, K] float32
    drafts: torch.Tensor  # [R] int32
    R: int
    K: int
    device: torch.device
    mode: str
    fixed_budget: int
    budget_in: Optional[torch.Tensor]  # 0-d int32
    min_verify: int
    max_verify: int
    extra_tokens: int
    extra_emitting: int
    budget_cap: int  # most drafts that fit: min(R * max_verify, T_pad - R, capacity - R - extra_tokens)
    verify_cost: Optional[torch.Tensor]  # [R + extra_tokens + budget_cap + 1] float32 (greedy/global)
    draft_cost: float  # cost_table.fixed_cost(R): draft_ms(R) + request_ms * R (the kernels' name)
    context_lens: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    block_size: int
    anchor_tokens: Optional[torch.Tensor]
    draft_tokens: Optional[torch.Tensor]
    token_offset: int
    num_reqs_padded: int
    num_tokens_padded: int
    conf: Optional[torch.Tensor] = None  # [R, K] float32 confidences: the kernel writes survival from them
    weights: Optional[torch.Tensor] = None  # [R] float32 priorities (None: all 1)
    step_cap: int = NO_STEP_CAP  # most drafts max_step_ms allows (B_min wins over it)
    parents: Optional[torch.Tensor] = None  # [R, N] int32: a draft-tree plan (K = N; drafts are the tree sizes)


def _tensor(name, t, *, dtype, device, shape=None, ndim=None, inner_contiguous=False):
    return check_tensor(name, t, dtypes=(dtype,), device=device, ndim=ndim, shape=shape,
                        inner_contiguous=inner_contiguous)


def as_int32(t):
    """An int64 tensor as the int32 copy the kernels read (a 0-d one, a budget, clamped to [0, INT32_MAX] first so
    that a huge value cannot wrap around); anything else unchanged, for the caller to check."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.int64:
        t = (t.clamp(0, INT32_MAX) if t.dim() == 0 else t).to(torch.int32)
    return t


def int32_tensor(name, t, device, shape):
    """int32 tensor, accepting int64 with a (documented) conversion."""
    return _tensor(name, as_int32(t), dtype=torch.int32, device=device, shape=shape)


def survival_and_drafts(survival, drafts, name="survival", tree=False):
    """(R, K, device, drafts as int32) of a [R, K] float32 tensor and its [R] draft counts. tree: a draft tree's
    [R, N] tensor and its [R] tree sizes (named tree_sizes), N <= MAX_TREE_NODES."""
    if not isinstance(survival, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(survival).__name__}")
    shape = "[R, N]" if tree else "[R, K]"
    if survival.dim() != 2:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(survival.shape)}")
    _tensor(name, survival, dtype=torch.float32, device=None, inner_contiguous=True)
    R, K = survival.shape
    if tree:
        if not 1 <= K <= MAX_TREE_NODES:
            raise ValueError(f"{name}.shape[1] (N, nodes per request) must be in [1, {MAX_TREE_NODES}], got {K}")
        if R > MAX_TREE_REQS:
            raise ValueError(f"{name}.shape[0] (R, requests) must be <= {MAX_TREE_REQS} for trees, got {R}")
    else:
        if not 1 <= K <= MAX_DRAFTS:
            raise ValueError(f"{name}.shape[1] (K, drafts per request) must be in [1, {MAX_DRAFTS}], got {K}")
        if R > MAX_REQS:
            raise ValueError(f"{name}.shape[0] (R, requests) must be <= {MAX_REQS}, got {R}")
    device = check_device(name, survival)
    return R, K, device, int32_tensor("tree_sizes" if tree else "drafts", drafts, device, (R,))


def parents_tensor(parents, R: int, N: int, device):
    """[R, N] int32 parents (int64 converted), last dim contiguous. Values are checked by the kernels (the CPU
    raises ValueError naming parents; CUDA counts them), since checking them here would sync a GPU."""
    return _tensor("parents", as_int32(parents), dtype=torch.int32, device=device, shape=(R, N), inner_contiguous=True)


def _table_costs(cost_table: CostTable, R: int, max_n: int, device, need_verify: bool):
    # Theta's fixed term is the step's fixed cost: the drafter plus the per-request term (CostTable.fixed_cost).
    return float(cost_table.fixed_cost(R)), cost_table.verify_array(max_n, device) if need_verify else None


def resolve_plan_args(
    survival, drafts, cost_table, *, mode, budget=None, min_verify=0, max_verify=None, extra_tokens=0,
    extra_emitting=0, capacity=None, context_lens=None, block_table=None, block_size=None, anchor_tokens=None,
    draft_tokens=None, token_offset=0, num_reqs_padded=None, num_tokens_padded=None, allowed_modes=tuple(MODES),
    conf=None, survival_out=None, weights=None, max_step_ms=None, parents=None,
) -> PlanArgs:
    """Validates every planner argument (errors name the argument) and fills the defaults; the cost arrays come from
    the table's own cached arrays (_table_costs).

    With ``conf`` ([R, K] confidences) instead of ``survival`` (which must then be None), the kernel computes
    the survival itself into ``survival_out`` ([R, K] float32 contiguous, allocated when None): PlanArgs.survival
    is that buffer and PlanArgs.conf the confidences.

    With ``parents`` ([R, N] int32) the rows are draft trees: ``drafts`` are the tree sizes, survival (or conf) is
    [R, N] per node, and N <= MAX_TREE_NODES."""
    tree = parents is not None
    if conf is not None:
        if survival is not None:
            raise ValueError("pass either survival or conf (confidences), not both")
        R, K, device, drafts = survival_and_drafts(conf, drafts, name="conf", tree=tree)
        if survival_out is None:
            survival_out = torch.empty(R, K, dtype=torch.float32, device=device)
        else:
            _tensor("survival_out", survival_out, dtype=torch.float32, device=device, shape=(R, K))
        survival = survival_out
    else:
        if survival is None:
            raise ValueError("survival is required (or pass conf= to compute it in the same call)")
        if survival_out is not None:
            raise ValueError("survival_out is only written with conf= (survival is then computed from it)")
        R, K, device, drafts = survival_and_drafts(survival, drafts, tree=tree)
    if tree:
        parents = parents_tensor(parents, R, K, device)
    if not isinstance(mode, str) or mode not in allowed_modes:
        raise ValueError(f"mode must be one of {list(allowed_modes)}, got {mode!r}")
    max_verify = K if max_verify is None else check_int("max_verify", max_verify, lo=0, hi=K)
    min_verify = check_int("min_verify", min_verify, lo=0, hi=INT32_MAX)
    if min_verify > max_verify:
        raise ValueError(f"min_verify ({min_verify}) must be <= max_verify ({max_verify})")

    budget_in = None
    if mode == "fixed":
        if budget is None:
            raise ValueError("budget is required with mode='fixed' (a Python int or a 0-d int32 tensor)")
        if isinstance(budget, torch.Tensor):
            budget_in = _tensor("budget", as_int32(budget), dtype=torch.int32, device=device, shape=())
    elif budget is not None:
        raise ValueError(f"budget is only used with mode='fixed', not mode={mode!r}")

    num_reqs_padded = R if num_reqs_padded is None else check_int("num_reqs_padded", num_reqs_padded, lo=R,
                                                                   hi=MAX_REQS)

    if context_lens is not None:
        context_lens = int32_tensor("context_lens", context_lens, device, (R,))
    if block_table is not None:
        if context_lens is None:
            raise ValueError("block_table needs context_lens (positions decide the slots)")
        if block_size is None:
            raise ValueError("block_size is required with block_table")
        check_int("block_size", block_size, lo=1, hi=INT32_MAX)
        block_table = as_int32(block_table)
        _tensor("block_table", block_table, dtype=torch.int32, device=device, ndim=2, inner_contiguous=True)
        if block_table.shape[0] != R:
            raise ValueError(f"block_table must have R = {R} rows, got shape {tuple(block_table.shape)}")
        if block_table.shape[1] > INT32_MAX:
            raise ValueError(f"block_table: at most {INT32_MAX} blocks per request, got {block_table.shape[1]}")
    elif block_size is not None:
        check_int("block_size", block_size, lo=1, hi=INT32_MAX)
    if anchor_tokens is not None and draft_tokens is None:
        raise ValueError("anchor_tokens needs draft_tokens (together they make input_ids)")
    if anchor_tokens is not None:
        anchor_tokens = int32_tensor("anchor_tokens", anchor_tokens, device, (R,))
    if draft_tokens is not None:  # alone it still ends each request's candidates at its first invalid (-1) draft
        draft_tokens = as_int32(draft_tokens)
        _tensor("draft_tokens", draft_tokens, dtype=torch.int32, device=device, ndim=2, inner_contiguous=True)
        if draft_tokens.shape[0] != R or draft_tokens.shape[1] < max_verify:
            raise ValueError(
                f"draft_tokens must have shape [R, >= max_verify] = [{R}, >= {max_verify}], "
                f"got {tuple(draft_tokens.shape)}"
            )

    if weights is not None:  # values: the CPU kernel refuses unusable ones, the CUDA kernel weighs them 1 (counted)
        _tensor("weights", weights, dtype=torch.float32, device=device, shape=(R,))

    a = PlanArgs(
        survival=survival, drafts=drafts, R=R, K=K, device=device, mode=mode, fixed_budget=0,
        budget_in=budget_in, min_verify=min_verify, max_verify=max_verify, extra_tokens=0,
        extra_emitting=0, budget_cap=0, verify_cost=None, draft_cost=0.0,
        context_lens=context_lens, block_table=block_table, block_size=block_size or 0,
        anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=0,
        num_reqs_padded=num_reqs_padded, num_tokens_padded=0, conf=conf, weights=weights, parents=parents,
    )
    resolve_step(a, cost_table, capacity, num_tokens_padded, _table_costs, budget=budget,
                 extra_tokens=extra_tokens, extra_emitting=extra_emitting, token_offset=token_offset,
                 max_step_ms=max_step_ms)
    return a


def step_cap_of(cost_table: CostTable, R: int, anchors: int, budget_cap: int, draft_cost: float,
                max_step_ms: float) -> int:
    """Most drafts B such that no budget up to B makes the modelled step time (the float32 sum fixed_cost(R) +
    verify_cost(R + extra_tokens + B), as the kernels add) exceed max_step_ms. A shifted view
    (``CostTable.shifted``, prompt chunks priced at the margin) is measured on its base curve at the real token
    count: the target bounds the step's time, prompt included."""
    anchors += cost_table.shifted_by
    cost_table = cost_table.unshifted
    costs = cost_table.verify_array(anchors + budget_cap, "cpu")[anchors: anchors + budget_cap + 1]
    over = (torch.tensor(draft_cost, dtype=torch.float32) + costs).double() > max_step_ms
    first = int(over.to(torch.uint8).argmax()) if bool(over.any()) else budget_cap + 1
    return max(first - 1, 0)


def resolve_step(a: PlanArgs, cost_table, capacity, num_tokens_padded, costs, *, budget, extra_tokens,
                 extra_emitting, token_offset, max_step_ms=None) -> None:
    """Fills a's per-step fields: the ones a decode loop may change every step (the cost table, e.g. a shifted
    view per prompt chunk, the capacity, a host budget, the prompt chunk's size, the token offset) and what they
    decide (B_max, the default T_pad, the cost arrays). The rest of ``a`` is already validated; the ops'
    prepared calls (planner/prepared.py) re-run only this when just these change."""
    R = a.R
    if cost_table is not None and not isinstance(cost_table, CostTable):
        raise TypeError(f"cost_table must be an adaptive_verify.CostTable, got {type(cost_table).__name__}")
    if cost_table is None and a.mode in ("greedy", "global"):
        raise ValueError(f"cost_table is required with mode={a.mode!r}")
    if capacity is not None:
        check_int("capacity", capacity, lo=0, hi=INT32_MAX)
        if cost_table is not None and cost_table.max_tokens is not None and capacity > cost_table.max_tokens:
            raise ValueError(f"capacity ({capacity}) exceeds cost_table.max_tokens ({cost_table.max_tokens})")
    extra_tokens = check_int("extra_tokens", extra_tokens, lo=0, hi=INT32_MAX)
    extra_emitting = check_int("extra_emitting", extra_emitting, lo=0, hi=MAX_REQS)
    token_offset = check_int("token_offset", token_offset, lo=0, hi=INT32_MAX)
    fixed_budget = 0
    if a.mode == "fixed" and not isinstance(budget, torch.Tensor):
        # Clamped to [B_min, B_max] later anyway; capping here keeps huge ints in the kernel's int64 field.
        fixed_budget = min(check_int("budget", budget, lo=0), INT32_MAX)

    anchors = R + extra_tokens
    limit = cost_table.max_tokens if cost_table is not None else None
    if capacity is not None:
        limit = capacity
    if limit is not None and limit < anchors:
        raise ValueError(
            f"capacity ({limit}) is below the R + extra_tokens = {anchors} anchor tokens that every step needs"
        )
    budget_cap = R * a.max_verify
    if limit is not None:
        budget_cap = min(budget_cap, limit - anchors)
    if num_tokens_padded is None:
        num_tokens_padded = R + budget_cap
    num_tokens_padded = check_int("num_tokens_padded", num_tokens_padded, lo=R, hi=MAX_TOKENS)
    budget_cap = min(budget_cap, num_tokens_padded - R)
    if token_offset + num_tokens_padded > INT32_MAX:
        raise ValueError(f"token_offset + num_tokens_padded must fit int32, got {token_offset + num_tokens_padded}")

    need_verify = a.mode in ("greedy", "global")
    if need_verify and anchors + budget_cap > cost_table.token_limit:
        raise ValueError(f"extra_tokens ({extra_tokens}): R + extra_tokens + the largest budget = "
                         f"{anchors + budget_cap} exceeds the cost curve's limit of {cost_table.token_limit} tokens "
                         f"(MAX_TOKENS_LIMIT = {MAX_TOKENS_LIMIT}, less a shifted table's prompt tokens; pass "
                         "capacity= or a cost table with max_tokens)")
    if max_step_ms is not None:  # every check before costs(), which may write a prepared call's cost array
        max_step_ms = check_real("max_step_ms", max_step_ms, lo=0.0, lo_open=True)
        if cost_table is None:
            raise ValueError("max_step_ms needs a cost_table (the step's modelled cost decides the cap)")
    verify_cost, draft_cost = None, 0.0
    if cost_table is not None:
        draft_cost, verify_cost = costs(cost_table, R, anchors + budget_cap, a.device, need_verify)
    step_cap = NO_STEP_CAP
    if max_step_ms is not None:
        step_cap = step_cap_of(cost_table, R, anchors, budget_cap, draft_cost, max_step_ms)
    a.fixed_budget, a.extra_tokens, a.extra_emitting, a.token_offset = fixed_budget, extra_tokens, extra_emitting, \
        token_offset
    a.budget_cap, a.num_tokens_padded, a.verify_cost, a.draft_cost = budget_cap, num_tokens_padded, verify_cost, \
        draft_cost
    a.step_cap = step_cap


def check_out(out, a: PlanArgs) -> VerifyPlan:
    """out= must hold every buffer this call writes, with the right dtype and device, contiguous. Request buffers have
    exactly R_pad (+ 1) entries; token buffers at least T_pad (a persistent buffer sized for the largest step, as
    engines keep theirs: the plan then returns views of their first T_pad entries, see :func:`token_room`)."""
    kind = TreeVerifyPlan if a.parents is not None else VerifyPlan
    if not isinstance(out, kind):
        raise TypeError(f"out must be a {kind.__name__} (see {kind.__name__}.allocate), got {type(out).__name__}")
    i32, dev = torch.int32, a.device
    Rp = a.num_reqs_padded
    _tensor("out.verify_lens", out.verify_lens, dtype=i32, device=dev, shape=(Rp,))
    _tensor("out.budget", out.budget, dtype=i32, device=dev, shape=())
    _tensor("out.expected_tokens", out.expected_tokens, dtype=torch.float32, device=dev, shape=())
    _tensor("out.num_tokens", out.num_tokens, dtype=i32, device=dev, shape=())
    _tensor("out.query_start_loc", out.query_start_loc, dtype=i32, device=dev, shape=(Rp + 1,))
    wanted = {
        "token_req": (True, i32, False),
        "seq_lens": (a.context_lens is not None, i32, True),
        "positions": (a.context_lens is not None, i32, False),
        "slot_mapping": (a.block_table is not None, torch.int64, False),
        "input_ids": (a.anchor_tokens is not None, i32, False),
    }
    if a.parents is not None:
        wanted.update(tree_mask=(True, torch.int64, False), token_parent=(True, i32, False),
                      token_node=(True, i32, False), token_depth=(True, i32, False))
    for name, (needed, dtype, per_request) in wanted.items():
        t = getattr(out, name)
        if t is not None and not isinstance(t, torch.Tensor):  # (a prepared call holds every field, used or not)
            raise TypeError(f"out.{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if not needed:
            continue
        if t is None:
            raise ValueError(f"out.{name} is None but this call produces it (allocate it in the VerifyPlan)")
        if per_request:
            _tensor(f"out.{name}", t, dtype=dtype, device=dev, shape=(Rp,))
            continue
        check_tensor(f"out.{name}", t, dtypes=(dtype,), device=dev, ndim=1, inner_contiguous=False)
        if t.shape[0] < a.num_tokens_padded:
            raise ValueError(f"out.{name} must have at least T_pad = {a.num_tokens_padded} entries, got "
                             f"{tuple(t.shape)}")
    return out


def token_room(out: VerifyPlan, a: PlanArgs) -> int:
    """The largest T_pad out's token buffers can take for calls like ``a`` (the shortest buffer such a call
    writes)."""
    writes = [out.token_req]
    if a.context_lens is not None:
        writes.append(out.positions)
    if a.block_table is not None:
        writes.append(out.slot_mapping)
    if a.anchor_tokens is not None:
        writes.append(out.input_ids)
    if a.parents is not None:
        writes += [out.tree_mask, out.token_parent, out.token_node, out.token_depth]
    return min(t.shape[0] for t in writes)
