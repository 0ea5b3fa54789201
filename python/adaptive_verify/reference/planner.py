"""Planner references: prefix survival, the candidate order of chains and trees, Theta, the budget and the chain
plan (docs/design.md, "Planner")."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

FIXED_ONE = 2**32  # survival 1.0 in 32.32 fixed point


@dataclasses.dataclass(frozen=True)
class Plan:
    """The reference chain plan: the outputs of adaptive_verify.plan_verification under the same field names as
    adaptive_verify.VerifyPlan (docs/design.md, "Planner", outputs), in a type of the oracle's own, so that it
    shares no code with the planner it checks. Optional fields are None where the op leaves them out."""

    verify_lens: torch.Tensor  # [R_pad] int32
    budget: torch.Tensor  # 0-d int32
    expected_tokens: torch.Tensor  # 0-d float32
    num_tokens: torch.Tensor  # 0-d int32
    query_start_loc: torch.Tensor  # [R_pad + 1] int32
    token_req: torch.Tensor  # [T_pad] int32
    seq_lens: Optional[torch.Tensor] = None  # [R_pad] int32
    positions: Optional[torch.Tensor] = None  # [T_pad] int32
    slot_mapping: Optional[torch.Tensor] = None  # [T_pad] int64
    input_ids: Optional[torch.Tensor] = None  # [T_pad] int32


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
class ResolvedArgs:
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


def resolve_args(survival, drafts, cost_table, *, mode, budget=None, min_verify=0, max_verify=None,
                 extra_tokens=0, extra_emitting=0, capacity=None, context_lens=None, block_table=None,
                 block_size=None, anchor_tokens=None, draft_tokens=None, token_offset=0, num_reqs_padded=None,
                 num_tokens_padded=None, verification=None, weights=None, max_step_ms=None) -> ResolvedArgs:
    """The planner's arguments resolved as docs/design.md states them (defaults, the budget cap, the cost array, the
    latency cap), independently of the op's own resolution. Public for the fuzzer, which sizes out= buffers with it.
    """
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
        # A shifted view (CostTable.shifted): the step's time on the table it views, at the real token count.
        real, shift = cost_table.unshifted, cost_table.shifted_by
        step_cap = budget_cap
        for b in range(budget_cap + 1):
            verify = torch.tensor(real.verify_cost(R + extra_tokens + shift + b), dtype=torch.float64).float()
            cost = torch.tensor(draft_cost, dtype=torch.float32) + verify  # float32, as the kernels add
            if float(cost) > float(max_step_ms):
                step_cap = max(b - 1, 0)
                break
    return ResolvedArgs(survival=survival, drafts=drafts.long(), R=R, K=K, device=survival.device, mode=mode,
                        budget=budget, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
                        extra_emitting=extra_emitting, budget_cap=budget_cap, verify_cost=verify_cost,
                        draft_cost=draft_cost, context_lens=context_lens, block_table=block_table,
                        block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens,
                        token_offset=token_offset, num_reqs_padded=R if num_reqs_padded is None else num_reqs_padded,
                        num_tokens_padded=num_tokens_padded, weights=weights, step_cap=step_cap)


def request_weights(a: ResolvedArgs):
    """(w_r / c per request, 1 / c) in float32, c = max(1, largest usable weight); unusable weights (NaN,
    negative, infinite) weigh 1, as on the device. Scaling by c keeps every weighted survival in [0, 1] and does
    not move Theta's argmax."""
    w = a.weights.detach().cpu().float()
    ok = (w >= 0) & torch.isfinite(w)
    w = torch.where(ok, w, torch.ones_like(w))
    c = max(1.0, float(w[ok].max())) if bool(ok.any()) else 1.0
    c = torch.tensor(c, dtype=torch.float32)
    return w / c, torch.tensor(1.0, dtype=torch.float32) / c


def candidate_order(a: ResolvedArgs):
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


def theta(a: ResolvedArgs, prefix_fixed: torch.Tensor, budgets: torch.Tensor) -> torch.Tensor:
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


def choose(a: ResolvedArgs, order=None):
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
    a = resolve_args(survival, drafts, cost_table, **kwargs)
    order = None if parents is None else tree_candidate_order(a, parents)[:4]
    return torch.tensor(choose(a, order)[0], dtype=torch.int32, device=a.device)


def choose_draft_depth(survival, drafts, cost_table, *, min_depth=0, max_step_ms=None, **kwargs):
    """Reference of adaptive_verify.choose_draft_depth by brute force: Theta(D, B) at every depth D and every budget B
    of that depth's [B_min, B_max] (candidates of positions < D, the step's fixed cost cost_table.fixed_cost(R, D),
    the latency cap from that cost), then the largest Theta, ties to the smallest D and then the smallest B (NaN never
    wins). Returns (depth, budget, expected_tokens) as 0-d tensors."""
    R, K = survival.shape if survival is not None else kwargs["conf"].shape
    if survival is None:
        survival = prefix_survival(kwargs.pop("conf"), drafts)
    max_verify = kwargs.pop("max_verify", None)
    max_verify = K if max_verify is None else max_verify
    d_lo = max(min_depth, min(kwargs.get("min_verify", 0), max_verify))
    found = []  # (theta, depth, budget, P fixed)
    for d in range(d_lo, max_verify + 1):
        a = resolve_args(survival, drafts, cost_table, mode="global", max_verify=d, **kwargs)
        budget_cap = a.budget_cap
        if max_verify != d:  # the step's room is its own, whatever the depth (capacity, T_pad): only positions change
            budget_cap = resolve_args(survival, drafts, cost_table, mode="global", max_verify=max_verify,
                                      **kwargs).budget_cap
        a = dataclasses.replace(a, draft_cost=float(cost_table.fixed_cost(R, d)), budget_cap=budget_cap)
        req, pos, s, n_forced = candidate_order(a)
        b_room = min(req.numel(), a.budget_cap)
        b_min = min(n_forced, b_room)
        b_max = b_room
        if max_step_ms is not None:
            real, shift = cost_table.unshifted, cost_table.shifted_by
            for b in range(b_room + 1):
                verify = torch.tensor(real.verify_cost(R + a.extra_tokens + shift + b), dtype=torch.float64).float()
                if float(torch.tensor(a.draft_cost, dtype=torch.float32) + verify) > float(max_step_ms):
                    b_max = max(b_min, min(b_room, b - 1))
                    break
        prefix = torch.cat([torch.zeros(1, dtype=torch.long), (s.cpu() * FIXED_ONE).long().cumsum(0)])
        bs = torch.arange(b_min, b_max + 1)
        for b, t in zip(bs.tolist(), theta(a, prefix[bs], bs).tolist()):
            found.append((t, d, b, int(prefix[b])))
    real = [f for f in found if f[0] == f[0]]
    if real:
        t_best = max(f[0] for f in real)
        _, d, b, p = min((f for f in real if f[0] == t_best), key=lambda f: (f[1], f[2]))
    else:
        _, d, b, p = min(found, key=lambda f: (f[1], f[2]))
    dev = survival.device
    expected = torch.tensor((R * FIXED_ONE + p) / FIXED_ONE, dtype=torch.float64).float()
    return (torch.tensor(d, dtype=torch.int32, device=dev), torch.tensor(b, dtype=torch.int32, device=dev),
            expected.to(dev))


def plan_verification(survival, drafts, cost_table=None, **kwargs) -> Plan:
    """Reference of adaptive_verify.plan_verification (same arguments, ``out`` excepted)."""
    kwargs.setdefault("mode", "greedy")
    a = resolve_args(survival, drafts, cost_table, **kwargs)
    dev, R, Rp, Tp = a.device, a.R, a.num_reqs_padded, a.num_tokens_padded
    budget, (req, pos), prefix = choose(a)
    if a.weights is not None:  # expected tokens stay unweighted: the verified drafts' own survivals
        unweighted = resolve_args(survival, drafts, cost_table, **{k: v for k, v in kwargs.items() if k != "weights"})
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
    return Plan(
        verify_lens=verify_lens,
        budget=torch.tensor(budget, **i32),
        expected_tokens=torch.tensor((R * FIXED_ONE + prefix) / FIXED_ONE, dtype=torch.float32, device=dev),
        num_tokens=torch.tensor(a.token_offset + total, **i32),
        query_start_loc=qsl,
        token_req=token_req,
        **extra,
    )


def tree_candidate_order(a: ResolvedArgs, parents: torch.Tensor):
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
