"""Random decode steps planned by this library (CPU), shared by the peer-structure tests."""
from __future__ import annotations

import numpy as np
import torch

import adaptive_verify as av

K = 5
BLOCK = 4
VOCAB = 1000


def make_step(seed: int, R: int, *, budget=None, R_pad=None, token_offset=0, T_pad=None, K=K):
    """A fixed-budget CPU plan with every metadata output, and its inputs (drafts as vLLM-style lists)."""
    rng = np.random.default_rng(seed)
    conf = torch.from_numpy(rng.uniform(0.05, 0.99, (R, K)).astype(np.float32)).contiguous()
    drafts_l = [[int(x) for x in rng.integers(0, VOCAB, rng.integers(0, K + 1))] for _ in range(R)]
    draft_tokens = torch.zeros(R, K, dtype=torch.int32)
    for r, d in enumerate(drafts_l):
        draft_tokens[r, : len(d)] = torch.tensor(d, dtype=torch.int32)
    drafts = torch.tensor([len(d) for d in drafts_l], dtype=torch.int32)
    ctx = torch.from_numpy(rng.integers(1, 30, R).astype(np.int32))
    max_blocks = (30 + K + 1) // BLOCK + 1
    bt = torch.from_numpy(rng.permutation(max(R, 1) * max_blocks)[: R * max_blocks].reshape(R, max_blocks)
                          .astype(np.int32)).contiguous()
    anchors = torch.from_numpy(rng.integers(0, VOCAB, R).astype(np.int32))
    survival = av.prefix_survival(conf, drafts)
    if budget is None:
        budget = int(rng.integers(0, int(drafts.sum()) + 1)) if R else 0
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=budget, context_lens=ctx, block_table=bt,
                                block_size=BLOCK, anchor_tokens=anchors, draft_tokens=draft_tokens,
                                token_offset=token_offset, num_reqs_padded=R_pad, num_tokens_padded=T_pad)
    return dict(plan=plan, conf=conf, drafts_l=drafts_l, draft_tokens=draft_tokens, drafts=drafts, ctx=ctx, bt=bt,
                anchors=anchors, R=R, K=K, token_offset=token_offset)


CASES = [
    dict(seed=0, R=6),
    dict(seed=1, R=9, budget=0),
    dict(seed=2, R=7, budget=10 ** 6),  # clamped: every draft
    dict(seed=3, R=5, R_pad=8, token_offset=11),
    dict(seed=4, R=12, T_pad=64),
    dict(seed=5, R=1),
    dict(seed=6, R=33, R_pad=40, T_pad=256),
]
