"""DSparkDrafter: a block drafter with a parallel backbone, a light sequential Markov head and a linear
confidence head (the DSpark shape, docs/design.md, "Confidence and calibration"), sized for :class:`TinyTarget`.

Conventions (the same as EAGLE / vLLM's drafters and the planner's ``anchor_tokens``): at a decode step
the request's last emitted token, the *anchor* at position p, is not yet in the target's KV cache; ``h``
is the target's hidden state at position p - 1 (the one whose logits produced the anchor). The drafter
proposes drafts d_0..d_{K-1} for positions p + 1 .. p + K, and the next target step verifies
[anchor, d_0, ..., d_{v-1}] with q_len = 1 + v.

- Backbone (parallel, one shot): base = MLP([RMSNorm(h), embed(anchor)]); K learned position vectors are
  added to base and two residual MLP blocks (shared across positions) refine each, giving the
  position-specific hidden states ``conf_hidden`` [R, K, H] and backbone logits [R, K, 256].
- Markov head (sequential, cheap): draft j's logits = backbone logits_j + markov_emb(prev_j) @ markov_out,
  prev_0 = anchor, prev_j = d_{j-1}; a rank-Q bigram correction, the only part that runs K times.
- Confidence head: one linear layer over [conf_hidden_j, markov_j] -> logit of
  P(d_j accepted | d_<j accepted), in the layout ``adaptive_verify.confidence`` takes. markov_j is the
  previous token's Markov embedding plus two numbers the sequential pick already has: the chosen draft's
  log-probability under the drafter and its top-1 minus top-2 logit margin (cheap, and the strongest
  single predictors of acceptance).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaptive_verify as av

from .model import VOCAB, RMSNorm

NUM_SCORE_FEATURES = 2  # log-prob of the chosen draft, top-1 minus top-2 margin


@dataclass
class DrafterConfig:
    target_dim: int = 256  # the target's d_model
    num_drafts: int = 6  # K
    hidden: int = 256  # H
    mlp_hidden: int = 512
    markov_dim: int = 32  # Markov embedding width; Q = markov_dim + NUM_SCORE_FEATURES
    vocab: int = VOCAB

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def q_features(self) -> int:
        return self.markov_dim + NUM_SCORE_FEATURES


class _MLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = RMSNorm(dim, 1e-5)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


class DSparkDrafter(nn.Module):
    """See the module docstring. ``draft`` and ``confidence`` are the inference API; ``backbone`` and
    ``draft_logits`` are what training uses."""

    def __init__(self, config: Optional[DrafterConfig] = None):
        super().__init__()
        self.config = c = config or DrafterConfig()
        self.h_norm = RMSNorm(c.target_dim, 1e-5)
        self.anchor_embed = nn.Embedding(c.vocab, c.hidden)
        self.inp = nn.Linear(c.target_dim + c.hidden, c.hidden)
        self.pos = nn.Parameter(torch.randn(c.num_drafts, c.hidden) * 0.02)  # [K, H] learned position queries
        self.blocks = nn.ModuleList(_MLPBlock(c.hidden, c.mlp_hidden) for _ in range(2))
        self.out_norm = RMSNorm(c.hidden, 1e-5)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        self.markov_embed = nn.Embedding(c.vocab, c.markov_dim)
        self.markov_out = nn.Linear(c.markov_dim, c.vocab, bias=False)
        nn.init.zeros_(self.markov_out.weight)  # start as the pure backbone
        # Confidence head [H + Q] and bias, fitted after the drafter (logistic regression); STS temperatures [K].
        self.register_buffer("conf_weight", torch.zeros(c.hidden + c.q_features))
        self.register_buffer("conf_bias", torch.zeros(()))
        self.register_buffer("conf_temperature", torch.ones(c.num_drafts))

    def backbone(self, h: torch.Tensor, anchor: torch.Tensor,
                 levels: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(conf_hidden [R, D, H], backbone logits [R, D, V]) from h [R, d] and anchor ids [R], for the first D =
        levels positions (default K): a shallower draft runs a smaller forward."""
        base = self.inp(torch.cat([self.h_norm(h), self.anchor_embed(anchor.long())], dim=-1))  # [R, H]
        z = base[:, None, :] + self.pos[:levels]  # [R, D, H]
        for block in self.blocks:
            z = block(z)
        z = self.out_norm(z)
        return z, self.lm_head(z)

    def draft_logits(self, backbone_logits: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Full draft logits [R, K, V] given the previous token of each position, prev [R, K] (teacher
        forcing in training; at inference ``draft`` builds prev one position at a time)."""
        return backbone_logits + self.markov_out(self.markov_embed(prev.long()))

    @staticmethod
    def score_features(logits: torch.Tensor) -> torch.Tensor:
        """[..., 2]: log-prob of the argmax and the top-1 minus top-2 margin of logits [..., V]."""
        top2 = logits.topk(2, dim=-1).values  # [..., 2]
        logp = top2[..., 0] - torch.logsumexp(logits, dim=-1)
        return torch.stack([logp, top2[..., 0] - top2[..., 1]], dim=-1)

    @torch.no_grad()
    def draft(self, h: torch.Tensor, anchor: torch.Tensor,
              levels: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Greedy drafts: (draft_tokens [R, D] int32, conf_hidden [R, D, H], markov [R, D, Q]), all float32.

        h: [R, d] target hidden at the position before the anchor; anchor: [R] the last emitted token ids.
        levels: D, the positions drafted (default K, in [1, K]): AdaptiveVerifier.plan_draft's depth, so the
        backbone and the Markov head run for those positions only.
        """
        K = self.config.num_drafts if levels is None else levels
        if not 1 <= K <= self.config.num_drafts:
            raise ValueError(f"levels must be in [1, {self.config.num_drafts}], got {levels!r}")
        conf_hidden, bb_logits = self.backbone(h, anchor, K)  # [R, D, H], [R, D, V]
        prev = anchor.long()  # [R]
        tokens, markov = [], []
        for j in range(K):  # only the Markov term depends on the previous draft
            m = self.markov_embed(prev)  # [R, markov_dim]
            logits = bb_logits[:, j] + self.markov_out(m)  # [R, V]
            markov.append(torch.cat([m, self.score_features(logits)], dim=-1))
            prev = logits.argmax(-1)
            tokens.append(prev)
        return torch.stack(tokens, 1).to(torch.int32), conf_hidden, torch.stack(markov, 1)

    def confidence(self, conf_hidden: torch.Tensor, markov: torch.Tensor, *, survival: bool = False,
                   calibrated: bool = True) -> torch.Tensor:
        """conf [R, D] float32 (or prefix survival with survival=True) via the fused ``av.confidence`` op, for the D
        positions of conf_hidden [R, D, H]; calibrated=False skips the fitted STS temperatures."""
        D = conf_hidden.shape[1]
        return av.confidence(conf_hidden, self.conf_weight, bias=self.conf_bias.to(torch.float32), markov=markov,
                             temperature=self.conf_temperature[:D] if calibrated else None, survival=survival)

    def confidence_logits(self, conf_hidden: torch.Tensor, markov: torch.Tensor) -> torch.Tensor:
        """The head's raw logits [R, K] in torch (for fitting temperatures)."""
        return torch.cat([conf_hidden, markov], -1).float() @ self.conf_weight + self.conf_bias
