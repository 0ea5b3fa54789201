"""Readable torch references of every op: the oracle the kernels are tested against.

They follow ../shared/design.md literally and use the same exact arithmetic as the kernels
(float32 products left to right, 32.32 fixed-point survival sums, float64 Theta), so the kernels
must match them integer for integer. Slow by design; never used on a hot path.
"""
from __future__ import annotations

import torch

from .planner import MODES, PlanArgs, VerifyPlan, resolve_plan_args

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


def candidate_order(a: PlanArgs):
    """Candidates in canonical order: forced first, survival descending, position, request.

    Returns (req [N], pos [N], survival [N], n_forced) with survival made non-increasing per row.
    """
    R, K = a.R, a.K
    s = a.survival.float()
    pos = torch.arange(K, device=s.device)
    # A NaN ends its row's candidates.
    nan = torch.isnan(s)
    first_nan = torch.where(nan.any(1), nan.int().argmax(1), torch.full((R,), K, device=s.device))
    cap = torch.minimum(a.drafts.long().clamp(0, K), torch.tensor(a.max_verify, device=s.device))
    cap = torch.minimum(cap, first_nan)
    # Running minimum makes every row non-increasing, so the first B are prefix-closed.
    s = _sanitize(s)
    running = torch.ones(R, device=s.device)
    mono = torch.empty_like(s)
    for j in range(K):
        running = torch.minimum(running, s[:, j])
        mono[:, j] = running
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


def theta(a: PlanArgs, prefix_fixed: torch.Tensor, budgets: torch.Tensor) -> torch.Tensor:
    """Theta(B) in float64 for each B, from P(B) in fixed point (same rounding as the kernels)."""
    num = (a.R + a.extra_emitting) * FIXED_ONE + prefix_fixed
    n = (a.R + a.extra_tokens + budgets).clamp(max=a.verify_cost.numel() - 1)
    cost = torch.tensor(a.draft_cost, dtype=torch.float32) + a.verify_cost.cpu()[n]  # float32 add
    return num.double() / cost.double()


def choose(a: PlanArgs):
    """(budget, canonical order, P(budget) fixed point) for the resolved arguments."""
    req, pos, s, n_forced = candidate_order(a)
    n_cand = req.numel()
    b_max = min(n_cand, a.budget_cap)
    b_min = min(n_forced, b_max)
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
        want = int(a.budget_in) if a.budget_in is not None else a.fixed_budget
        budget = max(b_min, min(want, b_max))
    else:
        budget = b_max
    return budget, (req, pos), int(prefix[budget])


def choose_budget(survival, drafts, cost_table, **kwargs) -> torch.Tensor:
    """Reference of adaptive_verify.choose_budget."""
    kwargs.setdefault("mode", "global")
    a = resolve_plan_args(survival, drafts, cost_table, **kwargs)
    return torch.tensor(choose(a)[0], dtype=torch.int32, device=a.device)


def plan_verification(survival, drafts, cost_table=None, **kwargs) -> VerifyPlan:
    """Reference of adaptive_verify.plan_verification (same arguments, ``out`` excepted)."""
    kwargs.setdefault("mode", "greedy")
    a = resolve_plan_args(survival, drafts, cost_table, **kwargs)
    assert a.mode in MODES
    dev, R, Rp, Tp = a.device, a.R, a.num_reqs_padded, a.num_tokens_padded
    budget, (req, pos), prefix = choose(a)
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

    plan = VerifyPlan(
        verify_lens=verify_lens,
        budget=torch.tensor(budget, **i32),
        expected_tokens=torch.tensor((R * FIXED_ONE + prefix) / FIXED_ONE, dtype=torch.float32, device=dev),
        num_tokens=torch.tensor(a.token_offset + total, **i32),
        query_start_loc=qsl,
        token_req=token_req,
    )
    if a.context_lens is not None:
        ctx = a.context_lens.long()
        plan.seq_lens = torch.zeros(Rp, **i32)
        plan.seq_lens[:R] = (ctx + q_len).to(torch.int32)
        p = ctx[tr] + offset
        plan.positions = torch.zeros(Tp, **i32)
        plan.positions[:total] = p.to(torch.int32)
        if a.block_table is not None:
            blk = p // a.block_size
            ok = (p >= 0) & (blk < a.block_table.shape[1])
            if not bool(ok.all()):
                raise ValueError("block_table: too few blocks per request for context_lens + q_len positions")
            slot = a.block_table.long()[tr, blk.clamp(0, a.block_table.shape[1] - 1)] * a.block_size + p % a.block_size
            plan.slot_mapping = torch.full((Tp,), -1, dtype=torch.int64, device=dev)
            plan.slot_mapping[:total] = slot
    if a.anchor_tokens is not None:
        if a.draft_tokens.shape[1] > 0:
            drafted = a.draft_tokens.long()[tr, (offset - 1).clamp(min=0)]
        else:  # max_verify = 0: every token is an anchor
            drafted = torch.zeros_like(offset)
        plan.input_ids = torch.zeros(Tp, **i32)
        plan.input_ids[:total] = torch.where(offset == 0, a.anchor_tokens.long()[tr], drafted).to(torch.int32)
    return plan


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
                b = min(max(int(c * num_bins), 0), num_bins - 1)
                trials[j, b] += 1
                survivals[j, b] += int(j < int(num_accepted[r]))
                conf_sum[j, b] += min(max(c, 0.0), 1.0)
    return trials, survivals, conf_sum
