"""The planner's public ops: choose_budget and plan_verification (prefix_survival: survival.py; the draft-tree
plan, plan_tree_verification: tree_ops.py, on the same call path).

Host path (docs/design.md, "Host overhead"): a call repeating an earlier call's argument objects (a decode loop's
persistent buffers and settings) reuses its validation and its filled kernel struct (_callcache.py); what a loop
may change every step (the cost table, e.g. a shifted view per prompt chunk, the capacity, a host budget, the
prompt chunk's size, the token offset) is re-derived by resolve_step alone.
"""
from __future__ import annotations

import ctypes
import dataclasses
import warnings
from typing import Optional, Union

import numpy as np
import torch

from .. import errors
from .._callcache import CallCache
from .._validate import check_tensor
from ..cost import CostTable
from ..cost.curve import ShiftedCurve
from .args import PlanArgs, _table_costs, check_out, resolve_plan_args, resolve_step, token_room
from .launch import fill_step, launch, launch_at, make_params, run_traced, workspace_for
from .step import MetadataInputs, PlanStep, merge_metadata, merge_step
from .survival import prefix_survival
from .verify_plan import VerifyPlan

VERIFICATIONS = (None, "onehot", "probs")

__all__ = ["VERIFICATIONS", "choose_budget", "plan_verification", "prefix_survival"]


# ----------------------------------------------------------------------------------------------------
# cost arrays: one lookup per (table, R, device), grown with the largest token count asked for
# ----------------------------------------------------------------------------------------------------

_COST_MEMO: dict = {}
_COST_MEMO_SIZE = 16


def _costs(cost_table: CostTable, R: int, max_n: int, device: torch.device, need_verify: bool):
    """(fixed_cost(R), verify_array(max_n)) with the table's own caching; remembered per (table, R, max_n)."""
    if torch.compiler.is_compiling():  # traced once: nothing to remember (and no id() in a graph)
        return _table_costs(cost_table, R, max_n, device, need_verify)
    key = (id(cost_table), R, max_n if need_verify else -1, device, need_verify)  # max_n sizes the verify array only
    hit = _COST_MEMO.get(key)
    if hit is not None and hit[0] is cost_table:
        return hit[1], hit[2]
    value = _table_costs(cost_table, R, max_n, device, need_verify)
    if len(_COST_MEMO) >= _COST_MEMO_SIZE:
        _COST_MEMO.pop(next(iter(_COST_MEMO)))
    _COST_MEMO[key] = (cost_table, *value)  # holds the table: its id stays unique while remembered
    return value


# ----------------------------------------------------------------------------------------------------
# launch-ready calls
# ----------------------------------------------------------------------------------------------------


class _ShiftCosts:
    """A remembered CPU call's verify costs for shifted cost tables (CostTable.shifted, one per prompt chunk), written
    into arrays the call owns. Chunked prefill brings a new shift almost every step; a view's own verify_array would
    be a new array (and a new tensor) each time, while here the same buffers take each step's values: the exact
    values of view.verify_array (ShiftedCurve.dense32_into, tested equal). Only the call's kernel reads them, at its
    launch on this thread, so rewriting them at the next restep is safe. CUDA calls keep the views' own arrays (a
    device buffer rewritten from the host would need ordering against the kernel still reading it)."""

    __slots__ = ("f32", "tensor", "view", "view_np", "fixed")

    def __init__(self):
        # view / view_np: the tensor's / the array's first n entries, for the last n asked
        self.f32 = self.tensor = self.view = self.view_np = None
        self.fixed = (None, -1, 0.0)  # (base table, R, its fixed cost)

    def __call__(self, cost_table: CostTable, R: int, max_n: int, device: torch.device, need_verify: bool):
        """_costs for a shifted view (its drafter is its base's, so the fixed cost is the base's, remembered)."""
        base, fixed_r, draft_cost = self.fixed
        unshifted = cost_table.unshifted
        if base is not unshifted or fixed_r != R:
            draft_cost, _ = _costs(unshifted, R, 0, device, False)
            self.fixed = (unshifted, R, draft_cost)
        if not need_verify:
            return draft_cost, None
        n = min(max_n, cost_table.token_limit) + 1
        if self.f32 is None or self.f32.shape[0] < n:
            size = max(n, 2 * (0 if self.f32 is None else self.f32.shape[0]))
            self.f32 = np.empty(size, dtype=np.float32)
            self.tensor, self.view = torch.from_numpy(self.f32), None
        if self.view is None or self.view_np.shape[0] != n:  # n follows R and the capacity: the same step after step
            self.view, self.view_np = self.tensor[:n], self.f32[:n]
        cost_table.verify_curve.dense32_into(self.view_np)
        return draft_cost, self.view


class _Call:
    """A validated call: its arguments, its filled struct, and what it returns."""

    __slots__ = ("a", "params", "addr", "on_cuda", "result", "step", "table", "workspace", "expected", "op",
                 "out", "room", "views", "shift_costs")

    def __init__(self, a: PlanArgs, params, result, step, table, workspace, expected, op, out=None):
        self.a, self.params, self.result, self.step, self.table = a, params, result, step, table
        self.addr, self.on_cuda = ctypes.addressof(params), a.device.type == "cuda"
        self.workspace, self.expected, self.op = workspace, expected, op  # workspace/expected: kept alive
        # out's token buffers may be longer than T_pad (persistent, sized for the largest step): the result is then
        # views of their first T_pad entries, one set per T_pad seen (an eager step's T_pad follows its budget).
        self.out, self.room = out, token_room(out, a) if out is not None else 0
        self.views = {a.num_tokens_padded: result} if out is not None else None
        self.shift_costs: Optional[_ShiftCosts] = None

    def restep(self, step, cost_table) -> bool:
        """Re-derives the per-step fields for a new step (id(cost_table), then capacity, budget, extra_tokens,
        extra_emitting, token_offset, max_step_ms and num_tokens_padded, each after its type); False when the padded
        token count outgrows out's token buffers (the caller then revalidates, and this entry is re-stepped on every
        use until replaced)."""
        _, _, capacity, _, budget, _, extra_tokens, _, extra_emitting, _, token_offset, _, max_step_ms, _, padded = step
        if budget is None and self.a.budget_in is not None:  # a tensor budget is in the key, not in the step
            budget = self.a.budget_in
        costs = _costs
        # A shifted view on the CPU: its verify costs go into this call's own arrays (_ShiftCosts).
        if not self.on_cuda and isinstance(cost_table, CostTable) and cost_table.shifted_by:
            if self.shift_costs is None:
                self.shift_costs = _ShiftCosts()
            costs = self.shift_costs
        resolve_step(self.a, cost_table, capacity, padded, costs, budget=budget, extra_tokens=extra_tokens,
                     extra_emitting=extra_emitting, token_offset=token_offset, max_step_ms=max_step_ms)
        fill_step(self.params, self.a)
        self.table = cost_table  # held: its id is in self.step
        if self.out is not None and self.a.num_tokens_padded > self.room:
            self.step = None
            return False
        self.step = step
        if self.views is not None:
            self.result = self._views(self.a.num_tokens_padded)
        return True

    def reshift(self, base: CostTable, shift: int, capacity: int) -> bool:
        """restep onto ``base.shifted(shift)`` with this capacity, without building the view: for a CPU budget-only
        call (choose_budget, mode greedy or global) whose other per-step arguments are the defaults (no host budget,
        extra_tokens, extra_emitting, token_offset, max_step_ms or num_tokens_padded) and which already reads its
        verify costs from this call's shifted-cost array for ``base`` at its R: AdaptiveVerifier's lagged budget, each
        step at its own prompt chunk. Leaves the call as resolve_step would (tested field by field): when B_max's cap
        stays, so do the default T_pad and the cost array's length, and only the shifted costs are rewritten; returns
        True. Returns False when the call is not such a call or the step needs resolve_step (another cap, a cap past
        the curve, a capacity out of range): the caller then takes restep, which also raises what is wrong."""
        a, sc, st = self.a, self.shift_costs, self.step
        if sc is None or st is None or a.verify_cost is not sc.view or sc.fixed[0] is not base or \
                sc.fixed[1] != a.R or a.mode not in ("greedy", "global") or self.out is not None or self.on_cuda:
            return False
        if st[0] != "reshift":  # a step_key: the fields by name
            (_, _, _, budget_type, _, _, extra_tokens, _, extra_emitting, _, token_offset, max_step_type, _,
             padded_type, _) = st
            if budget_type is not _NONE or max_step_type is not _NONE or padded_type is not _NONE or extra_tokens \
                    or extra_emitting or token_offset:
                return False  # a host budget, a latency target, a T_pad or a chunk: restep's business
        if type(shift) is not int or type(capacity) is not int or shift <= 0 or capacity < 0 or \
                (base.max_tokens is not None and capacity > base.max_tokens - shift):
            return False
        R = a.R
        budget_cap = min(R * a.max_verify, capacity - R)
        limit = base.token_limit - shift
        if budget_cap != a.budget_cap or R + budget_cap > limit or R + budget_cap + 1 != sc.view_np.shape[0]:
            return False
        # The same B_max cap, so the same default T_pad and cost array length (R + cap + 1 entries): only the costs
        # change.
        ShiftedCurve(base.verify_curve, shift).dense32_into(sc.view_np)  # the view's own curve, into the same array
        self.step = ("reshift", shift, capacity)  # equals no step_key: a later restep re-derives everything
        self.table = base
        return True

    def _views(self, padded: int):
        plan = self.views.get(padded)
        if plan is None:
            if len(self.views) >= _VIEWS_PER_CALL:
                self.views.pop(next(iter(self.views)))
            plan = self.views[padded] = token_views(self.out, self.a, padded)
        return plan

    def with_budget_out(self, budget_out: torch.Tensor) -> "_Call":
        """A copy writing the budget into ``budget_out`` (choose_budget without out=)."""
        params = type(self.params).from_buffer_copy(self.params)
        params.budget_out = budget_out.data_ptr()
        return _Call(self.a, params, budget_out, self.step, self.table, self.workspace, self.expected, self.op)

    def run(self) -> None:
        launch_at(self.addr, self.on_cuda, self.a.device, self.op, self.a.parents is not None)


_CALLS = CallCache()


def _signature_tensors(args: tuple, out: Optional[VerifyPlan]) -> tuple:
    if out is None:
        return args
    return args + tuple(getattr(out, f.name) for f in dataclasses.fields(out))


def step_key(cost_table, capacity, host_budget, extra_tokens, extra_emitting, token_offset, max_step_ms,
             num_tokens_padded) -> tuple:
    """The per-step part of a remembered call's key (what _Call.restep re-derives), each value with its type."""
    return (id(cost_table), type(capacity), capacity, type(host_budget), host_budget, type(extra_tokens), extra_tokens,
            type(extra_emitting), extra_emitting, type(token_offset), token_offset, type(max_step_ms), max_step_ms,
            type(num_tokens_padded), num_tokens_padded)


def _call(op: str, tensors: tuple, statics: tuple, step: tuple, cost_table, out):
    """The remembered call for these argument objects (re-stepped if the per-step arguments changed), or
    (key, None). The key holds the types of the static and per-step scalars (values alone conflate True with 1 and
    2.0 with 2): a scalar of another type than the remembered call's is another call, which validates it."""
    try:
        key = (op, id(out), *map(id, tensors), *statics, *map(type, statics + step))
        call = _CALLS.get(key)
    except TypeError:  # an unhashable scalar: the validating path names it
        return None, None
    if call is not None and call.step != step and not call.restep(step, cost_table):
        call = None
    return key, call


_NONE = type(None)

#: Views kept per remembered call, one set per T_pad (an eager step's T_pad follows its budget).
_VIEWS_PER_CALL = 64


def token_views(out: VerifyPlan, a: PlanArgs, padded: int) -> VerifyPlan:
    """The plan a call returns: out, with None for the fields it did not produce and its token buffers cut to their
    first ``padded`` (T_pad) entries when they are longer."""
    changes = {}
    if a.context_lens is None:
        changes.update(seq_lens=None, positions=None)
    if a.block_table is None:
        changes["slot_mapping"] = None
    if a.anchor_tokens is None:
        changes["input_ids"] = None
    changes = {k: v for k, v in changes.items() if getattr(out, k) is not v}
    plan = dataclasses.replace(out, **changes) if changes else out
    return plan.first_tokens(padded)


def _owns_inputs(a: PlanArgs, kw: dict, survival, conf, drafts) -> bool:
    """Whether the validated args hold the caller's own tensors (an int64 input converted to int32 is a per-call
    copy, so such a call is never remembered)."""
    budget = kw.get("budget")
    return ((a.survival is survival or (conf is not None and a.conf is conf)) and a.drafts is drafts
            and a.context_lens is kw.get("context_lens") and a.block_table is kw.get("block_table")
            and a.anchor_tokens is kw.get("anchor_tokens") and a.draft_tokens is kw.get("draft_tokens")
            and a.parents is kw.get("parents")
            and (a.budget_in is budget or not isinstance(budget, torch.Tensor)))


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
    if step is not None:
        budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, _, padded = \
            merge_step(step, None, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms,
                       weights, None, None)
        if budget is not None or padded is not None:
            name, value = ("budget", budget) if budget is not None else ("num_tokens_padded", padded)
            raise ValueError(f"step.{name} must be None for choose_budget, got {value!r}: choose_budget chooses the "
                             "budget, and plan_verification clamps it to its T_pad")
    if metadata is not None:
        draft_tokens = merge_metadata(metadata, None, None, None, None, draft_tokens, 0)[4]
    return _choose_budget(survival, drafts, cost_table, mode=mode, min_verify=min_verify, max_verify=max_verify,
                          extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity,
                          draft_tokens=draft_tokens, conf=conf, out=out, weights=weights, max_step_ms=max_step_ms,
                          parents=parents)[0]


def _choose_budget(survival, drafts, cost_table, *, mode, min_verify, max_verify, extra_tokens, extra_emitting,
                   capacity, draft_tokens, conf, out, weights, max_step_ms, parents):
    """choose_budget's work: (the budget tensor, the remembered _Call when this call repeats or is now remembered,
    else None). AdaptiveVerifier drives such a call itself (_Call.restep and run) on its own persistent inputs."""
    tensors = (survival, conf, drafts, draft_tokens, out, weights, parents)
    statics = (mode, type(min_verify), min_verify, type(max_verify), max_verify)
    step = step_key(cost_table, capacity, None, extra_tokens, extra_emitting, 0, max_step_ms, None)
    compiling = torch.compiler.is_compiling()
    key = None
    if not compiling:
        key, call = _call("choose_budget", tensors, statics, step, cost_table, None)
        if call is not None:
            if out is None:  # a fresh result each call: a copy of the struct, so threads never share one
                out = torch.empty((), dtype=torch.int32, device=call.a.device)
                call = call.with_budget_out(out)
            call.run()
            return out, call
    kw = dict(mode=mode, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, draft_tokens=draft_tokens,
              allowed_modes=("global", "greedy", "all"), conf=conf, weights=weights, max_step_ms=max_step_ms,
              parents=parents)
    a = resolve_plan_args(survival, drafts, cost_table, costs=_costs, **kw)
    if out is None:
        out = torch.empty((), dtype=torch.int32, device=a.device)
    else:
        check_tensor("out", out, dtypes=(torch.int32,), device=a.device, shape=())
    expected = torch.empty((), dtype=torch.float32, device=a.device)
    if compiling:
        run_traced(a, None, out, expected)
        return out, None
    p = make_params(a, None, out, expected, errors.error_buffer(a.device))
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    launch(p, a.device, "choose_budget")
    call = None
    if key is not None and _owns_inputs(a, kw, survival, conf, drafts):
        call = _CALLS.put(key, tensors, _signature_tensors(tensors, None),
                          _Call(a, p, out, step, cost_table, ws, expected, "choose_budget"))
    return out, call


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
            default, 0 or None) raises ValueError naming both. Either form is the same call, remembered alike.

    Host cost: a call that repeats an earlier call's objects (same tensors, same ``out``, same settings; the cost
    table, capacity, budget, extra_tokens, extra_emitting and token_offset may change) skips validation and
    launches the remembered kernel struct; pass ``out=`` (and ``survival_out=`` with ``conf``) to stay on that
    path (docs/design.md, "Host overhead"). ``step`` and ``metadata`` are unpacked before that (a few attribute
    reads), so a remembered call is keyed by the tensors they hold: build them around the persistent buffers.
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
    return plan_call(survival, drafts, cost_table, verification, kw, out)[0]


def plan_call(survival, drafts, cost_table, verification, kw: dict, out):
    """plan_verification with ``kw`` every one of its other keyword arguments: (the plan, the remembered _Call or
    None; AdaptiveVerifier drives that call itself, see _choose_budget)."""
    if not (verification is None or isinstance(verification, str)) or verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")
    mode = kw["mode"]
    if isinstance(mode, str) and mode == "global":
        _warn_global_live(verification)
    return run_plan("plan_verification", VerifyPlan, survival, drafts, cost_table, kw, out)


def run_plan(op: str, plan_type: type, survival, drafts, cost_table, kw: dict, out):
    """plan_verification's and plan_tree_verification's call (kw: their keyword arguments, ``parents`` for trees):
    the remembered launch when ``out`` and every argument object repeat an earlier call's, else validation, the
    launch, and remembering it. Returns (the plan, the remembered _Call or None: see _choose_budget)."""
    budget = kw["budget"]
    budget_tensor = budget if isinstance(budget, torch.Tensor) else None
    tensors = (survival, kw["conf"], drafts, kw["context_lens"], kw["block_table"], kw["anchor_tokens"],
               kw["draft_tokens"], budget_tensor, kw["survival_out"], kw["weights"], kw.get("parents"))
    # Scalars with their types, so a bool or a float never passes where an earlier call's int was validated.
    statics = tuple(x for name in ("mode", "min_verify", "max_verify", "block_size", "num_reqs_padded")
                    for x in ((kw[name],) if name == "mode" else (type(kw[name]), kw[name])))
    host_budget = None if budget_tensor is not None else budget
    step = step_key(cost_table, kw["capacity"], host_budget, kw["extra_tokens"], kw["extra_emitting"],
                    kw["token_offset"], kw["max_step_ms"], kw["num_tokens_padded"])
    compiling = torch.compiler.is_compiling()
    key = None
    if isinstance(out, plan_type) and not compiling:
        key, call = _call(op, tensors, statics, step, cost_table, out)
        if call is not None:
            call.run()
            return call.result, call
    a = resolve_plan_args(survival, drafts, cost_table, costs=_costs, **kw)
    if out is None:
        out = plan_type.allocate(
            a.num_reqs_padded, a.num_tokens_padded, a.device, positions=a.context_lens is not None,
            slot_mapping=a.block_table is not None, input_ids=a.anchor_tokens is not None,
        )
    else:
        check_out(out, a)
    if compiling:
        run_traced(a, out, out.budget, out.expected_tokens)
        return token_views(out, a, a.num_tokens_padded), None
    p = make_params(a, out, out.budget, out.expected_tokens, errors.error_buffer(a.device))
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    launch(p, a.device, op)
    result = token_views(out, a, a.num_tokens_padded)
    call = None
    if key is not None and _owns_inputs(a, kw, survival, kw["conf"], drafts):
        call = _CALLS.put(key, (out, *tensors), _signature_tensors(tensors, out),
                          _Call(a, p, result, step, cost_table, ws, None, op, out=out))
    return result, call
