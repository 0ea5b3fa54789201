"""The planner's public ops: choose_budget and plan_verification (prefix_survival: survival.py; the draft-tree
plan, plan_tree_verification: tree_ops.py, on the same call path).

Host path (docs/design.md, "Host overhead"): every call validates every argument and builds the kernel's struct;
nothing is remembered between calls. A decode loop's fast path is explicit: ``adaptive_verify.prepare`` of these
ops gives a PreparedPlan (planner/prepared.py) whose run() re-derives only what a loop changes per step.
"""
from __future__ import annotations

import warnings
from typing import Optional, Union

import torch

from .. import errors
from ..prepared import capture, preparing, refuse_copy, register
from .._validate import check_tensor
from ..cost import CostTable
from .args import PlanArgs, check_out, resolve_plan_args
from .launch import launch, make_params, run_traced, workspace_for
from .prepared import PreparedPlan, _Call, step_key, token_views
from .step import MetadataInputs, PlanStep, merge_metadata, merge_step
from .survival import prefix_survival
from .verify_plan import VerifyPlan

VERIFICATIONS = (None, "onehot", "probs")

__all__ = ["VERIFICATIONS", "choose_budget", "plan_verification", "prefix_survival"]


def _copied_input(a: PlanArgs, kw: dict, survival, conf, drafts) -> Optional[str]:
    """The name of an input the validation converted into a per-call copy (an int64 tensor made int32), or None:
    prepare refuses such a call (its copy would not see later values)."""
    if not (a.survival is survival or (conf is not None and a.conf is conf)):
        return "survival"
    if a.drafts is not drafts:
        return "drafts"
    for name in ("context_lens", "block_table", "anchor_tokens", "draft_tokens", "parents"):
        if getattr(a, name) is not kw.get(name):
            return name
    budget = kw.get("budget")
    if isinstance(budget, torch.Tensor) and a.budget_in is not budget:
        return "budget"
    return None


# ----------------------------------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------------------------------

_warned_global: set = set()


def _warn_global_live(verification):
    """Live global looks at a[r, j + 1] when deciding draft j. With one-hot verification (draft_probs=None,
    or greedy) every emitted token is a fresh target sample whatever was drafted, so that is lossless; with
    verification against draft probabilities it is not (docs/design.md, "When is which mode lossless"). Warn
    once per kind: when the caller declared "probs", and when the caller declared nothing (a silent bias is
    worse than one warning; declaring verification="onehot" silences it)."""
    if verification == "onehot" or verification in _warned_global:
        return
    _warned_global.add(verification)
    if verification == "probs":
        msg = ("plan_verification(mode='global', verification='probs') picks the budget from the live step's "
               "survivals while drafts are verified against draft probabilities: whether draft j is verified then "
               "depends on draft j itself, so sampling is NOT lossless. Use mode='greedy', or choose_budget() on an "
               "earlier step + mode='fixed' (lagged), or verify one-hot (draft_probs=None).")
    else:
        msg = ("plan_verification(mode='global') picks the budget from the live step's survivals: lossless with "
               "one-hot verification (rejection_sample(draft_probs=None), greedy, trees), NOT lossless when drafts "
               "are verified against draft probabilities. Pass verification='onehot' or 'probs' to say which "
               "(this warning is for undeclared callers).")
    warnings.warn(msg, stacklevel=3)


@register
def choose_budget(
    survival: Optional[torch.Tensor],
    drafts: torch.Tensor,
    cost_table: CostTable,
    *,
    mode: str = "global",
    min_verify: int = 0,
    max_verify: Optional[int] = None,
    extra_tokens: int = 0,
    extra_emitting: int = 0,
    capacity: Optional[int] = None,
    draft_tokens: Optional[torch.Tensor] = None,
    conf: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    max_step_ms: Optional[float] = None,
    parents: Optional[torch.Tensor] = None,
    step: Optional[PlanStep] = None,
    metadata: Optional[MetadataInputs] = None,
) -> torch.Tensor:
    """Budget B (0-d int32 tensor on survival's device) for ``mode`` in "global", "greedy", "all".

    survival [R, K] float32, drafts [R] int32. Run on an earlier step's survivals, "global" gives the
    lagged mode's budget: pass it to ``plan_verification(mode="fixed", budget=B)``, which clamps it
    to the new step's [B_min, B_max]. Arguments as in :func:`plan_verification` (``draft_tokens``: only a
    negative id, an invalidated draft, matters here: it ends its request's candidates).
    ``conf``: [R, K] confidences instead of survival (pass survival=None): the survival is computed in the same
    call. ``out``: a 0-d int32 tensor to write the budget into (returned). ``weights``, ``max_step_ms``: as in
    :func:`plan_verification`.

    ``parents``: [R, N] int32 (N <= 63) makes each row a draft tree (docs/design.md, "Draft trees"): ``drafts``
    are then the tree sizes, survival (or conf, through :func:`tree_survival`) is per node, taken as given but
    capped by the parent's (no running minimum along node index, which is right for chains only), and the budget
    depends on the survival multiset, min_verify and max_verify (both by node index), exactly as
    :func:`plan_tree_verification` chooses it. ``draft_tokens`` then also removes duplicate siblings.

    ``step``: a :class:`PlanStep` in place of min_verify, max_verify, capacity, extra_tokens, extra_emitting,
    max_step_ms and weights (its ``budget`` and ``num_tokens_padded`` must be None here: the budget is what this
    chooses, and T_pad clamps it in the plan; ``num_reqs_padded`` is not read). ``metadata``: a
    :class:`MetadataInputs`, of which only ``draft_tokens`` is read. A field given both as its keyword and in its
    object raises ValueError naming both.
    """
    min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, draft_tokens = budget_step(
        "choose_budget", step, metadata, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms,
        weights, draft_tokens)
    return _choose_budget(survival, drafts, cost_table, mode=mode, min_verify=min_verify, max_verify=max_verify,
                          extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity,
                          draft_tokens=draft_tokens, conf=conf, out=out, weights=weights, max_step_ms=max_step_ms,
                          parents=parents)


def budget_step(op: str, step, metadata, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms,
                weights, draft_tokens) -> tuple:
    """The step= and metadata= objects of choose_budget and choose_draft_depth merged with their keywords: (min_verify,
    max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, draft_tokens). A step's budget or T_pad
    is refused (these ops choose the budget; plan_verification clamps it to its T_pad)."""
    if step is not None:
        budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, _, padded = \
            merge_step(step, None, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms,
                       weights, None, None)
        if budget is not None or padded is not None:
            name, value = ("budget", budget) if budget is not None else ("num_tokens_padded", padded)
            raise ValueError(f"step.{name} must be None for {op}, got {value!r}: {op} chooses the budget, and "
                             "plan_verification clamps it to its T_pad")
    if metadata is not None:
        draft_tokens = merge_metadata(metadata, None, None, None, None, draft_tokens, 0)[4]
    return min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, draft_tokens


def _choose_budget(survival, drafts, cost_table, *, mode, min_verify, max_verify, extra_tokens, extra_emitting,
                   capacity, draft_tokens, conf, out, weights, max_step_ms, parents):
    """choose_budget's work: validates, then launches (or, under prepare, hands over its PreparedBudget). Returns
    the budget tensor."""
    compiling = torch.compiler.is_compiling()
    kw = dict(mode=mode, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, draft_tokens=draft_tokens,
              allowed_modes=("global", "greedy", "all"), conf=conf, weights=weights, max_step_ms=max_step_ms,
              parents=parents)
    a = resolve_plan_args(survival, drafts, cost_table, **kw)
    if out is None:
        out = torch.empty((), dtype=torch.int32, device=a.device)
    else:
        check_tensor("out", out, dtypes=(torch.int32,), device=a.device, shape=())
    expected = torch.empty((), dtype=torch.float32, device=a.device)
    if compiling:
        run_traced(a, None, out, expected)
        return out
    p = make_params(a, None, out, expected, errors.error_buffer(a.device))
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    if preparing():
        copied = _copied_input(a, kw, survival, conf, drafts)
        if copied is not None:
            refuse_copy("choose_budget", copied)
        step = step_key(cost_table, capacity, None, extra_tokens, extra_emitting, 0, max_step_ms, None)
        capture(PreparedPlan(_Call(a, p, out, step, cost_table, ws, expected, "choose_budget"),
                             (cost_table, capacity, None, extra_tokens, extra_emitting, 0, max_step_ms, None)))
        return out
    launch(p, a.device, "choose_budget")
    return out


@register
def plan_verification(
    survival: Optional[torch.Tensor],
    drafts: torch.Tensor,
    cost_table: Optional[CostTable] = None,
    *,
    mode: str = "greedy",
    budget: Union[int, torch.Tensor, None] = None,
    min_verify: int = 0,
    max_verify: Optional[int] = None,
    extra_tokens: int = 0,
    extra_emitting: int = 0,
    capacity: Optional[int] = None,
    context_lens: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    anchor_tokens: Optional[torch.Tensor] = None,
    draft_tokens: Optional[torch.Tensor] = None,
    token_offset: int = 0,
    num_reqs_padded: Optional[int] = None,
    num_tokens_padded: Optional[int] = None,
    out: Optional[VerifyPlan] = None,
    verification: Optional[str] = None,
    conf: Optional[torch.Tensor] = None,
    survival_out: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    max_step_ms: Optional[float] = None,
    step: Optional[PlanStep] = None,
    metadata: Optional[MetadataInputs] = None,
) -> VerifyPlan:
    """Chooses the budget, allocates it to the highest-survival drafts, and writes varlen metadata.

    One CUDA launch on CUDA tensors (no host sync; graph-capturable with ``out=``), the C++ CPU kernel
    on CPU tensors; both give the torch reference's integers exactly.

    Args:
        survival: [R, K] float32 prefix survival (see :func:`prefix_survival`), last dim contiguous.
            Sanitised: clamped to [0, 1] and made non-increasing per row; a NaN ends the row's
            candidates (never verified) and is counted in ``error_counts()``.
        drafts: [R] int32 drafted tokens per request, in [0, K] (CPU: ValueError; CUDA: clamped, counted).
        cost_table: step costs; required for "greedy" and "global".
        mode: "greedy" (default, lossless), "global" (argmax of Theta on these survivals: lossless with one-hot
            verification, NOT with verification against draft probabilities; see ``verification``),
            "fixed", "all".
        budget: "fixed" only: a Python int or a 0-d int32 (or int64) device tensor, clamped to
            [B_min, B_max].
        min_verify: forced drafts per request (ranked first). max_verify: cap per request (default K).
        extra_tokens: non-draft tokens in the step (prefill chunks), in [0, 2^31 - 1]; extra_emitting: prefill
            requests that sample this step (they add tokens to Theta's numerator), in [0, MAX_REQS].
        capacity: most tokens in the step (default cost_table.max_tokens, else unbounded); must be
            >= R + extra_tokens.
        context_lens: [R] int32 KV length before this step, in [0, MAX_CONTEXT_LEN = 2^31 - 65] (CPU: ValueError;
            CUDA: that request's seq_lens and positions are written 0, its slots -1, and it is counted in
            ``error_counts()["context_len_out_of_range"]``); enables seq_lens and positions.
        block_table: [R, max_blocks] int32 with block_size; enables slot_mapping. On CPU a block table
            too short for the positions raises ValueError; on CUDA the slot is -1 and it is counted.
        anchor_tokens: [R] int32 last emitted token; draft_tokens: [R, >= max_verify] int32; enable input_ids.
            A negative draft token (an engine's invalidated draft, e.g. by a grammar: vLLM marks them -1)
            ends its request's candidates, so it is never verified (draft_tokens may be given alone for that).
        token_offset: global index of this step's first decode token (query_start_loc starts there).
        num_reqs_padded: R_pad >= R (default R). num_tokens_padded: T_pad >= R (default
            R + min(R * max_verify, capacity - R - extra_tokens): room for every candidate that fits);
            the budget never exceeds T_pad - R.
        out: preallocated :class:`VerifyPlan` whose buffers are fully rewritten.
        verification: how the caller verifies the drafts, which decides whether live "global" is lossless
            (docs/design.md): "onehot" (``rejection_sample(draft_probs=None)``, greedy, trees: every mode is
            lossless, no warning), "probs" (against draft probabilities: live "global" is not lossless and
            warns once), or None (undeclared: "global" warns once, saying both). Other modes ignore it.
        conf: [R, K] float32 confidences instead of ``survival`` (pass survival=None): the same call computes
            the survival exactly as :func:`prefix_survival` does (NaNs counted as there) and plans on it.
            survival_out: [R, K] float32 contiguous buffer for that survival (scratch when None).
        weights: [R] float32 request priorities (finite, >= 0; default all 1): candidates rank by w_r * a[r, j]
            (then position, request: still prefix-closed) and Theta's numerator is sum_r w_r (1 + its verified
            survivals); ``expected_tokens`` stays unweighted. Unusable values raise on the CPU and weigh 1 on
            CUDA (counted as ``weight_out_of_range``). Fixed before the step's drafts, so every lossless mode
            stays lossless.
        max_step_ms: a latency target: the budget never makes the step's modelled cost (``fixed_cost(R) +
            verify_cost(R + extra_tokens + B)``, the kernel's float32 sum) exceed it; B_max shrinks to the last
            budget before the first one over the target. min_verify's forced drafts still win when they alone
            exceed it. Needs the cost table.
        step: a :class:`PlanStep`, the step's limits and budget in one object: budget, min_verify, max_verify,
            capacity, extra_tokens, extra_emitting, max_step_ms, weights, num_reqs_padded, num_tokens_padded.
        metadata: a :class:`MetadataInputs`, what the varlen metadata is written from in one object: context_lens,
            block_table, block_size, anchor_tokens, draft_tokens, token_offset.
            Each field keeps its keyword; a field given both ways (the keyword and the object's field each off its
            default, 0 or None) raises ValueError naming both. Either form is the same call.

    Host cost: every call validates everything (tens of microseconds). A decode loop prepares the call once,
    ``handle = adaptive_verify.prepare(plan_verification, ..., out=plan_buffers)``, and calls ``handle.run(...)``
    each step with what changed (new inputs of the same layout, the cost table, capacity, budget, extra_tokens,
    extra_emitting, token_offset, max_step_ms, num_tokens_padded): docs/design.md, "Host overhead".
    """
    if step is not None:
        (budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, num_reqs_padded,
         num_tokens_padded) = merge_step(step, budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting,
                                         max_step_ms, weights, num_reqs_padded, num_tokens_padded)
    if metadata is not None:
        context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset = merge_metadata(
            metadata, context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset)
    kw = dict(mode=mode, budget=budget, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, context_lens=context_lens, block_table=block_table,
              block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
              num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded, conf=conf,
              survival_out=survival_out, weights=weights, max_step_ms=max_step_ms)
    return plan_call(survival, drafts, cost_table, verification, kw, out)


def plan_call(survival, drafts, cost_table, verification, kw: dict, out):
    """plan_verification with ``kw`` every one of its other keyword arguments."""
    if not (verification is None or isinstance(verification, str)) or verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")
    mode = kw["mode"]
    if isinstance(mode, str) and mode == "global":
        _warn_global_live(verification)
    return run_plan("plan_verification", VerifyPlan, survival, drafts, cost_table, kw, out)


def run_plan(op: str, plan_type: type, survival, drafts, cost_table, kw: dict, out):
    """plan_verification's and plan_tree_verification's call (kw: their keyword arguments, ``parents`` for trees):
    validation, then the launch (or, under prepare, its PreparedPlan). Returns the plan."""
    a = resolve_plan_args(survival, drafts, cost_table, **kw)
    if out is None:
        out = plan_type.allocate(
            a.num_reqs_padded, a.num_tokens_padded, a.device, positions=a.context_lens is not None,
            slot_mapping=a.block_table is not None, input_ids=a.anchor_tokens is not None,
        )
    else:
        check_out(out, a)
    if torch.compiler.is_compiling():
        run_traced(a, out, out.budget, out.expected_tokens)
        return token_views(out, a, a.num_tokens_padded)
    p = make_params(a, out, out.budget, out.expected_tokens, errors.error_buffer(a.device))
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    result = token_views(out, a, a.num_tokens_padded)
    if preparing():
        copied = _copied_input(a, kw, survival, kw["conf"], drafts)
        if copied is not None:
            refuse_copy(op, copied)
        budget = kw["budget"]
        host_budget = None if isinstance(budget, torch.Tensor) else budget
        values = (cost_table, kw["capacity"], host_budget, kw["extra_tokens"], kw["extra_emitting"], kw["token_offset"],
                  kw["max_step_ms"], kw["num_tokens_padded"])
        capture(PreparedPlan(_Call(a, p, result, step_key(*values), cost_table, ws, None, op, out=out), values))
        return result
    launch(p, a.device, op)
    return result
