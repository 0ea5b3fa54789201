"""Draft trees in AdaptiveVerifier (docs/design.md, "Draft trees" and "What engines rely on every step").

A verifier built with ``max_nodes=N`` (1..63) also serves steps whose requests draft trees; the verifier's
methods take the tree through small hooks and land here:

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

from typing import Optional

import numpy as np
import torch

from . import planner
from ._checks import check_int
from .calibration import OnlineSTS
from .planner import MAX_TREE_NODES, TreeVerifyPlan
from .stats import AcceptanceStats

__all__ = ["TreeState", "lagged_budget", "observe", "plan", "record_confidence", "state"]


class TreeState:
    """The tree side of one AdaptiveVerifier: the slot table of sorted node survivals (device, two pinned host
    snapshots), the lagged budget's host inputs and the last recorded tree (plan buffers are the verifier's)."""

    def __init__(self, v, max_nodes: int):
        self.N = N = check_int("max_nodes", max_nodes, lo=1, hi=MAX_TREE_NODES)
        positions = max(v.max_drafts, N)
        if positions > v.stats.num_positions:  # a depth is at most N: the per-depth stats need N positions
            v.stats = AcceptanceStats(positions, device=v.device)
            if v.sts is not None:
                v.sts = OnlineSTS(positions, refresh_every=v.sts.refresh_every, device=v.device)
        pin = v.device.type == "cuda"
        # [N] survivals of a slot with no history: a chain of nodes of confidence `prior` each.
        self.prior_row = np.cumprod(np.full(N, v.prior, dtype=np.float32)).astype(np.float32)
        prior = torch.from_numpy(self.prior_row)
        self.surv_dev = prior.to(v.device).repeat(v.max_reqs, 1)  # [max_reqs, N]
        self.snap = prior.repeat(2, v.max_reqs, 1)  # [2, max_reqs, N]
        if pin:
            self.snap = self.snap.pin_memory()
        self.snap_np = self.snap.numpy()
        self.snap_gen = [v.slots.gen.copy(), v.slots.gen.copy()]
        self.events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self.idx_pinned = torch.zeros(2, v.max_reqs, dtype=torch.int64, pin_memory=pin)
        self.slot = 0
        self.recorded = False
        # Lagged budget inputs (host, persistent per R): sorted survivals [R, N], tree sizes [R], chain parents.
        self.lag_surv = torch.empty(v.max_reqs * N, dtype=torch.float32)
        self.lag_sizes = torch.empty(v.max_reqs, dtype=torch.int32)
        self.lag_parents = (torch.arange(N, dtype=torch.int32) - 1).repeat(v.max_reqs, 1)  # [max_reqs, N]
        self.lag_budget = torch.empty((), dtype=torch.int32)
        self.lag_views: dict = {}
        self.surv_flat = torch.empty(v.max_reqs * N, dtype=torch.float32, device=v.device)  # record's survival
        self.plan_surv_flat = torch.empty(v.max_reqs * N, dtype=torch.float32, device=v.device)  # plan's
        self.views: dict = {}
        self.last_conf: Optional[torch.Tensor] = None

    def reset_slots(self, idx: np.ndarray) -> None:
        """New requests in slots idx: their rows go back to the prior."""
        if idx.size:
            self.surv_dev[torch.from_numpy(idx).to(self.surv_dev.device)] = \
                torch.from_numpy(self.prior_row).to(self.surv_dev.device)

    def view(self, which: str, R: int, n: int) -> torch.Tensor:
        key = (which, R, n)
        t = self.views.get(key)
        if t is None:
            flat = self.surv_flat if which == "record" else self.plan_surv_flat
            t = self.views[key] = flat[:R * n].view(R, n)
        return t


# ------------------------------------------------------------------------------------------------------------
# the lagged budget (AdaptiveVerifier.plan_budget(..., tree=True))
# ------------------------------------------------------------------------------------------------------------


def stale_survival(v, idx: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """[R, N] float32: each slot's last recorded sorted node survivals, the prior row for a slot with none."""
    t = state(v)
    if out is None:
        out = np.empty((idx.shape[0], t.N), dtype=np.float32)
    if not t.recorded:
        out[:] = t.prior_row
        return out
    prev = 1 - t.slot
    if t.events[prev] is not None:
        t.events[prev].synchronize()
    np.take(t.snap_np[prev], idx, axis=0, out=out)
    new = t.snap_gen[prev][idx] != v.slots.gen[idx]
    if new.any():
        out[new] = t.prior_row
    return out


def lagged_budget(v, t: TreeState, idx, sizes, extra_tokens, b_min, b_max, weights=None) -> int:
    """AdaptiveVerifier.plan_budget(..., tree=True)'s lagged budget: a node count (module docstring)."""
    R = idx.shape[0]
    views = t.lag_views.get(R)
    if views is None:
        surv = t.lag_surv[:R * t.N].view(R, t.N)
        views = t.lag_views[R] = (surv, t.lag_sizes[:R], t.lag_parents[:R], surv.numpy(), t.lag_sizes[:R].numpy())
    surv, d, parents, surv_np, d_np = views
    stale_survival(v, idx, out=surv_np)
    np.copyto(d_np, sizes, casting="unsafe")
    table = v.cost_table.shifted(extra_tokens) if extra_tokens else v.cost_table
    planner.choose_budget(surv, d, table, mode="global", min_verify=v.min_verify, capacity=v.capacity - extra_tokens,
                          out=t.lag_budget, max_step_ms=v.max_step_ms, parents=parents,
                          weights=None if weights is None else torch.from_numpy(weights))
    return min(max(int(t.lag_budget), b_min), b_max)


# ------------------------------------------------------------------------------------------------------------
# record_confidence
# ------------------------------------------------------------------------------------------------------------


def _check_tree(v, t: TreeState, conf, parents, tree_sizes) -> tuple[int, int]:
    R, n = v._check_conf(conf, "N", "max_nodes", t.N)
    if not isinstance(parents, torch.Tensor) or parents.shape != conf.shape:
        raise ValueError(f"parents must be an int32 tensor of conf's shape {tuple(conf.shape)}, got "
                         f"{tuple(parents.shape) if isinstance(parents, torch.Tensor) else type(parents).__name__}")
    if not isinstance(tree_sizes, torch.Tensor) or tuple(tree_sizes.shape) != (R,):
        raise ValueError(f"tree_sizes must be an int32 tensor of shape [{R}]")
    return R, n


def record_confidence(v, conf: torch.Tensor, req_indices, parents: torch.Tensor, tree_sizes: torch.Tensor) -> None:
    """AdaptiveVerifier.record_confidence(conf, parents=, tree_sizes=): keeps each request's sorted node survivals
    (tree_survival of conf) for the next steps' lagged budgets, and conf for observe()."""
    t = state(v)
    R, n = _check_tree(v, t, conf, parents, tree_sizes)
    slot = t.slot
    idx_dev = v.slots.slot_indices(req_indices, R, t.idx_pinned[slot], t.events[slot])
    if R and n:
        surv = planner.tree_survival(conf, parents, tree_sizes, out=t.view("record", R, n))  # [R, n], 0 past sizes
        t.surv_dev[idx_dev, :n] = surv.sort(dim=1, descending=True).values
    if R and n < t.N:
        t.surv_dev[idx_dev, n:] = 0.0
    v.slots.snapshot(t.surv_dev, t.snap[slot], t.events[slot])
    t.snap_gen[slot] = v.slots.gen.copy()
    t.slot = 1 - slot
    t.recorded = True
    t.last_conf = conf
    v._last_conf = conf


# ------------------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------------------


def plan(v, conf, tree_sizes, context_lens, block_table, anchor_tokens, draft_tokens, budget, *, extra_tokens,
         padded_tokens, token_offset, weights, parents) -> TreeVerifyPlan:
    """AdaptiveVerifier.plan(..., parents=): plan_tree_verification in the verifier's mode and persistent buffers."""
    t = state(v)
    R, n = _check_tree(v, t, conf, parents, tree_sizes)
    wants = (context_lens is not None, block_table is not None, anchor_tokens is not None)
    out, budget, padded_tokens, extra_tokens = v._step_buffers(R, budget, extra_tokens, padded_tokens, wants, t.N,
                                                               TreeVerifyPlan)
    table = v.cost_table.shifted(extra_tokens) if extra_tokens and R else v.cost_table
    kw = dict(min_verify=v.min_verify, context_lens=context_lens, block_table=block_table,
              block_size=v.block_size if block_table is not None else None, anchor_tokens=anchor_tokens,
              draft_tokens=draft_tokens, token_offset=token_offset, num_tokens_padded=padded_tokens, out=out,
              capacity=v.capacity - extra_tokens, conf=conf, survival_out=t.view("plan", R, n),
              max_step_ms=v.max_step_ms, weights=weights)
    if v.mode in ("greedy", "global"):
        result = planner.plan_tree_verification(None, parents, tree_sizes, table, mode=v.mode, **kw)
    else:
        result = planner.plan_tree_verification(None, parents, tree_sizes, table, mode="fixed", budget=budget, **kw)
    v._last_plan = result
    return result


# ------------------------------------------------------------------------------------------------------------
# observe
# ------------------------------------------------------------------------------------------------------------


def observe(v, verify_lens: torch.Tensor, num_accepted: torch.Tensor, accepted_offsets: Optional[torch.Tensor]) -> None:
    """AdaptiveVerifier.observe for a tree step: per-depth trials (see the module docstring), on the device with
    no sync. verify_lens [R] (the plan's), num_accepted [R] the accepted depth (nodes on the accepted path),
    accepted_offsets [R, W] tree_rejection_sample's."""
    t = state(v)
    p = v._last_plan
    if t.last_conf is None or not isinstance(p, TreeVerifyPlan):
        raise RuntimeError("observe() of a tree step needs a record_confidence(parents=) and a plan(parents=) first")
    if accepted_offsets is None:
        raise ValueError("accepted_offsets is required for a tree step (tree_rejection_sample's [R, W] output)")
    conf = t.last_conf
    R, n = conf.shape
    for name, x in (("verify_lens", verify_lens), ("num_accepted", num_accepted),
                    ("accepted_offsets", accepted_offsets)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be an int32 tensor, got {type(x).__name__}")
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32 or int64 tensor, got {x.dtype}")
        if x.device != v.device:
            raise ValueError(f"{name} must be on the verifier's device {v.device}, got {x.device}")
        want = 2 if name == "accepted_offsets" else 1
        if x.dim() != want or x.shape[0] < R or (want == 2 and x.shape[1] < 1):
            raise ValueError(f"{name} must have {want} dims and R >= {R} rows, got {tuple(x.shape)}")
    stats = v.stats
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
    if R == 0 or n == 0:
        valid = torch.zeros_like(valid)
    else:
        offset = torch.arange(node.shape[0], device=v.device) - (qsl[rq] - qsl[0])  # [T] offset within the block
        a = acc[rq]
        dpar, dself = (depth - 1).clamp(0, W - 1), depth.clamp(0, W - 1)
        parent_ok = (depth - 1 <= a) & (offs[rq, dpar] == p.token_parent.long())
        survived = (depth <= a) & (offs[rq, dself] == offset)
        valid = valid & parent_ok
        # One stats row per token, a single trial at position depth - 1 (the kernel's binning, fixed point and NaN
        # count): verify_lens 1 for a trial, num_accepted 1 for a survival.
        c = conf[rq, nd].unsqueeze(1)  # [T, 1] float32
        trial = valid.to(torch.int32)  # [T]
        stats.update(c, trial, (valid & survived).to(torch.int32),
                     positions=(depth - 1).clamp(0, P - 1).to(torch.int32))
    if n:  # as the kernel: a conf without columns adds nothing to the totals
        stats.totals += torch.stack([vl.sum(), torch.minimum(acc, vl).sum()])
    if v.sts is not None:
        v.sts.step(stats)
    v._add_expected(p.expected_tokens)
    v._rows += R
    v._steps += 1


def state(v) -> TreeState:
    t = v._tree
    if t is None:
        raise ValueError("this AdaptiveVerifier serves chains only: construct it with max_nodes=N to pass trees")
    return t
