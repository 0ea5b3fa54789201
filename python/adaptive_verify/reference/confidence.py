"""Confidence-area references (float64 oracles): confidence heads, margins and acceptance statistics."""
from __future__ import annotations

import torch

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


def stats_update(conf, verify_lens, num_accepted, num_positions, num_bins, positions=None):
    """(trials, survivals, conf_sum) [num_positions, num_bins] of one step, by the literal definition. positions:
    [R] or None, row r's entry j at position positions[r] + j (every trial's must lie in [0, num_positions))."""
    trials = torch.zeros(num_positions, num_bins, dtype=torch.int64)
    survivals = torch.zeros_like(trials)
    conf_sum = torch.zeros(num_positions, num_bins, dtype=torch.float64)
    for r in range(conf.shape[0]):
        for j in range(conf.shape[1]):
            c = float(conf[r, j])
            if j < int(verify_lens[r]) and j <= int(num_accepted[r]) and c == c:
                at = j if positions is None else int(positions[r]) + j
                assert 0 <= at < num_positions, "a trial outside the positions"
                t = c * num_bins  # clamp as a float first: c may be +-inf or huge
                b = num_bins - 1 if t >= num_bins else (int(t) if t > 0 else 0)
                trials[at, b] += 1
                survivals[at, b] += int(j < int(num_accepted[r]))
                conf_sum[at, b] += min(max(c, 0.0), 1.0)
    return trials, survivals, conf_sum


def stats_totals(verify_lens, num_accepted, max_drafts):
    """AcceptanceStats.totals added by one update: [sum of verify_lens, sum of min(num_accepted, verify_lens)] over
    every row (int64), nothing when conf has no columns (max_drafts == 0)."""
    v, a = [int(x) for x in verify_lens], [int(x) for x in num_accepted]
    if max_drafts == 0:
        return torch.zeros(2, dtype=torch.int64)
    return torch.tensor([sum(v), sum(min(x, y) for x, y in zip(a, v))], dtype=torch.int64)
