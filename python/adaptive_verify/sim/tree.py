"""Draft trees in the simulator: the tree drafter model, its drafting cost, and the acceptance walk.

The model (docs/simulator.md, "Draft trees"), one tree per decoding request per step:

- Shape, EAGLE-2 style: depth 1 holds the drafter's top-k tokens after the anchor; at each further depth the
  k nodes of the previous depth with the highest path confidence (the beam) each get their top-k children,
  so a tree of depth D has k + (D - 1) k^2 nodes, D = min(max_depth, remaining output - 1). The planner's
  pool is the best ``max_nodes`` (<= 63) of them by path confidence, ties to the shallower node: node index
  is the rank, so every prefix of the pool is ancestor-closed and ``eagle2-N`` verifies nodes 0..N-1.
- Acceptance: each expanded node (a context) has a top alternative whose probability of matching the target's
  sample is the chain model's, p1 = sigmoid(logit(conditional[j]) + d_r + e) at depth j, with e fresh per context.
  The i-th alternative (i >= 2) matches with p_i = (1 - p1) * s * (1 - s)^(i - 2), s = ``sibling_share``: the
  residual mass split geometrically, so the k events are disjoint and sum to at most 1 (a target sample outside
  the top-k matches none). The target's sample at a context is one uniform u: alternative i matches iff
  u lies in [p1 + .. + p_{i-1}, p1 + .. + p_i).
- The head: each node's confidence is sigmoid((logit(p_i) + n) / head_temperature + head_bias) with
  n ~ N(0, head_noise), as the chain model's. Path confidence (survival) is the float32 product along the path,
  :func:`adaptive_verify.tree_survival`'s.
- Common random numbers: the path of rank-1 nodes from the anchor (the main path) uses the chain model's draws
  of the step (its e, n and u at depth j), so with top_k = 1 a tree is the chain and gives the chain's numbers
  bit for bit; every other context and node draws from a second stream of fixed shape [c, D, k(, k)].

Drafting cost (``draft_cost``, per step of R requests drafting a deepest tree of D levels):

- "levels" (default): the drafter runs one forward per level, EAGLE-2's expansion. A chain drafter's forward
  costs ``draft_cost(rows) / K`` (the profile's draft cost is K forwards): level 1 over R rows, levels 2..D
  over the R*k beam rows. A block drafter drafts the main path in its one block pass (``draft_cost(R)``, the
  chain's cost) and the other k - 1 beam branches level by level: D - 1 forwards over R*(k - 1) rows, each a
  whole ``draft_cost(rows)`` (one forward of that drafter). With k = 1 both are the chain's cost.
- "chain": a tree costs what the chain costs (an optimistic bound: what trees gain before paying to draft them).

Not modelled: tree attention's extra cost over a chain of as many tokens (a verified node costs a token), and
that one-hot matching accepts less than the chain's rejection sampling at temperature > 0 (the top node's
match probability is the chain's acceptance probability, exact at temperature 0, optimistic above).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from ..planner import MAX_TREE_NODES

__all__ = ["TreeModel", "DraftTrees", "TREE_DRAFT_COSTS", "draft_trees", "tree_draft_ms", "accepted_depths"]

TREE_DRAFT_COSTS = ("levels", "chain")


@dataclass(frozen=True)
class TreeModel:
    """top_k: alternatives per expanded node and the beam width (1..16); max_depth: deepest level (None: the
    profile's num_drafts, at most it); max_nodes: the planner's pool per request (1..63); sibling_share: s in
    p_i = (1 - p1) s (1 - s)^(i - 2) (in (0, 1)); draft_cost: "levels" or "chain" (module docstring)."""

    top_k: int = 4
    max_depth: Optional[int] = None
    max_nodes: int = MAX_TREE_NODES
    sibling_share: float = 0.5
    draft_cost: str = "levels"

    def __post_init__(self):
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16:
            raise ValueError(f"tree.top_k must be an int in [1, 16], got {k!r}")
        d = self.max_depth
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"tree.max_depth must be an int >= 1 or None, got {d!r}")
        n = self.max_nodes
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TREE_NODES:
            raise ValueError(f"tree.max_nodes must be an int in [1, {MAX_TREE_NODES}], got {n!r}")
        s = self.sibling_share
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0.0 < s < 1.0:
            raise ValueError(f"tree.sibling_share must be a number in (0, 1), got {s!r}")
        object.__setattr__(self, "sibling_share", float(s))
        if self.draft_cost not in TREE_DRAFT_COSTS:
            raise ValueError(f"tree.draft_cost must be one of {TREE_DRAFT_COSTS}, got {self.draft_cost!r}")

    def depth(self, num_drafts: int) -> int:
        """The deepest level for a profile drafting num_drafts (the chain model has no positions past it)."""
        if self.max_depth is None:
            return num_drafts
        if self.max_depth > num_drafts:
            raise ValueError(f"tree.max_depth must be <= the profile's drafter.num_drafts = {num_drafts} (the "
                             f"acceptance model's positions), got {self.max_depth}")
        return self.max_depth

    def num_nodes(self, depth: int) -> int:
        """Nodes of a full tree of ``depth`` levels: k + (depth - 1) k^2."""
        return self.top_k + (depth - 1) * self.top_k ** 2

    def pool_size(self, depth: int) -> int:
        return min(self.max_nodes, self.num_nodes(depth))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DraftTrees:
    """One step's trees, R requests, pool of M nodes in rank order (node index = rank by path confidence).

    survival [R, M] float32 path confidence (0 past sizes); parents [R, M] int32 (-1: the anchor; also past
    sizes); sizes [R] int32 nodes in the pool; order [R, M] int64 the full tree's index of each pool node;
    full: per level d (0-based) the full tree's arrays, for the acceptance walk: parent [R, n_d] (index into
    level d - 1, -1 at level 0) and matched [R, n_d] bool (the target's sample at the parent's context is this
    node's token)."""

    survival: np.ndarray
    parents: np.ndarray
    sizes: np.ndarray
    order: np.ndarray
    level_parent: list
    level_matched: list
    level_offset: list


def _head(logit: np.ndarray, noise: np.ndarray, temperature: float, bias: float) -> np.ndarray:
    # The chain model's exact expression (engine.simulate), so main-path confidences match it bit for bit.
    if temperature == 1.0 and bias == 0.0:
        return 1.0 / (1.0 + np.exp(-(logit + noise)))
    return 1.0 / (1.0 + np.exp(-((logit + noise) / temperature + bias)))


def _alternatives(z: np.ndarray, k: int, share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For contexts with top-alternative logit z [...]: (probabilities [..., k], logits [..., k], lower cumulative
    bounds [..., k]). The top logit is z itself (not logit(sigmoid(z))), so the main path is the chain's."""
    p1 = 1.0 / (1.0 + np.exp(-z))
    probs = np.empty(z.shape + (k,))
    probs[..., 0] = p1
    if k > 1:
        geo = share * (1.0 - share) ** np.arange(k - 1)  # [k - 1]
        probs[..., 1:] = (1.0 - p1)[..., None] * geo
    logits = np.empty_like(probs)
    logits[..., 0] = z
    if k > 1:
        rest = probs[..., 1:]
        with np.errstate(divide="ignore"):  # p1 rounding to 1 leaves a sibling p = 0: logit -inf, confidence 0
            logits[..., 1:] = np.log(rest) - np.log1p(-rest)
    lower = np.zeros_like(probs)
    if k > 1:
        lower[..., 1:] = np.cumsum(probs[..., :-1], axis=-1)
    return probs, logits, lower


def draft_trees(tree: TreeModel, depth: int, mu: np.ndarray, difficulty: np.ndarray, z_main: np.ndarray,
                head_main: np.ndarray, uni_main: np.ndarray, eps_t: np.ndarray, head_t: np.ndarray,
                uni_t: np.ndarray, depth_lim: np.ndarray, head_temperature: float = 1.0,
                head_bias: float = 0.0) -> DraftTrees:
    """This step's trees for R requests (module docstring).

    mu [>= depth] median conditional logits; difficulty [R]; z_main / head_main / uni_main [R, >= depth]: the chain
    model's true logits, head noise (already scaled) and uniforms; eps_t [R, depth, k] (scaled by token_sigma),
    head_t [R, depth, k, k] (scaled by head_noise), uni_t [R, depth, k]: the tree stream's draws; depth_lim [R]:
    deepest level each request may draft (0: no tree)."""
    k, R = tree.top_k, z_main.shape[0]
    rows = np.arange(R)[:, None]
    surv_levels, depth_levels, parent_levels, matched_levels = [], [], [], []
    # Level 1: the anchor's context is the main path's (the chain's draws at depth 0).
    probs, logits, lower = _alternatives(z_main[:, 0], k, tree.sibling_share)  # [R, k]
    noise = np.empty((R, k))
    noise[:, 0] = head_main[:, 0]
    noise[:, 1:] = head_t[:, 0, 0, 1:]
    surv = _head(logits, noise, head_temperature, head_bias).astype(np.float32)  # [R, k] (anchor survives 1)
    u = uni_main[:, 0:1]
    matched = (u >= lower) & (u < lower + probs)
    main = np.zeros((R, k), dtype=bool)
    main[:, 0] = True
    surv_levels.append(surv)
    parent_levels.append(np.full((R, k), -1, dtype=np.int64))
    matched_levels.append(matched)
    for j in range(1, depth):
        # The beam: the previous level's k best nodes by path confidence (ties to the lower index).
        beam = np.argsort(-surv, axis=1, kind="stable")[:, :k]  # [R, k]
        beam_surv = surv[rows, beam]  # [R, k]
        beam_main = main[rows, beam]  # [R, k]: at most one True (the main path's node, if in the beam)
        z = mu[j] + difficulty[:, None] + eps_t[:, j, :]  # [R, k] off-path contexts
        z = np.where(beam_main, z_main[:, j:j + 1], z)
        u = np.where(beam_main, uni_main[:, j:j + 1], uni_t[:, j, :])  # [R, k]
        probs, logits, lower = _alternatives(z, k, tree.sibling_share)  # [R, k, k]
        noise = head_t[:, j].copy()  # [R, k, k]
        noise[:, :, 0] = np.where(beam_main, head_main[:, j:j + 1], noise[:, :, 0])
        conf = _head(logits, noise, head_temperature, head_bias).astype(np.float32)
        surv = (beam_surv[:, :, None] * conf).reshape(R, k * k)  # float32 product, parent first: tree_survival's
        matched = ((u[:, :, None] >= lower) & (u[:, :, None] < lower + probs)).reshape(R, k * k)
        main = np.zeros((R, k, k), dtype=bool)
        main[:, :, 0] = beam_main
        main = main.reshape(R, k * k)
        surv_levels.append(surv)
        parent_levels.append(np.repeat(beam, k, axis=1))
        matched_levels.append(matched)
    # The pool: every node of every level, ranked by (allowed, survival desc, depth, index).
    counts = [s.shape[1] for s in surv_levels]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    all_surv = np.concatenate(surv_levels, axis=1)  # [R, Ntot]
    all_depth = np.concatenate([np.full(n, d + 1) for d, n in enumerate(counts)])  # [Ntot]
    all_parent = np.concatenate([np.where(p < 0, -1, p + offsets[max(d - 1, 0)]) for d, p in enumerate(parent_levels)],
                                axis=1)  # [R, Ntot] full-tree index of the parent
    allowed = all_depth[None, :] <= depth_lim[:, None]  # [R, Ntot]
    ntot = all_surv.shape[1]
    idx = np.broadcast_to(np.arange(ntot), (R, ntot))
    order = np.lexsort((idx, np.broadcast_to(all_depth, (R, ntot)), -all_surv, ~allowed), axis=-1)
    M = tree.pool_size(depth)
    order = order[:, :M]  # [R, M]
    sizes = np.minimum(allowed.sum(axis=1), M).astype(np.int32)
    inside = np.arange(M)[None, :] < sizes[:, None]  # [R, M]
    rank = np.full((R, ntot), -1, dtype=np.int64)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(M), (R, M)), axis=1)
    gp = all_parent[rows, order]  # [R, M] full index of each pool node's parent
    parents = np.where(gp < 0, -1, rank[rows, np.maximum(gp, 0)])
    parents = np.where(inside, parents, -1).astype(np.int32)
    survival = np.where(inside, all_surv[rows, order], np.float32(0.0)).astype(np.float32)
    return DraftTrees(survival=survival, parents=parents, sizes=sizes, order=order, level_parent=parent_levels,
                      level_matched=matched_levels, level_offset=list(offsets[:-1]))


def accepted_depths(trees: DraftTrees, verified: np.ndarray) -> np.ndarray:
    """Accepted nodes per request [R] (the accepted path's depth) given verified [R, M] bool over the pool: the
    sample-and-match walk from the anchor, which moves to the child carrying the target's sample if it is
    verified and stops otherwise."""
    R, M = verified.shape
    rows = np.arange(R)[:, None]
    ntot = trees.level_offset[-1] + trees.level_matched[-1].shape[1]
    full = np.zeros((R, ntot), dtype=bool)
    np.put_along_axis(full, trees.order, verified, axis=1)
    accepted = np.zeros(R, dtype=np.int64)
    reached = None
    for d, (parent, matched) in enumerate(zip(trees.level_parent, trees.level_matched)):
        off = trees.level_offset[d]
        ok = full[:, off:off + matched.shape[1]] & matched
        if reached is not None:
            ok &= reached[rows, parent]
        accepted += ok.any(axis=1)
        reached = ok
    return accepted


def tree_draft_ms(tree: TreeModel, cost_table, R: int, depth: int, chain_drafter: bool, num_drafts: int) -> float:
    """Milliseconds to draft this step's trees: R requests, the deepest tree ``depth`` levels (module docstring)."""
    if R == 0 or depth == 0:
        return 0.0 if chain_drafter or R == 0 else cost_table.draft_cost(R)
    k = tree.top_k
    if tree.draft_cost == "chain" or k == 1:  # the chain's cost, as engine.simulate prices it
        return cost_table.draft_cost(R) * (float(depth / num_drafts) if chain_drafter else 1.0)
    if chain_drafter:
        return (cost_table.draft_cost(R) + (depth - 1) * cost_table.draft_cost(R * k)) / num_drafts
    return cost_table.draft_cost(R) + (depth - 1) * cost_table.draft_cost(R * (k - 1))

