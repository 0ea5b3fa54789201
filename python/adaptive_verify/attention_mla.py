"""Verification attention for multi-head latent attention (MLA: DeepSeek V3/R1/V4, Kimi K2, GLM-5), its latent-cache
write and the draft-tree commit (docs/design.md, "MLA").

Engines run MLA decode in its absorbed form: W_UK is folded into the query's no-RoPE part and RoPE applied to its
RoPE part, so every query head attends over one shared latent row per token: 512 latent values then 64 RoPE values
(576). Scores use all 576, values are the first 512 of the same rows, so the output is [T, H, 512] (the engine then
applies W_UV). One paged cache [num_blocks, block_size, 576] holds the rows, bf16/fp16 or float8_e4m3fn with one
per-tensor scale.

Everything else is verify_attention's contract: varlen query lengths read on the device (``query_start_loc``, no
host sync, CUDA-graph capturable), draft-tree masks, ``return_lse``, split-KV over 512-token splits merged by
log-sum-exp in order (batch-invariant), padding tokens zero with lse -inf, lengths and block ids checked on CPU and
skipped and counted on CUDA. Implementations: the torch oracle ``adaptive_verify.reference.verify_attention_mla``,
the C++ CPU kernel (verify_attention's, with V the latent part of K's row), and on CUDA "rowwise" (one warp per
(token, head) row, the default) or "mma" (tensor cores: a request's q_len x H rows in the MMA M dimension, the
latent tile read once per 64 rows; "mma_fused" runs the same kernel). Neither has run on a GPU yet; both run under
the host emulator in the CPU suite (tests/test_attention_mla.py).

Decisions: ``scale`` is required (MLA's softmax scale is 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) of the
unabsorbed heads, 192 for DeepSeek V3, not 576, so no default is right); H, the query heads on this rank, may be 1 to
128 (any count: rows are packed in tiles of 16 whatever H is).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import errors
from .attention import (BLOCK_SIZES, _DTYPES, _check_commit_args, _commit_tree_kv_, _cuda_kernel, _launch_attention,
                        _launch_commit_tree_kv, _launch_write_kv, _verify_attention_into, _write_kv_,
                        check_plan_args)
from .attention_fp8 import FP8, check_cache_dtype, kv_scale_fields
from ._checks import check_real
from ._ext import _C
from ._validate import check_device, check_tensor, run_op

LATENT_DIM = _C.MLA_VALUE_DIM  # 512: the value part of a latent row
ROPE_DIM = _C.MLA_ROPE_DIM  # 64
HEAD_DIM = LATENT_DIM + ROPE_DIM  # 576
MAX_HEADS = _C.MLA_MAX_HEADS  # 128


def _latent_cache(kv_cache, device) -> None:
    check_tensor("kv_cache", kv_cache, ndim=3, device=device, inner_contiguous=False)
    if kv_cache.shape[2] != HEAD_DIM:
        raise ValueError(f"kv_cache must have shape [num_blocks, block_size, {HEAD_DIM}] (512 latent + 64 RoPE "
                         f"values), got {tuple(kv_cache.shape)}")
    if kv_cache.shape[1] not in BLOCK_SIZES:
        raise ValueError(f"kv_cache: block_size must be one of {BLOCK_SIZES}, got {kv_cache.shape[1]}")


def verify_attention_mla(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                         query_start_loc: torch.Tensor, max_query_len: int, *, scale: float, kv_scale=None,
                         tree_mask: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                         return_lse: bool = False, max_seq_len: Optional[int] = None,
                         cuda_kernel: Optional[str] = None):
    """MLA verification attention of each request's verified tokens over its paged latent cache.

    Args:
        q: [T, H, 576] bf16 or fp16 (absorbed: 512 values of q_nope W_UK, then 64 of RoPE'd q_pe), last dim
            contiguous; H in 1..128.
        kv_cache: [num_blocks, block_size, 576] contiguous, q's dtype or torch.float8_e4m3fn; block_size in 16..256
            (powers of two).
        block_table, seq_lens, query_start_loc, max_query_len, tree_mask, max_seq_len: as verify_attention.
        scale: the softmax scale (required, module docstring). kv_scale: fp8 caches only: None (1.0), a float, or a
            [] / [1] float32 tensor on the cache's device (the cache holds value / scale).
        out: [T, H, 512] of q's dtype to write (every element is written). return_lse: also return lse [T, H] float32.
        cuda_kernel: "rowwise", "mma" or "mma_fused" (the same tensor-core kernel as "mma" here); None takes
            ``adaptive_verify.attention.CUDA_KERNEL``. CPU tensors check the value and otherwise ignore it.
    Returns out (and lse): softmax(scale * q . row) over the visible rows, times the rows' first 512 values.
    """
    kernel_id = _cuda_kernel(cuda_kernel)
    check_tensor("q", q, dtypes=tuple(_DTYPES), ndim=3)
    device = check_device("q", q)
    T, H, D = q.shape
    if D != HEAD_DIM:
        raise ValueError(f"q: head dim must be {HEAD_DIM} (512 latent + 64 RoPE), got {D}")
    if not 1 <= H <= MAX_HEADS:
        raise ValueError(f"q: MLA takes 1 to {MAX_HEADS} query heads, got {H}")
    _latent_cache(kv_cache, device)
    fp8 = check_cache_dtype("kv_cache", kv_cache, q.dtype)
    kv_value, kv_tensor = kv_scale_fields("kv_scale", kv_scale, fp8, 1, device)
    R, max_blocks = check_plan_args(device, T, kv_cache.shape[1], block_table, seq_lens, query_start_loc,
                                    max_query_len, max_seq_len, tree_mask)
    scale = check_real("scale", scale, float32=True)
    if out is None:
        out = torch.empty(T, H, LATENT_DIM, dtype=q.dtype, device=device)
    else:
        check_tensor("out", out, dtypes=(q.dtype,), device=device, shape=(T, H, LATENT_DIM), inner_contiguous=False)
    lse = torch.empty(T, H, dtype=torch.float32, device=device) if return_lse else None
    if device.type == "cuda" and R > 65535:
        raise ValueError(f"block_table: at most 65535 requests per call on CUDA, got {R}")
    # One KV "head" whose K and V are the same rows: the op's k_cache and v_cache are one tensor; out's 512 columns
    # make the kernels read V as the first 512 values of each row (AttentionParams::v_head_dim).
    rows = kv_cache.unsqueeze(2)  # [num_blocks, block_size, 1, 576]
    run_op(_verify_attention_into, _launch_attention, q, rows, rows, block_table, seq_lens, query_start_loc, out, lse,
           errors.error_buffer(device), max_query_len, max_blocks, scale, kernel_id, tree_mask, kv_value, kv_tensor,
           kv_value, kv_tensor)
    return (out, lse) if return_lse else out


def write_kv_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                 kv_scale=None) -> None:
    """Writes token t's latent row into slot slot_mapping[t] of the latent cache (as vLLM's concat_and_cache_mla):
    kv_c [T, 512] (the compressed KV) at values 0..511 and k_pe [T, 64] (its RoPE'd key part) at 512..575, both of
    the cache's dtype, or bf16 / fp16 into a float8_e4m3fn cache (quantised as write_kv does, by kv_scale). Slot -1
    skips a token; other out-of-range slots raise ValueError on CPU and are skipped and counted on CUDA. Two launches
    (the latent part, then the RoPE part), every length on the device: graph-safe."""
    _latent_cache(kv_cache, None)
    device = check_device("kv_cache", kv_cache)
    fp8 = kv_cache.dtype == FP8
    dtypes = (torch.bfloat16, torch.float16) if fp8 else (torch.bfloat16, torch.float16, torch.float32)
    if not fp8 and kv_cache.dtype not in dtypes:
        raise TypeError(f"kv_cache must be bfloat16, float16, float32 or float8_e4m3fn, got {kv_cache.dtype}")
    check_tensor("kv_c", kv_c, dtypes=dtypes if fp8 else (kv_cache.dtype,), device=device, ndim=2)
    T = kv_c.shape[0]
    if kv_c.shape[1] != LATENT_DIM:
        raise ValueError(f"kv_c must have shape [T, {LATENT_DIM}], got {tuple(kv_c.shape)}")
    check_tensor("k_pe", k_pe, dtypes=(kv_c.dtype,), device=device, shape=(T, ROPE_DIM))
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64,), device=device, shape=(T,),
                 inner_contiguous=False)
    kv_value, kv_tensor = kv_scale_fields("kv_scale", kv_scale, fp8, 1, device)
    err = errors.error_buffer(device)
    # Each part is a one-head K-only write into 576-value rows at its offset (WriteKvParams cache_row/cache_offset).
    for part, offset in ((kv_c, 0), (k_pe, LATENT_DIM)):
        run_op(_write_kv_, _launch_write_kv, part.unsqueeze(1), None, kv_cache.unsqueeze(2), None, slot_mapping, err,
               kv_value, kv_tensor, kv_value, kv_tensor, HEAD_DIM, offset)


def commit_tree_kv_mla(kv_cache: torch.Tensor, block_table: torch.Tensor, context_lens: torch.Tensor,
                       accepted_offsets: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """:func:`adaptive_verify.commit_tree_kv` for a latent cache [num_blocks, block_size, 576] (any dtype, fp8
    included): each request's accepted path moves to the KV indices of its depths, rows as bytes."""
    _latent_cache(kv_cache, None)
    device = check_device("kv_cache", kv_cache)
    _check_commit_args(device, block_table, context_lens, accepted_offsets, num_accepted)
    run_op(_commit_tree_kv_, _launch_commit_tree_kv, kv_cache.unsqueeze(2), None, block_table, context_lens,
           accepted_offsets, num_accepted, errors.error_buffer(device))


__all__ = ["verify_attention_mla", "write_kv_mla", "commit_tree_kv_mla", "HEAD_DIM", "LATENT_DIM", "ROPE_DIM",
           "MAX_HEADS"]
