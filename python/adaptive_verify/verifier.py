"""AdaptiveVerifier: the per-step orchestration an engine calls, with persistent buffers.

One decode step of an engine, in order::

    verifier.add_request(idx)                            # when a request takes persistent slot idx
    budget, padded = verifier.plan_budget(num_reqs, drafts_host, extra_tokens, req_indices=idx_host)  # host
    #   (a level-by-level drafter: depth, budget, padded = verifier.plan_draft(num_reqs, ...), then draft `depth`
    #    levels: conf [R, depth] below)
    ... draft, compute conf [R, K] on the device ...
    verifier.record_confidence(conf)                     # async copy for the NEXT step's budget
    plan = verifier.plan(conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, budget)
    ... target forward on plan's varlen batch (padded to `padded` tokens), rejection_sample ...
    verifier.observe(plan.verify_lens, num_accepted)
    verifier.metrics()                                   # whenever wanted (one small sync)

Draft trees (``max_nodes=N``; verifier_tree.py holds the tree logic and its decisions): pass ``tree=True`` to
plan_budget (drafts_host are then tree sizes, the budget a node count), ``parents=`` and ``tree_sizes=`` to
record_confidence (conf [R, N] conditional per node), ``parents=`` to plan (drafts are the tree sizes; it returns
a TreeVerifyPlan) and ``accepted_offsets=`` to observe (num_accepted is the accepted depth). Every mode serves
trees, losslessly (they are verified one-hot). An EAGLE-2 drafter (``tree_top_k=k``) calls plan_tree_draft in
place of plan_budget: depth, width, budget, padded, then it drafts depth levels expanding width nodes per level.

Why the budget comes from an earlier step (mode "lagged", the default): it decides the padded token count (the
CUDA graph replayed), which the host needs before the drafts exist, and ignoring the current drafts keeps
verification lossless (docs/design.md, "When is which mode lossless"). Confidences reach the host through
pinned, double-buffered memory, copied in step t long before step t + 1 asks: nothing waits.

Decisions (docs/design.md, "What engines rely on every step"):
- Request identity: engines reorder, add and drop requests between steps, so the confidences kept for the
  lagged budget live in a persistent table of ``max_reqs`` slots (verifier_slots.SlotTable) indexed by the
  engine's request index (``req_indices``, vLLM's ``idx_mapping``), not by the previous step's row. Without
  ``req_indices`` the row number is the index (only right for engines that never reorder).
- A request with no history (a new slot: :meth:`add_request`) enters with ``prior`` as the confidence of each
  of its drafts (default 1.0, so survival 1.0, as vLLM does) until its first confidences are recorded.
- The lagged budget is priced entirely at the CURRENT step: its requests, their drafts, its prompt tokens
  (``cost_table.shifted(extra_tokens)``), capacity and graph sizes; only each request's survivals come from
  its last recorded step. So a request that joins can never push the step past its CUDA graph. The decision
  itself is planner/lagged.py's, the one every caller of a lagged budget makes.
- "greedy" and "global" decide the budget on the device from the live survivals; the host only knows
  B <= B_max, so ``plan_budget`` returns B_max and the padded size for it. "global" (argmax of Theta on the
  live survivals) is lossless with one-hot verification (``rejection_sample(draft_probs=None)``, greedy,
  trees) and is the best live mode there; declare how drafts are verified with ``verification``.
- Padded tokens: the smallest graph size >= R + extra_tokens + B; above the largest, exactly that count
  (an eager step). Graph sizes default to the cost table's.
- Bounded host state: plan buffers per (R, padded size) in an LRU of ``PLAN_CACHE_SIZE`` (never evicted when made
  during capture); eager steps and uncaptured steps with prompt tokens share one entry per R, their plans views
  of its first padded tokens (VIEW_CACHE_SIZE per buffer set); metrics keep running sums.
- Chains and trees are two strategies with their own state: ``ChainSteps`` (verifier_chain.py) and ``TreeSteps``
  (verifier_tree.py); a call with ``parents=`` (or ``tree=True``) is a tree step. This class keeps what both share.
- Fast path: each buffer set holds its prepared planner calls (adaptive_verify.prepare), one per shape of the
  caller's inputs; a step rebinds the caller's tensors and scalars (docs/design.md, "Host overhead"); another
  dtype or strides prepares the call again.
"""
from __future__ import annotations

import bisect
import collections
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import planner, verifier_tree
from ._checks import check_bool, check_int, check_real
from .calibration import OnlineSTS
from .cost import CostTable
from .planner import MAX_DRAFTS, TreeVerifyPlan, VerifyPlan
from .planner.args import step_cap_of
from ._validate import device_arg
from .stats import AcceptanceStats
from .verifier_buffers import BufferSet
from .verifier_chain import ChainSteps
from .verifier_slots import SlotTable, host_step

__all__ = ["AdaptiveVerifier", "MODES", "PLAN_CACHE_SIZE"]

MODES = ("lagged", "greedy", "global", "all", "off")
#: Persistent plan buffers kept for eager (R, padded) keys; captured ones are kept for the verifier's lifetime.
PLAN_CACHE_SIZE = 64
#: Most persistent request slots (the confidence table is max_reqs x max_drafts floats, twice on the host).
MAX_REQ_SLOTS = 1 << 20
#: The plan-buffer key of eager steps (above the largest graph size): one buffer set per R, views per size.
EAGER = -1
#: Most CUDA-graph sizes (engines capture tens; the bound keeps a mistyped range from being walked per step).
MAX_GRAPH_SIZES = 1 << 16


class AdaptiveVerifier:
    """Budget, allocation, metadata and statistics of adaptive verification, step after step.

    Args:
        cost_table: the step cost model (its max_tokens, if any, is the token capacity per step).
        max_reqs: most requests in one step, and the size of the persistent request-slot table
            (``req_indices`` lie in [0, max_reqs)). max_drafts: K, drafts per request at most (1..32).
        block_size: the paged KV cache's block size (slot_mapping).
        mode: "lagged" (default, lossless: budget from each request's last confidences, priced at this
            step), "greedy" (lossless, live budget on the device), "global" (live argmax on the device:
            lossless with one-hot verification only), "all" (verify every draft: fixed k), "off" (verify
            none: no speculation).
        graph_sizes: the engine's CUDA-graph token sizes (default: the cost table's).
        min_verify: drafts every request verifies at least.
        device: where plans, statistics and temperatures live.
        online_calibration: keep an :class:`OnlineSTS`; pass ``verifier.temperatures`` to
            :func:`adaptive_verify.confidence` so confidences are calibrated as the drafter drifts.
        prior: confidence of each draft of a request with no recorded history (default 1.0: survival 1.0,
            vLLM's choice), in [0, 1].
        verification: how drafts are verified, "onehot" or "probs" (see
            :func:`adaptive_verify.plan_verification`); "global" warns unless it is "onehot".
        max_step_ms: a latency target per step (see :func:`adaptive_verify.plan_verification`): budgets, the
            lagged one and the live ones, never make the step's modelled time exceed it (min_verify still wins).
        max_nodes: N, the most nodes of a request's draft tree (1..63), or 0 (default): chains only. With it the
            statistics keep max(max_drafts, N) positions (one per depth); see verifier_tree.py.
        tree_top_k: k, the children an EAGLE-2 drafter drafts per expanded node (1..16), for plan_tree_draft
            (needs max_nodes; trees then have at most max_drafts levels); 0 (default): no tree shapes.
        tree_widths: plan_tree_draft's beam, "uniform" (an int) or "per_level" (a tuple; docs/api.md).
    """

    def __init__(self, cost_table: CostTable, *, max_reqs: int, max_drafts: int, block_size: int, mode: str = "lagged",
                 graph_sizes: Sequence[int] = (), min_verify: int = 0, device: Union[str, torch.device] = "cpu",
                 online_calibration: bool = False, refresh_every: int = 100, prior: float = 1.0,
                 verification: Optional[str] = None, max_step_ms: Optional[float] = None, max_nodes: int = 0,
                 tree_top_k: int = 0, tree_widths: str = "uniform"):
        if not isinstance(cost_table, CostTable):
            raise TypeError(f"cost_table must be a CostTable, got {type(cost_table).__name__}")
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not (verification is None or isinstance(verification, str)) or verification not in planner.VERIFICATIONS:
            raise ValueError(f"verification must be one of {planner.VERIFICATIONS}, got {verification!r}")
        self.cost_table = cost_table
        self.max_reqs = check_int("max_reqs", max_reqs, lo=1, hi=MAX_REQ_SLOTS)
        # The planner's limit, checked here so a bad value fails at construction rather than at plan().
        self.max_drafts = check_int("max_drafts", max_drafts, lo=1, hi=MAX_DRAFTS)
        self.block_size = check_int("block_size", block_size, lo=1, hi=planner.INT32_MAX)
        self.min_verify = check_int("min_verify", min_verify, lo=0, hi=self.max_drafts)
        self.prior = check_real("prior", prior, lo=0.0, hi=1.0)
        self.max_step_ms = max_step_ms  # (the property checks it)
        check_bool("online_calibration", online_calibration)
        check_int("refresh_every", refresh_every, lo=1)
        self.mode = mode
        self.verification = verification
        if isinstance(graph_sizes, (str, bytes)) or not isinstance(graph_sizes, Iterable):
            raise TypeError(f"graph_sizes must be a sequence of ints, got {type(graph_sizes).__name__}")
        sizes = tuple(itertools.islice(graph_sizes, MAX_GRAPH_SIZES + 1))  # never walks an unbounded iterable
        if len(sizes) > MAX_GRAPH_SIZES:
            raise ValueError(f"graph_sizes must hold at most {MAX_GRAPH_SIZES} sizes, got {len(sizes)}")
        sizes = sizes or tuple(cost_table.graph_sizes)
        for i, g in enumerate(sizes):
            check_int(f"graph_sizes[{i}]", g, lo=1, hi=planner.INT32_MAX)
            if i and g <= sizes[i - 1]:
                raise ValueError(f"graph_sizes must be strictly increasing, got {list(sizes)}")
        self.graph_sizes = sizes
        self.device = device_arg("device", device)
        self.capacity = cost_table.max_tokens if cost_table.max_tokens is not None else \
            self.max_reqs * (1 + self.max_drafts)
        K = self.max_drafts
        # The lagged budget's per-slot confidences (verifier_slots.py: request identity across steps).
        self.slots = SlotTable(self.max_reqs, K, self.prior, self.min_verify, self.device)
        # Plan buffer sets (with their prepared calls and views), per (kind, R, padded size or EAGER) + wants
        self._plans: collections.OrderedDict[tuple, BufferSet] = collections.OrderedDict()
        self._plans_pinned: dict[tuple, BufferSet] = {}
        # The host budget of plan() as a persistent 0-d tensor on the plan's device (written in place each step).
        self._budget_in = torch.zeros((), dtype=torch.int32, device=self.device)
        self._budget_np = self._budget_in.numpy() if self.device.type == "cpu" else None
        self._last_plan: Optional[VerifyPlan] = None
        max_nodes = check_int("max_nodes", max_nodes, lo=0)
        # Draft trees (verifier_tree.py): their own slot table of node survivals; statistics per depth, and a depth is
        # at most N, so the statistics keep max(K, N) positions.
        top_k, tree_widths = verifier_tree.check_shape_args(tree_top_k, tree_widths, max_nodes)
        self._tree = verifier_tree.TreeSteps(max_nodes, max_reqs=self.max_reqs, prior=self.prior, device=self.device,
                                             slots=self.slots, top_k=top_k, max_depth=K, widths=tree_widths) \
            if max_nodes else None
        positions = max(K, max_nodes)
        self._stats = AcceptanceStats(positions, device=self.device)
        # Chains (verifier_chain.py): the survival buffers of their plans, observe's prepared statistics updates.
        self._chain = ChainSteps(max_reqs=self.max_reqs, max_drafts=K, device=self.device, slots=self.slots,
                                 stats=self._stats)
        self.sts = OnlineSTS(positions, refresh_every=refresh_every, device=self.device) if online_calibration else None
        # Verified and accepted drafts are the stats kernel's own running totals (stats.totals); the planner's
        # expected tokens add up on the device (one graph-safe in-place add per step), the rows on the host.
        self._expected = torch.zeros((), dtype=torch.float64, device=self.device)
        self._expected_host = 0.0  # CPU plans: the same float64 sum on the host (a torch add costs microseconds)
        self._expected_last = (None, None)  # (the last CPU plan's expected_tokens, its numpy view): .item() costs more
        self._rows = 0
        self._steps = 0
        self._budget_count = 0
        self._budget_sum = 0
        self._budget_last = 0
        self._depth_sum = self._depth_count = 0  # plan_draft's depths, for metrics()
        self._graph_use: Counter = Counter()

    # ------------------------------------------------------------------------------------------------
    @property
    def stats(self) -> AcceptanceStats:
        """The acceptance statistics observe() adds to (read-only: observe's prepared update writes into this one;
        ``stats.reset()`` zeroes it in place)."""
        return self._stats

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
    def max_step_ms(self) -> Optional[float]:
        """The step-time target in milliseconds (None: none). An engine may change it between steps (an SLO that
        follows the load; the simulator's ``slo<ms>`` policies set the target less the adaptive overhead of each
        step's R): the next plan_budget and plan read it. A captured CUDA graph keeps the value it was captured
        with, as every host value of a captured plan()."""
        return self._max_step_ms

    @max_step_ms.setter
    def max_step_ms(self, value: Optional[float]) -> None:
        self._max_step_ms = None if value is None else check_real("max_step_ms", value, lo=0.0, lo_open=True)

    @property
    def temperatures(self) -> Optional[torch.Tensor]:
        """[K] float32 temperatures of the online calibration (None without it)."""
        return self.sts.temperatures if self.sts is not None else None

    def _bounds(self, R: int, drafts_sum: int, forced_sum: int, extra_tokens: int,
                fixed_cost: Optional[float] = None) -> tuple[int, int]:
        """(B_min, B_max) of a step of R requests drafting drafts_sum drafts (values in [0, max_drafts], or a tree
        step's sizes in [0, max_nodes]), forced_sum of them forced (min(d, min_verify) summed: a tree's forced nodes
        are those of index < min_verify); capacity and max_step_ms respected, the step's fixed cost
        ``fixed_cost`` (default the full draft's, cost_table.fixed_cost(R))."""
        room = max(self.capacity - R - extra_tokens, 0)
        b_room = min(drafts_sum, room)
        # As the planner: forced drafts (min_verify) never push the step past capacity; they beat the latency target.
        b_min = min(forced_sum, b_room)
        b_max = b_room
        if self._max_step_ms is not None and R:
            fixed = float(self.cost_table.fixed_cost(R)) if fixed_cost is None else float(fixed_cost)
            cap = step_cap_of(self.cost_table, R, R + extra_tokens, b_room, fixed, self._max_step_ms)
            b_max = max(b_min, min(b_room, cap))
        return b_min, b_max

    def padded_tokens(self, n: int) -> int:
        """The smallest graph size >= n, or n itself above the largest (eager); 0 for 0."""
        if n == 0:
            return 0
        i = bisect.bisect_left(self.graph_sizes, n)
        return self.graph_sizes[i] if i < len(self.graph_sizes) else n

    def add_request(self, req_indices) -> None:
        """Slots ``req_indices`` (an int or ints in [0, max_reqs)) now hold new requests: they enter the
        lagged budget with the prior until their first confidences are recorded. Call when the engine assigns
        a slot (vLLM: ``add_request``); an in-flight snapshot of the slot's previous request is ignored."""
        idx = self.slots.add(req_indices)
        if self._tree is not None:
            self._tree.reset_slots(idx)

    def plan_budget(self, num_reqs: int, drafts_host, extra_tokens: int = 0, *,
                    req_indices=None, tree: bool = False, weights=None) -> tuple[int, int]:
        """(budget, padded_tokens) of this step, on the host with no device synchronisation.

        num_reqs: R. drafts_host: [R] ints (a list, numpy array or CPU tensor), drafts per request this
        step (count only the valid drafts: a draft the engine invalidated, id -1, is not a candidate).
        extra_tokens: prompt tokens sharing the step (chunked prefill). req_indices: [R] host ints, each
        request's persistent slot in [0, max_reqs), distinct (default: the row number).
        tree: this step drafts trees (needs max_nodes): drafts_host are the tree sizes, in [0, max_nodes], and the
        budget is a node count (lagged: priced from each slot's last recorded node survivals, verifier_tree.py).
        weights: [R] host floats, request priorities (as ``plan(weights=)``'s): the lagged budget is the argmax of
        the weighted Theta (host knowledge, no sync); None weighs every request 1; the live modes weigh in plan().
        """
        tree_state = self._trees() if tree else None
        R, extra_tokens, drafts, weights, idx = host_step(num_reqs, drafts_host, extra_tokens, weights, req_indices,
                                                          self.max_reqs, self.capacity)
        # One pass: drafts and req_indices checked, their sums, and for the lagged chain budget its inputs gathered.
        lag = self.mode == "lagged" and R > 0 and tree_state is None
        limit, name = (self.max_drafts, "max_drafts") if tree_state is None else (tree_state.N, "max_nodes")
        drafts_sum, forced_sum = self.slots.inputs(drafts, idx, R, limit, name, lag)
        if idx is None:
            idx = self.slots.arange[:R]
        self.slots.pending_idx = idx
        b_min, b_max = self._bounds(R, drafts_sum, forced_sum, extra_tokens)
        if self.mode == "off":
            budget = b_min
        elif self.mode != "lagged" or R == 0:
            budget = b_max
        elif tree_state is None:
            budget = min(max(self.slots.lagged_budget(R, extra_tokens, weights, self.cost_table, self.capacity,
                                                      self.min_verify, self._max_step_ms), b_min), b_max)
        else:  # a node count, from each slot's last recorded node survivals
            budget = min(max(tree_state.lagged_budget(idx, drafts, weights, self.cost_table, extra_tokens,
                                                      self.capacity, self.min_verify, self._max_step_ms), b_min), b_max)
        padded = self.padded_tokens(R + extra_tokens + budget)
        self._count_budget(budget, padded)
        return budget, padded

    def _count_budget(self, budget: int, padded: int) -> None:
        """metrics()' running figures of a host budget and its padded size."""
        self._budget_count += 1
        self._budget_sum += budget
        self._budget_last = budget
        self._graph_use[padded] += 1

    def plan_draft(self, num_reqs: int, drafts_host=None, extra_tokens: int = 0, *, req_indices=None,
                   weights=None) -> tuple[int, int, int]:
        """(depth, budget, padded_tokens) of this step, on the host before drafting, with no device sync: the levels
        the drafter runs (the same for every request) and what plan() will verify (docs/design.md, "Drafting from the
        budget"). In place of :meth:`plan_budget` with a level-by-level drafter (EAGLE, multi-step MTP): request r
        then drafts min(depth, drafts_host[r]), and record_confidence / plan take those (conf [R, depth]).

        num_reqs, extra_tokens, req_indices, weights: as in :meth:`plan_budget`; drafts_host: [R] host ints, the most
        each request may draft this step (its room before the output's end), default max_drafts.

        The decision is :func:`adaptive_verify.choose_draft_depth`, priced at this step as the lagged budget is
        (``fixed_cost(R, D)`` per depth, prompt tokens on the shifted curve, capacity, max_step_ms), on a prediction
        of this step's confidences from earlier steps only (lossless): each request's last recorded ones blended with
        each position's acceptance in the statistics, the statistics' alone where the last step did not draft, so the
        depth grows again when acceptance rises (verifier_chain.depth_inputs). Call observe() every step.
        A block drafter (the table's draft_levels None: one forward whatever it drafts) gets max_drafts or 0.
        Modes: "lagged" returns the decision's budget; "greedy" and "global" decide the depth so and return B_max at
        it (plan() chooses live); "all" drafts and verifies everything; "off" drafts nothing. Chains only.
        """
        K = self.max_drafts
        R, extra_tokens, drafts, weights, idx = host_step(num_reqs, drafts_host, extra_tokens, weights, req_indices,
                                                          self.max_reqs, self.capacity, default_drafts=K)
        self.slots.inputs(drafts, idx, R, K, "max_drafts", R > 0)  # checks; gathers each slot's stale confidences
        if idx is None:
            idx = self.slots.arange[:R]
        self.slots.pending_idx = idx
        chain = self._chain
        chain.track_depths = True
        if self.mode == "off" or R == 0:
            depth, budget = 0, 0
        elif self.mode == "all":
            depth = int(drafts.max())
            budget = self._bounds(R, int(drafts.sum()), int(np.minimum(drafts, self.min_verify).sum()),
                                  extra_tokens)[1]
        else:
            depth, budget = chain.lagged_depth(R, extra_tokens, weights, self.cost_table, self.capacity,
                                               self.min_verify, self._max_step_ms, self.prior)
            if self.mode != "lagged":  # the live modes: every draft of the chosen depth may be verified
                at_depth = np.minimum(drafts, depth)
                budget = self._bounds(R, int(at_depth.sum()), int(np.minimum(at_depth, self.min_verify).sum()),
                                      extra_tokens, self.cost_table.fixed_cost(R, depth))[1]
        padded = self.padded_tokens(R + extra_tokens + budget)
        self._count_budget(budget, padded)
        self._depth_sum += depth
        self._depth_count += 1
        return depth, budget, padded

    def plan_tree_draft(self, num_reqs: int, drafts_host=None, extra_tokens: int = 0, *, req_indices=None,
                        weights=None) -> tuple[int, Union[int, tuple], int, int]:
        """(depth, width, budget, padded_tokens) of a tree step, on the host before drafting, no sync: draft ``depth``
        levels (request r: min(depth, drafts_host[r])), each level's ``width`` best nodes (path confidence; per_level:
        level l's width[l - 1]) expanded into their top tree_top_k children. Arguments and modes: plan_draft's
        (drafts_host: the most levels per request); choose_tree_shape on a prediction from earlier steps only."""
        R, extra_tokens, lim, weights, idx = host_step(num_reqs, drafts_host, extra_tokens, weights, req_indices,
                                                       self.max_reqs, self.capacity, default_drafts=self.max_drafts)
        self.slots.inputs(lim, idx, R, self.max_drafts, "max_drafts", False)  # checks
        idx = self.slots.pending_idx = self.slots.arange[:R] if idx is None else idx
        depth, width, budget = self._trees().plan_draft(
            idx, lim, self.cost_table, self.mode, extra_tokens, self.capacity, weights, self._max_step_ms,
            lambda n, fixed: self._bounds(R, n, 0, extra_tokens, fixed)[1], self.stats)
        padded = self.padded_tokens(R + extra_tokens + budget)
        self._count_budget(budget, padded)
        self._depth_sum, self._depth_count = self._depth_sum + depth, self._depth_count + 1
        return depth, width, budget, padded

    def stale_confidence(self, req_indices) -> np.ndarray:
        """[R, max_drafts] float32: the confidences the lagged budget ranks for requests in slots
        ``req_indices`` (host ints): each one's last recorded confidences, or the prior for a slot with no
        history. Waits for the last snapshot's copy (long done in a running engine)."""
        return self.slots.stale(req_indices)

    def record_confidence(self, conf: torch.Tensor, req_indices=None, *, parents: Optional[torch.Tensor] = None,
                          tree_sizes: Optional[torch.Tensor] = None) -> None:
        """Starts the copy of this step's conf [R, K'] (float32, K' <= K) to pinned host memory for the next steps'
        budgets (asynchronous on CUDA), once per step after plan_budget. req_indices: [R] persistent slots (host
        ints, or an int32/int64 tensor on the verifier's device); default: plan_budget's of this step when it had R
        requests, else the row numbers. parents [R, N] int32 and tree_sizes [R] int32 (device): a tree step, conf
        [R, N] each node's conditional acceptance probability (verifier_tree.record_confidence)."""
        self._trees().record(conf, req_indices, parents, tree_sizes) if parents is not None else \
            self._chain.record(conf, req_indices)

    def _step_buffers(self, R: int, budget, extra_tokens, padded_tokens, wants: tuple, per_request: int, kind: type):
        """plan()'s shared part, for chains and trees: checks budget, extra_tokens and padded_tokens, and returns
        (the buffer set (its ``out`` and prepared calls), the budget to pass, padded_tokens, extra_tokens).
        ``per_request``: tokens a request may verify besides its anchor (K, or a tree's N); ``kind``: VerifyPlan or
        TreeVerifyPlan.

        Graph-sized steps get buffers per (R, padded size). An eager step's size follows its budget, so one buffer
        set per R serves them all (sized for the largest eager step): the planner writes the step's padded_tokens
        entries and returns views of them (its out= buffers may be longer than T_pad). A host budget goes in through
        a persistent 0-d tensor, as a CUDA-graph replay's does. Both keep the planner on one prepared call while
        the budget changes every step."""
        if budget is None:
            raise ValueError("budget is required: pass the budget plan_budget returned")
        host_budget = not isinstance(budget, torch.Tensor)
        if not host_budget:  # a 0-d device tensor: CUDA-graph replays read it afresh
            if budget.dim() != 0 or budget.dtype not in (torch.int32, torch.int64):
                raise ValueError("budget must be an int or a 0-d int32/int64 tensor")
            if padded_tokens is None:
                raise ValueError("padded_tokens is required with a tensor budget")
        else:
            budget = check_int("budget", budget, lo=0, hi=planner.INT32_MAX)
        extra_tokens = check_int("extra_tokens", extra_tokens, lo=0, hi=planner.INT32_MAX)
        if padded_tokens is None:
            padded_tokens = self.padded_tokens(R + extra_tokens + budget) - extra_tokens
        # Every step's tokens fit the capacity; a graph size may round up past it (the largest bounds that).
        padded_tokens = check_int("padded_tokens", padded_tokens, lo=R,
                                  hi=max(self.capacity, self.graph_sizes[-1] if self.graph_sizes else 0))
        # A step with a prompt chunk shares the eager buffers unless a graph is being captured: its padded decode
        # size is a graph size less the chunk, so chunked prefill would otherwise make a buffer set per chunk size.
        if self.graph_sizes and padded_tokens + extra_tokens <= self.graph_sizes[-1] and (
                not extra_tokens or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing())):
            key, tokens = (kind, R, padded_tokens) + wants, padded_tokens
        else:
            key = (kind, R, EAGER) + wants
            tokens = max(padded_tokens, min(R * (1 + per_request), self.capacity))
        bufs = self._plan_buffers(key, wants, tokens)
        if host_budget and self.mode not in ("greedy", "global"):
            # The planner's own cap, applied here (it clamps to it anyway, forced drafts included: B_max <= the cap),
            # so that a shared eager buffer can be planned without passing the step's size (see plan()).
            budget = min(budget, padded_tokens - R, max(self.capacity - extra_tokens - R, 0))
            if self._budget_np is not None:
                self._budget_np[()] = budget
            else:
                self._budget_in.fill_(budget)
            budget = self._budget_in
        return bufs, budget, padded_tokens, extra_tokens

    def _plan_buffers(self, key: tuple, wants: tuple, tokens: int) -> "BufferSet":
        """Buffers for key = (plan kind, R, padded size or EAGER) + wants, with at least ``tokens`` token entries."""
        bufs = self._plans_pinned.get(key)
        if bufs is None:
            bufs = self._plans.get(key)
            if bufs is not None:
                self._plans.move_to_end(key)
        if bufs is not None and bufs.out.token_req.shape[0] < tokens:
            bufs = None  # an eager step larger than every earlier one (a caller's own padded_tokens): grow
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if bufs is None:
            bufs = BufferSet(key[0].allocate(key[1], tokens, self.device, positions=wants[0],
                                              slot_mapping=wants[1], input_ids=wants[2]))
            if capturing:
                self._plans_pinned[key] = bufs  # a captured graph writes these addresses at every replay
            else:
                self._plans[key] = bufs
                while len(self._plans) > PLAN_CACHE_SIZE:
                    self._plans.popitem(last=False)
        elif capturing and key not in self._plans_pinned:  # eager steps made them; a graph now holds their addresses
            self._plans_pinned[key] = self._plans.pop(key)
        return bufs

    def plan(self, conf: torch.Tensor, drafts: torch.Tensor, context_lens: Optional[torch.Tensor] = None,
             block_table: Optional[torch.Tensor] = None, anchor_tokens: Optional[torch.Tensor] = None,
             draft_tokens: Optional[torch.Tensor] = None, budget: Optional[int] = None, *,
             extra_tokens: int = 0, padded_tokens: Optional[int] = None, token_offset: int = 0,
             weights: Optional[torch.Tensor] = None, parents: Optional[torch.Tensor] = None) -> VerifyPlan:
        """This step's allocation and varlen metadata, in persistent buffers (one per (R, padded size)).

        conf [R, K] float32 on the device, drafts [R] int32; metadata inputs as in
        :func:`adaptive_verify.plan_verification` (a draft token of -1 ends its request's candidates).
        budget: from plan_budget (ignored by "greedy" and "global"), an int or a 0-d int32 device tensor
        (for CUDA graphs: the captured call reads it at every replay; then padded_tokens is required).
        padded_tokens: the step's padded decode-token count (default from the budget: R + budget
        rounded to a graph size, with extra_tokens counted), at most the capacity or the largest graph size.
        weights: [R] float32 request priorities on the device (see :func:`adaptive_verify.plan_verification`);
        they rank this step's live allocation. The lagged budget is plan_budget's, weighted by its own ``weights=``
        (host priorities) when given.
        CUDA graphs: capture this call once per (R, padded size) and replay it with new inputs copied into
        the captured tensors and the budget as a 0-d tensor. Host values are frozen at capture: keep
        extra_tokens (hence the shifted cost curve and the capacity) the same for a captured key, and
        after a replay tell the verifier which plan ran (``verifier.last_plan = plan``) before observe().
        parents: [R, N] int32, a tree step: conf [R, N] conditional per node, drafts the tree sizes [R], draft_tokens
        [R, N]; returns the :class:`TreeVerifyPlan` of plan_tree_verification (verifier_tree.plan).
        """
        if parents is not None:
            return self._plan_tree(conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, budget,
                                   extra_tokens, padded_tokens, token_offset, weights, parents)
        if not isinstance(conf, torch.Tensor):
            raise TypeError(f"conf must be a float32 tensor [R, K], got {type(conf).__name__}")
        if conf.dim() != 2:
            raise ValueError(f"conf must be a float32 tensor [R, K], got shape {tuple(conf.shape)}")
        R = conf.shape[0]
        if R > self.max_reqs or conf.shape[1] > self.max_drafts:
            raise ValueError(f"conf shape {tuple(conf.shape)} exceeds [max_reqs, max_drafts] = "
                             f"[{self.max_reqs}, {self.max_drafts}]")
        wants = (context_lens is not None, block_table is not None, anchor_tokens is not None)
        tensor_budget = isinstance(budget, torch.Tensor)
        bufs, budget, padded_tokens, extra_tokens = self._step_buffers(R, budget, extra_tokens, padded_tokens, wants,
                                                                       self.max_drafts, VerifyPlan)
        out = bufs.out
        # One call: the kernel computes the survival from conf, then plans. The prompt chunk is priced through the
        # shifted curve (a draft's marginal time), not as extra_tokens (docs/design.md, "Planner").
        # (A step of prompt tokens only, R = 0, may fill the capacity: no view is left to price, and none is needed.)
        live = self.mode in ("greedy", "global")
        # A fixed budget never reads the verify curve (only the drafter's cost, the same for a shifted view), so
        # without a latency target the base table gives the kernel the same fields and no new view is priced.
        priced = live or self._max_step_ms is not None
        table = self.cost_table.shifted(extra_tokens) if extra_tokens and R and priced else self.cost_table
        capacity, T = self.capacity - extra_tokens, padded_tokens
        if not (priced or self.min_verify or tensor_budget) and out.token_req.shape[0] > padded_tokens:
            # A shared eager buffer and a host budget (already capped to this step's room by _step_buffers): the
            # kernel's budget is then min(budget, the drafts there are) whatever capacity and T_pad it is told, so it
            # is told the constant ones and its prepared call needs no re-derivation when the prompt chunk or the
            # budget changes; the step's first padded_tokens entries come back as views (_first_tokens). Forced
            # drafts (min_verify) could exceed a budget and need the step's real cap, so they keep the exact call.
            capacity, T = self.capacity, out.token_req.shape[0]
        # The chain side's prepared call on these buffers. A fixed budget is a 0-d tensor here, the caller's or the
        # verifier's own that a host budget goes through, rebound like the other inputs.
        plan = self._chain.plan(bufs, conf, drafts, context_lens, block_table, anchor_tokens, draft_tokens, weights,
                                budget, table, capacity, T, token_offset, self._max_step_ms,
                                (self.mode, self.min_verify, self.block_size, self.verification))
        if T != padded_tokens:
            plan = bufs.first_tokens(plan, padded_tokens)
        self._last_plan = plan
        return plan

    def observe(self, verify_lens: torch.Tensor, num_accepted: torch.Tensor, *,
                accepted_offsets: Optional[torch.Tensor] = None) -> None:
        """Counts this step's outcomes on the device (no sync): verify_lens [R] and num_accepted [R] int32,
        in the rows of this step's conf (statistics are per draft position, so rows need no identity).
        A tree step (the last plan a TreeVerifyPlan): num_accepted is the accepted depth and accepted_offsets
        [R, W] tree_rejection_sample's; statistics are per depth (verifier_tree.observe)."""
        if accepted_offsets is not None or type(self._last_plan) is TreeVerifyPlan:
            p = self._last_plan
            self._finish_step(p, self._trees().observe(p, verify_lens, num_accepted, accepted_offsets, self.stats))
            return
        if self._chain.last_conf is None or self._last_plan is None:
            raise RuntimeError("observe() needs a record_confidence() and a plan() first")
        self._finish_step(self._last_plan, self._chain.observe(verify_lens, num_accepted))

    def _finish_step(self, plan, R: int) -> None:
        """observe()'s bookkeeping shared by chains and trees, once the statistics hold the step."""
        if self.sts is not None:
            self.sts.step(self.stats)
        self._add_expected(plan.expected_tokens)
        self._rows += R
        self._steps += 1

    def _trees(self) -> verifier_tree.TreeSteps:
        if self._tree is None:
            raise ValueError("this AdaptiveVerifier serves chains only: construct it with max_nodes=N to pass trees")
        return self._tree

    def _plan_tree(self, conf, tree_sizes, context_lens, block_table, anchor_tokens, draft_tokens, budget,
                   extra_tokens, padded_tokens, token_offset, weights, parents) -> TreeVerifyPlan:
        """plan(..., parents=): the tree side's plan_tree_verification in the verifier's mode and plan buffers."""
        t = self._trees()
        R, _ = t.check(conf, parents, tree_sizes)
        wants = (context_lens is not None, block_table is not None, anchor_tokens is not None)
        bufs, budget, padded_tokens, extra_tokens = self._step_buffers(R, budget, extra_tokens, padded_tokens, wants,
                                                                       t.N, TreeVerifyPlan)
        table = self.cost_table.shifted(extra_tokens) if extra_tokens and R else self.cost_table
        kw = dict(min_verify=self.min_verify, context_lens=context_lens, block_table=block_table,
                  block_size=self.block_size if block_table is not None else None, anchor_tokens=anchor_tokens,
                  draft_tokens=draft_tokens, token_offset=token_offset, num_tokens_padded=padded_tokens, out=bufs.out,
                  capacity=self.capacity - extra_tokens, max_step_ms=self._max_step_ms, weights=weights)
        self._last_plan = t.plan(bufs.calls, conf, tree_sizes, parents, table, mode=self.mode, budget=budget, kw=kw)
        return self._last_plan

    def _add_expected(self, expected_tokens: torch.Tensor) -> None:
        """Adds a plan's expected tokens (0-d float32) to the running float64 sum: on the device for CUDA plans (one
        graph-safe in-place add, no sync), on the host for CPU ones."""
        if expected_tokens is self._expected_last[0]:  # a CPU plan's buffer seen last step: read through numpy
            self._expected_host += float(self._expected_last[1])
        elif expected_tokens.is_cuda:
            self._expected += expected_tokens
        else:
            self._expected_last = (expected_tokens, expected_tokens.detach().numpy())
            self._expected_host += float(self._expected_last[1])

    def metrics(self) -> dict:
        """Figures since construction (one small device-to-host copy plus the stats' report):
        steps, budget_last, budget_mean, verified_per_step, accepted_per_step, predicted_accepted_per_step
        (the planner's P(B), what it expected), acceptance_rate (accepted / verified drafts), ece and auc
        of the confidences (AcceptanceStats), graph_use {padded size: steps}, depth_mean (plan_draft's and
        plan_tree_draft's depths; 0.0 without them). In "greedy" and "global" modes the budget figures are the
        upper bound B_max (the device chooses the budget); verified_per_step is what it chose. The verified and accepted counts are ``stats.totals`` (so a
        ``verifier.stats.reset()`` restarts them too)."""
        acc = [*self.stats.totals.cpu().tolist(), float(self._expected) + self._expected_host - self._rows]
        steps = max(self._steps, 1)
        rep = self.stats.report()
        return {
            "steps": self._steps,
            "budget_last": self._budget_last,
            "budget_mean": self._budget_sum / self._budget_count if self._budget_count else 0.0,
            "depth_mean": self._depth_sum / self._depth_count if self._depth_count else 0.0,
            "verified_per_step": acc[0] / steps,
            "accepted_per_step": acc[1] / steps,
            "predicted_accepted_per_step": acc[2] / steps,
            "acceptance_rate": acc[1] / acc[0] if acc[0] else float("nan"),
            "ece": rep["ece_overall"],
            "auc": rep["auc_overall"],
            "graph_use": dict(sorted(self._graph_use.items())),
        }
