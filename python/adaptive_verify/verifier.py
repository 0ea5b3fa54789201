"""AdaptiveVerifier: the per-step orchestration an engine calls, with persistent buffers.

One decode step of an engine, in order::

    budget, padded = verifier.plan_budget(num_reqs, drafts_host, extra_tokens)   # host, no sync
    ... draft, compute conf [R, K] on the device ...
    verifier.record_confidence(conf)                     # async copy for the NEXT step's budget
    plan = verifier.plan(conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, budget)
    ... target forward on plan's varlen batch (padded to `padded` tokens), rejection_sample ...
    verifier.observe(plan.verify_lens, num_accepted)
    verifier.metrics()                                   # whenever wanted (one small sync)

Why the budget comes from the previous step (mode "lagged", the default): the budget decides the padded
token count and so which CUDA graph the engine replays; the host must know it before the step's drafts
exist, and a budget that does not look at the current drafts keeps verification lossless (design.md,
section 4). The previous step's confidences reach the host through pinned, double-buffered memory: the copy
started in step t is complete long before step t + 1 asks for its budget, so nothing waits.

Decisions:
- The lagged budget is the global argmax of Theta on the previous step's survivals, priced with
  ``cost_table.shifted(extra_tokens)`` of the *current* step (only the survivals must come from the past;
  the cost curve is known now; ``CostTable.shifted`` explains why prompt tokens shift the curve instead of
  entering Theta), then clamped to this step's [B_min, B_max].
- Cold start (no snapshot yet), or a previous step with more requests than this step's capacity allows:
  verify everything that fits (B = B_max), the fixed-k behaviour.
- "greedy" decides the budget on the device from the live survivals; the host only knows B <= B_max, so
  ``plan_budget`` returns B_max and the padded size for it.
- Padded tokens: the smallest graph size >= R + extra_tokens + B; above the largest, exactly that count
  (an eager step). Graph sizes default to the cost table's.
"""
from __future__ import annotations

import bisect
from collections import Counter
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import planner
from .calibration import OnlineSTS
from .cost import CostTable
from .planner import VerifyPlan
from .stats import AcceptanceStats

__all__ = ["AdaptiveVerifier", "MODES"]

MODES = ("lagged", "greedy", "all", "off")


def _check_int(name: str, value, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class AdaptiveVerifier:
    """Budget, allocation, metadata and statistics of adaptive verification, step after step.

    Args:
        cost_table: the step cost model (its max_tokens, if any, is the token capacity per step).
        max_reqs: most requests in one step. max_drafts: K, drafts per request at most.
        block_size: the paged KV cache's block size (slot_mapping).
        mode: "lagged" (default, lossless), "greedy" (lossless, live budget on the device), "all"
            (verify every draft: fixed k), "off" (verify none: no speculation).
        graph_sizes: the engine's CUDA-graph token sizes (default: the cost table's).
        min_verify: drafts every request verifies at least.
        device: where plans, statistics and temperatures live.
        online_calibration: keep an :class:`OnlineSTS`; pass ``verifier.temperatures`` to
            :func:`adaptive_verify.confidence` so confidences are calibrated as the drafter drifts.
    """

    def __init__(self, cost_table: CostTable, *, max_reqs: int, max_drafts: int, block_size: int,
                 mode: str = "lagged", graph_sizes: Sequence[int] = (), min_verify: int = 0,
                 device: Union[str, torch.device] = "cpu", online_calibration: bool = False,
                 refresh_every: int = 100):
        if not isinstance(cost_table, CostTable):
            raise TypeError(f"cost_table must be a CostTable, got {type(cost_table).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.cost_table = cost_table
        self.max_reqs = _check_int("max_reqs", max_reqs, minimum=1)
        self.max_drafts = _check_int("max_drafts", max_drafts, minimum=1)
        self.block_size = _check_int("block_size", block_size, minimum=1)
        self.min_verify = _check_int("min_verify", min_verify, minimum=0)
        self.mode = mode
        sizes = tuple(graph_sizes) if graph_sizes else tuple(cost_table.graph_sizes)
        for i, g in enumerate(sizes):
            _check_int(f"graph_sizes[{i}]", g, minimum=1)
            if i and g <= sizes[i - 1]:
                raise ValueError(f"graph_sizes must be strictly increasing, got {list(sizes)}")
        self.graph_sizes = sizes
        self.device = torch.device(device)
        self.capacity = cost_table.max_tokens if cost_table.max_tokens is not None else \
            self.max_reqs * (1 + self.max_drafts)
        # Double-buffered pinned snapshot of the confidences: [2, max_reqs, K] with its row count and the
        # drafts the host planned with in that step; an event per slot (CUDA) says when the copy landed.
        pin = self.device.type == "cuda"
        self._snap = torch.zeros(2, self.max_reqs, self.max_drafts, dtype=torch.float32, pin_memory=pin)
        self._snap_rows = [0, 0]
        self._snap_drafts: list[Optional[np.ndarray]] = [None, None]
        self._snap_events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self._slot = 0  # the slot the next record_confidence writes
        self._have_snapshot = False
        self._pending_drafts: Optional[np.ndarray] = None  # drafts_host of the step being planned
        self._plans: dict[tuple, VerifyPlan] = {}  # (R, padded tokens, metadata wanted) -> persistent outputs
        self._survival: dict[tuple, torch.Tensor] = {}  # conf's shape -> survival buffer
        self._last_conf: Optional[torch.Tensor] = None
        self._last_plan: Optional[VerifyPlan] = None
        self.stats = AcceptanceStats(self.max_drafts, device=self.device)
        self.sts = OnlineSTS(self.max_drafts, refresh_every=refresh_every, device=self.device) \
            if online_calibration else None
        # Device accumulators (graph-safe in-place adds): verified drafts, accepted drafts, expected accepted.
        self._acc = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._steps = 0
        self._budgets: list[int] = []
        self._graph_use: Counter = Counter()

    # ------------------------------------------------------------------------------------------------
    @property
    def last_plan(self) -> Optional[VerifyPlan]:
        """The plan observe() reads expected tokens from: the last plan() call's, or the one set here
        after replaying a CUDA graph that captured a plan() call."""
        return self._last_plan

    @last_plan.setter
    def last_plan(self, plan: VerifyPlan) -> None:
        if not isinstance(plan, VerifyPlan):
            raise TypeError(f"last_plan must be a VerifyPlan, got {type(plan).__name__}")
        self._last_plan = plan

    @property
    def temperatures(self) -> Optional[torch.Tensor]:
        """[K] float32 temperatures of the online calibration (None without it)."""
        return self.sts.temperatures if self.sts is not None else None

    def _bounds(self, drafts_host: np.ndarray, extra_tokens: int) -> tuple[int, int]:
        """(B_min, B_max) of a step with these drafts (capacity and max_drafts respected)."""
        d = np.minimum(drafts_host, self.max_drafts)
        room = max(self.capacity - len(d) - extra_tokens, 0)
        b_max = min(int(d.sum()), room)
        # As the planner: forced drafts (min_verify) never push the step past its capacity.
        return min(int(np.minimum(d, self.min_verify).sum()), b_max), b_max

    def padded_tokens(self, n: int) -> int:
        """The smallest graph size >= n, or n itself above the largest (eager); 0 for 0."""
        if n == 0:
            return 0
        i = bisect.bisect_left(self.graph_sizes, n)
        return self.graph_sizes[i] if i < len(self.graph_sizes) else n

    def plan_budget(self, num_reqs: int, drafts_host, extra_tokens: int = 0) -> tuple[int, int]:
        """(budget, padded_tokens) of this step, on the host with no device synchronisation.

        num_reqs: R. drafts_host: [R] ints (a list, numpy array or CPU tensor), drafts per request this
        step. extra_tokens: prompt tokens sharing the step (chunked prefill).
        """
        R = _check_int("num_reqs", num_reqs, minimum=0)
        if R > self.max_reqs:
            raise ValueError(f"num_reqs {R} exceeds max_reqs {self.max_reqs}")
        extra_tokens = _check_int("extra_tokens", extra_tokens, minimum=0)
        drafts = np.asarray(drafts_host.cpu() if isinstance(drafts_host, torch.Tensor) else drafts_host,
                            dtype=np.int64).reshape(-1)
        if drafts.shape[0] != R:
            raise ValueError(f"drafts_host must have num_reqs = {R} entries, got {drafts.shape[0]}")
        if R and (drafts.min() < 0 or drafts.max() > self.max_drafts):
            raise ValueError(f"drafts_host values must be in [0, max_drafts = {self.max_drafts}]")
        if R + extra_tokens > self.capacity:
            raise ValueError(f"num_reqs + extra_tokens = {R + extra_tokens} exceeds the capacity {self.capacity}")
        self._pending_drafts = drafts
        b_min, b_max = self._bounds(drafts, extra_tokens)
        if self.mode == "off":
            budget = b_min
        elif self.mode in ("all", "greedy") or not self._have_snapshot or R == 0:
            budget = b_max
        else:
            budget = self._lagged_budget(extra_tokens, b_min, b_max)
        padded = self.padded_tokens(R + extra_tokens + budget)
        self._budgets.append(budget)
        self._graph_use[padded] += 1
        return budget, padded

    def _lagged_budget(self, extra_tokens: int, b_min: int, b_max: int) -> int:
        prev = 1 - self._slot  # the slot the last record_confidence wrote
        rows, drafts = self._snap_rows[prev], self._snap_drafts[prev]
        table = self.cost_table.shifted(extra_tokens) if extra_tokens else self.cost_table
        cap = self.capacity - extra_tokens
        if drafts is None or rows == 0 or rows > cap:
            return b_max
        if self._snap_events[prev] is not None:
            self._snap_events[prev].synchronize()  # long done in a running engine: the copy was a step ago
        conf = self._snap[prev, :rows]
        d = torch.from_numpy(np.minimum(drafts, self.max_drafts).astype(np.int32))
        survival = planner.prefix_survival(conf, d)
        b = int(planner.choose_budget(survival, d, table, mode="global", min_verify=self.min_verify, capacity=cap))
        return min(max(b, b_min), b_max)

    def record_confidence(self, conf: torch.Tensor) -> None:
        """Starts the copy of this step's conf [R, K'] (float32, K' <= K) to pinned host memory for the
        next step's budget (asynchronous on CUDA). Call after plan_budget, once per step."""
        if not isinstance(conf, torch.Tensor) or conf.dim() != 2 or conf.dtype != torch.float32:
            raise ValueError("conf must be a float32 tensor [R, K]")
        R, K = conf.shape
        if R > self.max_reqs or K > self.max_drafts:
            raise ValueError(f"conf shape {tuple(conf.shape)} exceeds [max_reqs, max_drafts] = "
                             f"[{self.max_reqs}, {self.max_drafts}]")
        slot = self._slot
        dst = self._snap[slot, :R, :K]
        dst.copy_(conf, non_blocking=conf.is_cuda)
        if K < self.max_drafts:
            self._snap[slot, :R, K:] = 0.0
        if self._snap_events[slot] is not None:
            self._snap_events[slot].record(torch.cuda.current_stream(conf.device))
        self._snap_rows[slot] = R
        self._snap_drafts[slot] = self._pending_drafts if self._pending_drafts is not None and \
            len(self._pending_drafts) == R else np.full(R, K, dtype=np.int64)
        self._slot = 1 - slot
        self._have_snapshot = True
        self._last_conf = conf

    def plan(self, conf: torch.Tensor, drafts: torch.Tensor, context_lens: Optional[torch.Tensor] = None,
             block_table: Optional[torch.Tensor] = None, anchor_tokens: Optional[torch.Tensor] = None,
             draft_tokens: Optional[torch.Tensor] = None, budget: Optional[int] = None, *,
             extra_tokens: int = 0, padded_tokens: Optional[int] = None, token_offset: int = 0) -> VerifyPlan:
        """This step's allocation and varlen metadata, in persistent buffers (one per (R, padded size)).

        conf [R, K] float32 on the device, drafts [R] int32; metadata inputs as in
        :func:`adaptive_verify.plan_verification`. budget: from plan_budget (ignored by "greedy"), an int
        or a 0-d int32 device tensor (for CUDA graphs: the captured call reads it at every replay; then
        padded_tokens is required).
        padded_tokens: the step's padded decode-token count (default from the budget: R + budget
        rounded to a graph size, with extra_tokens counted).
        CUDA graphs: capture this call once per (R, padded size) and replay it with new inputs copied into
        the captured tensors and the budget as a 0-d tensor. Host values are frozen at capture: keep
        extra_tokens (hence the shifted cost curve and the capacity) the same for a captured key, and
        after a replay tell the verifier which plan ran (``verifier.last_plan = plan``) before observe().
        """
        R = conf.shape[0]
        if budget is None:
            raise ValueError("budget is required: pass the budget plan_budget returned")
        if isinstance(budget, torch.Tensor):  # a 0-d device tensor: CUDA-graph replays read it afresh
            if budget.dim() != 0 or budget.dtype not in (torch.int32, torch.int64):
                raise ValueError("budget must be an int or a 0-d int32/int64 tensor")
            if padded_tokens is None:
                raise ValueError("padded_tokens is required with a tensor budget")
        else:
            budget = _check_int("budget", budget, minimum=0)
        if padded_tokens is None:
            padded_tokens = self.padded_tokens(R + extra_tokens + budget) - extra_tokens
        wants = (context_lens is not None, block_table is not None, anchor_tokens is not None)
        key = (R, int(padded_tokens)) + wants
        out = self._plans.get(key)
        if out is None:
            out = VerifyPlan.allocate(R, int(padded_tokens), self.device, positions=wants[0], slot_mapping=wants[1],
                                      input_ids=wants[2])
            self._plans[key] = out
        skey = tuple(conf.shape)
        if skey not in self._survival:
            self._survival[skey] = torch.empty(skey, dtype=torch.float32, device=self.device)
        survival = planner.prefix_survival(conf, drafts, out=self._survival[skey])
        table = self.cost_table.shifted(extra_tokens) if extra_tokens else self.cost_table
        kw = dict(min_verify=self.min_verify, context_lens=context_lens, block_table=block_table,
                  block_size=self.block_size if block_table is not None else None, anchor_tokens=anchor_tokens,
                  draft_tokens=draft_tokens, token_offset=token_offset, num_tokens_padded=key[1], out=out,
                  capacity=self.capacity - extra_tokens)
        if self.mode == "greedy":
            plan = planner.plan_verification(survival, drafts, table, mode="greedy", **kw)
        else:
            plan = planner.plan_verification(survival, drafts, table, mode="fixed", budget=budget, **kw)
        self._last_plan = plan
        return plan

    def observe(self, verify_lens: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Counts this step's outcomes on the device (no sync): verify_lens [R] and num_accepted [R] int32."""
        if self._last_conf is None or self._last_plan is None:
            raise RuntimeError("observe() needs a record_confidence() and a plan() first")
        R = self._last_conf.shape[0]
        v, a = verify_lens[:R], num_accepted[:R]
        self.stats.update(self._last_conf, v.to(torch.int32), a.to(torch.int32))
        if self.sts is not None:
            self.sts.step(self.stats)
        self._acc[0] += v.sum()
        self._acc[1] += torch.minimum(a.to(torch.int64), v.to(torch.int64)).sum()
        self._acc[2] += self._last_plan.expected_tokens.double() - R
        self._steps += 1

    def metrics(self) -> dict:
        """Figures since construction (one small device-to-host copy plus the stats' report):
        steps, budget_last, budget_mean, verified_per_step, accepted_per_step, predicted_accepted_per_step
        (the planner's P(B), what it expected), acceptance_rate (accepted / verified drafts), ece and auc
        of the confidences (AcceptanceStats), graph_use {padded size: steps}. In "greedy" mode the budget
        figures are plan_budget's upper bound B_max (the device chooses the budget); verified_per_step is
        what it chose."""
        acc = self._acc.cpu().tolist()
        steps = max(self._steps, 1)
        rep = self.stats.report()
        return {
            "steps": self._steps,
            "budget_last": self._budgets[-1] if self._budgets else 0,
            "budget_mean": float(np.mean(self._budgets)) if self._budgets else 0.0,
            "verified_per_step": acc[0] / steps,
            "accepted_per_step": acc[1] / steps,
            "predicted_accepted_per_step": acc[2] / steps,
            "acceptance_rate": acc[1] / acc[0] if acc[0] else float("nan"),
            "ece": rep["ece_overall"],
            "auc": rep["auc_overall"],
            "graph_use": dict(sorted(self._graph_use.items())),
        }
