"""The persistent request-slot table behind AdaptiveVerifier's lagged budget (docs/design.md, "What engines rely on
every step").

Engines reorder, add and drop requests between steps, so what the lagged budget ranks (each request's confidences
of its last recorded step) lives in a table of ``max_reqs`` slots indexed by the engine's request index
(``req_indices``, vLLM's ``idx_mapping``), not by the previous step's row:

- ``table`` [max_reqs, width] float32 on the verifier's device, written by ``record`` in stream order, and copied
  whole into one of two pinned host snapshots each step (asynchronously on CUDA; the copy started in step t is done
  long before step t + 1 asks for its budget, so nothing waits);
- ``gen[i]`` counts the requests that took slot i (``add``); a snapshot remembers the generations it saw, so a slot
  re-used after the copy was enqueued reads as new (the prior) rather than as its previous request's confidences;
- ``inputs`` is plan_budget's one extension call (_C.slot_inputs): it checks the step's drafts and slots, sums them,
  and gathers the stale rows into persistent host buffers that the lagged budget's prepared planner call reads.

The chain verifier keeps one table of width K; the tree side (verifier_tree.py) keeps its own sorted node survivals
and uses this table's generations, staging and snapshot helpers.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
import torch

from ._binding import SlotParams
from ._checks import INT32_MAX, check_int
from ._ext import _C
from .planner.args import as_int32
from .planner.lagged import prepare_lagged_budget

#: The lagged budget's prepared calls kept per SlotTable, one per (R, weighted): R wanders as requests join and leave.
BUDGET_CALLS = 64

__all__ = ["SlotTable", "check_conf", "host_floats", "host_ints", "host_step"]

SLOT_DRAFTS_OUT_OF_RANGE, SLOT_INDEX_OUT_OF_RANGE, SLOT_INDEX_REPEATED = _C.SLOT_STATUS


def _host_array(name: str, values, what: str) -> np.ndarray:
    """``values`` (a list, numpy array or CPU tensor) as a numpy array; a CUDA tensor would need a sync, and something
    numpy cannot read is a TypeError: both name the argument (``what``: "ints" or "floats", for the message)."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} must be on the host (a list, numpy array or CPU tensor), got {values.device}")
        values = values.numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a sequence of {what}, got {type(values).__name__}") from e


def _check_entries(name: str, arr: np.ndarray, n: Optional[int]) -> None:
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} must have num_reqs = {n} entries, got {arr.shape[0]}")


def host_ints(name: str, values, n: Optional[int]) -> np.ndarray:
    """[n] int64 numpy array from a list, numpy array or CPU tensor (a CUDA tensor would need a sync)."""
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1 and values.flags.c_contiguous:
        if n is not None and values.shape[0] != n:  # the per-step case: no copy, no call
            _check_entries(name, values, n)
        return values
    if isinstance(values, torch.Tensor) and (values.is_floating_point() or values.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got {values.dtype}")
    arr = _host_array(name, values, "ints")
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr.astype(np.int64, copy=False).reshape(-1))  # _C.slot_inputs reads it raw
    _check_entries(name, arr, n)
    return arr


def host_floats(name: str, values, n: int) -> np.ndarray:
    """[n] float32 numpy array from a list, numpy array or CPU tensor of real numbers (values are the kernel's)."""
    arr = _host_array(name, values, "floats")
    if arr.dtype == object or arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.floating) or
                                                            np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr.astype(np.float32, copy=False).reshape(-1))
    _check_entries(name, arr, n)
    # Checked here, whatever the mode (the live modes never hand host weights to a kernel that would name them).
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {arr[~np.isfinite(arr) | (arr < 0)][:4].tolist()}...")
    return arr


def host_step(num_reqs, drafts_host, extra_tokens, weights, req_indices, max_reqs: int, capacity: int,
              default_drafts: Optional[int] = None) -> tuple:
    """AdaptiveVerifier.plan_budget's and plan_draft's host arguments checked: (R, extra_tokens, drafts [R] int64,
    weights [R] float32 or None, req_indices [R] int64 or None). drafts_host None: default_drafts each where given
    (plan_draft), else an error. The slot table's inputs() checks the drafts' values and the slots."""
    R = check_int("num_reqs", num_reqs, lo=0)
    if R > max_reqs:
        raise ValueError(f"num_reqs {R} exceeds max_reqs {max_reqs}")
    extra_tokens = check_int("extra_tokens", extra_tokens, lo=0, hi=INT32_MAX)
    if drafts_host is None and default_drafts is not None:
        drafts = np.full(R, default_drafts, dtype=np.int64)
    else:
        drafts = host_ints("drafts_host", drafts_host, R)
    if weights is not None:
        weights = host_floats("weights", weights, R)
    if R + extra_tokens > capacity:
        raise ValueError(f"num_reqs + extra_tokens = {R + extra_tokens} exceeds the capacity {capacity}")
    return R, extra_tokens, drafts, weights, None if req_indices is None else host_ints("req_indices", req_indices, R)


def int32_inputs(*tensors) -> tuple:
    """The planner's integer inputs as the kernel reads them (planner.args.as_int32: an int64 tensor becomes the
    int32 copy the free planner would make). The verifier's prepared calls are bound to int32 inputs (prepare refuses
    a per-call conversion), so it converts here, once per step."""
    return tuple(map(as_int32, tensors))


def check_conf(conf, columns: str, limit_name: str, limit: int, max_reqs: int, device: torch.device) -> tuple[int, int]:
    """(R, columns) of record_confidence's conf: float32 [R, <= limit] on the verifier's device, R <= max_reqs."""
    if not isinstance(conf, torch.Tensor):
        raise TypeError(f"conf must be a float32 tensor [R, {columns}], got {type(conf).__name__}")
    if conf.dim() != 2 or conf.dtype != torch.float32:
        raise ValueError(f"conf must be a float32 tensor [R, {columns}], got {conf.dtype} {tuple(conf.shape)}")
    if conf.layout is not torch.strided:  # (the CPU scatter reads it through its strides)
        raise TypeError(f"conf must be a dense (strided) tensor, got layout {conf.layout}")
    if conf.device != device:
        raise ValueError(f"conf must be on the verifier's device {device}, got {conf.device}")
    R, n = conf.shape
    if R > max_reqs or n > limit:
        raise ValueError(f"conf shape {tuple(conf.shape)} exceeds [max_reqs, {limit_name}] = "
                         f"[{max_reqs}, {limit}]")
    return R, n


class SlotTable:
    """Per-slot stale confidences for the lagged budget (module docstring).

    max_reqs slots of ``width`` confidences each (K), ``prior`` for a slot with no history, ``min_verify`` for the
    forced-draft sum, on ``device``."""

    def __init__(self, max_reqs: int, width: int, prior: float, min_verify: int, device: torch.device):
        self.max_reqs, self.width, self.prior, self.device = max_reqs, width, prior, device
        K = width
        pin = device.type == "cuda"
        self.table = torch.full((max_reqs, K), prior, dtype=torch.float32, device=device)  # [max_reqs, K]
        self._table_ptr = self.table.data_ptr()  # record's CPU scatter writes here (_C.record_rows)
        self._snap = torch.full((2, max_reqs, K), prior, dtype=torch.float32, pin_memory=pin)  # [2, max_reqs, K]
        self._snap_ptrs = [self._snap[0].data_ptr(), self._snap[1].data_ptr()]
        self._stamp = 0  # _C.slot_inputs' last stamp
        self.gen = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs] requests that took each slot
        self._snap_gen = [self.gen.copy(), self.gen.copy()]
        self.adds = 0  # add() calls so far: a snapshot taken at the same count has no new slot
        self._snap_adds = [0, 0]
        self._events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self._idx_pinned = torch.zeros(2, max_reqs, dtype=torch.int64, pin_memory=pin)
        self._slot = 0  # the snapshot slot the next record writes
        self._recorded = False
        self.pending_idx: Optional[np.ndarray] = None  # req_indices of the step being planned
        self.arange = np.arange(max_reqs, dtype=np.int64)
        # The lagged budget's host inputs, persistent so that its planner call sees the same tensors each step (a
        # prepared call: microseconds of host time): [R, K] stale confidences, [R] drafts and weights per R.
        self._lag_conf = torch.empty(max_reqs * K, dtype=torch.float32)
        self._lag_drafts = torch.empty(max_reqs, dtype=torch.int32)
        self._lag_weights = torch.empty(max_reqs, dtype=torch.float32)
        self._lag_budget = torch.empty((), dtype=torch.int32)
        self._lag_budget_np = self._lag_budget.numpy()  # read back without a torch call
        self._lag_ptrs = (self._lag_conf.data_ptr(), self._lag_drafts.data_ptr())
        self._lag_views: dict[int, tuple] = {}
        # (R, weighted) -> the lagged budget's PreparedPlan on the views below, BUDGET_CALLS of them at most
        self._budget_calls: dict = {}
        # inputs()'s checks, draft sums and stale-row gather: one extension call (_C.slot_inputs; numpy would take a
        # call per check). Its persistent fields are set once; marks is its scratch for distinct slots.
        self._marks = np.zeros(max_reqs, dtype=np.uint32)
        self._sums = np.zeros(2, dtype=np.int64)
        self.zeros = np.zeros(max_reqs, dtype=np.int64)  # drafts of a check of req_indices alone
        sp = self._params = SlotParams()
        sp.max_reqs, sp.max_drafts, sp.min_verify, sp.prior = max_reqs, K, min_verify, prior
        sp.gen, sp.marks, sp.sums = self.gen.ctypes.data, self._marks.ctypes.data, self._sums.ctypes.data
        self._addr = ctypes.addressof(sp)

    def inputs(self, drafts: np.ndarray, idx: Optional[np.ndarray], R: int, limit: int, limit_name: str,
               gather: bool) -> tuple[int, int]:
        """_C.slot_inputs on this step's host arrays: checks drafts (values in [0, limit], named limit_name) and idx
        (slots in [0, max_reqs), distinct; None: the row numbers), and with ``gather`` writes the lagged budget's
        inputs (each slot's last recorded confidences, the prior for a slot with no history, and the drafts as
        int32) into its persistent buffers. Returns (sum of drafts, sum of min(drafts, min_verify))."""
        sp = self._params
        sp.num_reqs, sp.draft_limit = R, limit
        self._stamp = stamp = self._stamp + 1 if self._stamp < 0xFFFFFFFF else 1
        if stamp == 1:
            self._marks.fill(0)  # a fresh stamp cycle: no slot looks seen
        sp.stamp = stamp
        if gather:
            sp.conf_out, sp.drafts_out = self._lag_ptrs
            if self._recorded:
                prev = 1 - self._slot  # the snapshot the last record wrote
                if self._events[prev] is not None:
                    self._events[prev].synchronize()  # long done in a running engine
                sp.snapshot = self._snap_ptrs[prev]
                # A slot took a new request since that snapshot: compare generations (else no slot can differ).
                sp.snapshot_gen = self._snap_gen[prev].ctypes.data if self._snap_adds[prev] != self.adds else None
            else:
                sp.snapshot = sp.snapshot_gen = None
        else:
            sp.conf_out = sp.drafts_out = None
        status = _C.slot_inputs(self._addr, drafts, idx)
        if status:
            if status == SLOT_DRAFTS_OUT_OF_RANGE:
                what = " (tree sizes)" if limit_name == "max_nodes" else ""
                raise ValueError(f"drafts_host{what} values must be in [0, {limit_name} = {limit}]")
            if status == SLOT_INDEX_OUT_OF_RANGE:
                raise ValueError(f"req_indices must lie in [0, max_reqs = {self.max_reqs}), got "
                                 f"{idx.min()}..{idx.max()}")
            if status == SLOT_INDEX_REPEATED:
                raise ValueError("req_indices must be distinct (one persistent slot per request)")
            raise RuntimeError(f"adaptive_verify._C.slot_inputs returned status {status}")
        return int(self._sums[0]), int(self._sums[1])

    def indices(self, req_indices, R: int) -> np.ndarray:
        """[R] int64 slots from the caller's req_indices (None: the row numbers), checked in range and distinct."""
        if req_indices is None:
            return self.arange[:R]
        idx = host_ints("req_indices", req_indices, R)
        self.inputs(self.zeros[:R], idx, R, 0, "max_drafts", False)
        return idx

    def add(self, req_indices) -> np.ndarray:
        """Slots ``req_indices`` (an int or ints) hold new requests: their rows go back to the prior and their
        generation moves on. Returns them as int64."""
        idx = host_ints("req_indices", [req_indices] if isinstance(req_indices, int) else req_indices, None)
        if idx.size and (idx.min() < 0 or idx.max() >= self.max_reqs):
            raise ValueError(f"req_indices must lie in [0, max_reqs = {self.max_reqs}), got {idx.tolist()}")
        self.gen[idx] += 1
        self.adds += 1
        self.table[torch.from_numpy(idx).to(self.device)] = self.prior
        return idx

    def stale(self, req_indices) -> np.ndarray:
        """[R, width] float32 copy of what the lagged budget ranks for slots ``req_indices`` (host ints)."""
        idx = host_ints("req_indices", req_indices, None)
        R = idx.shape[0]
        if R > self.max_reqs:
            raise ValueError(f"req_indices has {R} entries, more than max_reqs = {self.max_reqs}")
        self.inputs(self.zeros[:R], idx, R, 0, "max_drafts", True)  # the lagged budget's own gather
        return self.lag_inputs(R)[2].copy()

    def lag_inputs(self, R: int) -> tuple:
        """([R, K] stale confidences, [R] drafts): views of the lagged budget's persistent inputs, with numpy twins."""
        views = self._lag_views.get(R)
        if views is None:
            K = self.width
            conf, drafts = self._lag_conf[:R * K].view(R, K), self._lag_drafts[:R]
            views = self._lag_views[R] = (conf, drafts, conf.numpy(), drafts.numpy())
        return views

    def lagged_budget(self, R: int, extra_tokens: int, weights: Optional[np.ndarray], cost_table, capacity: int,
                      min_verify: int, max_step_ms: Optional[float]) -> int:
        """planner.lagged_budget ("marginal" prompt pricing) over the rows ``inputs(gather=True)`` gathered for this
        step of R requests, weighted by ``weights`` ([R] float32 host array) when given. ``capacity``: the
        verifier's, before the prompt chunk."""
        cap = capacity - extra_tokens
        # Every tensor of this call is the table's own (views of its persistent inputs, one set per R): one prepared
        # choose_budget per (R, weighted), run with the step's table and capacity. A new prompt chunk moves the call
        # onto its shifted costs in place (run_shifted: no CostTable view, no resolve_step) once the call reads
        # shifted costs at all; anything else takes the view. run_shifted only serves calls without a latency target,
        # which says nothing of one, so a target (settable between steps) always takes run().
        key = (R, weights is not None)  # (the weights' view is one more input: a call of its own)
        if weights is not None:
            self._lag_weights.numpy()[:R] = weights  # (host_floats checked them: finite, >= 0)
        call = self._budget_calls.get(key)
        if call is None:
            if len(self._budget_calls) >= BUDGET_CALLS:  # the oldest R goes (requests join and leave: R wanders)
                self._budget_calls.pop(next(iter(self._budget_calls)))
            conf, d = self.lag_inputs(R)[:2]
            call = self._budget_calls[key] = prepare_lagged_budget(
                conf, d, cost_table, prompt_tokens=extra_tokens, prompt_pricing="marginal", capacity=capacity,
                min_verify=min_verify, max_step_ms=max_step_ms,
                weights=self._lag_weights[:R] if weights is not None else None,
                out=self._lag_budget).own_outputs(inputs=True)  # (every tensor of it is this table's own)
        if not (extra_tokens and max_step_ms is None and call.run_shifted(cost_table, extra_tokens, cap)):
            table = cost_table.shifted(extra_tokens) if extra_tokens else cost_table
            call.run_owned(None, table, cap, 0, max_step_ms, None)
        return int(self._lag_budget_np)

    def record(self, conf: torch.Tensor, req_indices, R: int, Kc: int) -> None:
        """Writes conf [R, Kc] (Kc <= width, checked by the caller) into the slots' rows (zeros past Kc) and starts
        the table's copy into this step's snapshot."""
        slot = self._slot
        if self.device.type == "cpu":
            # CPU tables: one extension call scatters the rows and copies the table into this step's snapshot (a numpy
            # scatter and a torch copy cost tens of microseconds per step; torch's index_put several times that).
            idx = self.host_slots(req_indices, R)
            status = _C.record_rows(self._table_ptr, self._snap_ptrs[slot], self.max_reqs, self.width, idx,
                                    conf.data_ptr(), *conf.stride(), Kc)
            if status:  # idx was checked (host_slots); this is a bug, not an input error
                raise RuntimeError(f"adaptive_verify._C.record_rows returned status {status}")
        else:
            idx_dev = self.slot_indices(req_indices, R, self._idx_pinned[slot], self._events[slot])
            if R:
                self.table[idx_dev, :Kc] = conf
                if Kc < self.width:
                    self.table[idx_dev, Kc:] = 0.0
            self.snapshot(self.table, self._snap[slot], self._events[slot])
        if self._snap_adds[slot] != self.adds:
            self._snap_gen[slot] = self.gen.copy()
            self._snap_adds[slot] = self.adds
        self._slot = 1 - slot
        self._recorded = True

    def snapshot(self, table: torch.Tensor, snap: torch.Tensor, event) -> None:
        """Copies a device slot table into its pinned host snapshot: asynchronously on CUDA, ``event`` marking the
        copy (the snapshot is read by nobody now: its previous copy was waited for by plan_budget)."""
        if event is not None:
            snap.copy_(table, non_blocking=True)
            event.record(torch.cuda.current_stream(self.device))
        else:
            snap.copy_(table)

    def slot_indices(self, req_indices, R: int, staging: torch.Tensor, event) -> torch.Tensor:
        """[R] int64 on the device: the persistent slots of record's rows. req_indices: host ints (checked, staged
        through ``staging``, a pinned [max_reqs] buffer whose previous copy ``event`` marks), an int32/int64 CUDA
        tensor (used as it is: generations are then the engine's business, through add), or None (plan_budget's of
        this step when it had R requests, else the row numbers)."""
        if isinstance(req_indices, torch.Tensor) and req_indices.device == self.device and req_indices.dim() == 1 \
                and self.device.type == "cuda":
            if req_indices.shape[0] != R or req_indices.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"req_indices must be an int32/int64 tensor of shape [{R}]")
            return req_indices.long()
        host_idx = self.host_slots(req_indices, R)
        if event is not None:
            event.synchronize()  # this staging slot's copy of two steps ago is done
        staged = staging[:R]
        staged.numpy()[:] = host_idx
        return staged.to(self.device, non_blocking=True) if self.device.type == "cuda" else staged

    def host_slots(self, req_indices, R: int) -> np.ndarray:
        """[R] int64 host slots of record's rows: req_indices (host ints, checked), or with None plan_budget's of
        this step when it had R requests, else the row numbers."""
        if req_indices is None:
            return self.pending_idx if self.pending_idx is not None and len(self.pending_idx) == R else \
                self.arange[:R]
        return self.indices(req_indices, R)
