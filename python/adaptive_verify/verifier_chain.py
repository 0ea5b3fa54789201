"""The chain side of AdaptiveVerifier (verifier.py): what a step of drafted chains records, plans and observes,
beside the tree side (verifier_tree.py). Each side owns its state and is told what it needs; the verifier keeps
what both share (plan buffer sets, budget bounds and padded sizes, the statistics and metrics).

Per step, for a chain step (conf [R, K'] per draft position):

- ``record``: the confidences go into the verifier's slot table (verifier_slots.SlotTable), for later budgets;
- ``plan``: plan_verification(conf=) prepared on the step's buffer set, one call per shape of the caller's inputs
  (the confidences' width, which optional inputs are given, live or fixed mode), run with the caller's tensors
  rebound and the step's scalars; its survival buffer is this side's, one view per (R, K');
- ``observe``: AcceptanceStats.update prepared per conf shape, run with the step's outcomes.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import planner
from .prepared import PreparedMismatch, prepare
from .stats import AcceptanceStats
from .verifier_buffers import BufferSet
from .verifier_slots import SlotTable, check_conf, int32_inputs

__all__ = ["ChainSteps"]

#: observe()'s prepared statistics updates kept, one per conf shape (R and the width wander: the oldest goes).
STATS_CALLS = 64


class ChainSteps:
    """The chain side of one AdaptiveVerifier: the survival buffers its plans write, the last recorded confidences
    and observe's prepared statistics updates. ``slots``: the verifier's slot table; ``stats``: its statistics."""

    def __init__(self, *, max_reqs: int, max_drafts: int, device: torch.device, slots: SlotTable,
                 stats: AcceptanceStats):
        self.max_reqs, self.K, self.device, self.slots, self.stats = max_reqs, max_drafts, device, slots, stats
        self.survival_flat = torch.empty(max_reqs * max_drafts, dtype=torch.float32, device=device)
        self.survival_views: dict[tuple, torch.Tensor] = {}
        self.stats_calls: dict = {}
        self.last_conf: Optional[torch.Tensor] = None

    def record(self, conf: torch.Tensor, req_indices) -> None:
        """record_confidence of a chain step: conf [R, K'] (K' <= K) into the slot table."""
        R, Kc = check_conf(conf, "K", "max_drafts", self.K, self.max_reqs, self.device)
        self.slots.record(conf, req_indices, R, Kc)
        self.last_conf = conf

    def survival_buffer(self, R: int, Kc: int) -> torch.Tensor:
        view = self.survival_views.get((R, Kc))
        if view is None:
            view = self.survival_views[(R, Kc)] = self.survival_flat[:R * Kc].view(R, Kc)
        return view

    def plan(self, bufs: BufferSet, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, weights,
             budget, table, capacity: int, padded: int, token_offset: int, max_step_ms, settings: tuple):
        """plan(): plan_verification(conf=) into ``bufs``, as the prepared call kept there for this shape of inputs,
        in ``settings`` = (mode, min_verify, block_size, verification), the verifier's: mode "greedy" and "global"
        live, else "fixed" with ``budget`` (a 0-d tensor). Returns the plan, T_pad = ``padded`` tokens (the caller
        cuts a shared eager buffer's views to the step's own size). Positional: it runs every step."""
        mode, min_verify, block_size, verification = settings
        live = mode in ("greedy", "global")
        key = (conf.shape[1], draft_tokens is not None, weights is not None, live)
        call = bufs.calls.get(key)
        if call is not None:
            try:
                return self._run(call, live, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens,
                                 weights, budget, table, capacity, padded, token_offset, max_step_ms)
            except PreparedMismatch:  # another layout than the prepared one, or int64 where it holds int32
                pass
        # int64 inputs as the int32 copies the free planner would make (once per step: the prepared call holds int32)
        drafts, context_lens, block_table, anchor_tokens, draft_tokens, budget = int32_inputs(
            drafts, context_lens, block_table, anchor_tokens, draft_tokens, budget)
        if call is not None:
            try:
                return self._run(call, live, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens,
                                 weights, budget, table, capacity, padded, token_offset, max_step_ms)
            except PreparedMismatch:  # another layout: prepare again below
                pass
        kw = dict(mode=mode if live else "fixed", budget=None if live else budget, min_verify=min_verify,
                  capacity=capacity, context_lens=context_lens, block_table=block_table,
                  block_size=block_size if block_table is not None else None, anchor_tokens=anchor_tokens,
                  draft_tokens=draft_tokens, token_offset=token_offset, num_tokens_padded=padded, conf=conf,
                  survival_out=self.survival_buffer(conf.shape[0], conf.shape[1]), weights=weights,
                  max_step_ms=max_step_ms, verification=verification if live else None, out=bufs.out)
        # (its buffers are the verifier's and this side's own: own_outputs)
        call = bufs.calls[key] = prepare(planner.plan_verification, None, drafts, table, **kw).own_outputs()
        return call.run()

    @staticmethod
    def _run(call, live, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, weights, budget, table,
             capacity, padded, token_offset, max_step_ms):
        # (planner.prepared.INPUTS order: survival, conf, drafts, context_lens, block_table, anchor_tokens,
        # draft_tokens, weights, parents, budget)
        return call.run_owned((None, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, weights,
                               None, None if live else budget), table, capacity, token_offset, max_step_ms, padded)

    def observe(self, verify_lens: torch.Tensor, num_accepted: torch.Tensor) -> int:
        """observe() of a chain step: verify_lens and num_accepted ([>= R] int32 or int64 on the device) counted into
        the statistics against the recorded conf's R rows (the stats kernel also adds the step's verified and
        accepted drafts to stats.totals). Returns R."""
        conf = self.last_conf
        R = conf.shape[0]
        for name, t in (("verify_lens", verify_lens), ("num_accepted", num_accepted)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be an int32 tensor [R], got {type(t).__name__}")
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")
            if t.dim() != 1 or t.shape[0] < R:
                raise ValueError(f"{name} must have shape [R] with R >= {R} (the recorded conf's rows), "
                                 f"got {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} must be on the verifier's device {self.device}, got {t.device}")
        # The caller's own tensors when they hold exactly R int32 rows (else an [R] int32 slice or copy).
        v = verify_lens if verify_lens.shape[0] == R else verify_lens[:R]
        a = num_accepted if num_accepted.shape[0] == R else num_accepted[:R]
        if v.dtype != torch.int32:  # (a no-op .to() still costs microseconds)
            v = v.to(torch.int32)
        if a.dtype != torch.int32:
            a = a.to(torch.int32)
        call = self.stats_calls.get(conf.shape)
        try:
            if call is not None:
                call.run_owned((conf, v, a, None))  # (AcceptanceStats.update's inputs, in order)
        except PreparedMismatch:  # a caller tensor of another layout than the prepared one: prepare again
            call = None
        if call is None:
            if len(self.stats_calls) >= STATS_CALLS:
                self.stats_calls.pop(next(iter(self.stats_calls)))
            call = self.stats_calls[conf.shape] = prepare(self.stats.update, conf, v, a)
            call.run()
        return R
