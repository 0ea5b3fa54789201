"""The planner's prepared calls (adaptive_verify.prepare of plan_verification, plan_tree_verification and
choose_budget): a validated call's struct, re-derived per step for the scalars a decode loop changes (the cost
table, e.g. a shifted view per prompt chunk, the capacity, a host budget, the prompt chunk's size, the token offset,
the latency target, T_pad) by resolve_step alone, and launched."""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Optional

import numpy as np
import torch

from ..cost import CostTable
from ..cost.curve import ShiftedCurve
from ..prepared import Prepared
from .args import PlanArgs, _table_costs, resolve_step, token_room
from .launch import fill_step, launch_at
from .verify_plan import VerifyPlan


class _ShiftCosts:
    """A prepared CPU call's verify costs for shifted cost tables (CostTable.shifted, one per prompt chunk), written
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
        """_table_costs for a shifted view (its drafter is its base's, so the fixed cost is the base's, remembered)."""
        base, fixed_r, draft_cost = self.fixed
        unshifted = cost_table.unshifted
        if base is not unshifted or fixed_r != R:
            draft_cost, _ = _table_costs(unshifted, R, 0, device, False)
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
        token count outgrows out's token buffers (PreparedPlan.run then raises; the call is re-stepped at its next
        run). Raises what resolve_step raises, having changed nothing."""
        _, _, capacity, _, budget, _, extra_tokens, _, extra_emitting, _, token_offset, _, max_step_ms, _, padded = step
        if budget is None and self.a.budget_in is not None:  # a tensor budget is in the key, not in the step
            budget = self.a.budget_in
        costs = _table_costs
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

    def run(self) -> None:
        launch_at(self.addr, self.on_cuda, self.a.device, self.op, self.a.parents is not None)


def step_key(cost_table, capacity, host_budget, extra_tokens, extra_emitting, token_offset, max_step_ms,
             num_tokens_padded) -> tuple:
    """The per-step part of a prepared call's state (what _Call.restep re-derives), each value with its type."""
    return (id(cost_table), type(capacity), capacity, type(host_budget), host_budget, type(extra_tokens), extra_tokens,
            type(extra_emitting), extra_emitting, type(token_offset), token_offset, type(max_step_ms), max_step_ms,
            type(num_tokens_padded), num_tokens_padded)


_NONE = type(None)

#: Views kept per prepared call, one set per T_pad (an eager step's T_pad follows its budget).
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


class _Keep:
    """run()'s default: the argument keeps its last value."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()

# run()'s rebindable inputs: name -> the PlanArgs attribute and the struct field holding the pointer
_INPUTS = {"survival": ("survival", "survival"), "conf": ("conf", "conf"), "drafts": ("drafts", "drafts"),
           "context_lens": ("context_lens", "context_lens"), "block_table": ("block_table", "block_table"),
           "anchor_tokens": ("anchor_tokens", "anchor_tokens"), "draft_tokens": ("draft_tokens", "draft_tokens"),
           "weights": ("weights", "weights"), "parents": ("parents", "parents"), "budget": ("budget_in", "budget_in")}
#: The planner's inputs in the order run_owned takes them.
INPUTS = tuple(_INPUTS)
_PLAIN = (int, float, type(None))  # per-step values compared by value (a bool is not an int here: its own type)


class PreparedPlan(Prepared):
    """A prepared plan_verification, plan_tree_verification or choose_budget (adaptive_verify.prepare).

    ``run(**changes)`` launches it and returns the plan (views of the prepared ``out``'s buffers; their first
    T_pad token entries when out is longer), or choose_budget's 0-d budget tensor (one per handle, rewritten each
    run). It may change, by keyword:

    - per step: ``cost_table`` (e.g. ``table.shifted(prompt_tokens)``), ``capacity``, ``budget`` (a host int for
      mode "fixed"; a prepared tensor budget is an input, below; None keeps it), ``extra_tokens``, ``extra_emitting``,
      ``token_offset``, ``max_step_ms`` (None: off) and ``num_tokens_padded`` (None: the default; at most what the
      prepared out holds); choose_budget has no budget, token_offset or num_tokens_padded. Validated like the op's
      arguments whenever they differ from the last run's.
    - inputs (the tensors that were given, not None, at prepare): ``survival`` or ``conf``, ``drafts``,
      ``context_lens``, ``block_table``, ``anchor_tokens``, ``draft_tokens``, ``weights``, ``parents``, and
      ``budget`` when it was a tensor; each of the prepared one's dtype, device, shape and strides.
    """

    __slots__ = ("call", "_values", "_step")

    def __init__(self, call: _Call, values: tuple):
        a = call.a
        inputs = {}
        for name, (attr, field) in _INPUTS.items():  # (in INPUTS order: run_owned's; None ones are not inputs)
            t = getattr(a, attr)
            inputs[name] = (None if name == "survival" and a.conf is not None else t, field)  # survival_out: an output
        held = {"workspace": call.workspace, "expected": call.expected,
                "survival_out": a.survival if a.conf is not None else None}
        if call.out is not None:
            held.update((f"out.{f.name}", getattr(call.out, f.name)) for f in dataclasses.fields(call.out))
        else:
            held["out"] = call.result
        super().__init__(call.op, call.params, inputs, held)
        self.call, self._values, self._step = call, values, call.step

    def run(self, *, cost_table=KEEP, capacity=KEEP, budget=KEEP, extra_tokens=KEEP, extra_emitting=KEEP,
            token_offset=KEEP, max_step_ms=KEEP, num_tokens_padded=KEEP, **inputs):
        if isinstance(budget, torch.Tensor):
            inputs["budget"], budget = budget, KEEP
        elif budget is None:  # (like a None input: keeps the prepared budget)
            budget = KEEP
        self._bind(inputs)
        budget_in = inputs.get("budget")
        if budget_in is not None:  # (restep reads the tensor budget from the planner arguments)
            self.call.a.budget_in = budget_in
        return self._step_and_run((cost_table, capacity, budget, extra_tokens, extra_emitting, token_offset,
                                   max_step_ms, num_tokens_padded))

    def run_owned(self, tensors: tuple, cost_table, capacity, token_offset, max_step_ms, num_tokens_padded):
        """The per-step form for an owner that calls it every step (AdaptiveVerifier): ``tensors`` are the inputs in
        INPUTS order (None: not an input of this call, or keep it; None for all: keep every one), the rest as in
        run(); for choose_budget token_offset and num_tokens_padded are its own (0, None). The same checks as run()
        with less interpretation: no names to look up, and the usual case, the same per-step values as the last
        run's, recognised by identity or (type, value) without rebuilding the step."""
        self._bind_seq(tensors)
        call = self.call
        budget_in = tensors[-1] if tensors else None
        if budget_in is not None and budget_in is not call.a.budget_in:  # (restep reads the tensor budget there)
            call.a.budget_in = budget_in
        v = self._values
        if cost_table is v[0] and (capacity is v[1] or (type(capacity) is int is type(v[1]) and capacity == v[1])) \
                and (token_offset is v[5] or (type(token_offset) is int is type(v[5]) and token_offset == v[5])) \
                and (max_step_ms is v[6] or (type(max_step_ms) is float is type(v[6]) and max_step_ms == v[6])) \
                and (num_tokens_padded is v[7] or (type(num_tokens_padded) is int is type(v[7])
                                                    and num_tokens_padded == v[7])) \
                and (call.step is self._step or call.step == self._step):
            call.run()  # the last run's step: nothing to re-derive
            return call.result
        if call.out is None:  # choose_budget: no token_offset or T_pad (what it was prepared with is kept)
            token_offset = num_tokens_padded = KEEP
        return self._step_and_run((cost_table, capacity, KEEP, KEEP, KEEP, token_offset, max_step_ms,
                                   num_tokens_padded))

    def _step_and_run(self, new: tuple):
        """Re-derives the step when ``new`` (run()'s scalars, KEEP where unchanged) differs from the last run's,
        then launches."""
        call = self.call
        cost_table, capacity, budget, extra_tokens, extra_emitting, token_offset, max_step_ms, num_tokens_padded = new
        values, step = self._values, self._step
        changed = False
        for v, old in zip(new, values):  # (a value equal to the last run's, of its type, changes nothing)
            if v is not KEEP and v is not old and (type(v) is not type(old) or type(v) not in _PLAIN or v != old):
                changed = True
                break
        if changed:
            if call.out is None and (budget is not KEEP or token_offset is not KEEP or num_tokens_padded is not KEEP):
                raise TypeError("choose_budget's prepared call takes no budget, token_offset or num_tokens_padded")
            if type(values[0]) is _LazyShift and new[0] is KEEP:  # (a new table replaces it unbuilt)
                values = (values[0].view(),) + values[1:]
            values = tuple(old if v is KEEP else v for old, v in zip(values, new))
            step = step_key(*values)
        elif type(values[0]) is _LazyShift:  # after run_shifted: that view, built now
            values = (values[0].view(),) + values[1:]
            step = step_key(*values)
        if call.step is not step and call.step != step:
            # (restep validates first and changes nothing when it raises: the last good run's values stay)
            if not call.restep(step, values[0]):
                raise ValueError(f"{self.op}: num_tokens_padded = {call.a.num_tokens_padded} exceeds the {call.room} "
                                 "token entries of the prepared out; prepare it with larger buffers")
        self._values, self._step = values, step
        call.run()
        return call.result

    def run_shifted(self, base: CostTable, shift: int, capacity: int) -> bool:
        """The verifier's lagged budget (a CPU choose_budget, mode "global" or "greedy", with no host budget, no
        extra_tokens, extra_emitting, token_offset or latency target): run on ``base.shifted(shift)`` with this
        capacity without building the shifted view, by rewriting the prepared call's shifted costs in place
        (_Call.reshift, tested equal to the view's). False, launching nothing, when this call cannot (the caller
        then runs it with the view as cost_table). Inputs are not rebound here: the caller's are its own buffers."""
        call = self.call
        if call.step == ("reshift", shift, capacity):  # the last run's chunk again: nothing to re-derive
            call.run()
            return True
        if not call.reshift(base, shift, capacity):
            return False
        self._values = (_LazyShift(base, shift), capacity) + self._values[2:]
        self._step = call.step
        call.run()
        return True


class _LazyShift:
    """The cost table of a run_shifted step, ``base.shifted(shift)``, built only if a later run needs it."""

    __slots__ = ("base", "shift")

    def __init__(self, base: CostTable, shift: int):
        self.base, self.shift = base, shift

    def view(self) -> CostTable:
        return self.base.shifted(self.shift)
