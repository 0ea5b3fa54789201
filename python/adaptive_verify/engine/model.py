"""TinyTarget: a small byte-level decoder-only transformer, the target model of the in-repo engine.

One set of weights, two forward paths:
- ``forward_dense(ids [B, L])``: causal attention with torch SDPA, for training and as the test oracle;
- ``forward_paged(...)``: the engine's path, one flat batch of T tokens from R requests, each layer
  writing its K/V with ``adaptive_verify.write_kv`` and attending with ``adaptive_verify.verify_attention``
  over a paged cache (:class:`PagedKV`), so a request may prefill in chunks and verify several tokens per step.

Architecture (Llama-style, sized to train on 2 CPU cores): vocab 256 (raw bytes), d_model 256, 4 layers,
4 query heads and 2 KV heads (GQA ratio 2), head_dim 64 (a head dim verify_attention supports), RoPE on
q/k, RMSNorm before attention and MLP and at the end, SwiGLU MLP (hidden 768). Embeddings are tied to the
output projection: with 256 bytes the saving is small, but it keeps the input and output byte
representations in one table, which helps a model that sees little data.

verify_attention takes bf16/fp16 q and caches only, so the paged path rounds q/k/v to the cache dtype
(fp16 by default: 10 mantissa bits, and this model's activations are far inside fp16's range) and
accumulates in fp32. ``forward_dense(..., attn_dtype=torch.float16)`` applies the same rounding so the
dense oracle differs from the paged path only by summation order.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaptive_verify as av

VOCAB = 256


@dataclass
class TargetConfig:
    vocab: int = VOCAB
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    mlp_hidden: int = 768
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def to_dict(self) -> dict:
        return asdict(self)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., head_dim // 2] float32 for integer positions [...] (computed in fp32 from the
    integer positions, so the dense and paged paths get bit-identical rotations)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., head_dim // 2]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates pairs (x[i], x[i + D/2]) ("rotate half" convention). x [..., H, D]; cos/sin [..., D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over heads
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class PagedKV:
    """Per-layer paged K/V caches and a trivial block allocator.

    ``k[layer]`` / ``v[layer]``: [num_blocks, block_size, n_kv_heads, head_dim] in ``dtype`` (bf16 or fp16:
    the dtypes verify_attention takes). Token position p of a request whose blocks are ``blocks`` lives in
    block ``blocks[p // block_size]`` at offset ``p % block_size``, i.e. slot
    ``blocks[p // block_size] * block_size + p % block_size`` (the slot_mapping write_kv takes).

    The allocator is a free list: ``allocate(n)`` pops n block ids (lowest first, so blocks of requests
    that join later interleave with earlier ones), ``free(ids)`` returns them. It does no reference
    counting or prefix sharing; an engine that needs those keeps its own block tables and uses only the caches.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float16, device="cpu"):
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.k: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free: List[int] = list(range(num_blocks))

    @classmethod
    def for_model(cls, config: TargetConfig, num_blocks: int, block_size: int = 16,
                  dtype: torch.dtype = torch.float16, device="cpu") -> "PagedKV":
        return cls(config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim, dtype, device)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> List[int]:
        if n > len(self._free):
            raise RuntimeError(f"PagedKV.allocate: asked for {n} blocks, only {len(self._free)} free")
        ids, self._free = self._free[:n], self._free[n:]
        return ids

    def free(self, ids: List[int]) -> None:
        self._free = sorted(set(self._free).union(ids))

    def slots(self, blocks: List[int], positions: torch.Tensor) -> torch.Tensor:
        """slot_mapping [T] int64 for token positions [T] of one request whose blocks are ``blocks``."""
        table = torch.tensor(blocks, dtype=torch.int64, device=positions.device)
        pos = positions.to(torch.int64)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def commit_tree(self, block_table: torch.Tensor, context_lens: torch.Tensor, accepted_offsets: torch.Tensor,
                    num_accepted: torch.Tensor) -> None:
        """``adaptive_verify.commit_tree_kv`` on every layer: after a draft-tree step, each request's accepted path
        moves from KV index context_lens + offset to context_lens + depth (a chain's path stays)."""
        for k, v in zip(self.k, self.v):
            av.commit_tree_kv(k, v, block_table, context_lens, accepted_offsets, num_accepted)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, c: TargetConfig):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.wq = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.wkv = nn.Linear(c.d_model, 2 * c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.mlp_norm = RMSNorm(c.d_model, c.norm_eps)
        self.w_gate_up = nn.Linear(c.d_model, 2 * c.mlp_hidden, bias=False)
        self.w_down = nn.Linear(c.mlp_hidden, c.d_model, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [..., Hq, D], k/v [..., Hkv, D] (RoPE applied to q and k) for x [..., d_model]."""
        c = self.c
        h = self.attn_norm(x)
        q = self.wq(h).unflatten(-1, (c.n_heads, c.head_dim))
        k, v = self.wkv(h).unflatten(-1, (2, c.n_kv_heads, c.head_dim)).unbind(-3)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


class TinyTarget(nn.Module):
    """Byte-level target model; see the module docstring. ``hidden`` outputs are the final-norm inputs
    (the residual stream after the last layer), the state a drafter conditions on."""

    def __init__(self, config: Optional[TargetConfig] = None):
        super().__init__()
        self.config = c = config or TargetConfig()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        nn.init.normal_(self.embed.weight, std=0.02)
        for layer in self.layers:
            for lin in (layer.wq, layer.wkv, layer.w_gate_up):
                nn.init.normal_(lin.weight, std=0.02)
            # Residual outputs start small so the deep residual sum starts near the embedding (GPT-2's trick).
            for lin in (layer.wo, layer.w_down):
                nn.init.normal_(lin.weight, std=0.02 / (2 * c.n_layers) ** 0.5)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(hidden), self.embed.weight)  # tied output projection

    def forward_dense(self, ids: torch.Tensor, positions: Optional[torch.Tensor] = None,
                      attn_mask: Optional[torch.Tensor] = None,
                      attn_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, L, 256] fp32, hidden [B, L, d]) for byte ids [B, L].

        positions: [B, L] or [L] RoPE positions (default 0..L-1). attn_mask: [L, L] or [B, 1, L, L] bool,
        True = may attend (default causal); used for tree-shaped verification during training.
        attn_dtype: round q/k/v and the attention output to this dtype, as the paged path's caches do.
        """
        c = self.config
        B, L = ids.shape
        if positions is None:
            positions = torch.arange(L, device=ids.device)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)  # [(B,) L, D/2]
        x = self.embed(ids)  # [B, L, d]
        for layer in self.layers:
            q, k, v = layer.qkv(x, cos, sin)  # [B, L, Hq|Hkv, D]
            if attn_dtype is not None:
                q, k, v = (t.to(attn_dtype).float() for t in (q, k, v))
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=attn_mask, is_causal=attn_mask is None, enable_gqa=True,
            ).transpose(1, 2)  # [B, L, Hq, D]
            if attn_dtype is not None:
                o = o.to(attn_dtype).float()
            x = layer.mlp(x + layer.wo(o.flatten(-2)))
        return self.logits(x), x

    def forward_paged(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: PagedKV,
                      block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                      slot_mapping: torch.Tensor, max_query_len: int,
                      tree_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits [T, 256] fp32, hidden [T, d]) for T tokens of R requests over the paged cache ``kv``.

        input_ids: [T] int32/int64; positions: [T] int32 (RoPE positions = KV positions);
        block_table: [R, max_blocks] int32; seq_lens: [R] int32, each request's KV length after this step;
        query_start_loc: [R + 1] int32, request r's tokens are query_start_loc[r]:query_start_loc[r + 1];
        slot_mapping: [T] int64 cache slot of each token (-1: not written); max_query_len: host bound of q_len.
        Each layer writes its K/V first, so a request's tokens attend causally to each other and to its
        earlier KV (verify_attention's contract).
        tree_mask: [T] int64, a draft-tree step (TreeVerifyPlan.tree_mask): positions are then context_len + depth
        (RoPE) while slot_mapping writes KV index context_len + offset, and each token attends to its context and
        its ancestors only (None: causal chains).
        """
        c = self.config
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)  # [T, D/2]
        x = self.embed(input_ids.long())  # [T, d]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, cos, sin)  # [T, Hq, D], [T, Hkv, D] x2
            dt = kv.k[i].dtype
            av.write_kv(k.to(dt).contiguous(), v.to(dt).contiguous(), kv.k[i], kv.v[i], slot_mapping)
            o = av.verify_attention(q.to(dt).contiguous(), kv.k[i], kv.v[i], block_table, seq_lens,
                                    query_start_loc, max_query_len, tree_mask=tree_mask)  # [T, Hq, D] in dt
            x = layer.mlp(x + layer.wo(o.float().flatten(-2)))
        return self.logits(x), x
