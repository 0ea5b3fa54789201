"""Acceptance and calibration metrics for the engine's drafter (small, dependency-free)."""
from __future__ import annotations

import torch


def acceptance_report(accepted: torch.Tensor) -> dict:
    """accepted [N, K] bool, cumulative (draft j accepted => drafts < j accepted). Returns per-position
    conditional acceptance P(j | < j), cumulative acceptance P(0..j) and the mean accepted length."""
    acc = accepted.float()
    cumulative = acc.mean(0)  # [K]
    prev = torch.cat([torch.ones(1), cumulative[:-1]])
    conditional = cumulative / prev.clamp_min(1e-12)
    return {
        "acceptance_conditional": [round(x, 4) for x in conditional.tolist()],
        "acceptance_cumulative": [round(x, 4) for x in cumulative.tolist()],
        "mean_accepted_length": round(acc.sum(1).mean().item(), 4),
    }


def auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    score, label = score.double().flatten(), label.bool().flatten()
    pos, neg = label.sum().item(), (~label).sum().item()
    if pos == 0 or neg == 0:
        return float("nan")
    order = score.argsort()
    ranks = torch.empty_like(score)
    ranks[order] = torch.arange(1, score.numel() + 1, dtype=torch.float64)
    # average ranks of ties
    uniq, inv = score.unique(return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, ranks)
    cnts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, torch.ones_like(ranks))
    ranks = (sums / cnts)[inv]
    return ((ranks[label].sum().item() - pos * (pos + 1) / 2) / (pos * neg))


def ece(prob: torch.Tensor, label: torch.Tensor, num_bins: int = 15) -> float:
    """Expected calibration error with ``num_bins`` equal-width bins."""
    prob, label = prob.double().flatten(), label.double().flatten()
    bins = (prob * num_bins).long().clamp(0, num_bins - 1)
    total = 0.0
    for b in range(num_bins):
        sel = bins == b
        if sel.any():
            total += sel.sum().item() * abs(prob[sel].mean().item() - label[sel].mean().item())
    return total / prob.numel()
