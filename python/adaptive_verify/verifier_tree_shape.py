"""The lagged tree shape of AdaptiveVerifier.plan_tree_draft (docs/design.md, "Drafting from the budget"): each
step's draft depth D, beam width W and budget B, decided on the host before drafting by
:func:`adaptive_verify.choose_tree_shape` on a prediction of this step's trees from earlier steps only.

The prediction lives in the beam layout of an EAGLE-2 drafter with top-k expansion (k = ``tree_top_k``): depth 1
holds the anchor's k children, each deeper level k children of each of the k best nodes (by path confidence) of
the level before; a position is (level, beam slot b, child rank i), b the parent's rank within its level by
survival, i the node's rank among its siblings by confidence (ties to the lower node index). Per request:

- a position's conditional confidence is OWN_WEIGHT times the request's own from its last recorded tree plus the
  rest times a batch estimate of the position, where that tree had a node there (the request's token noise does not
  carry over to the next step), else the batch estimate alone: an exponential average (weight ``AVG_WEIGHT``) over
  the requests that recorded one; every step that records nothing moves the estimates towards the prior by
  ``EXPLORE_DECAY`` (so a shape that collapsed to no drafting regrows; a drafted level's fresh confidences move
  its children sooner);
- the confidence is then scaled by the calibration of its depth and bin (accepted over predicted in the statistics
  observe() keeps; siblings and top children fall in different bins, so an overconfident head on either is
  corrected for it);
- survivals are float32 products along the path, each level's beam its k best nodes by predicted survival, the pool
  the best min(max_nodes, k + (D - 1) k^2) in the planner's order (ancestor-closed);
- nodes deeper than a request may draft this step are invalidated (negative draft ids).

Recorded trees reach the host through a pinned copy started by record_confidence (asynchronous on CUDA); the next
plan_tree_draft folds the most recent one in (waiting for its copy, long done in a running engine). A record that
a second record replaces before any plan_tree_draft is not folded. Slots that took a new request (add_request) start
from the batch estimates, and a record made before the slot changed hands is not folded into it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .planner.tree_shape import choose_tree_shape

__all__ = ["TreeShapes", "AVG_WEIGHT", "EXPLORE_DECAY"]

AVG_WEIGHT = 0.1
OWN_WEIGHT = 0.3
#: Calibration per depth and confidence bin: observed acceptance over predicted confidence, from AcceptanceStats'
#: counts (via observe) decayed by CALIB_DECAY per step and shrunk to 1 by CALIB_PRIOR pseudo-trials.
CALIB_DECAY = 0.97
CALIB_PRIOR = 4.0
EXPLORE_DECAY = 0.01


class TreeShapes:
    """Host state of the lagged tree shape for ``max_reqs`` slots: per slot the last folded confidences at each
    beam-layout position (NaN where its tree had no node), the batch estimate per position, and two pinned staging
    buffers of recorded trees."""

    def __init__(self, top_k: int, max_depth: int, max_nodes: int, max_reqs: int, prior: float,
                 device: torch.device, gen: np.ndarray, profiles: Optional[list] = None):
        self.k, self.D, self.N = k, D, N = top_k, max_depth, max_nodes
        self.profiles = profiles  # per-level width profiles (tree_widths="per_level"), or None: uniform widths
        self.counts = [k] + [k * k] * (D - 1)  # beam-layout positions per level
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.ntot = int(self.offsets[-1])
        self.level = np.repeat(np.arange(1, D + 1), self.counts)  # [ntot] 1-based depth of each position
        self.M = min(N, self.ntot)  # predicted pool per request
        self.prior = prior
        self.avg = np.full(self.ntot, prior)
        self.last = np.full((max_reqs, self.ntot), np.nan, dtype=np.float32)
        self.gen = gen  # the verifier's slot generations (add_request bumps them)
        pin = device.type == "cuda"
        self.h_conf = torch.zeros(2, max_reqs, N, dtype=torch.float32, pin_memory=pin)
        self.h_par = torch.zeros(2, max_reqs, N, dtype=torch.int32, pin_memory=pin)
        self.h_size = torch.zeros(2, max_reqs, dtype=torch.int32, pin_memory=pin)
        self.h_idx = torch.zeros(2, max_reqs, dtype=torch.int64, pin_memory=pin)
        self.events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self.staged: list = [None, None]  # (R, n, generations) of an unfolded record per buffer
        self.latest = 0
        # Calibration counts [3, D, bins]: trials, survivals, sum of conf (host; CUDA: a pinned copy per observe)
        self.bins = 0  # (the statistics' bins, known at the first calibration)
        self.cal_counts = self.cal_seen = self.decayed = None
        self.h_counts = None
        self.counts_event = torch.cuda.Event() if pin else None
        self.counts_pending = False

    def reset(self, idx: np.ndarray) -> None:
        self.last[idx] = np.nan

    def _counts(self, stats) -> torch.Tensor:
        """[3, D, bins] float64 on the statistics' device: trials, survivals and sum of conf per depth and bin."""
        if self.cal_counts is None:
            self.bins = stats.num_bins
            shape = (3, self.D, self.bins)
            self.cal_counts, self.cal_seen, self.decayed = np.zeros(shape), np.zeros(shape), np.zeros(shape)
            self.h_counts = torch.zeros(shape, dtype=torch.float64, pin_memory=self.counts_event is not None)
        rows = min(self.D, stats.num_positions)
        out = torch.zeros(3, self.D, self.bins, dtype=torch.float64, device=stats.trials.device)
        out[0, :rows] = stats.trials[:rows].double()
        out[1, :rows] = stats.survivals[:rows].double()
        out[2, :rows] = stats.conf_sum[:rows]
        return out

    def observed(self, stats) -> None:
        """After a tree observe(): on CUDA, starts the copy of the calibration counts (no sync; the next decide
        takes it if done, else the one before)."""
        if self.counts_event is not None and not self.counts_pending:
            counts = self._counts(stats)
            self.h_counts.copy_(counts, non_blocking=True)
            self.counts_event.record(torch.cuda.current_stream(stats.trials.device))
            self.counts_pending = True

    def calibration(self, stats) -> np.ndarray:
        """[D, bins] observed acceptance over predicted confidence per depth and confidence bin (module
        docstring): a head that is overconfident on siblings and not on the top child is corrected for each."""
        if self.counts_event is None:
            counts = self._counts(stats).numpy()  # (the first call sizes the arrays)
            self.cal_counts[:] = counts
        elif self.counts_pending and self.counts_event.query():
            self.cal_counts[:] = self.h_counts.numpy()
            self.counts_pending = False
        if self.cal_counts is None:  # (CUDA, nothing observed yet)
            return np.ones((self.D, 1))
        new = self.cal_counts - self.cal_seen
        if (new < 0).any():  # stats.reset()
            new = self.cal_counts.copy()
        self.cal_seen[:] = self.cal_counts
        self.decayed = self.decayed * CALIB_DECAY + new
        return (self.decayed[1] + CALIB_PRIOR) / (self.decayed[2] + CALIB_PRIOR)

    def stage(self, conf: torch.Tensor, parents: torch.Tensor, sizes: torch.Tensor, idx: torch.Tensor) -> None:
        """record_confidence's tree [R, n] (device tensors) and its slots [R]: copied to pinned host memory."""
        R, n = conf.shape
        b = 1 - self.latest
        if self.events[b] is not None:
            self.events[b].synchronize()  # its previous copy (two records ago) is done
        self.h_conf[b, :R, :n].copy_(conf, non_blocking=True)
        self.h_par[b, :R, :n].copy_(parents, non_blocking=True)
        self.h_size[b, :R].copy_(sizes, non_blocking=True)
        self.h_idx[b, :R].copy_(idx, non_blocking=True)
        if self.events[b] is not None:
            self.events[b].record(torch.cuda.current_stream(conf.device))
        self.staged[b] = (R, n, self.gen.copy())
        self.staged[1 - b] = None  # replaced before it was folded
        self.latest = b

    def fold(self) -> None:
        """The most recent staged record into the per-slot confidences and the batch estimates."""
        b = self.latest
        if self.staged[b] is None:  # nothing recorded since the last call (a step that drafted nothing)
            self.avg += EXPLORE_DECAY * (self.prior - self.avg)
            return
        R, n, gen = self.staged[b]
        self.staged[b] = None
        if self.events[b] is not None:
            self.events[b].synchronize()
        idx = self.h_idx[b, :R].numpy().copy()
        obs = self.positions(self.h_conf[b, :R, :n].numpy(), self.h_par[b, :R, :n].numpy(),
                             self.h_size[b, :R].numpy())
        ok = (idx >= 0) & (idx < self.last.shape[0])
        ok[ok] &= gen[idx[ok]] == self.gen[idx[ok]]
        self.last[idx[ok]] = obs[ok]
        seen = ~np.isnan(obs)
        cnt = seen.sum(axis=0)
        mean = np.where(seen, obs, 0.0).sum(axis=0) / np.maximum(cnt, 1)
        self.avg = np.where(cnt > 0, (1 - AVG_WEIGHT) * self.avg + AVG_WEIGHT * mean,
                            self.avg + EXPLORE_DECAY * (self.prior - self.avg))

    def positions(self, conf: np.ndarray, parents: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """[R, ntot] float32: each recorded node's confidence at its beam-layout position, NaN elsewhere (nodes past
        the size, under a bad parent or a NaN, deeper than max_depth, or outside the k-beam layout leave none)."""
        R, n = conf.shape
        k, rows = self.k, np.arange(R)[:, None]
        conf = np.clip(conf, 0.0, 1.0).astype(np.float32)
        par = parents.astype(np.int64)
        root = par == -1
        ok_p = (par >= 0) & (par < np.arange(n)[None, :])  # parents precede their children
        pc = np.where(ok_p, par, 0)
        base = (np.arange(n)[None, :] < np.asarray(sizes)[:, None]) & ~np.isnan(conf) & (root | ok_p)
        # Depth by depth (a node's values are final once its parent's are: D + 1 passes cover every node up to
        # max_depth, and deeper nodes get no position anyway).
        valid, level = base & root, np.ones((R, n), dtype=np.int64)
        surv = np.where(root, conf, np.float32(0.0))
        for _ in range(self.D):
            valid = base & (root | valid[rows, pc])
            level = np.where(root, 1, level[rows, pc] + 1)
            surv = np.where(root, np.float32(1.0), surv[rows, pc]) * conf
        q_lt_j = np.arange(n)[None, :, None] < np.arange(n)[None, None, :]  # [1, q, j]: q < j

        def rank(key, group):  # [R, n]: j's rank among valid q of the same group, key descending, ties to lower q
            same = valid[:, :, None] & (group[:, :, None] == group[:, None, :])
            before = (key[:, :, None] > key[:, None, :]) | ((key[:, :, None] == key[:, None, :]) & q_lt_j)
            return (same & before).sum(axis=1)

        beam = rank(surv, level)  # by path survival within the level
        child = rank(conf, np.where(valid, parents, -2))  # by own confidence among siblings
        at = np.where(root, child, self.offsets[np.clip(level - 1, 0, self.D - 1)] + beam[rows, pc] * k + child)
        fits = valid & (level <= self.D) & (child < k) & (root | (beam[rows, pc] < k))
        pos = np.where(fits & root, at, -1)
        for _ in range(self.D - 1):  # a position needs its parent's
            pos = np.where(fits & (root | (pos[rows, pc] >= 0)), at, -1)
        obs = np.full((R, self.ntot), np.nan, dtype=np.float32)
        r_idx, j_idx = np.nonzero(pos >= 0)
        obs[r_idx, pos[r_idx, j_idx]] = conf[r_idx, j_idx]
        return obs

    def predict(self, idx: np.ndarray, depth_lim: np.ndarray, calib: Optional[np.ndarray] = None):
        """(survival [R, M] float32, parents [R, M] int32, sizes [R] int32, ids [R, M] int32): the predicted pool
        of the requests in slots idx, ``depth_lim`` [R] the deepest level each may draft (module docstring)."""
        k, R = self.k, idx.size
        rows = np.arange(R)[:, None]
        last = self.last[idx]
        avg = self.avg[None, :].astype(np.float32)
        conf = np.where(np.isnan(last), avg, OWN_WEIGHT * np.nan_to_num(last) + (1 - OWN_WEIGHT) * avg)  # [R, ntot]
        if calib is not None:  # [D, bins]: by each position's depth and its predicted confidence's bin
            bins = calib.shape[1]
            b = np.clip((conf * bins).astype(np.int64), 0, bins - 1)
            factor = calib[self.level - 1][np.arange(self.ntot)[None, :], b]  # [R, ntot]
            conf = np.minimum(conf * factor.astype(np.float32), np.float32(1.0))
        surv = np.empty((R, self.ntot), dtype=np.float32)
        parent = np.full((R, self.ntot), -1, dtype=np.int64)  # beam-layout index of the parent
        surv[:, :k] = conf[:, :k]
        for j in range(1, self.D):
            lo, prev = self.offsets[j], self.offsets[j - 1]
            top = np.argsort(-surv[:, prev:lo], axis=1, kind="stable")[:, :k]  # [R, k]: the beam, in slot order
            child = conf[:, lo:lo + k * k].reshape(R, k, k)
            surv[:, lo:lo + k * k] = (surv[rows, prev + top][:, :, None] * child).reshape(R, k * k)
            parent[:, lo:lo + k * k] = np.repeat(prev + top, k, axis=1)
        order = np.argsort(-surv, axis=1, kind="stable")[:, :self.M]  # rank order (ties: the shallower)
        rank = np.full((R, self.ntot + 1), -1, dtype=np.int64)  # column ntot: the anchor's (-1) rank, -1
        rank[rows, order] = np.arange(self.M)
        parents = rank[rows, parent[rows, order]].astype(np.int32)
        ids = np.where(self.level[order] <= depth_lim[:, None], np.arange(self.M)[None, :], -1).astype(np.int32)
        return surv[rows, order], parents, np.full(R, self.M, dtype=np.int32), ids

    def decide(self, idx: np.ndarray, depth_lim: np.ndarray, cost_table, *, extra_tokens: int, capacity: int,
               weights: Optional[np.ndarray], max_step_ms: Optional[float], stats=None) -> tuple[int, object, int]:
        """(depth, width, budget) of this step: the staged record folded in, then choose_tree_shape (its CPU
        kernel: everything here is host data) on the prediction, at most the table's draft_levels deep. width: an
        int, or with per-level profiles the tuple of levels 1 .. depth - 1's widths."""
        self.fold()
        survival, parents, sizes, ids = self.predict(idx, depth_lim,
                                                     None if stats is None else self.calibration(stats))
        w = None if weights is None else torch.from_numpy(np.asarray(weights, dtype=np.float32))
        d_hi = min(self.D, cost_table.draft_levels or self.D)  # (the table's)
        beams = dict(max_width=self.k) if self.profiles is None else dict(widths=self.profiles)
        d, width, b = choose_tree_shape(torch.from_numpy(survival), torch.from_numpy(parents),
                                        torch.from_numpy(sizes), cost_table, **beams, max_depth=d_hi,
                                        extra_tokens=extra_tokens, capacity=capacity, weights=w,
                                        max_step_ms=max_step_ms, draft_tokens=torch.from_numpy(ids))
        if self.profiles is not None:
            return int(d), tuple(width.tolist()[:max(int(d) - 1, 0)]), int(b)
        return int(d), int(width), int(b)
