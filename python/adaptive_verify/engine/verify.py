"""Exact greedy acceptance of drafts, for training the confidence head and for evaluation.

Under greedy verification draft j is accepted iff drafts 0..j equal the target's greedy continuation of
the context. For a window of text and drafts at many anchors, one dense target forward computes that
exactly: the drafts of anchor p are appended as a branch at positions p + 1 .. p + K - 1 that sees the
text up to p and its own earlier drafts (tree attention), so the target's argmax at each branch token is
its greedy prediction given the context plus the drafts before it.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .drafter import DSparkDrafter
from .model import TinyTarget


def tree_mask(L: int, anchors: torch.Tensor, K: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mask [L + P*(K-1), L + P*(K-1)] bool, positions [L + P*(K-1)] int64) for a text of L tokens and P
    anchors (positions [P]), each with a branch of K - 1 draft tokens (the last draft needs no token)."""
    P, B = anchors.numel(), K - 1
    N = L + P * B
    pos = torch.cat([torch.arange(L), (anchors[:, None] + 1 + torch.arange(B)).flatten()])  # [N]
    mask = torch.zeros(N, N, dtype=torch.bool)
    mask[:L, :L] = torch.ones(L, L, dtype=torch.bool).tril()
    branch = L + torch.arange(P * B).view(P, B)  # [P, B] token index of draft j of anchor p
    # A branch token sees the text up to and including its anchor ...
    mask[L:, :L] = torch.arange(L)[None, :] <= anchors.repeat_interleave(B)[:, None]
    # ... and the earlier tokens of its own branch (and itself).
    for p in range(P):
        rows = branch[p]
        mask[rows[:, None], rows[None, :]] = torch.ones(B, B, dtype=torch.bool).tril()
    return mask, pos


@torch.no_grad()
def draft_and_verify(target: TinyTarget, drafter: DSparkDrafter, ids: torch.Tensor, anchors: torch.Tensor,
                     mask: torch.Tensor, positions: torch.Tensor):
    """Drafts at every anchor of each window and their exact greedy acceptance.

    ids: [Bw, L] text windows; anchors: [P] positions in 1..L-K (the anchor token is ids[:, p], the
    drafter's h is the target hidden at p - 1). Returns (drafts [Bw, P, K] int64,
    conf_hidden [Bw, P, K, H], markov [Bw, P, K, Q], accepted [Bw, P, K] bool, cumulative).
    """
    Bw, L = ids.shape
    K = drafter.config.num_drafts
    _, hidden = target.forward_dense(ids)  # [Bw, L, d]
    h = hidden[:, anchors - 1].flatten(0, 1)  # [Bw*P, d]
    anchor_ids = ids[:, anchors].flatten()  # [Bw*P]
    drafts, conf_hidden, markov = drafter.draft(h, anchor_ids)  # [Bw*P, K], [Bw*P, K, H], [Bw*P, K, Q]
    drafts = drafts.long().view(Bw, -1, K)
    tree_ids = torch.cat([ids, drafts[:, :, :K - 1].flatten(1)], dim=1)  # [Bw, L + P*(K-1)]
    logits, _ = target.forward_dense(tree_ids, positions=positions, attn_mask=mask)
    greedy = logits.argmax(-1)  # [Bw, N]
    pred0 = greedy[:, anchors]  # [Bw, P]: the target's next token after the anchor
    pred_rest = greedy[:, L:].view(Bw, -1, K - 1)  # [Bw, P, K-1]: after each draft
    match = drafts == torch.cat([pred0[..., None], pred_rest], -1)  # [Bw, P, K]
    accepted = match.long().cumprod(-1).bool()
    return drafts, conf_hidden.view(Bw, -1, K, conf_hidden.shape[-1]), markov.view(Bw, -1, K, markov.shape[-1]), accepted
