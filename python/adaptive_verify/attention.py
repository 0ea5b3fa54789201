"""Varlen verification attention over a paged KV cache, KV writes and the draft-tree KV commit (docs/design.md,
"Verification attention", "Draft trees").

Each request verifies a different number of tokens (q_len = 1 + verify_lens, chosen on the device), so
the attention reads every length from device memory: query token i of request r attends to KV positions
0 .. seq_lens[r] - q_len + i (causal inside the verified block; the block's own K/V were written first by
``write_kv`` with the planner's slot_mapping). A draft tree's block passes ``tree_mask`` (the tree planner's
[T] int64): then token i sees its context and only the block's tokens whose bit is set (its ancestors and
itself), a subset of the causal ones.

Status: the torch oracle (``adaptive_verify.reference.verify_attention``), the C++ CPU kernel, and two
split-KV CUDA kernels, chosen with ``cuda_kernel`` (or the module setting ``CUDA_KERNEL``): "rowwise" (the
default; SIMT; validated on an H200 on 2026-11-29, but slow) and the candidate "mma" (tensor cores: each
request's q_len x (Hq / Hkv) rows packed into the MMA M dimension so a block reads its split of a KV head's
cache once for up to 128 rows, a cp.async pipeline, mma.sync m16n8k16), also as "mma_fused" (the split
merge in the same launch). The candidate has not run on a GPU; its CUDA source, launched by its real
launcher, runs in the CPU suite under a fiber emulator (tests/test_attention_emu.py). On CUDA, lengths and
block ids that the host cannot check without a sync make their request padding (or skip the bad block) and
are counted in ``error_counts()``. ``write_kv`` has both kernels. Both ops are torch.library custom ops
(``adaptive_verify::verify_attention_into``, ``adaptive_verify::write_kv_``), so a whole verification step
compiles with ``torch.compile(fullgraph=True)``.

Decisions:
- Split-KV with a fixed kSplitTokens = 512 KV positions per split, merged by log-sum-exp in order: a
  request's output never depends on the rest of the batch, bit for bit.
- Padding: tokens of rows with q_len 0 and tokens at or past query_start_loc[R] get out = 0 and lse = -inf.
- fp32 accumulation; the output is rounded to q's dtype (round to nearest even).
- Draft trees (tree_mask): the mask only removes positions inside the causal bound (bits above a token's own
  offset are ignored), so every kernel keeps its tiles and splits and a chain's mask gives None's bits. The mask
  is a runtime pointer (null: every bit), not a template parameter: no extra kernel instantiations.
- On CPU, lengths and block ids are checked (every message names the argument): query_start_loc must be
  non-decreasing within [0, T], q_len <= max_query_len, seq_lens >= q_len, and every block a request needs
  must exist in block_table and lie in [0, num_blocks). Block-table entries past a request's needs are
  never read.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import errors
from .attention_fa4 import attention_backend, run_fa4
from .attention_fp8 import DTYPE_CODES, FP8, check_cache_dtype, kv_scale_fields, set_kv_scales
from ._binding import AttentionParams, CommitTreeKvParams, WriteKvParams, call
from ._checks import INT32_MAX, check_real
from ._ext import _C, check_status
from ._validate import check_device, check_tensor, kernel_choice, ptr, run_op, stream_of

HEAD_DIMS = (64, 128, 256)
BLOCK_SIZES = (16, 32, 64, 128, 256)
GQA_RATIOS = (1, 2, 4, 8, 16)
MAX_QUERY_LEN = _C.ATTENTION_MAX_QUERY_LEN  # params.h kMaxQueryLen: chains of 32 drafts, trees of 63 nodes
_DTYPES = {torch.bfloat16: 2, torch.float16: 1}
# CUDA implementations of verify_attention (AttentionParams::kernel in params.h): rowwise, mma, mma_fused.
CUDA_KERNELS = dict(_C.ATTENTION_KERNELS)
#: The CUDA kernel used when a call passes cuda_kernel=None (set it once, e.g. after validating "mma").
CUDA_KERNEL = "rowwise"

_MESSAGES = {
    "STATUS_QUERY_LEN": "query_start_loc must be non-decreasing within [0, T] and no request may have more than "
                        "max_query_len tokens",
    "STATUS_SEQ_LENS": "seq_lens: every request needs seq_lens[r] >= q_len[r] (its KV includes its own tokens)",
    "STATUS_BLOCK_TABLE_TOO_SHORT": "block_table has too few blocks per request for seq_lens (or a seq_lens "
                                    "value exceeds max_seq_len)",
    "STATUS_BLOCK_ID_OUT_OF_RANGE": "block_table holds a block id outside [0, num_blocks) where a request reads",
    "STATUS_SLOT_OUT_OF_RANGE": "slot_mapping holds a slot outside [0, num_blocks * block_size) (only -1 skips)",
    "STATUS_KV_SCALE": "k_scale / v_scale must be finite and > 0",
    "STATUS_SINKS": "sinks must be finite",
}


def _raise_for(status: int, op: str, device: torch.device) -> None:
    if device.type == "cpu":
        for name, message in _MESSAGES.items():
            if status == getattr(_C, name):
                raise ValueError(f"adaptive_verify.{op}: {message}")
    check_status(status, op, device)


def _cuda_kernel(cuda_kernel: Optional[str]) -> int:
    """The CUDA implementation's id: ``cuda_kernel``, else the module setting CUDA_KERNEL."""
    return kernel_choice(cuda_kernel, "adaptive_verify.attention.CUDA_KERNEL", CUDA_KERNEL, CUDA_KERNELS)


def _cache(name, t, dtype, device):
    check_tensor(name, t, dtypes=(dtype,), device=device, ndim=4, inner_contiguous=False)
    return t


def _cache_pair(k_cache, v_cache) -> torch.device:
    """Checks the paged K and V caches a write moves entries in (bf16, fp16, fp32 or float8_e4m3fn, [num_blocks,
    block_size, Hkv, D], one shape and dtype); returns their device."""
    check_tensor("k_cache", k_cache, dtypes=(torch.bfloat16, torch.float16, torch.float32, FP8), ndim=4,
                 inner_contiguous=False)
    device = check_device("k_cache", k_cache)
    _cache("v_cache", v_cache, k_cache.dtype, device)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    return device


def check_plan_args(device, T, block_size, block_table, seq_lens, query_start_loc, max_query_len, max_seq_len,
                    tree_mask):
    """The checks verify_attention and verify_attention_mla share on the planner's per-step arguments; returns (R,
    the blocks a request may use: the kernels' bound and the CUDA workspace's)."""
    check_tensor("block_table", block_table, dtypes=(torch.int32,), device=device, ndim=2)
    R = block_table.shape[0]
    if R >= INT32_MAX:  # num_reqs is an int32 field, and query_start_loc has R + 1 entries
        raise ValueError(f"block_table: at most {INT32_MAX - 1} requests, got {R}")
    if block_table.shape[1] * block_size > 2**31 - 1:
        raise ValueError(f"block_table: {block_table.shape[1]} blocks of {block_size} tokens exceed int32 positions")
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), device=device, shape=(R,), inner_contiguous=False)
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), device=device, shape=(R + 1,),
                 inner_contiguous=False)
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"max_query_len must be an int, got {type(max_query_len).__name__}")
    max_blocks = block_table.shape[1]  # blocks a request may use: the kernels' bound and the workspace's
    if max_seq_len is not None:
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int):
            raise TypeError(f"max_seq_len must be an int or None, got {type(max_seq_len).__name__}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        max_blocks = min(max_blocks, -(-max_seq_len // block_size))
    if not 1 <= max_query_len <= MAX_QUERY_LEN:
        why = " (a tree_mask row holds 64 query offsets)" if tree_mask is not None else ""
        raise ValueError(f"max_query_len must be in [1, {MAX_QUERY_LEN}]{why}, got {max_query_len}")
    if tree_mask is not None:
        # [T] int64: one bit per query offset of the token's request (kernels index it by token)
        check_tensor("tree_mask", tree_mask, dtypes=(torch.int64,), device=device, shape=(T,))
    return R, max_blocks


def verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    cuda_kernel: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    tree_mask: Optional[torch.Tensor] = None,
    k_scale=None,
    v_scale=None,
    sinks: Optional[torch.Tensor] = None,
    window_left: int = -1,
    softcap: float = 0.0,
    backend: str = "auto",
):
    """Attention of each request's verified tokens over its paged KV cache.

    Args:
        q: [T, Hq, D] bf16 or fp16, last dim contiguous. D in (64, 128, 256).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], contiguous, q's dtype or both torch.float8_e4m3fn;
            block_size in 16..256 (powers of two); Hq / Hkv in (1, 2, 4, 8, 16).
        k_scale, v_scale: fp8 caches only (docs/design.md, "fp8 KV caches"; adaptive_verify.attention_fp8): the
            cache holds value / scale. None (1.0), a Python float (per tensor), or a float32 tensor on the cache's
            device of shape [] / [1] (per tensor) or [Hkv] (per KV head). Kernels decode each fp8 element exactly
            to q's dtype and apply K's scale to the scores and V's to the output, so the result is the attention
            over the dequantised cache (the reference's float64 dequantisation) within the usual tolerance.
        sinks, window_left, softcap: model variants (docs/design.md, "Sinks, windows and soft-capping"), each
            composable with the others, trees, fp8 caches and return_lse:
            - sinks: [Hq] float32 on q's device (gpt-oss): a learned logit per query head that joins the softmax
              denominator and contributes no value, in the units of the scaled scores (neither multiplied by
              ``scale`` nor soft-capped); lse includes it. A token that sees nothing gets zeros and lse = its sink.
              Entries must be finite (ValueError on CPU; on CUDA used as given and counted in
              ``error_counts()["sink_out_of_range"]``).
            - window_left: -1 (off) or W >= 0: a token at position p sees keys at positions p - W .. p, a position
              being a context key's KV index or a block token's context length plus its depth (its mask's set bits
              at offsets <= its own, minus one; a chain's offset). Splits wholly below every token's window are
              skipped, not only masked.
            - softcap: 0 (off) or cap > 0 (Gemma 2): each scaled score s becomes cap * tanh(s / cap) before the
              softmax.
        backend: "auto" (default), "ours" or "fa4": on SM100-class GPUs with the ``[sm100]`` extra installed, "auto"
            runs FlashAttention-4's kernel for the cases it covers (no trees, no fp8 caches, head dim 64 / 128, pages
            of 16 / 64 / 128, not sinks together with soft-capping); everything else runs this package's kernels.
            ``adaptive_verify.attention_backend(...)`` says which one runs; "fa4" forces it (ValueError naming the
            reason where it cannot run). adaptive_verify/attention_fa4.py has the decision, the glue and the
            documented differences.
        block_table: [R, max_blocks] int32. seq_lens: [R] int32, KV length including this step's tokens.
        query_start_loc: [R + 1] int32 (the planner's). max_query_len: host upper bound of q_len, 1..64.
        scale: softmax scale (default D ** -0.5). out: [T, Hq, D] to write (every element is written).
        return_lse: also return lse [T, Hq] float32 (natural log of the softmax denominator, scaled scores).
        tree_mask: [T] int64 or None (causal chains). Draft trees (docs/design.md, "Draft trees";
            ``TreeVerifyPlan.tree_mask``): bit k of tree_mask[t] set iff token t attends to its request's query
            token at offset k. Token i of a request sees its context [0, seq_lens - q_len) and the block's
            position context + k for each set bit k <= i; bits above i (so every bit >= q_len) are ignored, as
            a topologically ordered tree only has ancestor bits. A chain's mask (bits 0..i) gives None's bits
            exactly, on every kernel. A token that sees no position (no context and no bit) gets zeros and lse
            -inf, as padding does. Padding tokens' entries are never read.
        max_seq_len: host upper bound of seq_lens (engines know it: vLLM's max_seq_len). It sizes the split
            workspace on CUDA, T x Hq x ceil(max_seq_len / 512) x (D + 2) floats, instead of the block
            table's full width, which for a long-context table is mostly unused (2048 tokens, Hq = 64, D =
            128 and a 128k-token table would otherwise need 17 GB). A request with seq_lens above it is
            treated like one whose block table is too short: ValueError on CPU, skipped and counted on CUDA.
        cuda_kernel: CUDA implementation, "rowwise", "mma" or "mma_fused"; None (default) takes the module
            setting ``adaptive_verify.attention.CUDA_KERNEL`` ("rowwise"). Any other value raises ValueError.
            All agree with the float64 reference within the tests' tolerance (twice a float32 reference's
            rounding error plus one ulp); CPU tensors check the value and otherwise ignore it.
            - "rowwise" (default): one warp per query row; validated on an H200 on 2026-11-29 (every CUDA
              test passes), but latency-bound, about 10x slower than it should be.
            - "mma": tensor cores, GQA rows in the MMA M dimension (K/V read once per split and KV head
              for up to 128 rows), softmax probabilities rounded to q's dtype before P V as in
              FlashAttention-2. Opt-in until it passes the CUDA tests on a GPU; its source already runs
              in the CPU suite under an emulator. An inf or NaN in a V row that a query row cannot see but a
              later row of its request can (a later draft token's V, or another tree branch's) makes the row NaN
              (0 x inf), where the other kernels skip it; finite values of hidden rows never reach it.
            - "mma_fused": "mma" with the merge in the partials launch: the last split block of each
              (request, KV head) merges, reading the partials back from L2 instead of a second launch
              re-reading them. Requests of more than 4096 tokens (8 splits) are still merged by the merge
              kernel, launched only when max_seq_len / the block table allows them, since one block
              merging hundreds of splits would be a serial tail. Same bits as "mma"; at most 65534
              requests.
    """
    kernel_id = _cuda_kernel(cuda_kernel)
    check_tensor("q", q, dtypes=tuple(_DTYPES), ndim=3)
    device = check_device("q", q)
    T, Hq, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"q: head dim D must be one of {HEAD_DIMS}, got {D}")
    check_tensor("k_cache", k_cache, ndim=4, device=device, inner_contiguous=False)
    fp8 = check_cache_dtype("k_cache", k_cache, q.dtype)
    _cache("v_cache", v_cache, k_cache.dtype, device)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    num_blocks, block_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} does not match q's {D}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"k_cache: block_size must be one of {BLOCK_SIZES}, got {block_size}")
    if Hkv < 1 or Hq % Hkv != 0 or Hq // Hkv not in GQA_RATIOS:
        raise ValueError(f"q / k_cache: Hq / Hkv must be one of {GQA_RATIOS}, got Hq={Hq}, Hkv={Hkv}")
    k_value, k_scales = kv_scale_fields("k_scale", k_scale, fp8, Hkv, device)
    v_value, v_scales = kv_scale_fields("v_scale", v_scale, fp8, Hkv, device)
    R, max_blocks = check_plan_args(device, T, block_size, block_table, seq_lens, query_start_loc, max_query_len,
                                    max_seq_len, tree_mask)
    # NaN or inf (also a float64 beyond float32's range, the kernels' type) would make every row NaN or -inf
    scale = D ** -0.5 if scale is None else check_real("scale", scale, float32=True)
    window_left, softcap = check_variants(device, Hq, sinks, window_left, softcap)
    if out is None:
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=device)
    else:
        check_tensor("out", out, dtypes=(q.dtype,), device=device, shape=(T, Hq, D), inner_contiguous=False)
    lse = torch.empty(T, Hq, dtype=torch.float32, device=device) if return_lse else None
    if attention_backend(q, k_cache, v_cache, block_table, backend=backend, tree_mask=tree_mask,
                         max_seq_len=max_seq_len, sinks=sinks, softcap=softcap) == "fa4":
        run_fa4(out, lse, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, max_query_len, scale=scale,
                sinks=sinks, window_left=window_left, softcap=softcap)
        return (out, lse) if return_lse else out
    if device.type == "cuda":
        limit = 65534 if kernel_id == CUDA_KERNELS["mma_fused"] else 65535  # grid z (+1: padding slice)
        if R > limit:
            raise ValueError(f"block_table: at most {limit} requests per call on CUDA with this kernel, got {R}")
    run_op(_verify_attention_into, _launch_attention, q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
           out, lse, errors.error_buffer(device), max_query_len, max_blocks, scale, kernel_id, tree_mask, k_value,
           k_scales, v_value, v_scales, sinks, window_left, softcap)
    return (out, lse) if return_lse else out


def check_variants(device, Hq, sinks, window_left, softcap):
    """Checks verify_attention's model-variant keywords; returns (window_left, softcap) as the kernels take them."""
    if sinks is not None:
        check_tensor("sinks", sinks, dtypes=(torch.float32,), device=device, shape=(Hq,), inner_contiguous=False)
        if sinks.device.type == "cpu" and not bool(torch.isfinite(sinks).all()):
            raise ValueError("sinks must be finite")
    if isinstance(window_left, bool) or not isinstance(window_left, int):
        raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
    if not -1 <= window_left <= INT32_MAX:
        raise ValueError(f"window_left must be -1 (no window) or in [0, {INT32_MAX}], got {window_left}")
    softcap = check_real("softcap", softcap, lo=0.0, float32=True)
    return window_left, softcap


def _attention_params(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, err, max_query_len,
                      max_blocks, scale, kernel, tree_mask=None, k_scale=1.0, k_scales=None, v_scale=1.0,
                      v_scales=None, sinks=None, window_left=-1, softcap=0.0) -> AttentionParams:
    p = AttentionParams()
    p.num_tokens, p.num_q_heads, p.head_dim = q.shape
    p.num_blocks, p.block_size, p.num_kv_heads, _ = k_cache.shape
    p.q, p.q_stride_t, p.q_stride_h = q.data_ptr(), q.stride(0), q.stride(1)
    p.k_cache, p.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
    p.block_table, p.block_table_stride, p.max_blocks = block_table.data_ptr(), block_table.stride(0), max_blocks
    p.seq_lens, p.query_start_loc = seq_lens.data_ptr(), query_start_loc.data_ptr()
    p.dtype, p.num_reqs, p.max_query_len, p.scale = _DTYPES[q.dtype], block_table.shape[0], max_query_len, scale
    p.out, p.lse, p.error_counts, p.kernel = out.data_ptr(), ptr(lse), err.data_ptr(), kernel
    p.tree_mask = ptr(tree_mask)
    p.kv_dtype = DTYPE_CODES[k_cache.dtype]
    p.v_head_dim = out.shape[2]  # D, or 512 for MLA (verify_attention_mla: V is the latent part of the row)
    # (set always: a ctypes struct starts zeroed, and window_left 0 would be a window of one position)
    p.sinks, p.window_left, p.softcap = ptr(sinks), window_left, softcap
    set_kv_scales(p, k_scale, k_scales, v_scale, v_scales, p.num_kv_heads)
    return p


def _launch_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, err, max_query_len,
                      max_blocks, scale, kernel, tree_mask=None, k_scale=1.0, k_scales=None, v_scale=1.0,
                      v_scales=None, sinks=None, window_left=-1, softcap=0.0):
    p = _attention_params(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, err, max_query_len,
                          max_blocks, scale, kernel, tree_mask, k_scale, k_scales, v_scale, v_scales, sinks,
                          window_left, softcap)
    workspace = None
    if q.is_cuda:
        # (max, sum) and acc[D] per (token, head, split), splits of ATTENTION_SPLIT_TOKENS positions, the same
        # layout for every CUDA kernel ("mma_fused" adds arrival counters): params.h says how much.
        workspace = torch.empty(max(_C.attention_workspace_floats(ctypes.addressof(p)), 1), dtype=torch.float32,
                                device=q.device)
        p.workspace = workspace.data_ptr()
    _raise_for(call(_C.verify_attention, p, q.is_cuda, stream_of(q.device)), "verify_attention", q.device)


@torch.library.custom_op("adaptive_verify::verify_attention_into", mutates_args=("out", "lse", "error_counts"))
def _verify_attention_into(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                           query_start_loc: Tensor, out: Tensor, lse: Optional[Tensor], error_counts: Tensor,
                           max_query_len: int, max_blocks: int, scale: float, kernel: int,
                           tree_mask: Optional[Tensor] = None, k_scale: float = 1.0, k_scales: Optional[Tensor] = None,
                           v_scale: float = 1.0, v_scales: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                           window_left: int = -1, softcap: float = 0.0) -> None:
    _launch_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, error_counts,
                      max_query_len, max_blocks, scale, kernel, tree_mask, k_scale, k_scales, v_scale, v_scales, sinks,
                      window_left, softcap)


@_verify_attention_into.register_fake
def _(*args, **kwargs):
    return None


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale=None, v_scale=None) -> None:
    """Writes token t's K/V ([T, Hkv, D], last dim contiguous) into slot slot_mapping[t] (int64 [T]) of the
    caches ([num_blocks, block_size, Hkv, D], contiguous, same dtype): block slot // block_size, offset
    slot % block_size. Slot -1 is skipped. Other out-of-range slots raise ValueError on CPU; on CUDA they
    are skipped and counted in ``error_counts()["slot_out_of_range"]``.

    torch.float8_e4m3fn caches take bf16 / fp16 k and v and quantise them: x / scale computed in float32, rounded to
    nearest even, saturating at +-448 (NaN stays NaN); k_scale / v_scale as in :func:`verify_attention` (None: 1.0).
    Other caches take k and v of their own dtype and copy them (scales must then be None)."""
    device = _cache_pair(k_cache, v_cache)
    num_blocks, block_size, Hkv, D = k_cache.shape
    fp8 = k_cache.dtype == FP8
    k_dtypes = (torch.bfloat16, torch.float16) if fp8 else (k_cache.dtype,)
    check_tensor("k", k, dtypes=k_dtypes, device=device, ndim=3)
    T = k.shape[0]
    if tuple(k.shape) != (T, Hkv, D):
        raise ValueError(f"k must have shape [T, Hkv, D] = [T, {Hkv}, {D}], got {tuple(k.shape)}")
    check_tensor("v", v, dtypes=(k.dtype,), device=device, shape=(T, Hkv, D))
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64,), device=device, shape=(T,),
                 inner_contiguous=False)
    k_value, k_scales = kv_scale_fields("k_scale", k_scale, fp8, Hkv, device)
    v_value, v_scales = kv_scale_fields("v_scale", v_scale, fp8, Hkv, device)
    run_op(_write_kv_, _launch_write_kv, k, v, k_cache, v_cache, slot_mapping, errors.error_buffer(device),
           k_value, k_scales, v_value, v_scales)


def _launch_write_kv(k, v, k_cache, v_cache, slot_mapping, err, k_scale=1.0, k_scales=None, v_scale=1.0,
                     v_scales=None, cache_row=0, cache_offset=0):
    """v and v_cache None: K only (MLA's latent cache, written in parts at cache_offset of cache_row-value rows)."""
    p = WriteKvParams()
    p.cache_dtype, p.dtype = DTYPE_CODES[k_cache.dtype], DTYPE_CODES[k.dtype]
    set_kv_scales(p, k_scale, k_scales, v_scale, v_scales, k_cache.shape[2])
    p.cache_row, p.cache_offset = cache_row, cache_offset
    p.num_blocks, p.block_size, p.num_kv_heads, p.head_dim = k_cache.shape
    p.num_kv_heads, p.head_dim = k.shape[1], k.shape[2]  # (a part of the cache's rows, for MLA)
    p.k, p.v, p.k_stride_t, p.k_stride_h = k.data_ptr(), ptr(v), k.stride(0), k.stride(1)
    p.v_stride_t, p.v_stride_h = (v.stride(0), v.stride(1)) if v is not None else (0, 0)
    p.k_cache, p.v_cache, p.slot_mapping = k_cache.data_ptr(), ptr(v_cache), slot_mapping.data_ptr()
    p.num_tokens, p.elem_size, p.error_counts = k.shape[0], k.element_size(), err.data_ptr()
    _raise_for(call(_C.write_kv, p, k.is_cuda, stream_of(k.device)), "write_kv", k.device)


@torch.library.custom_op("adaptive_verify::write_kv_", mutates_args=("k_cache", "v_cache", "error_counts"))
def _write_kv_(k: Tensor, v: Optional[Tensor], k_cache: Tensor, v_cache: Optional[Tensor], slot_mapping: Tensor,
               error_counts: Tensor, k_scale: float = 1.0, k_scales: Optional[Tensor] = None, v_scale: float = 1.0,
               v_scales: Optional[Tensor] = None, cache_row: int = 0, cache_offset: int = 0) -> None:
    _launch_write_kv(k, v, k_cache, v_cache, slot_mapping, error_counts, k_scale, k_scales, v_scale, v_scales,
                     cache_row, cache_offset)


@_write_kv_.register_fake
def _(*args, **kwargs):
    return None


def commit_tree_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                   context_lens: torch.Tensor, accepted_offsets: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Moves each request's accepted draft-tree path to the KV indices the next step expects (docs/design.md,
    "Draft trees"): a verified block's K/V were written at KV index context_lens + offset (slot_mapping of
    :func:`plan_tree_verification`), but the accepted path must sit at context_lens + depth.

    accepted_offsets: [R, W] int32, row r the accepted path as offsets within its verified block, the anchor first
    (entry i is the path's token at depth i; entry 0, the anchor's offset 0, is not read); num_accepted: [R] int32,
    accepted nodes (the anchor not counted): entries 1..num_accepted[r] move from context_lens[r] +
    accepted_offsets[r, i] to context_lens[r] + i, in place in the caches ([num_blocks, block_size, Hkv, D],
    contiguous, same dtype) through block_table ([R, max_blocks] int32) and context_lens ([R] int32, the KV length
    before the step). Entries already at their depth stay (a chain's path: a no-op). A path is valid when
    num_accepted[r] lies in [0, min(W - 1, 63)], its offsets increase strictly from >= 1 and stay below 64, and every
    source and destination falls in the request's blocks (ids in [0, num_blocks)); on CPU an invalid path raises
    ValueError before anything moves, on CUDA that request moves nothing and is counted in
    ``error_counts()["accepted_path"]``: never a read or write outside the request's blocks. One launch, every length
    read on the device: graph-safe.
    """
    device = _cache_pair(k_cache, v_cache)
    _check_commit_args(device, block_table, context_lens, accepted_offsets, num_accepted)
    run_op(_commit_tree_kv_, _launch_commit_tree_kv, k_cache, v_cache, block_table, context_lens, accepted_offsets,
           num_accepted, errors.error_buffer(device))


def _check_commit_args(device, block_table, context_lens, accepted_offsets, num_accepted) -> None:
    """commit_tree_kv's and commit_tree_kv_mla's checks of the path arguments."""
    check_tensor("block_table", block_table, dtypes=(torch.int32,), device=device, ndim=2)
    R = block_table.shape[0]
    if device.type == "cuda" and R > 65535:
        raise ValueError(f"block_table: at most 65535 requests per call on CUDA, got {R}")
    check_tensor("context_lens", context_lens, dtypes=(torch.int32,), device=device, shape=(R,),
                 inner_contiguous=False)
    check_tensor("accepted_offsets", accepted_offsets, dtypes=(torch.int32,), device=device, ndim=2)
    if accepted_offsets.shape[0] != R or accepted_offsets.shape[1] < 1:
        raise ValueError(f"accepted_offsets must have shape [R, >= 1] = [{R}, >= 1], got "
                         f"{tuple(accepted_offsets.shape)}")
    check_tensor("num_accepted", num_accepted, dtypes=(torch.int32,), device=device, shape=(R,),
                 inner_contiguous=False)


def _launch_commit_tree_kv(k_cache, v_cache, block_table, context_lens, accepted_offsets, num_accepted, err):
    p = CommitTreeKvParams()
    p.num_blocks, p.block_size, Hkv, D = k_cache.shape
    p.k_cache, p.v_cache, p.row_bytes = k_cache.data_ptr(), ptr(v_cache), Hkv * D * k_cache.element_size()
    p.block_table, p.block_table_stride, p.max_blocks = block_table.data_ptr(), block_table.stride(0), \
        block_table.shape[1]
    p.context_lens, p.num_accepted, p.num_reqs = context_lens.data_ptr(), num_accepted.data_ptr(), block_table.shape[0]
    p.accepted_offsets, p.accepted_offsets_stride = accepted_offsets.data_ptr(), accepted_offsets.stride(0)
    p.width, p.error_counts = accepted_offsets.shape[1], err.data_ptr()
    _raise_for(call(_C.commit_tree_kv, p, k_cache.is_cuda, stream_of(k_cache.device)), "commit_tree_kv",
               k_cache.device)


@torch.library.custom_op("adaptive_verify::commit_tree_kv_", mutates_args=("k_cache", "v_cache", "error_counts"))
def _commit_tree_kv_(k_cache: Tensor, v_cache: Optional[Tensor], block_table: Tensor, context_lens: Tensor,
                     accepted_offsets: Tensor, num_accepted: Tensor, error_counts: Tensor) -> None:
    _launch_commit_tree_kv(k_cache, v_cache, block_table, context_lens, accepted_offsets, num_accepted, error_counts)


@_commit_tree_kv_.register_fake
def _(*args, **kwargs):
    return None
