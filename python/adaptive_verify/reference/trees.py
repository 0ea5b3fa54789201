"""Draft-tree references: tree survival, the tree plan and the KV commit (docs/design.md, "Draft trees"), loops over
each request's nodes as the design states them."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .planner import FIXED_ONE, Plan, _sanitize, choose, resolve_args, theta, tree_candidate_order


@dataclasses.dataclass(frozen=True)
class TreePlan(Plan):
    """The reference tree plan: :class:`Plan`'s fields and the four per-token tree fields ([T_pad]), named as in
    adaptive_verify.TreeVerifyPlan."""

    tree_mask: Optional[torch.Tensor] = None  # int64: bit i set iff the token attends to offset i of its request
    token_parent: Optional[torch.Tensor] = None  # int32: the parent's offset, -1 for the anchor and for padding
    token_node: Optional[torch.Tensor] = None  # int32: the node, -1 for the anchor and for padding
    token_depth: Optional[torch.Tensor] = None  # int32: the anchor 0, its children 1; 0 for padding


# ----------------------------------------------------------------------------------------------------
# draft trees (docs/design.md, "Draft trees"): loops over each request's nodes, as the design states them
# ----------------------------------------------------------------------------------------------------


def tree_survival(conf: torch.Tensor, parents: torch.Tensor, tree_sizes: torch.Tensor) -> torch.Tensor:
    """a[r, j] = a[r, parents[r, j]] * clamp(conf[r, j], 0, 1) (the anchor, parent -1, survives with 1) for
    j < tree_sizes[r], else 0. [R, N] float32, one float32 product per node."""
    R, N = conf.shape
    c = _sanitize(conf.float())
    out = torch.zeros(R, N, dtype=torch.float32, device=conf.device)
    for j in range(N):  # node order is topological: a parent's survival is final before its children's
        p = parents[:, j].long()
        base = torch.where(p >= 0, out.gather(1, p.clamp(0, N - 1)[:, None])[:, 0], torch.ones_like(out[:, 0]))
        out[:, j] = torch.where(j < tree_sizes.long(), base * c[:, j], torch.zeros_like(base))
    return out


def plan_tree_verification(survival, parents, tree_sizes, cost_table=None, **kwargs) -> TreePlan:
    """Reference of adaptive_verify.plan_tree_verification (same arguments, ``out`` excepted)."""
    kwargs.setdefault("mode", "global")
    a = resolve_args(survival, tree_sizes, cost_table, **kwargs)
    dev, R, Rp, Tp = a.device, a.R, a.num_reqs_padded, a.num_tokens_padded
    order = tree_candidate_order(a, parents)
    budget, (req, node), prefix = choose(a, order[:4])
    if a.weights is not None:  # expected tokens stay unweighted: the verified nodes' own survivals
        prefix = int((order[5][:budget] * FIXED_ONE).long().sum())
    verified = [sorted(int(n) for n, q in zip(node[:budget], req[:budget]) if int(q) == r) for r in range(R)]
    par = parents.long().tolist()
    ctx = [0] * R if a.context_lens is None else a.context_lens.long().tolist()
    depth_of = {}  # (request, node) -> depth
    rows = []  # one per token: (request, offset, node, depth, parent offset, mask)
    for r in range(R):
        offset = {n: 1 + i for i, n in enumerate(verified[r])}  # the anchor is offset 0
        rows.append((r, 0, -1, 0, -1, 1))
        for n in verified[r]:
            p = par[r][n]
            depth_of[r, n] = 1 + (depth_of[r, p] if p >= 0 else 0)
            mask, q = 1 | (1 << offset[n]), p
            while q >= 0:  # itself, its ancestors and the anchor
                mask, q = mask | (1 << offset[q]), par[r][q]
            rows.append((r, offset[n], n, depth_of[r, n], offset[p] if p >= 0 else 0, mask))
    T = len(rows)
    i32 = dict(dtype=torch.int32, device=dev)

    def lanes(values, pad, dtype=torch.int32):  # [Tp]: the tokens' values, then padding
        return torch.tensor(values + [pad] * (Tp - T), dtype=dtype, device=dev)

    q_len = [1 + len(v) for v in verified]
    starts = [a.token_offset + sum(q_len[:r]) for r in range(R + 1)]
    out = dict(
        verify_lens=torch.tensor([len(v) for v in verified] + [0] * (Rp - R), **i32),
        budget=torch.tensor(budget, **i32),
        expected_tokens=torch.tensor((R * FIXED_ONE + prefix) / FIXED_ONE, dtype=torch.float32, device=dev),
        num_tokens=torch.tensor(a.token_offset + T, **i32),
        query_start_loc=torch.tensor(starts + [starts[-1]] * (Rp - R), **i32),
        token_req=lanes([t[0] for t in rows], -1),
        # int64 two's complement: the 64th token of a request (offset 63) sets the sign bit
        tree_mask=lanes([t[5] - (1 << 64) if t[5] >> 63 else t[5] for t in rows], 0, torch.int64),
        token_parent=lanes([t[4] for t in rows], -1),
        token_node=lanes([t[2] for t in rows], -1),
        token_depth=lanes([t[3] for t in rows], 0),
    )
    if a.context_lens is not None:
        out["seq_lens"] = torch.tensor([ctx[r] + q_len[r] for r in range(R)] + [0] * (Rp - R), **i32)
        out["positions"] = lanes([ctx[t[0]] + t[3] for t in rows], 0)  # RoPE position: context_len + depth
        if a.block_table is not None:
            bt, bs = a.block_table.long().tolist(), a.block_size
            kv = [ctx[t[0]] + t[1] for t in rows]  # KV index: context_len + offset
            if any(k // bs >= len(bt[0]) for k in kv):
                raise ValueError("block_table: too few blocks per request for context_lens + q_len positions")
            out["slot_mapping"] = lanes([bt[t[0]][k // bs] * bs + k % bs for t, k in zip(rows, kv)], -1, torch.int64)
    if a.anchor_tokens is not None:
        anchors, ids = a.anchor_tokens.long().tolist(), a.draft_tokens.long().tolist()
        out["input_ids"] = lanes([anchors[t[0]] if t[2] < 0 else ids[t[0]][t[2]] for t in rows], 0)
    return TreePlan(**out)


def commit_tree_kv(k_cache, v_cache, block_table, context_lens, accepted_offsets, num_accepted):
    """Reference of adaptive_verify.commit_tree_kv: for each request r and i = 1 .. num_accepted[r], the K/V entry at
    KV index context_lens[r] + accepted_offsets[r, i] moves to context_lens[r] + i (the accepted node's depth), in
    increasing i. Returns new caches (the inputs are not modified)."""
    k, v = k_cache.clone(), v_cache.clone()
    bs = k.shape[1]
    for r in range(block_table.shape[0]):
        for i in range(1, int(num_accepted[r]) + 1):
            src, dst = int(context_lens[r]) + int(accepted_offsets[r, i]), int(context_lens[r]) + i
            sb, db = int(block_table[r, src // bs]), int(block_table[r, dst // bs])
            k[db, dst % bs] = k[sb, src % bs]
            v[db, dst % bs] = v[sb, src % bs]
    return k, v


def _tree_draft_cost(ct, r: int, depth: int, width: int) -> float:
    """docs/design.md's drafting cost of a tree shape: the first level over r anchors (draft_cost(r, 1)), each later
    one over the r * width expanded nodes (a later level at n rows: draft_cost(n, L) - draft_cost(n, L - 1))."""
    if depth <= 1:
        return float(ct.draft_cost(r, depth))
    L = ct.draft_levels
    if isinstance(width, tuple):  # per-level widths: level l + 1 over r * width[l - 1] rows, summed in level order
        total = float(ct.draft_cost(r, 1))
        for w in width[:depth - 1]:
            total += float(ct.draft_cost(r * w, L)) - float(ct.draft_cost(r * w, L - 1))
        return total
    return float(ct.draft_cost(r, 1)) + (depth - 1) * (float(ct.draft_cost(r * width, L))
                                                      - float(ct.draft_cost(r * width, L - 1)))


def choose_tree_shape(survival, parents, tree_sizes, cost_table, *, max_width=None, widths=None, max_depth=None,
                      min_depth=0, max_step_ms=None, **kwargs):
    """Reference of adaptive_verify.choose_tree_shape by brute force: for every width W (or per-level profile of
    ``widths``), depth D and budget B, the nodes of depth <= D whose ancestors at each depth l >= 1 rank among the W
    (W_l) best of their depth (rank by the ranked value of tree_candidate_order among that request's candidates of
    the same depth, ties to the lower node), in canonical order; Theta with the shape's fixed cost
    tree_draft_cost(R, D, W) + request_ms * R and its latency cap; the largest Theta, ties to the smallest W (the
    earlier profile), D, then B (NaN never wins). Returns (depth, width, budget); with widths=, width is the chosen
    profile's widths of levels 1 .. max_depth, 0 from level D on ([max_depth] int32)."""
    if survival is None:
        survival = tree_survival(kwargs.pop("conf"), parents, tree_sizes)
    R = survival.shape[0]
    a0 = resolve_args(survival, tree_sizes, cost_table, mode="global", **kwargs)
    req, node, ranked, n_forced, depth, _ = tree_candidate_order(a0, parents)
    par = parents.long().cpu()
    rank = {}  # (request, node) -> rank within its depth
    for r in range(R):
        mine = [(int(node[i]), float(ranked[i]), int(depth[i])) for i in range(req.numel()) if int(req[i]) == r]
        for j, vj, dj in mine:
            rank[(r, j)] = sum(1 for q, v, d in mine if d == dj and q != j and (v > vj or (v == vj and q < j)))
    if widths is None:
        d_hi = min(cost_table.draft_levels, 32) if max_depth is None else max_depth
        shapes = list(range(1, max_width + 1))
    else:
        shapes = [tuple(int(x) for x in w) for w in widths]
        d_hi = min(cost_table.draft_levels, 32, len(shapes[0]) + 1) if max_depth is None else max_depth

    def beam(shape, level):  # a shape's width at a level
        return shape if widths is None else shape[level - 1]

    def drafted(shape, r, j):  # every ancestor at depth l >= 1 among the beam(shape, l) best of its depth
        p = int(par[r, j])
        while p >= 0:
            d_p = 1 + sum(1 for _ in _ancestors(par, r, p))
            if rank[(r, p)] >= beam(shape, d_p):
                return False
            p = int(par[r, p])
        return True

    found = []  # (theta, shape index, depth, budget)
    for si, w in enumerate(shapes):
        for d in range(min_depth, d_hi + 1):
            keep = torch.tensor([int(depth[i]) <= d and drafted(w, int(req[i]), int(node[i]))
                                 for i in range(req.numel())], dtype=torch.bool)
            cost = _tree_draft_cost(cost_table, R, d, w) + cost_table.request_ms * R
            a = dataclasses.replace(a0, draft_cost=cost, step_cap=None)
            if max_step_ms is not None:
                real, shift = cost_table.unshifted, cost_table.shifted_by
                a = dataclasses.replace(a, step_cap=1 << 62)
                for b in range(min(int(keep.sum()), a.budget_cap) + 1):  # (no budget past the capacity)
                    verify = torch.tensor(real.verify_cost(R + a.extra_tokens + shift + b), dtype=torch.float64).float()
                    if float(torch.tensor(cost, dtype=torch.float32) + verify) > float(max_step_ms):
                        a = dataclasses.replace(a, step_cap=b - 1)
                        break
            order = (req[keep], node[keep], ranked[keep], 0)
            a = dataclasses.replace(a, mode="global")
            b, _, prefix = choose(a, order)
            t = float(theta(a, torch.tensor([prefix]), torch.tensor([b]))[0])
            found.append((t, si, d, b))
    real = [f for f in found if f[0] == f[0]]
    if real:
        t_best = max(f[0] for f in real)
        _, si, d, b = min((f for f in real if f[0] == t_best), key=lambda f: (f[1], f[2], f[3]))
    else:
        _, si, d, b = min(found, key=lambda f: (f[1], f[2], f[3]))
    dev = survival.device
    if widths is None:
        w = torch.tensor(shapes[si], dtype=torch.int32, device=dev)
    else:
        w = torch.tensor([shapes[si][l - 1] if l < d else 0 for l in range(1, d_hi + 1)], dtype=torch.int32,
                         device=dev)
    return torch.tensor(d, dtype=torch.int32, device=dev), w, torch.tensor(b, dtype=torch.int32, device=dev)


def _ancestors(par, r: int, j: int):
    """The ancestors of request r's node j below the anchor, nearest first."""
    p = int(par[r, j])
    while p >= 0:
        yield p
        p = int(par[r, p])
