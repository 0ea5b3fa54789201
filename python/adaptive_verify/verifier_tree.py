"""Draft trees in AdaptiveVerifier (docs/design.md, "Draft trees" and "What engines rely on every step").

A verifier built with ``max_nodes=N`` (1..63) also serves steps whose requests draft trees. It holds a
:class:`TreeSteps`, which owns everything tree-specific (its slot table of node survivals, its views, the last
tree conf) and is told what it needs through its arguments; the verifier keeps what chains and trees share (plan
buffers, budgets' bounds, statistics and metrics bookkeeping) and calls it from the same methods an engine calls:

    budget, padded = verifier.plan_budget(R, tree_sizes_host, tree=True, req_indices=idx)   # host, node count
    verifier.record_confidence(conf, parents=parents, tree_sizes=tree_sizes)              # conf [R, N] conditional
    plan = verifier.plan(conf, tree_sizes, ctx, blocks, anchors, tokens, budget, parents=parents)  # TreeVerifyPlan
    ... target forward with tree_mask=plan.tree_mask, tree_rejection_sample, commit_tree_kv ...
    verifier.observe(plan.verify_lens, num_accepted, accepted_offsets=accepted_offsets)

A chain is the tree with parents[r, j] = j - 1, so a batch mixing chain and tree requests is planned as trees.
conf [R, N] is each node's CONDITIONAL acceptance probability (the planner multiplies it along the path).

Decisions:
- Trees are verified one-hot (sample and match), so every mode is lossless for them, live "global" included;
  no mode warns.
- Lagged budget: a count of nodes, priced at the CURRENT step (its R, prompt tokens through the shifted cost
  curve, capacity, graph sizes, max_step_ms) from each request's last recorded node survivals. record_confidence
  keeps, per persistent slot, the survivals of that step's drafted nodes sorted in decreasing order (zeros past
  its tree size); plan_budget ranks, per request, the first tree_sizes[r] of them as a chain (a sorted list is
  ancestor-closed along a chain, and the candidate order only depends on the survival multiset), and takes the
  argmax of Theta over all requests ("global" on stale values: independent of this step's drafts). Forced nodes
  (min_verify) count as the top min_verify of the sorted list there. A slot with no history enters with the
  survivals of a chain of nodes each of confidence ``prior`` (prior ** depth: all 1.0 by default, as vLLM).
- Statistics per depth: AcceptanceStats' position d - 1 counts the nodes at depth d. A node is a trial iff it
  was verified and its parent was accepted (the anchor always is), and a survival iff it was accepted; it is
  binned by its own conditional confidence. Siblings are separate trials (at most one of them survives), which
  is what makes each trial a Bernoulli(conf) event under one-hot verification, so ECE, AUC and OnlineSTS's
  per-depth temperatures mean what they mean for chains. Each token is one row of the stats kernel placed at
  its depth (``AcceptanceStats.update(positions=)``: the kernel's own binning, 32.32 fixed point and NaN count; a
  chain given as a tree gets the chain's counts bit for bit). The stats then need max depth <= positions:
  ``positions = max(max_drafts, max_nodes)`` (a depth never exceeds the node count). totals: nodes verified and
  accepted depth, as for chains.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from . import planner
from .prepared import prepare, run_prepared
from ._checks import check_int
from ._ext import _C
from .planner import MAX_TREE_NODES, TreeVerifyPlan, tree_width_profiles
from .cost import tree_draft_cost
from .planner.lagged import lagged_tree_budget
from .stats import AcceptanceStats
from .verifier_slots import SlotTable, check_conf, int32_inputs
from .verifier_tree_shape import TreeShapes

__all__ = ["TreeSteps", "TREE_WIDTHS", "check_shape_args"]

#: Most (width, depth) shapes one choose_tree_shape call weighs: tree_top_k * (max_drafts + 1) must fit.
MAX_TREE_SHAPES = _C.PLANNER_MAX_SHAPES


#: AdaptiveVerifier's tree_widths: one beam width for every level, or one per level.
TREE_WIDTHS = ("uniform", "per_level")


def check_shape_args(top_k, widths, max_nodes: int) -> tuple[int, str]:
    """AdaptiveVerifier's tree_top_k (1..16 with max_nodes, else 0) and tree_widths ("uniform", or "per_level" with
    a tree_top_k), checked."""
    top_k = check_int("tree_top_k", top_k, lo=0, hi=16 if max_nodes else 0)
    if not isinstance(widths, str) or widths not in TREE_WIDTHS:
        raise ValueError(f"tree_widths must be 'uniform' or 'per_level', got {widths!r:.60}")
    if widths == "per_level" and not top_k:
        raise ValueError("tree_widths='per_level' shapes plan_tree_draft's trees: it needs tree_top_k (and max_nodes)")
    return top_k, widths


class TreeSteps:
    """The tree side of one AdaptiveVerifier: the slot table of sorted node survivals (device, two pinned host
    snapshots), the lagged budget's host inputs and the last recorded tree. ``slots``: the verifier's chain slot
    table, whose generations (add_request), staging and snapshot copies it shares."""

    def __init__(self, max_nodes: int, *, max_reqs: int, prior: float, device: torch.device, slots: SlotTable,
                 top_k: int = 0, max_depth: int = 0, widths: str = "uniform"):
        self.N = N = check_int("max_nodes", max_nodes, lo=1, hi=MAX_TREE_NODES)
        # The lagged tree shape (plan_tree_draft; verifier_tree_shape.py), for a drafter expanding top_k per node.
        profiles, levels = None, max(max_depth - 1, 0)
        if top_k and widths == "per_level":
            if math.comb(top_k + levels - 1, levels) * (max_depth + 1) > MAX_TREE_SHAPES:
                raise ValueError(f"tree_widths='per_level': the per-level profiles of tree_top_k = {top_k} over "
                                 f"max_drafts = {max_depth} levels exceed the {MAX_TREE_SHAPES} tree shapes "
                                 "choose_tree_shape weighs; lower tree_top_k or max_drafts, or use 'uniform'")
            profiles = tree_width_profiles(top_k, levels)
        elif top_k and top_k * (max_depth + 1) > MAX_TREE_SHAPES:
            raise ValueError(f"tree_top_k * (max_drafts + 1) = {top_k * (max_depth + 1)} exceeds the "
                             f"{MAX_TREE_SHAPES} tree shapes choose_tree_shape weighs; lower tree_top_k or max_drafts")
        self.shapes = TreeShapes(top_k, max_depth, N, max_reqs, prior, device, slots.gen,
                                 profiles=profiles) if top_k else None
        self.max_reqs, self.device, self.slots = max_reqs, device, slots
        pin = device.type == "cuda"
        # [N] survivals of a slot with no history: a chain of nodes of confidence `prior` each.
        self.prior_row = np.cumprod(np.full(N, prior, dtype=np.float32)).astype(np.float32)
        prior_t = torch.from_numpy(self.prior_row)
        self.surv_dev = prior_t.to(device).repeat(max_reqs, 1)  # [max_reqs, N]
        self.snap = prior_t.repeat(2, max_reqs, 1)  # [2, max_reqs, N]
        if pin:
            self.snap = self.snap.pin_memory()
        self.snap_np = self.snap.numpy()
        self.snap_gen = [slots.gen.copy(), slots.gen.copy()]
        self.events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self.idx_pinned = torch.zeros(2, max_reqs, dtype=torch.int64, pin_memory=pin)
        self.slot = 0
        self.recorded = False
        # Lagged budget inputs (host, persistent per R): sorted survivals [R, N], tree sizes [R], chain parents.
        self.lag_surv = torch.empty(max_reqs * N, dtype=torch.float32)
        self.lag_sizes = torch.empty(max_reqs, dtype=torch.int32)
        self.lag_parents = (torch.arange(N, dtype=torch.int32) - 1).repeat(max_reqs, 1)  # [max_reqs, N]
        self.lag_weights = torch.empty(max_reqs, dtype=torch.float32)  # plan_budget(weights=), per R
        self.lag_budget = torch.empty((), dtype=torch.int32)
        self.lag_views: dict = {}
        self.surv_flat = torch.empty(max_reqs * N, dtype=torch.float32, device=device)  # record's survival
        self.plan_surv_flat = torch.empty(max_reqs * N, dtype=torch.float32, device=device)  # plan's
        self.views: dict = {}
        self.last_conf: Optional[torch.Tensor] = None

    def reset_slots(self, idx: np.ndarray) -> None:
        """New requests in slots idx: their rows go back to the prior."""
        if idx.size:
            self.surv_dev[torch.from_numpy(idx).to(self.surv_dev.device)] = \
                torch.from_numpy(self.prior_row).to(self.surv_dev.device)
            if self.shapes is not None:
                self.shapes.reset(idx)

    def view(self, which: str, R: int, n: int) -> torch.Tensor:
        key = (which, R, n)
        t = self.views.get(key)
        if t is None:
            flat = self.surv_flat if which == "record" else self.plan_surv_flat
            t = self.views[key] = flat[:R * n].view(R, n)
        return t

    # --------------------------------------------------------------------------------------------------------
    # the lagged budget (AdaptiveVerifier.plan_budget(..., tree=True))
    # --------------------------------------------------------------------------------------------------------

    def stale_survival(self, idx: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """[R, N] float32: each slot's last recorded sorted node survivals, the prior row for a slot with none."""
        if out is None:
            out = np.empty((idx.shape[0], self.N), dtype=np.float32)
        if not self.recorded:
            out[:] = self.prior_row
            return out
        prev = 1 - self.slot
        if self.events[prev] is not None:
            self.events[prev].synchronize()
        np.take(self.snap_np[prev], idx, axis=0, out=out)
        new = self.snap_gen[prev][idx] != self.slots.gen[idx]
        if new.any():
            out[new] = self.prior_row
        return out

    def lagged_budget(self, idx: np.ndarray, sizes: np.ndarray, weights: Optional[np.ndarray], cost_table,
                      extra_tokens: int, capacity: int, min_verify: int, max_step_ms: Optional[float]) -> int:
        """plan_budget(..., tree=True)'s lagged budget before the verifier's clamp: a node count (module docstring).
        idx [R] slots, sizes [R] this step's tree sizes, weights [R] host priorities or None; ``capacity`` the
        verifier's, before the prompt chunk of ``extra_tokens``."""
        R, N = idx.shape[0], self.N
        views = self.lag_views.get(R)
        if views is None:
            surv = self.lag_surv[:R * N].view(R, N)
            views = self.lag_views[R] = (surv, self.lag_sizes[:R], self.lag_parents[:R], self.lag_weights[:R],
                                         surv.numpy(), self.lag_sizes[:R].numpy())
        surv, d, parents, w, surv_np, d_np = views
        self.stale_survival(idx, out=surv_np)
        np.copyto(d_np, sizes, casting="unsafe")
        if weights is not None:
            w.numpy()[:] = weights  # persistent, as every other input: a prepared call could hold them
        return lagged_tree_budget(surv, d, parents, cost_table, prompt_tokens=extra_tokens, capacity=capacity,
                                  min_verify=min_verify, max_step_ms=max_step_ms,
                                  weights=None if weights is None else w, out=self.lag_budget)

    def plan_draft(self, idx: np.ndarray, depth_lim: np.ndarray, cost_table, mode: str, extra_tokens: int,
                   capacity: int, weights: Optional[np.ndarray], max_step_ms: Optional[float], bounds, stats):
        """AdaptiveVerifier.plan_tree_draft's (depth, width, budget): the lagged shape (verifier_tree_shape.py) in
        every mode but "all" (the whole tree: max depth, at most the table's draft_levels, width top_k) and "off"
        (nothing). The budget: the live
        modes and "all" take B_max of the nodes the shape drafts (``bounds(nodes_sum, fixed_cost)``: the verifier's
        B_max), "lagged" the lagged node budget at those tree sizes (plan_budget(tree=True)'s, clamped the same way):
        the shape decision's own B, ranked on the blended prediction, verified more than pays in the simulator
        (llama3-70b-8xh200, c=256, seed 0, 2026-12-06: 8142 tok/s against 8893 with this budget)."""
        if self.shapes is None:
            raise ValueError("plan_tree_draft needs the drafter's beam: construct the AdaptiveVerifier with "
                             "tree_top_k=k (its top-k per expanded node)")
        k, per_level = self.shapes.k, self.shapes.profiles is not None
        if mode == "off" or idx.size == 0:
            return 0, () if per_level else 1, 0
        if mode == "all":
            depth = min(int(depth_lim.max()), cost_table.draft_levels or self.shapes.D)
            width = (k,) * max(depth - 1, 0) if per_level else k
        else:  # (the decision's own budget is not used: see the docstring)
            depth, width, _ = self.shapes.decide(idx, depth_lim, cost_table, extra_tokens=extra_tokens,
                                                      capacity=capacity, weights=weights, max_step_ms=max_step_ms,
                                                      stats=stats)
        d = np.minimum(depth_lim, depth)
        # [R] nodes each request drafts: level 1 k, level l + 1 k per expanded node of level l
        expanded = np.cumsum((0,) + tuple(width)) if per_level else np.arange(depth + 1) * width
        sizes = np.minimum(np.where(d > 0, k + expanded[np.maximum(d - 1, 0)] * k, 0), self.N)
        fixed = tree_draft_cost(cost_table, idx.size, depth, width) + cost_table.request_ms * idx.size
        b_max = bounds(int(sizes.sum()), fixed)
        if mode == "lagged":
            return depth, width, min(self.lagged_budget(idx, sizes, weights, cost_table, extra_tokens, capacity, 0,
                                                        max_step_ms), b_max)
        return depth, width, b_max

    # --------------------------------------------------------------------------------------------------------
    # record_confidence and plan
    # --------------------------------------------------------------------------------------------------------

    def check(self, conf, parents, tree_sizes) -> tuple[int, int]:
        """(R, n) of a tree step's conf [R, n <= N], with parents of conf's shape and tree_sizes [R]."""
        R, n = check_conf(conf, "N", "max_nodes", self.N, self.max_reqs, self.device)
        if not isinstance(parents, torch.Tensor) or parents.shape != conf.shape:
            raise ValueError(f"parents must be an int32 tensor of conf's shape {tuple(conf.shape)}, got "
                             f"{tuple(parents.shape) if isinstance(parents, torch.Tensor) else type(parents).__name__}")
        if not isinstance(tree_sizes, torch.Tensor) or tuple(tree_sizes.shape) != (R,):
            raise ValueError(f"tree_sizes must be an int32 tensor of shape [{R}]")
        return R, n

    def record(self, conf: torch.Tensor, req_indices, parents: torch.Tensor, tree_sizes: torch.Tensor) -> None:
        """record_confidence(conf, parents=, tree_sizes=): keeps each request's sorted node survivals (tree_survival
        of conf) for the next steps' lagged budgets, and conf for observe()."""
        R, n = self.check(conf, parents, tree_sizes)
        slot = self.slot
        idx_dev = self.slots.slot_indices(req_indices, R, self.idx_pinned[slot], self.events[slot])
        if R and n:
            surv = planner.tree_survival(conf, parents, tree_sizes, out=self.view("record", R, n))  # [R, n]
            self.surv_dev[idx_dev, :n] = surv.sort(dim=1, descending=True).values
        if R and n < self.N:
            self.surv_dev[idx_dev, n:] = 0.0
        self.slots.snapshot(self.surv_dev, self.snap[slot], self.events[slot])
        self.snap_gen[slot] = self.slots.gen.copy()
        if self.shapes is not None and R:
            self.shapes.stage(conf, parents, tree_sizes, idx_dev)
        self.slot = 1 - slot
        self.recorded = True
        self.last_conf = conf

    def plan(self, calls: dict, conf, tree_sizes, parents, table, *, mode: str, budget, kw: dict) -> TreeVerifyPlan:
        """plan(..., parents=): plan_tree_verification in the verifier's mode ("greedy" and "global" live, else
        "fixed" with ``budget``) into its persistent buffers (``kw["out"]``) and this tree side's survival view, as a
        prepared call kept in ``calls`` (the buffer set's). ``kw``: the step's shared planner arguments (metadata
        inputs, capacity, padded size, weights...)."""
        R, n = self.check(conf, parents, tree_sizes)
        live = mode in ("greedy", "global")
        # int64 inputs as int32 copies, as the planner itself would (a prepared call is bound to int32 ones)
        tree_sizes, parents, ctx, bt, anchors, tokens, budget = int32_inputs(
            tree_sizes, parents, kw["context_lens"], kw["block_table"], kw["anchor_tokens"], kw["draft_tokens"], budget)
        kw = dict(kw, context_lens=ctx, block_table=bt, anchor_tokens=anchors, draft_tokens=tokens)
        # (a fixed budget is a 0-d tensor here: the caller's, or the verifier's own that a host budget goes through)
        caller_budget = budget if not live and isinstance(budget, torch.Tensor) else None
        host_budget = None if live or caller_budget is not None else budget
        key = ("tree", n, kw["draft_tokens"] is not None, kw["weights"] is not None, caller_budget is not None, live)

        def make():
            args = dict(kw, conf=conf, survival_out=self.view("plan", R, n), mode=mode if live else "fixed",
                        budget=None if live else budget)
            return prepare(planner.plan_tree_verification, None, parents, tree_sizes, table, **args).own_outputs()

        changes = dict(cost_table=table, capacity=kw["capacity"], token_offset=kw["token_offset"],
                       max_step_ms=kw["max_step_ms"], num_tokens_padded=kw["num_tokens_padded"])
        if host_budget is not None:
            changes["budget"] = host_budget
        return run_prepared(calls, key, make, conf=conf, parents=parents, drafts=tree_sizes,
                            context_lens=kw["context_lens"], block_table=kw["block_table"],
                            anchor_tokens=kw["anchor_tokens"], draft_tokens=kw["draft_tokens"],
                            weights=kw["weights"], budget=caller_budget, **changes)

    # --------------------------------------------------------------------------------------------------------
    # observe
    # --------------------------------------------------------------------------------------------------------

    def observe(self, p: TreeVerifyPlan, verify_lens: torch.Tensor, num_accepted: torch.Tensor,
                accepted_offsets: Optional[torch.Tensor], stats: AcceptanceStats) -> int:
        """observe() of a tree step: per-depth trials (module docstring) counted into ``stats`` on the device with no
        sync. ``p``: the step's plan; verify_lens [R] (the plan's), num_accepted [R] the accepted depth (nodes on
        the accepted path), accepted_offsets [R, W] tree_rejection_sample's. Returns R."""
        if self.last_conf is None or not isinstance(p, TreeVerifyPlan):
            raise RuntimeError("observe() of a tree step needs a record_confidence(parents=) and a plan(parents=) "
                               "first")
        if accepted_offsets is None:
            raise ValueError("accepted_offsets is required for a tree step (tree_rejection_sample's [R, W] output)")
        conf = self.last_conf
        R, n = conf.shape
        for name, x in (("verify_lens", verify_lens), ("num_accepted", num_accepted),
                        ("accepted_offsets", accepted_offsets)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be an int32 tensor, got {type(x).__name__}")
            if x.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name} must be an int32 or int64 tensor, got {x.dtype}")
            if x.device != self.device:
                raise ValueError(f"{name} must be on the verifier's device {self.device}, got {x.device}")
            want = 2 if name == "accepted_offsets" else 1
            if x.dim() != want or x.shape[0] < R or (want == 2 and x.shape[1] < 1):
                raise ValueError(f"{name} must have {want} dims and R >= {R} rows, got {tuple(x.shape)}")
        P = stats.num_positions
        vl = verify_lens[:R].long()
        acc = num_accepted[:R].long().clamp(min=0)  # [R] accepted depth
        offs = accepted_offsets[:R].long()  # [R, W]
        W = offs.shape[1]
        node = p.token_node.long()  # [T]
        req = p.token_req.long()
        depth = p.token_depth.long()
        qsl = p.query_start_loc.long()
        valid = (node >= 0) & (node < n) & (req >= 0) & (req < R) & (depth >= 1) & (depth <= P) & (depth < W)
        rq, nd = req.clamp(0, max(R - 1, 0)), node.clamp(0, max(n - 1, 0))
        if R and n:
            offset = torch.arange(node.shape[0], device=self.device) - (qsl[rq] - qsl[0])  # [T] offset in the block
            a = acc[rq]
            dpar, dself = (depth - 1).clamp(0, W - 1), depth.clamp(0, W - 1)
            parent_ok = (depth - 1 <= a) & (offs[rq, dpar] == p.token_parent.long())
            survived = (depth <= a) & (offs[rq, dself] == offset)
            valid = valid & parent_ok
            # One stats row per token, a single trial at position depth - 1 (the kernel's binning, fixed point and
            # NaN count): verify_lens 1 for a trial, num_accepted 1 for a survival.
            c = conf[rq, nd].unsqueeze(1)  # [T, 1] float32
            trial = valid.to(torch.int32)  # [T]
            stats.update(c, trial, (valid & survived).to(torch.int32),
                         positions=(depth - 1).clamp(0, P - 1).to(torch.int32))
        if n:  # as the kernel: a conf without columns adds nothing to the totals
            stats.totals += torch.stack([vl.sum(), torch.minimum(acc, vl).sum()])
        if self.shapes is not None:
            self.shapes.observed(stats)
        return R
