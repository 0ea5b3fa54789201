"""Readable torch references of every op: the oracle the kernels are tested against.

They follow docs/design.md literally and use the same exact arithmetic as the kernels
(float32 products left to right, 32.32 fixed-point survival sums, float64 Theta), so the kernels
must match them integer for integer. Slow by design; never used on a hot path. They resolve their own
arguments (defaults, the budget cap, the cost curve read through CostTable's public scalar methods) and
share no code with the ops they check beyond the VerifyPlan container; they assume valid inputs (the ops'
validation is tested separately).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from .planner import TreeVerifyPlan, VerifyPlan

FIXED_ONE = 2**32  # survival 1.0 in 32.32 fixed point


def _sanitize(x: torch.Tensor) -> torch.Tensor:
    """Clamp to [0, 1]; NaN and negatives become 0."""
    return torch.where(x > 0, x.clamp(max=1.0), torch.zeros_like(x))


def prefix_survival(conf: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """a[r, j] = prod_{i<=j} clamp(conf[r, i], 0, 1) for j < drafts[r], else 0.  [R, K] float32."""
    R, K = conf.shape
    c = _sanitize(conf.float())
    out = torch.zeros(R, K, dtype=torch.float32, device=conf.device)
    a = torch.ones(R, dtype=torch.float32, device=conf.device)
    for j in range(K):  # a left-to-right float32 product, as the kernels compute it
        a = a * c[:, j]
        out[:, j] = a
    return torch.where(torch.arange(K, device=conf.device) < drafts.long()[:, None], out, torch.zeros_like(out))


@dataclasses.dataclass
class _Args:
    """The planner's arguments with their defaults, resolved the way docs/design.md states them."""

    survival: torch.Tensor
    drafts: torch.Tensor
    R: int
    K: int
    device: torch.device
    mode: str
    budget: Optional[int]
    min_verify: int
    max_verify: int
    extra_tokens: int
    extra_emitting: int
    budget_cap: int
    verify_cost: Optional[torch.Tensor]  # float32 [n + 1]: the cost of every total token count the search needs
    draft_cost: float  # cost_table.fixed_cost(R): the kernels' name for Theta's fixed term
    context_lens: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    block_size: Optional[int]
    anchor_tokens: Optional[torch.Tensor]
    draft_tokens: Optional[torch.Tensor]
    token_offset: int
    num_reqs_padded: int
    num_tokens_padded: int
    weights: Optional[torch.Tensor] = None  # float32 [R] priorities (None: all 1)
    step_cap: Optional[int] = None  # most drafts the latency target allows (None: no target)


def _resolve(survival, drafts, cost_table, *, mode, budget=None, min_verify=0, max_verify=None, extra_tokens=0,
             extra_emitting=0, capacity=None, context_lens=None, block_table=None, block_size=None,
             anchor_tokens=None, draft_tokens=None, token_offset=0, num_reqs_padded=None, num_tokens_padded=None,
             verification=None, weights=None, max_step_ms=None):
    R, K = survival.shape
    max_verify = K if max_verify is None else max_verify
    limit = cost_table.max_tokens if cost_table is not None else None
    if capacity is not None:
        limit = capacity
    budget_cap = R * max_verify
    if limit is not None:  # every step needs its R + extra_tokens anchors; drafts get what is left
        budget_cap = min(budget_cap, limit - R - extra_tokens)
    if num_tokens_padded is None:
        num_tokens_padded = R + budget_cap
    budget_cap = min(budget_cap, num_tokens_padded - R)
    verify_cost = None
    draft_cost = 0.0
    if cost_table is not None:
        # Theta's fixed term is the step's whole fixed cost, the drafter plus request_ms * R (docs/design.md,
        # "Step cost"); draft_cost alone left a table's per-request term out of the reference.
        draft_cost = float(cost_table.fixed_cost(R))
        top = R + extra_tokens + budget_cap
        if cost_table.max_tokens is not None:
            top = min(top, cost_table.max_tokens)
        # float32 of each count's cost, as the design's dense cost array holds it
        verify_cost = torch.tensor([cost_table.verify_cost(n) for n in range(top + 1)], dtype=torch.float64).float()
    if isinstance(budget, torch.Tensor):
        budget = int(budget.clamp(0, 2**31 - 1))
    step_cap = None
    if max_step_ms is not None:  # the largest B before the first whose modelled step time exceeds the target
        real, shift = cost_table, 0
        if getattr(cost_table, "_base", None) is not None:  # a shifted view: the step's time on the base curve
            real, shift = cost_table._base, cost_table._shift
        step_cap = budget_cap
        for b in range(budget_cap + 1):
            verify = torch.tensor(real.verify_cost(R + extra_tokens + shift + b), dtype=torch.float64).float()
            cost = torch.tensor(draft_cost, dtype=torch.float32) + verify  # float32, as the kernels add
            if float(cost) > float(max_step_ms):
                step_cap = max(b - 1, 0)
                break
    return _Args(survival=survival, drafts=drafts.long(), R=R, K=K, device=survival.device, mode=mode, budget=budget,
                 min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
                 extra_emitting=extra_emitting, budget_cap=budget_cap, verify_cost=verify_cost, draft_cost=draft_cost,
                 context_lens=context_lens, block_table=block_table, block_size=block_size,
                 anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
                 num_reqs_padded=R if num_reqs_padded is None else num_reqs_padded,
                 num_tokens_padded=num_tokens_padded, weights=weights, step_cap=step_cap)


def request_weights(a: _Args):
    """(w_r / c per request, 1 / c) in float32, c = max(1, largest usable weight); unusable weights (NaN,
    negative, infinite) weigh 1, as on the device. Scaling by c keeps every weighted survival in [0, 1] and does
    not move Theta's argmax."""
    w = a.weights.detach().cpu().float()
    ok = (w >= 0) & torch.isfinite(w)
    w = torch.where(ok, w, torch.ones_like(w))
    c = max(1.0, float(w[ok].max())) if bool(ok.any()) else 1.0
    c = torch.tensor(c, dtype=torch.float32)
    return w / c, torch.tensor(1.0, dtype=torch.float32) / c


def candidate_order(a: _Args):
    """Candidates in canonical order: forced first, survival descending (weighted: w_r * survival), position,
    request.

    Returns (req [N], pos [N], ranked value [N], n_forced) with survival made non-increasing per row.
    """
    R, K = a.R, a.K
    s = a.survival.float()
    pos = torch.arange(K, device=s.device)
    # A NaN ends its row's candidates.
    nan = torch.isnan(s)
    first_nan = torch.where(nan.any(1), nan.int().argmax(1), torch.full((R,), K, device=s.device))
    cap = torch.minimum(a.drafts.long().clamp(0, K), torch.tensor(a.max_verify, device=s.device))
    cap = torch.minimum(cap, first_nan)
    if a.draft_tokens is not None:  # an invalidated draft (negative id) ends its request's candidates
        bad = a.draft_tokens[:, :K].long() < 0
        if a.draft_tokens.shape[1] < K:
            bad = torch.cat([bad, torch.zeros(R, K - bad.shape[1], dtype=torch.bool, device=bad.device)], 1)
        first_bad = torch.where(bad.any(1), bad.int().argmax(1), torch.full((R,), K, device=s.device))
        cap = torch.minimum(cap, first_bad)
    # Running minimum makes every row non-increasing, so the first B are prefix-closed.
    s = _sanitize(s)
    running = torch.ones(R, device=s.device)
    mono = torch.empty_like(s)
    for j in range(K):
        running = torch.minimum(running, s[:, j])
        mono[:, j] = running
    if a.weights is not None:  # rank by w_r * a[r, j] (float32 products: non-increasing along each row)
        mono = request_weights(a)[0].to(s.device)[:, None] * mono
    is_cand = pos[None, :] < cap[:, None]
    forced = is_cand & (pos[None, :] < a.min_verify)
    # Flatten position-major so a stable sort keeps (position, request) order among equal survivals.
    req_f = torch.arange(R, device=s.device)[None, :].expand(K, R).reshape(-1)
    pos_f = pos[:, None].expand(K, R).reshape(-1)
    s_f, cand_f, forced_f = mono.t().reshape(-1), is_cand.t().reshape(-1), forced.t().reshape(-1)
    req_f, pos_f, s_f, forced_f = req_f[cand_f], pos_f[cand_f], s_f[cand_f], forced_f[cand_f]
    o = torch.sort(s_f, descending=True, stable=True).indices
    req_f, pos_f, s_f, forced_f = req_f[o], pos_f[o], s_f[o], forced_f[o]
    o = torch.sort((~forced_f).int(), stable=True).indices
    return req_f[o], pos_f[o], s_f[o], int(forced.sum())


def theta(a: _Args, prefix_fixed: torch.Tensor, budgets: torch.Tensor) -> torch.Tensor:
    """Theta(B) in float64 for each B, from P(B) in fixed point (same rounding as the kernels)."""
    if a.weights is None:
        base = (a.R + a.extra_emitting) * FIXED_ONE
    else:  # sum_r w_r / c, and each prefill request that samples weighs 1 / c
        w, inv_c = request_weights(a)
        base = int((w * FIXED_ONE).long().sum()) + a.extra_emitting * int((inv_c * FIXED_ONE).long())
    num = base + prefix_fixed
    n = (a.R + a.extra_tokens + budgets).clamp(max=a.verify_cost.numel() - 1)
    cost = torch.tensor(a.draft_cost, dtype=torch.float32) + a.verify_cost.cpu()[n]  # float32 add
    return num.double() / cost.double()


def choose(a: _Args, order=None):
    """(budget, canonical order, P(budget) fixed point) for the resolved arguments. order: (req, pos, survival,
    n_forced) of the candidates in canonical order (default: the chain's, candidate_order)."""
    req, pos, s, n_forced = candidate_order(a) if order is None else order
    n_cand = req.numel()
    b_room = min(n_cand, a.budget_cap)
    b_min = min(n_forced, b_room)  # capacity wins over min_verify, min_verify over the latency target
    b_max = b_room if a.step_cap is None else max(b_min, min(b_room, a.step_cap))
    fixed = (s.cpu() * FIXED_ONE).long()  # exact scale, truncating conversion
    prefix = torch.cat([torch.zeros(1, dtype=torch.long), fixed.cumsum(0)])  # P(0..N)
    if a.mode in ("greedy", "global"):
        bs = torch.arange(b_min, b_max + 1)
        t = theta(a, prefix[bs], bs)
        if a.mode == "global":  # argmax, first maximum = smallest B
            budget = b_min + int(torch.argmax(t))
        else:  # first B whose successor does not strictly improve Theta
            stops = (~(t[1:] > t[:-1])).nonzero()
            budget = b_min + int(stops[0]) if stops.numel() else b_max
    elif a.mode == "fixed":
        budget = max(b_min, min(a.budget, b_max))
    else:
        budget = b_max
    return budget, (req, pos), int(prefix[budget])


def choose_budget(survival, drafts, cost_table, *, parents=None, **kwargs) -> torch.Tensor:
    """Reference of adaptive_verify.choose_budget (parents: draft trees, drafts their sizes)."""
    kwargs.setdefault("mode", "global")
    a = _resolve(survival, drafts, cost_table, **kwargs)
    order = None if parents is None else tree_candidate_order(a, parents)[:4]
    return torch.tensor(choose(a, order)[0], dtype=torch.int32, device=a.device)


def plan_verification(survival, drafts, cost_table=None, **kwargs) -> VerifyPlan:
    """Reference of adaptive_verify.plan_verification (same arguments, ``out`` excepted)."""
    kwargs.setdefault("mode", "greedy")
    a = _resolve(survival, drafts, cost_table, **kwargs)
    dev, R, Rp, Tp = a.device, a.R, a.num_reqs_padded, a.num_tokens_padded
    budget, (req, pos), prefix = choose(a)
    if a.weights is not None:  # expected tokens stay unweighted: the verified drafts' own survivals
        unweighted = _resolve(survival, drafts, cost_table, **{k: v for k, v in kwargs.items() if k != "weights"})
        mono = candidate_order(dataclasses.replace(unweighted, mode="all"))
        verified = {(int(r), int(j)): float(v) for r, j, v in zip(*mono[:3])}
        prefix = sum(int(verified[(int(r), int(j))] * FIXED_ONE) for r, j in zip(req[:budget], pos[:budget]))
    i32 = dict(dtype=torch.int32, device=dev)

    verify_lens = torch.zeros(Rp, **i32)
    verify_lens[:R] = torch.bincount(req[:budget], minlength=R).to(torch.int32)
    q_len = 1 + verify_lens[:R].long()
    total = int(q_len.sum())
    qsl = torch.full((Rp + 1,), a.token_offset + total, **i32)
    qsl[: R + 1] = a.token_offset + torch.cat([torch.zeros(1, dtype=torch.long, device=dev), q_len.cumsum(0)])

    token_req = torch.full((Tp,), -1, **i32)
    tr = torch.repeat_interleave(torch.arange(R, device=dev), q_len)  # [total]
    token_req[:total] = tr
    offset = torch.arange(total, device=dev) - (qsl[tr].long() - a.token_offset)  # 0 = anchor

    extra = {}  # the optional outputs
    if a.context_lens is not None:
        ctx = a.context_lens.long()
        if bool(((ctx < 0) | (ctx > 2**31 - 65)).any()):  # docs/design.md: positions and seq_lens are int32
            raise ValueError("context_lens: every value must lie in [0, 2^31 - 65]")
        extra["seq_lens"] = torch.zeros(Rp, **i32)
        extra["seq_lens"][:R] = (ctx + q_len).to(torch.int32)
        p = ctx[tr] + offset
        extra["positions"] = torch.zeros(Tp, **i32)
        extra["positions"][:total] = p.to(torch.int32)
        if a.block_table is not None:
            blk = p // a.block_size
            ok = (p >= 0) & (blk < a.block_table.shape[1])
            if not bool(ok.all()):
                raise ValueError("block_table: too few blocks per request for context_lens + q_len positions")
            slot = a.block_table.long()[tr, blk.clamp(0, a.block_table.shape[1] - 1)] * a.block_size + p % a.block_size
            extra["slot_mapping"] = torch.full((Tp,), -1, dtype=torch.int64, device=dev)
            extra["slot_mapping"][:total] = slot
    if a.anchor_tokens is not None:
        if a.draft_tokens.shape[1] > 0:
            drafted = a.draft_tokens.long()[tr, (offset - 1).clamp(min=0)]
        else:  # max_verify = 0: every token is an anchor
            drafted = torch.zeros_like(offset)
        extra["input_ids"] = torch.zeros(Tp, **i32)
        extra["input_ids"][:total] = torch.where(offset == 0, a.anchor_tokens.long()[tr], drafted).to(torch.int32)
    return VerifyPlan(
        verify_lens=verify_lens,
        budget=torch.tensor(budget, **i32),
        expected_tokens=torch.tensor((R * FIXED_ONE + prefix) / FIXED_ONE, dtype=torch.float32, device=dev),
        num_tokens=torch.tensor(a.token_offset + total, **i32),
        query_start_loc=qsl,
        token_req=token_req,
        **extra,
    )


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


def tree_candidate_order(a: _Args, parents: torch.Tensor):
    """Nodes in canonical order: forced (node < min_verify) first, then survival descending, depth, request, node.

    A node is a candidate when j < min(tree size, max_verify), its parent is the anchor or a candidate, its draft
    id (draft_tokens given) is not negative nor an earlier sibling's, and its survival is not NaN. Its survival is
    clamped to [0, 1] and capped by its parent's; with weights it ranks by the float32 product w_r * that survival.
    Returns (req, node, ranked value, n_forced, depth, survival) as tensors in that order (float32 values)."""
    surv, par = a.survival.float().cpu(), parents.long().cpu().tolist()
    w = None if a.weights is None else request_weights(a)[0].numpy()
    ids = None if a.draft_tokens is None else a.draft_tokens.long().cpu().tolist()
    cands = []  # (not forced, -survival, depth, request, node)
    for r in range(a.R):
        kept = {}  # candidate node -> (survival, depth)
        siblings = set()  # (parent, id) of the nodes seen
        for j in range(min(max(int(a.drafts[r]), 0), a.K, a.max_verify)):
            p = par[r][j]
            if ids is not None:
                if ids[r][j] < 0:
                    continue
                duplicate = (p, ids[r][j]) in siblings
                siblings.add((p, ids[r][j]))
                if duplicate:
                    continue
            if p >= 0 and p not in kept:
                continue
            raw = float(surv[r, j])
            if raw != raw:
                continue
            s = min(float(_sanitize(surv[r, j])), kept[p][0] if p >= 0 else 1.0)
            kept[j] = (s, kept[p][1] + 1 if p >= 0 else 1)
            ranked = s if w is None else float(np.float32(w[r]) * np.float32(s))
            cands.append((j >= a.min_verify, -ranked, kept[j][1], r, j, s))
    cands.sort()
    n_forced = sum(1 for c in cands if not c[0])
    long, f32 = dict(dtype=torch.long), dict(dtype=torch.float32)
    return (torch.tensor([c[3] for c in cands], **long), torch.tensor([c[4] for c in cands], **long),
            torch.tensor([-c[1] for c in cands], **f32), n_forced, torch.tensor([c[2] for c in cands], **long),
            torch.tensor([c[5] for c in cands], **f32))


def plan_tree_verification(survival, parents, tree_sizes, cost_table=None, **kwargs) -> TreeVerifyPlan:
    """Reference of adaptive_verify.plan_tree_verification (same arguments, ``out`` excepted)."""
    kwargs.setdefault("mode", "global")
    a = _resolve(survival, tree_sizes, cost_table, **kwargs)
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
    return TreeVerifyPlan(**out)


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


# ----------------------------------------------------------------------------------------------------
# confidence area (float64 oracles)
# ----------------------------------------------------------------------------------------------------


def confidence(hidden, weight, *, bias=None, markov=None, temperature=None, survival=False, dtype=torch.float64):
    """sigmoid((hidden . w_h + markov . w_m + bias) / T_j) computed in `dtype` (float64: the oracle)."""
    H = hidden.shape[-1]
    z = hidden.to(dtype) @ weight[:H].to(dtype)  # [R, K]
    if markov is not None:
        z = z + markov.to(dtype) @ weight[H:].to(dtype)
    if bias is not None:
        z = z + (bias.to(dtype) if isinstance(bias, torch.Tensor) else bias)
    if temperature is not None:
        z = z / torch.as_tensor(temperature, dtype=dtype, device=z.device)
    conf = torch.sigmoid(z)
    return torch.cumprod(conf, dim=1) if survival else conf


def confidence_from_logits(logits, temperature=None, *, survival=False, dtype=torch.float64):
    z = logits.to(dtype)
    if temperature is not None:
        z = z / torch.as_tensor(temperature, dtype=dtype, device=z.device)
    conf = torch.sigmoid(z)
    return torch.cumprod(conf, dim=1) if survival else conf


def draft_margin(draft_logits):
    """Top-1 minus top-2 over the vocabulary in float32, NaN entries ignored (-inf), +inf when V == 1."""
    x = draft_logits.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    if x.shape[-1] == 1:
        return torch.where(torch.isinf(x[..., 0]) & (x[..., 0] < 0), torch.full_like(x[..., 0], float("nan")),
                           torch.full_like(x[..., 0], float("inf")))
    top = torch.topk(x, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def stats_update(conf, verify_lens, num_accepted, num_positions, num_bins):
    """(trials, survivals, conf_sum) [num_positions, num_bins] of one step, by the literal definition."""
    trials = torch.zeros(num_positions, num_bins, dtype=torch.int64)
    survivals = torch.zeros_like(trials)
    conf_sum = torch.zeros(num_positions, num_bins, dtype=torch.float64)
    for r in range(conf.shape[0]):
        for j in range(conf.shape[1]):
            c = float(conf[r, j])
            if j < int(verify_lens[r]) and j <= int(num_accepted[r]) and c == c:
                t = c * num_bins  # clamp as a float first: c may be +-inf or huge
                b = num_bins - 1 if t >= num_bins else (int(t) if t > 0 else 0)
                trials[j, b] += 1
                survivals[j, b] += int(j < int(num_accepted[r]))
                conf_sum[j, b] += min(max(c, 0.0), 1.0)
    return trials, survivals, conf_sum


def stats_totals(verify_lens, num_accepted, max_drafts):
    """AcceptanceStats.totals added by one update: [sum of verify_lens, sum of min(num_accepted, verify_lens)] over
    every row (int64), nothing when conf has no columns (max_drafts == 0)."""
    v, a = [int(x) for x in verify_lens], [int(x) for x in num_accepted]
    if max_drafts == 0:
        return torch.zeros(2, dtype=torch.int64)
    return torch.tensor([sum(v), sum(min(x, y) for x, y in zip(a, v))], dtype=torch.int64)


# ----------------------------------------------------------------------------------------------------
# sampling area: bit-exact oracles of csrc/include/adaptive_verify/sampling/math.h
#
# Every float operation below is one torch op on float32 tensors, so each rounds once to float32, in
# the header's order (no fused multiply-add, no wider intermediate). Integers are int64 tensors masked
# to 32 bits. Terms: a draft is *accepted* or *rejected*; the token emitted at the first rejection is
# the *recovered* token; the token emitted after L accepted drafts is the *bonus* token.
# ----------------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF
_LANES = 256  # kLanes: partial sums of the canonical softmax summation
_ACCEPT, _RACE, _SAMPLE = 0, 1, 2  # Philox streams


def _c(v: float) -> torch.Tensor:
    """A float32 constant (the header's `f` literals round the same way)."""
    return torch.tensor(v, dtype=torch.float32)


def _fadd(a, b):
    return torch.add(a, b)


def _fsub(a, b):
    return torch.sub(a, b)


def _fmul(a, b):
    return torch.mul(a, b)


def _fdiv(a, b):
    return torch.div(a, b)


def _mulhilo(a: torch.Tensor, b: int):
    """(hi, lo) 32-bit words of a * b for uint32 values in int64 `a`, without overflowing int64."""
    x = a * (b & 0xFFFF)  # < 2^48
    t = a * (b >> 16) + (x >> 16)  # a * b == t * 2^16 + (x & 0xffff), t < 2^49
    return t >> 16, ((t & 0xFFFF) << 16) | (x & 0xFFFF)


def philox(c0, c1, c2, c3, k0, k1) -> torch.Tensor:
    """Philox4x32-10 of (counter, key), each an int or int64 tensor (broadcast; low 32 bits used).

    Returns int64 [..., 4] holding the four uint32 output words.
    """
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.int64) & _M32
                                                       for v in (c0, c1, c2, c3, k0, k1)))
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, 0xD2511F53)
        hi1, lo1 = _mulhilo(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return torch.stack([c0, c1, c2, c3], dim=-1)


def to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """23 random bits k to float32 (k + 0.5) * 2^-23 with the header's two float32 operations (exact:
    u lies in [2^-24, 1 - 2^-24])."""
    return _fmul(_fadd((bits >> 9).to(torch.float32), _c(0.5)), _c(1.1920928955078125e-07))


def _int64(v) -> torch.Tensor:
    """An int (any 64-bit pattern, e.g. an offset >= 2^63) or int64 tensor as an int64 tensor."""
    if not isinstance(v, torch.Tensor):
        v = int(v) & (2**64 - 1)
        v = v - 2**64 if v >= 2**63 else v
    return torch.as_tensor(v, dtype=torch.int64)


def uniforms(seed, offset, j: int, stream: int, index) -> torch.Tensor:
    """Uniform number `index` (int64 tensor) of (seed, offset, position j, stream): word index & 3 of the
    Philox block keyed by seed with counter (index >> 2, j << 8 | stream, offset lo, offset hi)."""
    seed, offset = _int64(seed), _int64(offset)
    index = torch.as_tensor(index, dtype=torch.int64)
    words = philox(index >> 2, (j << 8) | stream, offset, offset >> 32, seed, seed >> 32)
    return to_uniform(words.gather(-1, (index & 3).unsqueeze(-1)).squeeze(-1))


def _bits_float(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)  # bits < 2^31 here


def av_log(x: torch.Tensor) -> torch.Tensor:
    """The header's av_log: natural log of positive normal float32 values."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & _M32
    e = ((bits >> 23) & 0xFF) - 127
    m = _bits_float((bits & 0x007FFFFF) | 0x3F800000)
    big = m > _c(1.41421356)
    m = torch.where(big, _fmul(m, _c(0.5)), m)
    e = torch.where(big, e + 1, e)
    s = _fdiv(_fsub(m, _c(1.0)), _fadd(m, _c(1.0)))
    s2 = _fmul(s, s)
    poly = _c(0.11111111)
    for coef in (0.14285715, 0.2, 0.33333334):
        poly = _fadd(_fmul(poly, s2), _c(coef))
    t = _fadd(s, _fmul(_fmul(s, s2), poly))
    log_m = _fadd(t, t)
    ef = e.to(torch.float32)  # exact
    return _fadd(_fmul(ef, _c(0.693145751953125)), _fadd(_fmul(ef, _c(1.42860677e-06)), log_m))


def av_exp(x: torch.Tensor) -> torch.Tensor:
    """The header's av_exp: e^x for x <= 0; 0 below -103 and for NaN."""
    x = x.to(torch.float32)
    valid = x > -103.0
    x = torch.where(valid, x, _c(0.0))
    kf = torch.floor(_fadd(_fmul(x, _c(1.44269504)), _c(0.5)))
    r = _fsub(_fsub(x, _fmul(kf, _c(0.693145751953125))), _fmul(kf, _c(1.42860677e-06)))
    p = _c(1.98412698e-04)
    for coef in (1.38888889e-03, 8.33333377e-03, 4.16666679e-02, 0.166666672, 0.5, 1.0, 1.0):
        p = _fadd(_fmul(p, r), _c(coef))
    k = kf.to(torch.int64).clamp(max=0)
    normal = _fmul(p, _bits_float((k.clamp(min=-126) + 127) << 23))
    tiny = _fmul(_fmul(p, _bits_float((k.clamp(min=-191) + 127 + 64) << 23)), _bits_float(torch.tensor(0x1F800000)))
    return torch.where(valid, torch.where(k >= -126, normal, tiny), _c(0.0))


def canonical_sum(terms: torch.Tensor) -> torch.Tensor:
    """Sum of float32 [V] in the kernels' order: 256 lanes, lane l adding v = l, l + 256, ... in turn,
    then the pairwise tree lane[l] += lane[l + s], s = 128 .. 1. Zero padding is exact."""
    V = terms.numel()
    padded = torch.zeros(max(1, -(-V // _LANES)) * _LANES, dtype=torch.float32)
    padded[:V] = terms
    rows = padded.view(-1, _LANES)
    part = rows[0].clone()
    for row in rows[1:]:
        part = _fadd(part, row)
    s = _LANES // 2
    while s >= 1:
        part = _fadd(part[:s], part[s:2 * s])
        s //= 2
    return part[0]


def _argmax(x: torch.Tensor) -> int:
    """First maximum (smallest id), NaN treated as -inf; 0 when nothing beats -inf."""
    return int(torch.argmax(torch.where(torch.isnan(x), _c(float("-inf")), x)))


_FLT_MIN = 1.17549435e-38  # min_p below the smallest normal float is off


def kept_tokens(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """bool [V]: the tokens a row keeps under min-p, then top-k, then top-p (vLLM's order), z = logits / T.

    Read by sorting: rank the tokens by z descending, then id ascending (a stable sort of the descending z); NaN
    is never kept. min-p keeps z_v >= max z + av_log(min_p); top-k the first k of what is left; top-p the
    first tokens of that up to and including the one where the cumulative mass reaches top_p * M, masses
    floor(av_exp(z_v - max z) * 2^32) and M their sum (M = 0: top-p keeps everything)."""
    V = z.numel()
    # Out-of-range values turn their filter off (what the CUDA kernel does; the CPU path rejects them).
    top_k = top_k if top_k > 0 else 0
    top_p = top_p if 0.0 < top_p <= 1.0 else 1.0
    min_p = min_p if 0.0 <= min_p <= 1.0 else 0.0
    valid = ~torch.isnan(z)
    if not bool(valid.any()):
        return valid
    m = z[valid].max()
    if not bool(m > float("-inf")):
        return valid
    keep = valid.clone()
    if min_p >= _FLT_MIN:
        keep &= z >= _fadd(m, av_log(torch.tensor(min_p, dtype=torch.float32)))
    zz = torch.where(z == 0, _c(0.0), z)  # -0 ranks as +0
    order = torch.sort(torch.where(valid, zz, _c(float("-inf"))), descending=True, stable=True).indices
    ranked = order[keep[order]]
    if 0 < top_k < V:
        ranked = ranked[:top_k]
    if top_p < 1.0:
        mass = (av_exp(_fsub(z[ranked], m)) * 4294967296.0).to(torch.int64)  # exact scale, truncated
        total = int(mass.sum())
        if total > 0:
            target = float(top_p) * float(total)  # one double rounding, as the kernels
            before = torch.cumsum(mass, 0) - mass
            take = before.to(torch.float64) < target
            take[0] = True
            ranked = ranked[take]
    out = torch.zeros(V, dtype=torch.bool)
    out[ranked] = True
    return out


def _race(z: torch.Tensor, seed, offset, j: int, stream: int, keep=None) -> int:
    """Gumbel-max sample of softmax(z) over the kept tokens: argmax_v z_v - av_log(E_v), E_v = -av_log(u_v)."""
    E = -av_log(uniforms(seed, offset, j, stream, torch.arange(z.numel())))
    score = _fsub(z, av_log(E))
    if keep is not None:
        score = torch.where(keep, score, _c(float("-inf")))
    return _argmax(score)


def token_logprob(z: torch.Tensor, tok: int) -> float:
    """log softmax(z)[tok], untruncated: (z_tok - max z) - av_log(canonical sum of av_exp(z_v - max z))."""
    valid = ~torch.isnan(z)
    if not bool(valid.any()):
        return float("-inf")
    m = z[valid].max()
    if not bool(m > float("-inf")):
        return float("-inf")
    e = torch.where(valid, av_exp(_fsub(z, m)), _c(0.0))
    return float(_fsub(_fsub(z[tok], m), av_log(canonical_sum(e))))


def _judge_with_probs(z, q, x, seed, offset, j, keep=None):
    """(accepted, recovered token) for draft x ~ q judged by logits z / T (float32 [V]), the target restricted to
    the kept tokens."""
    V = z.numel()
    m = torch.where(torch.isnan(z), _c(float("-inf")), z).max()
    if not bool(torch.isfinite(m)):  # no finite logit, or a +inf one: p is 0/0; reject and emit id 0
        return False, 0
    if keep is None:
        keep = ~torch.isnan(z)
    e = torch.where(keep, av_exp(_fsub(z, m)), _c(0.0))
    p = _fdiv(e, canonical_sum(e))
    if 0 <= x < V and float(q[x]) > 0.0:  # q(x) == 0 (or not a probability) rejects
        u = uniforms(seed, offset, j, _ACCEPT, torch.tensor(0))
        if bool(_fmul(u, q[x]) < p[x]):
            return True, x
    d = _fsub(p, q)
    w = torch.where(d > 0, d, _c(0.0))  # max(p - q, 0), NaN q weighs 0
    if not bool((w > 0).any()):
        w = p
    E = -av_log(uniforms(seed, offset, j, _RACE, torch.arange(V)))
    return False, _argmax(_fdiv(w, E))


def _seeds_or_fresh(seeds, temperature, n, device):
    """Unseeded requests (seeds None) draw independent streams: one int64 seed each from torch's default
    generator of the tensors' device, drawn only when some request samples (temperature given)."""
    if seeds is not None:
        return seeds.cpu().long()
    if temperature is None:
        return torch.zeros(n, dtype=torch.int64)
    return torch.randint(-2**63, 2**63 - 1, (n,), dtype=torch.int64, device=device).cpu()


def _param(values, r, default):
    return default if values is None else values[r]


def rejection_sample(target_logits, query_start_loc, draft_tokens, *, draft_probs=None, temperature=None,
                     seeds=None, offset=0, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.rejection_sample (same arguments, ``out`` excepted).

    Request r judges its L[r] = q_len[r] - 1 drafts with rows query_start_loc[r] + j (q_len 0: padding,
    nothing emitted). Greedy (T = 0): accept iff the draft is the argmax. Without draft_probs: one race
    per row over the kept tokens (:func:`kept_tokens`), accept iff it picks the draft, else emit its winner.
    With draft_probs: p is softmax(z) restricted to the kept tokens; accept iff u * q(x) < p(x) (x in [0, V)
    and q(x) > 0), else emit the residual race argmax max(p - q, 0) / E. Bonus after L accepted drafts:
    argmax or race of row L. A row with no finite logit emits id 0 (greedy, race and residual alike).
    Returns (output_tokens [R, K + 1] int32 padded with -1, num_emitted [R] int32[, logprobs [R, K + 1]
    float32: :func:`token_logprob` of each emitted token at T (1 when greedy), -inf past num_emitted]).
    """
    R, K = draft_tokens.shape
    logits = target_logits.detach().cpu().to(torch.float32)
    qsl = query_start_loc.cpu().long().tolist()
    drafts = draft_tokens.cpu().long()
    probs = None if draft_probs is None else draft_probs.detach().cpu().to(torch.float32)
    temps = torch.zeros(R) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, R, target_logits.device)
    offset = int(offset)
    out = torch.full((R, K + 1), -1, dtype=torch.int32)
    emitted = torch.zeros(R, dtype=torch.int32)
    lps = torch.full((R, K + 1), float("-inf"), dtype=torch.float32)
    for r in range(R):
        q_len = qsl[r + 1] - qsl[r]
        if q_len == 0:
            continue
        T, seed = temps[r], seeds[r]
        trunc = (_param(ks, r, 0), _param(ps, r, 1.0), _param(mps, r, 0.0))
        n = 0
        for j in range(q_len):
            row = logits[qsl[r] + j]
            bonus = j == q_len - 1
            x = None if bonus else int(drafts[r, j])
            if float(T) == 0.0:
                y = _argmax(row)
                accepted = y == x
            else:
                z = _fdiv(row, T)
                keep = kept_tokens(z, *trunc)
                if bonus or probs is None:
                    y = _race(z, seed, offset, j, _RACE, keep)
                    accepted = y == x
                else:
                    accepted, y = _judge_with_probs(z, probs[r, j], x, seed, offset, j, keep)
            out[r, n] = y
            lps[r, n] = token_logprob(row if float(T) == 0.0 else _fdiv(row, T), y)
            n += 1
            if not accepted:
                break
        emitted[r] = n
    dev = target_logits.device
    if logprobs:
        return out.to(dev), emitted.to(dev), lps.to(dev)
    return out.to(dev), emitted.to(dev)


def tree_rejection_sample(target_logits, query_start_loc, token_parent, input_ids, max_query_len, *,
                          temperature=None, seeds=None, offset=0, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.tree_rejection_sample (same arguments, ``out`` excepted), for valid trees.

    From request r's anchor (offset 0): y = argmax (T = 0) or a race over the kept tokens of the current token's
    row at position = its depth; go to the child (token_parent == current offset) whose input id is y, else emit y
    and stop. Returns (output_tokens [R, W] int32, num_emitted [R] int32, accepted_offsets [R, W] int32), -1 padded,
    W = max_query_len[, logprobs [R, W] float32: :func:`token_logprob` of each emitted token at T (1 when greedy),
    -inf past num_emitted]."""
    R, W = query_start_loc.numel() - 1, max_query_len
    logits = target_logits.detach().cpu().to(torch.float32)
    qsl = query_start_loc.cpu().long().tolist()
    parent, ids = token_parent.cpu().long(), input_ids.cpu().long()
    temps = torch.zeros(R) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, R, target_logits.device)
    out = torch.full((R, W), -1, dtype=torch.int32)
    emitted = torch.zeros(R, dtype=torch.int32)
    path = torch.full((R, W), -1, dtype=torch.int32)
    lps = torch.full((R, W), float("-inf"), dtype=torch.float32)
    for r in range(R):
        begin, q_len = qsl[r], qsl[r + 1] - qsl[r]
        cur, depth = 0, 0
        while q_len > 0:
            row = logits[begin + cur]
            if float(temps[r]) == 0.0:
                y = _argmax(row)
            else:
                z = _fdiv(row, temps[r])
                keep = kept_tokens(z, _param(ks, r, 0), _param(ps, r, 1.0), _param(mps, r, 0.0))
                y = _race(z, seeds[r], int(offset), depth, _RACE, keep)
            out[r, depth], path[r, depth] = y, cur
            lps[r, depth] = token_logprob(row if float(temps[r]) == 0.0 else _fdiv(row, temps[r]), y)
            depth += 1
            kids = [i for i in range(1, q_len) if int(parent[begin + i]) == cur and int(ids[begin + i]) == y]
            if not kids:
                break
            cur = kids[0]
        emitted[r] = depth
    dev = target_logits.device
    if logprobs:
        return out.to(dev), emitted.to(dev), path.to(dev), lps.to(dev)
    return out.to(dev), emitted.to(dev), path.to(dev)


def sample(logits, temperature=None, seeds=None, offset=0, *, top_k=None, top_p=None, min_p=None, logprobs=False):
    """Reference of adaptive_verify.sample: argmax (T = 0) or a race over the kept tokens on stream 2,
    position 0, per row; with ``logprobs`` also each token's :func:`token_logprob`."""
    N = logits.shape[0]
    x = logits.detach().cpu().to(torch.float32)
    temps = torch.zeros(N) if temperature is None else temperature.cpu().to(torch.float32)
    ks = None if top_k is None else top_k.cpu().tolist()
    ps = None if top_p is None else top_p.cpu().to(torch.float32).tolist()
    mps = None if min_p is None else min_p.cpu().to(torch.float32).tolist()
    seeds = _seeds_or_fresh(seeds, temperature, N, logits.device)
    out = torch.empty(N, dtype=torch.int32)
    lps = torch.empty(N, dtype=torch.float32)
    for n in range(N):
        T = temps[n]
        if float(T) == 0.0:
            out[n] = _argmax(x[n])
            lps[n] = token_logprob(x[n], int(out[n]))
        else:
            z = _fdiv(x[n], T)
            keep = kept_tokens(z, _param(ks, n, 0), _param(ps, n, 1.0), _param(mps, n, 0.0))
            out[n] = _race(z, seeds[n], int(offset), 0, _SAMPLE, keep)
            lps[n] = token_logprob(z, int(out[n]))
    if logprobs:
        return out.to(logits.device), lps.to(logits.device)
    return out.to(logits.device)


# ----------------------------------------------------------------------------------------------------
# verification attention and KV writes (docs/design.md, "Verification attention")
# ----------------------------------------------------------------------------------------------------


def verify_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, *, scale=None,
                     return_lse=False, dtype=torch.float64, tree_mask=None):
    """Readable oracle of adaptive_verify.verify_attention, computed in `dtype` (float64 by default).

    q [T, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_table [R, max_blocks];
    seq_lens [R] (KV length including this step's tokens); query_start_loc [R + 1]. Query token i of
    request r attends to KV positions 0 .. seq_lens[r] - q_len[r] + i. With tree_mask [T] int64 (draft
    trees), it attends to its context 0 .. context_len - 1 (context_len = seq_lens[r] - q_len[r]) and to
    context_len + k for each k <= i whose bit k of tree_mask[token] is set (higher bits are ignored). A token
    that sees nothing, like the tokens of padding rows (q_len 0) and past query_start_loc[R], gets zeros (and
    lse -inf). Returns out [T, Hq, D] in q's dtype (as float `dtype` when dtype is given explicitly and
    differs) and lse [T, Hq] float32 when asked.
    """
    T, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, Hq, D, dtype=dtype)
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32)
    qsl = query_start_loc.cpu().long()
    for r in range(block_table.shape[0]):
        begin, end = int(qsl[r]), int(qsl[r + 1])
        q_len, kv_len = end - begin, int(seq_lens[r])
        if q_len <= 0:
            continue
        pos = torch.arange(kv_len)
        blocks = block_table[r].cpu().long()[pos // block_size]
        k = k_cache.cpu()[blocks, pos % block_size].to(dtype)  # [kv_len, Hkv, D]
        v = v_cache.cpu()[blocks, pos % block_size].to(dtype)
        k = k.repeat_interleave(group, dim=1)  # [kv_len, Hq, D]: query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        qr = q[begin:end].cpu().to(dtype)  # [q_len, Hq, D]
        scores = torch.einsum("ihd,phd->hip", qr, k) * scale  # [Hq, q_len, kv_len]
        context_len = kv_len - q_len
        i = torch.arange(q_len)[:, None]  # query offsets [q_len, 1]
        block_pos = pos[None, :] - context_len  # offset in the verified block of each KV position [1, kv_len]
        visible = block_pos <= i  # [q_len, kv_len]: the context and the causal part of the block
        if tree_mask is not None:
            masks = tree_mask[begin:end].cpu().long()[:, None]  # [q_len, 1]
            bit_set = (masks >> block_pos.clamp(0, 63)) & 1 == 1
            visible = visible & ((block_pos < 0) | bit_set)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        seen = visible.any(dim=1)  # [q_len]: a token that sees nothing gets zeros and lse -inf
        probs = torch.where(seen[None, :, None], torch.softmax(scores, dim=-1), 0.0)  # [Hq, q_len, kv_len]
        # Every token sees the whole context; in the block each token multiplies only the V rows it sees (a
        # hidden row's V is zeroed, so a NaN there never reaches it as 0 * NaN).
        out_ctx = torch.einsum("hip,phd->ihd", probs[..., :context_len], v[:context_len])
        v_block = torch.where(visible[:, context_len:, None, None], v[None, context_len:], 0.0)  # [i, j, Hq, D]
        out_block = torch.einsum("hij,ijhd->ihd", probs[..., context_len:], v_block)
        out[begin:end] = out_ctx + out_block
        lse[begin:end] = torch.logsumexp(scores, dim=-1).transpose(0, 1).float()
    out = out.to(q.dtype) if dtype == torch.float64 else out
    return (out, lse) if return_lse else out


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    """Oracle of adaptive_verify.write_kv on copies: token t's K/V go to slot slot_mapping[t]
    (block slot // block_size, offset slot % block_size); slot -1 is skipped. Returns (k_cache, v_cache)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = k[t]
        v_cache[slot // block_size, slot % block_size] = v[t]
    return k_cache, v_cache
