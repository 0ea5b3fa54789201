"""The chain side of AdaptiveVerifier (verifier.py): what a step of drafted chains records, plans and observes,
beside the tree side (verifier_tree.py). Each side owns its state and is told what it needs; the verifier keeps
what both share (plan buffer sets, budget bounds and padded sizes, the statistics and metrics).

Per step, for a chain step (conf [R, K'] per draft position):

- ``record``: the confidences go into the verifier's slot table (verifier_slots.SlotTable), for later budgets;
- ``plan``: plan_verification(conf=) prepared on the step's buffer set, one call per shape of the caller's inputs
  (the confidences' width, which optional inputs are given, live or fixed mode), run with the caller's tensors
  rebound and the step's scalars; its survival buffer is this side's, one view per (R, K');
- ``observe``: AcceptanceStats.update prepared per conf shape, run with the step's outcomes;
- ``depth_rates``: for the draft depth (AdaptiveVerifier.plan_draft), the per-position acceptance the statistics
  hold, what the positions the last step did not draft are estimated with.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import planner
from .prepared import PreparedMismatch, prepare
from .stats import AcceptanceStats
from .verifier_buffers import BufferSet
from .verifier_slots import SlotTable, check_conf, int32_inputs

__all__ = ["ChainSteps"]

#: Pseudo-trials of depth_rates' shrinkage of each position's acceptance towards the position before it.
DEPTH_PRIOR_TRIALS = 16.0

#: depth_rates' decay of its per-position counts per call (per step): a memory of about 1 / (1 - decay) = 33 steps, so
#: the estimate follows acceptance as it drifts.
DEPTH_DECAY = 0.97

#: depth_inputs' weight of a request's last recorded confidence against the statistics' acceptance at its position.
DEPTH_CONF_WEIGHT = 0.3

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
        # The draft depth (plan_draft): the columns the last record held (K before any: every position has its
        # confidences or the prior), and the per-depth acceptance counts [2, K] (trials, survivals) as the host last
        # saw them: read directly on the CPU; on CUDA copied after each observe into pinned memory, whose copy
        # plan_draft takes once its event is done (never waiting: a step late at worst).
        self.last_width = max_drafts
        self.depth_counts = np.zeros((2, max_drafts), dtype=np.int64)
        self._counts_seen = np.zeros((2, max_drafts), dtype=np.int64)  # depth_counts at the last depth_rates
        self._decayed = np.zeros((2, max_drafts), dtype=np.float64)  # decayed (trials, survivals) per position
        self.track_depths = False  # set by the first plan_draft: until then observe copies nothing
        pin = device.type == "cuda"
        self._counts_pinned = torch.zeros(2, max_drafts, dtype=torch.int64, pin_memory=pin)
        self._counts_event = torch.cuda.Event() if pin else None
        self._counts_pending = False

    def record(self, conf: torch.Tensor, req_indices) -> None:
        """record_confidence of a chain step: conf [R, K'] (K' <= K) into the slot table."""
        R, Kc = check_conf(conf, "K", "max_drafts", self.K, self.max_reqs, self.device)
        self.slots.record(conf, req_indices, R, Kc)
        self.last_conf = conf
        self.last_width = Kc

    def lagged_depth(self, R: int, extra_tokens: int, weights: Optional[np.ndarray], cost_table, capacity: int,
                     min_verify: int, max_step_ms: Optional[float], prior: float) -> tuple[int, int]:
        """plan_draft's (depth, budget): choose_draft_depth on the rows the slot table gathered for this step of R
        requests (slots.inputs(gather=True)), predicted by depth_inputs, priced at this step as the lagged budget is
        (prompt tokens on the shifted table within the capacity they leave). ``capacity``: the verifier's. A block
        drafter (the table's draft_levels None) drafts K whenever the decision drafts at all."""
        conf, drafts, conf_np, _ = self.slots.lag_inputs(R)
        self.depth_inputs(conf_np, prior)
        table = cost_table.shifted(extra_tokens) if extra_tokens else cost_table
        w = None if weights is None else torch.from_numpy(weights)
        depth, budget = planner.choose_draft_depth(None, drafts, table, conf=conf, min_verify=min_verify,
                                                   capacity=capacity - extra_tokens, weights=w,
                                                   max_step_ms=max_step_ms)
        depth = int(depth)
        if cost_table.draft_levels is None and depth:  # a block drafter: every level comes with the first, and more
            depth = self.K  # positions give the live allocation more to choose from (the decision is 0 or not)
        return depth, int(budget)

    def depth_inputs(self, conf: np.ndarray, prior: float) -> None:
        """plan_draft's prediction of this step's conditional confidences, written over ``conf`` ([R, K] float32, the
        stale rows gathered for the step): DEPTH_CONF_WEIGHT of each request's last recorded confidence plus the rest
        of the statistics' acceptance at that position (depth_rates), and the statistics' alone past the columns the
        last step recorded. Why a blend: a draft's confidence carries that step's token noise, which the next step
        does not share, so the last step alone over-reacts, while the statistics alone lose what tells requests apart
        (the simulator on llama3-70b-8xh200, lagged against the best fixed k, one seed, 2026-12-03: at c=1 -3.0%
        with the stale rows alone, -1.2% at weight 0.5, -0.7% with the statistics alone; at c=128 +1.5%, +5.5% and
        -0.1%; three seeds at c=8 / 16: -0.6% / -0.9% at weight 0.5, -0.3% / -0.6% at 0.3)."""
        rates = self.depth_rates(prior)
        width = self.last_width
        conf *= DEPTH_CONF_WEIGHT
        conf += (1.0 - DEPTH_CONF_WEIGHT) * rates
        if width < self.K:
            conf[:, width:] = rates[width:]

    def depth_rates(self, prior: float) -> np.ndarray:
        """[K] float32 conditional acceptance per position from the statistics, for the positions the last step did not
        draft: (survivals + A m) / (trials + A) over counts decayed by DEPTH_DECAY per call, m the estimate of the position before (the prior for position 0),
        A = DEPTH_PRIOR_TRIALS pseudo-trials. Without the shrinkage one early rejection at a deep position (a rate of
        0) would stop that level from being drafted, and so from being measured, for good; with it a position with
        few trials sits near the one before it (acceptance falls with depth: this errs towards drafting, which is
        how the estimate gets its trials). Host-known: no device sync (the counts' copy, __init__)."""
        K = self.K
        if self.device.type == "cpu":
            self.depth_counts[0] = self.stats.trials[:K].sum(1).numpy()
            self.depth_counts[1] = self.stats.survivals[:K].sum(1).numpy()
        elif self._counts_pending and self._counts_event.query():
            self.depth_counts[:] = self._counts_pinned.numpy()
            self._counts_pending = False
        # What was counted since the last call, added to counts that decay by DEPTH_DECAY per call (the statistics
        # themselves never forget, and acceptance drifts); a count that went down (stats.reset()) restarts.
        new = self.depth_counts - self._counts_seen
        if (new < 0).any():
            new = self.depth_counts.copy()
        self._counts_seen[:] = self.depth_counts
        self._decayed *= DEPTH_DECAY
        self._decayed += new
        rates = np.empty(K, dtype=np.float32)
        mean = prior
        for j in range(K):  # shrunk towards the position before it by DEPTH_PRIOR_TRIALS pseudo-trials
            n, s = float(self._decayed[0, j]), float(self._decayed[1, j])
            mean = min(max((s + DEPTH_PRIOR_TRIALS * mean) / (n + DEPTH_PRIOR_TRIALS), 0.0), 1.0)
            rates[j] = mean
        return rates

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
        if self.track_depths and self.device.type == "cuda" and not self._counts_pending:
            K = self.K
            self._counts_pinned.copy_(torch.stack([self.stats.trials[:K].sum(1), self.stats.survivals[:K].sum(1)]),
                                      non_blocking=True)
            self._counts_event.record(torch.cuda.current_stream(self.device))
            self._counts_pending = True
        return R
