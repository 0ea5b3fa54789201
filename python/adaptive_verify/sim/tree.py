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
  u lies in [p1 + .. + p_{i-1}, p1 + .. + p_i) (computed as: the top iff u < p1, the chain's test; else rank
  2 + floor(log(1 - t) / log(1 - s)) with t = (u - p1) / (1 - p1), none past k).
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
  chain's cost) and the other k - 1 beam branches level by level: D - 1 forwards over R*(k - 1) single-token
  rows, each priced as a block forward over as many tokens, ``draft_cost(ceil(R*(k - 1) / K))`` (a block forward
  at r requests runs r*K tokens). With k = 1 both are the chain's cost.
- "chain": a tree costs what the chain costs (an optimistic bound: what trees gain before paying to draft them).

The planner prices a step with the profile's cost table, whose drafter term is the chain's (Theta's fixed term,
as for a chain drafter's shorter chains); the simulated step pays the tree's drafting cost above.

Not modelled: tree attention's extra cost over a chain of as many tokens (a verified node costs a token), and
that one-hot matching accepts less than the chain's rejection sampling at temperature > 0 (the top node's
match probability is the chain's acceptance probability, exact at temperature 0, optimistic above).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from ..cost import tree_draft_cost
from ..planner import MAX_TREE_NODES
from ..verifier_tree import TREE_WIDTHS

__all__ = ["TreeModel", "DraftTrees", "TREE_DRAFT_COSTS", "draft_trees", "tree_draft_ms", "accepted_depths"]

TREE_DRAFT_COSTS = ("levels", "chain")


@dataclass(frozen=True)
class TreeModel:
    """top_k: alternatives per expanded node and the beam width (1..16); max_depth: deepest level (None: the
    profile's num_drafts, at most it); max_nodes: the planner's pool per request (1..63); sibling_share: s in
    p_i = (1 - p1) s (1 - s)^(i - 2) (in (0, 1)); draft_cost: "levels" or "chain" (module docstring); widths: the
    adaptive tree policies' beams, "uniform" (one width for every level) or "per_level" (AdaptiveVerifier's
    tree_widths)."""

    top_k: int = 4
    max_depth: Optional[int] = None
    max_nodes: int = MAX_TREE_NODES
    sibling_share: float = 0.5
    draft_cost: str = "levels"
    widths: str = "uniform"

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
        if self.widths not in TREE_WIDTHS:
            raise ValueError(f"tree.widths must be 'uniform' or 'per_level', got {self.widths!r}")

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

    survival [R, M] float32 path confidence (0 past sizes); conf [R, M] float32 each node's own (conditional)
    confidence, the head's output an engine records (0 past sizes; survival is its float32 product along the path,
    parent first, as :func:`adaptive_verify.tree_survival` computes it); parents [R, M] int32 (-1: the anchor; also past
    sizes); sizes [R] int32 nodes in the pool; order [R, M] int64 the full tree's index of each pool node. For the
    acceptance walk, per level d (0-based) of the full tree (levels concatenated, level d from level_offset[d]):
    level_parent[d] [R, n_d] int64 the parent's index within level d - 1 (-1 at level 0) and level_matched[d]
    [R, n_d] bool (the target's sample at the parent's context is this node's token)."""

    survival: np.ndarray
    conf: np.ndarray
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


def _sibling_logits(z: np.ndarray, geo: np.ndarray) -> np.ndarray:
    """Logits of the alternatives of rank 2..k [..., k - 1] at contexts whose top alternative has logit z [...]:
    p_i = (1 - p1) * geo[i - 2], geo[m] = s (1 - s)^m."""
    p = (1.0 / (1.0 + np.exp(z)))[..., None] * geo  # 1 - p1 = sigmoid(-z)
    with np.errstate(divide="ignore"):  # p1 rounding to 1 leaves p = 0: logit -inf, confidence 0
        return np.log(p) - np.log1p(-p)


def _matched_rank(z: np.ndarray, u: np.ndarray, k: int, share: float) -> np.ndarray:
    """0-based rank of the alternative the target's sample (uniform u) matches at contexts with top logit z, or k
    for none: rank 0 iff u < p1 (the chain model's test, same expression), else the geometric split of the
    residual: with t = (u - p1) / (1 - p1), rank 1 + floor(log(1 - t) / log(1 - s)). One rank per context, so
    sibling matches are disjoint by construction."""
    p1 = 1.0 / (1.0 + np.exp(-z))
    top = u < p1
    if k == 1:
        return np.where(top, 0, 1)
    # Where top holds, t < 0 and the rank is unused; elsewhere 1 - p1 > 0 (u < 1), and t < 1 but for rounding.
    t = np.minimum((u - p1) / np.maximum(1.0 - p1, 1e-300), 1.0)
    with np.errstate(divide="ignore"):  # t = 1: log1p(-1) = -inf, rank +inf, clipped to k (none)
        rank = 1.0 + np.floor(np.log1p(-t) / np.log1p(-share))
    return np.where(top, 0, np.minimum(rank, k)).astype(np.int64)


def draft_trees(tree: TreeModel, depth: int, mu: np.ndarray, difficulty: np.ndarray, z_main: np.ndarray,
                head_main: np.ndarray, uni_main: np.ndarray, eps_t: np.ndarray, head_t: np.ndarray,
                uni_t: np.ndarray, depth_lim: np.ndarray, head_temperature: float = 1.0,
                head_bias: float = 0.0, width=None) -> DraftTrees:
    """This step's trees for R requests (module docstring).

    mu [>= depth] median conditional logits; difficulty [R]; z_main / head_main / uni_main [R, >= depth]: the chain
    model's true logits, head noise (already scaled) and uniforms; eps_t [R, depth, k] (scaled by token_sigma),
    head_t [R, depth, k, k] (scaled by head_noise), uni_t [R, depth, k]: the tree stream's draws; depth_lim [R]:
    deepest level each request may draft (0: no tree). width: the beam, the nodes of each level expanded for the
    next (1..k; None: k, the model's top_k), or per-level widths (entry l - 1 for level l; levels past them, which
    depth_lim leaves undrafted, expand one); a narrower beam uses the first ``width`` beam slots' draws (common
    random numbers across widths: levels 1 and 2 are the full beam's nodes, deeper ones hang from its own beam)."""
    k, R, share = tree.top_k, z_main.shape[0], tree.sibling_share
    if isinstance(width, (tuple, list)):
        beams = [int(w) for w in width] + [1] * max(depth - 1 - len(width), 0)
    else:
        beams = [k if width is None else width] * max(depth - 1, 0)
    geo = share * (1.0 - share) ** np.arange(k - 1)  # [k - 1]
    rows = np.arange(R)[:, None]
    ranks = np.arange(k)
    # Every context's alternatives, computed up front for the main path's context at each depth ([R, depth]: the
    # chain's draws) and for beam slot b's context off the main path ([R, depth, k]); the levels then only select.
    zm = z_main[:, :depth]  # [R, D]
    zo = mu[:depth][None, :, None] + difficulty[:, None, None] + eps_t  # [R, D, k]
    # Confidences [R, D, b, i] of child i at beam slot b: a main context's top child gets the chain's head noise
    # (its siblings the tree stream's at slot b), an off-path context's children all the tree stream's.
    logit_m = np.empty((R, depth, k))
    logit_m[:, :, 0] = zm  # the top alternative's logit is z itself, so the main path's confidence is the chain's
    logit_m[:, :, 1:] = _sibling_logits(zm, geo)
    noise_m = head_t.copy()
    noise_m[:, :, :, 0] = head_main[:, :depth, None]
    conf_m = _head(logit_m[:, :, None, :], noise_m, head_temperature, head_bias).astype(np.float32)
    logit_o = np.empty((R, depth, k, k))
    logit_o[..., 0] = zo
    logit_o[..., 1:] = _sibling_logits(zo, geo)
    conf_o = _head(logit_o, head_t, head_temperature, head_bias).astype(np.float32)
    rank_m = _matched_rank(zm, uni_main[:, :depth], k, share)  # [R, D]
    rank_o = _matched_rank(zo, uni_t, k, share)  # [R, D, k]
    surv_levels, conf_levels, parent_levels, matched_levels = [], [], [], []
    # Level 1: the anchor's context is the main path's (slot 0).
    surv = conf_m[:, 0, 0]  # [R, k] (the anchor survives 1)
    main = np.zeros((R, k), dtype=bool)
    main[:, 0] = True
    surv_levels.append(surv)
    conf_levels.append(surv)
    parent_levels.append(np.full((R, k), -1, dtype=np.int64))
    matched_levels.append(ranks[None, :] == rank_m[:, 0:1])
    for j in range(1, depth):
        # The beam: the previous level's W best nodes by path confidence (ties to the lower index).
        W = beams[j - 1]
        beam = np.argsort(-surv, axis=1, kind="stable")[:, :W]  # [R, W]
        beam_surv = surv[rows, beam]  # [R, W]
        beam_main = main[rows, beam]  # [R, W]: at most one True (the main path's node, if in the beam)
        conf = np.where(beam_main[:, :, None], conf_m[:, j, :W], conf_o[:, j, :W])  # [R, W, k]
        surv = (beam_surv[:, :, None] * conf).reshape(R, W * k)  # float32 product, parent first: tree_survival's
        rank = np.where(beam_main, rank_m[:, j:j + 1], rank_o[:, j, :W])  # [R, W]
        matched = (ranks[None, None, :] == rank[:, :, None]).reshape(R, W * k)
        main = np.zeros((R, W, k), dtype=bool)
        main[:, :, 0] = beam_main
        main = main.reshape(R, W * k)
        surv_levels.append(surv)
        conf_levels.append(conf.reshape(R, W * k))
        parent_levels.append(np.repeat(beam, k, axis=1))
        matched_levels.append(matched)
    # The pool: the nodes a request may draft, ranked by survival desc; levels are concatenated in depth order, so
    # a stable sort breaks ties to the shallower node, then the lower index (the planner's canonical order).
    counts = [x.shape[1] for x in surv_levels]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    ntot = int(offsets[-1])
    all_surv = np.concatenate(surv_levels, axis=1)  # [R, Ntot]
    all_depth = np.repeat(np.arange(1, depth + 1), counts)  # [Ntot]
    all_parent = np.concatenate([p if d == 0 else p + offsets[d - 1] for d, p in enumerate(parent_levels)],
                                axis=1)  # [R, Ntot] full-tree index of the parent (-1: the anchor)
    allowed = all_depth[None, :] <= depth_lim[:, None]  # [R, Ntot]
    key = np.where(allowed, all_surv, np.float32(-1.0))  # survivals are >= 0: not allowed sorts last
    M = tree.pool_size(depth)  # the pool's columns (a narrower beam has fewer nodes: padding past them)
    order = np.argsort(-key, axis=1, kind="stable")[:, :M]  # [R, min(M, ntot)]
    sizes = np.minimum(allowed.sum(axis=1), order.shape[1]).astype(np.int32)
    if order.shape[1] < M:  # padding points at column ntot, which no level reads
        order = np.concatenate([order, np.full((R, M - order.shape[1]), ntot, dtype=order.dtype)], axis=1)
    inside = np.arange(M)[None, :] < sizes[:, None]  # [R, M]
    rank = np.full((R, ntot + 1), -1, dtype=np.int64)  # column ntot: the anchor's (index -1) rank, -1
    rank[rows, order] = np.arange(M)
    rank[:, ntot] = -1  # (padding wrote there)
    o = np.minimum(order, ntot - 1)  # padding reads a real column, masked by `inside`
    parents = np.where(inside, rank[rows, all_parent[rows, o]], -1).astype(np.int32)
    survival = np.where(inside, all_surv[rows, o], np.float32(0.0))
    conf = np.where(inside, np.concatenate(conf_levels, axis=1)[rows, o], np.float32(0.0))
    return DraftTrees(survival=survival, conf=conf, parents=parents, sizes=sizes, order=order, level_parent=parent_levels,
                      level_matched=matched_levels, level_offset=list(offsets[:-1]))


def accepted_depths(trees: DraftTrees, verified: np.ndarray, offsets: bool = False):
    """Accepted nodes per request [R] (the accepted path's depth) given verified [R, M] bool over the pool: the
    sample-and-match walk from the anchor, which moves to the child carrying the target's sample if it is
    verified and stops otherwise. offsets=True: also [R, depth + 1] int32, the accepted path's offsets in each
    request's verified block (0 the anchor, then a verified node j at 1 + the verified nodes before it; -1 past
    the path), tree_rejection_sample's accepted_offsets."""
    R, M = verified.shape
    rows = np.arange(R)[:, None]
    ntot = trees.level_offset[-1] + trees.level_matched[-1].shape[1]
    full = np.zeros((R, ntot + 1), dtype=bool)  # column ntot: the pool's padding (draft_trees)
    full[rows, trees.order] = verified
    accepted = np.zeros(R, dtype=np.int64)
    path = np.full((R, len(trees.level_parent)), ntot, dtype=np.int64)  # full-tree index of each accepted node
    reached = None
    for d, (parent, matched) in enumerate(zip(trees.level_parent, trees.level_matched)):
        off = trees.level_offset[d]
        ok = full[:, off:off + matched.shape[1]] & matched
        if reached is not None:
            ok &= reached[rows, parent]
        hit = ok.any(axis=1)
        accepted += hit
        path[:, d] = np.where(hit, off + ok.argmax(axis=1), ntot)
        reached = ok
    if not offsets:
        return accepted
    pool = np.full((R, ntot + 1), -1, dtype=np.int64)  # pool index of each full-tree node
    pool[rows, trees.order] = np.arange(M)
    pool[:, ntot] = -1
    block = np.concatenate([np.zeros((R, 1), dtype=np.int64), np.cumsum(verified, axis=1)], axis=1)  # [R, M + 1]
    node = pool[rows, path]  # [R, depth]
    offs = np.where(node >= 0, block[rows, node + 1], -1)
    return accepted, np.concatenate([np.zeros((R, 1), dtype=np.int64), offs], axis=1).astype(np.int32)


def tree_draft_ms(tree: TreeModel, cost_table, R: int, depth: int, chain_drafter: bool, num_drafts: int,
                  width=None) -> float:
    """Milliseconds to draft this step's trees: R requests, the deepest tree ``depth`` levels, a beam of ``width``
    nodes per level (None: top_k; or per-level widths, entry l - 1 for level l) (module docstring)."""
    if R == 0 or depth == 0:
        return 0.0 if chain_drafter or R == 0 else cost_table.draft_cost(R)
    chain = cost_table.draft_cost(R) * (float(depth / num_drafts) if chain_drafter else 1.0)  # as simulate prices it
    levels = chain_drafter and cost_table.draft_levels is not None  # the table prices each level
    if not isinstance(width, (tuple, list)):  # one width for every level
        k = tree.top_k if width is None else int(width)
        if tree.draft_cost == "chain" or k == 1:
            return chain
        if levels:
            return tree_draft_cost(cost_table, R, depth, k)
        if chain_drafter:
            return (cost_table.draft_cost(R) + (depth - 1) * cost_table.draft_cost(R * k)) / num_drafts
        # A block forward at r requests runs r * K query tokens; a level's R * (k - 1) single-token rows are as many
        # tokens as ceil(R * (k - 1) / K) block rows.
        return cost_table.draft_cost(R) + (depth - 1) * cost_table.draft_cost(-(-R * (k - 1) // num_drafts))
    ks = [int(w) for w in width[:depth - 1]]  # per-level widths: each later level at its own rows
    if tree.draft_cost == "chain" or (ks and all(k == 1 for k in ks)):
        return chain
    if levels:
        return tree_draft_cost(cost_table, R, depth, tuple(ks))
    if chain_drafter:
        return (cost_table.draft_cost(R) + sum(cost_table.draft_cost(R * k) for k in ks)) / num_drafts
    return cost_table.draft_cost(R) + sum(cost_table.draft_cost(-(-R * (k - 1) // num_drafts)) for k in ks)

