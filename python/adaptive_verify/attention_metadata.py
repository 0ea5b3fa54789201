"""The verification plan in the forms attention backends take (docs/integrations, "Keeping your attention backend"),
for engines that keep their attention kernels and use this library for planning, sampling and statistics.

Both builders read every length where it lives and size every output from host bounds, so they never sync and a
CUDA graph can capture them:

- :func:`flash_attn_plan`: FlashAttention-3/4 (``flash_attn_varlen_func`` / ``flash_attn_with_kvcache`` with a page
  table) and trtllm-gen style: ``cu_seqlens_q`` (the planner's ``query_start_loc``), ``seqused_k`` (its
  ``seq_lens``: each request's KV length including the verified tokens), ``page_table`` (the engine's block table,
  [R, max_pages] int32) and ``max_seqlen_q`` (a host int). FlashAttention's causal mode aligns the query block to
  the end of the keys (bottom-right), which is exactly "token i sees the context and block tokens 0..i"; with a
  page table ``cu_seqlens_k`` must be None. These are the planner's own tensors, returned as they are (views, no
  copy): the form was chosen to match.
- :func:`flashinfer_plan`: FlashInfer's paged prefill (``BatchPrefillWithPagedKVCacheWrapper.plan``): ``qo_indptr``,
  ``paged_kv_indptr``, ``paged_kv_indices``, ``paged_kv_last_page_len`` and, for draft trees, ``packed_custom_mask``
  with ``mask_indptr`` (FlashInfer's per-request [q_len, kv_len] mask over the whole KV, context included, packed
  little-endian per request and padded to bytes, as ``flashinfer.segment_packbits(bitorder="little")`` makes it; pass
  both, not the packed mask alone). One C++ CPU kernel and two CUDA launches (attention/metadata.h); the oracle is
  ``adaptive_verify.reference.flashinfer_plan``, written from FlashInfer's documentation.

Decisions: a request with no KV (a padding row) has 0 pages and last page length 0; ``paged_kv_indices`` has R x
max_pages entries, the first ``paged_kv_indptr[R]`` meaningful and the rest 0; block ids are copied as they are. On
CPU, lengths the bounds do not allow raise ValueError naming the argument; on CUDA such a request is written empty and
counted in ``error_counts()["query_len_out_of_range"]``.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import errors
from ._binding import call, struct_type
from ._checks import INT32_MAX
from ._ext import _C, check_status
from ._validate import check_device, check_tensor, ptr, run_op, stream_of

FlashInferParams = struct_type("FLASHINFER_PARAMS", _C.FLASHINFER_PARAMS)

_MESSAGES = {
    "STATUS_QUERY_LEN": "query_start_loc must be non-decreasing within [0, T] (T: tree_mask's length), no q_len may "
                        "exceed max_query_len, and q_len x seq_len must fit the mask bound max_query_len x max_seq_len",
    "STATUS_SEQ_LENS": "seq_lens: every request needs seq_lens[r] >= q_len[r]",
    "STATUS_BLOCK_TABLE_TOO_SHORT": "seq_lens exceeds the block table's pages (max_pages x page_size)",
}


def _check_plan(query_start_loc, seq_lens, block_table):
    check_tensor("block_table", block_table, dtypes=(torch.int32,), ndim=2)
    device = check_device("block_table", block_table)
    R = block_table.shape[0]
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), device=device, shape=(R,), inner_contiguous=False)
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), device=device, shape=(R + 1,),
                 inner_contiguous=False)
    return device, R


def _positive_int(name, value, hi=INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= hi:
        raise ValueError(f"{name} must be in [1, {hi}], got {value}")
    return value


def flash_attn_plan(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    max_query_len: int) -> dict:
    """FlashAttention-3/4 varlen paged arguments (module docstring): cu_seqlens_q, seqused_k, page_table (the given
    tensors, no copy) and max_seqlen_q (max_query_len, a host int)."""
    _check_plan(query_start_loc, seq_lens, block_table)
    return dict(cu_seqlens_q=query_start_loc, seqused_k=seq_lens, page_table=block_table,
                max_seqlen_q=_positive_int("max_query_len", max_query_len))


def flashinfer_plan(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    page_size: int, *, tree_mask: Optional[torch.Tensor] = None, max_query_len: Optional[int] = None,
                    max_seq_len: Optional[int] = None) -> dict:
    """FlashInfer paged-prefill arguments (module docstring): qo_indptr, paged_kv_indptr [R + 1], paged_kv_indices
    [R x max_pages], paged_kv_last_page_len [R] (int32), and with tree_mask ([T] int64, the tree planner's) also
    packed_custom_mask (uint8, sized by the host bound R x ceil(max_query_len x max_seq_len / 8); required then) and
    mask_indptr [R + 1] int32. max_seq_len defaults to the table's max_pages x page_size."""
    device, R = _check_plan(query_start_loc, seq_lens, block_table)
    page_size = _positive_int("page_size", page_size, 1 << 20)
    max_pages = block_table.shape[1]
    if R * max(max_pages, 1) > INT32_MAX or max_pages * page_size > INT32_MAX:
        raise ValueError(f"block_table: {R} x {max_pages} pages of {page_size} exceed int32 offsets")
    T = 0
    capacity = 0
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, dtypes=(torch.int64,), device=device, ndim=1)
        T = tree_mask.shape[0]
        if max_query_len is None:
            raise ValueError("max_query_len is required with tree_mask (it bounds the packed mask's size)")
        max_query_len = _positive_int("max_query_len", max_query_len, 64)
        max_seq_len = max_pages * page_size if max_seq_len is None else _positive_int("max_seq_len", max_seq_len)
        capacity = R * -(-max_query_len * max_seq_len // 8)
        if capacity > INT32_MAX:
            raise ValueError(f"max_query_len x max_seq_len x R: the packed mask ({capacity} bytes) exceeds int32 offsets")
    else:
        T = int(1 << 62)  # no mask: token offsets are never read; q_len is bounded by nothing but its own order
    out = dict(qo_indptr=query_start_loc,
               paged_kv_indptr=torch.empty(R + 1, dtype=torch.int32, device=device),
               paged_kv_indices=torch.empty(R * max_pages, dtype=torch.int32, device=device),
               paged_kv_last_page_len=torch.empty(R, dtype=torch.int32, device=device))
    if tree_mask is not None:
        out["packed_custom_mask"] = torch.zeros(max(capacity, 1), dtype=torch.uint8, device=device)
        out["mask_indptr"] = torch.empty(R + 1, dtype=torch.int32, device=device)
    run_op(_flashinfer_plan_, _launch_flashinfer_plan, query_start_loc, seq_lens, block_table, tree_mask,
           out["paged_kv_indptr"], out["paged_kv_indices"], out["paged_kv_last_page_len"],
           out.get("packed_custom_mask"), out.get("mask_indptr"), errors.error_buffer(device), page_size, T, capacity,
           max_query_len or 0)
    return out


def _launch_flashinfer_plan(query_start_loc, seq_lens, block_table, tree_mask, kv_indptr, kv_indices, last_page_len,
                            packed_mask, mask_indptr, err, page_size, num_tokens, capacity, max_query_len=0):
    p = FlashInferParams()
    p.query_start_loc, p.seq_lens = query_start_loc.data_ptr(), seq_lens.data_ptr()
    p.block_table, p.block_table_stride, p.max_blocks = block_table.data_ptr(), block_table.stride(0), \
        block_table.shape[1]
    p.tree_mask, p.num_reqs, p.num_tokens, p.page_size = ptr(tree_mask), block_table.shape[0], num_tokens, page_size
    p.mask_capacity, p.kv_indptr, p.kv_indices = capacity, kv_indptr.data_ptr(), kv_indices.data_ptr()
    p.kv_last_page_len, p.packed_mask, p.mask_indptr = last_page_len.data_ptr(), ptr(packed_mask), ptr(mask_indptr)
    p.error_counts, p.max_query_len = err.data_ptr(), max_query_len
    status = call(_C.flashinfer_plan, p, block_table.is_cuda, stream_of(block_table.device))
    if block_table.device.type == "cpu":
        for name, message in _MESSAGES.items():
            if status == getattr(_C, name):
                raise ValueError(f"adaptive_verify.flashinfer_plan: {message}")
    check_status(status, "flashinfer_plan", block_table.device)


@torch.library.custom_op("adaptive_verify::flashinfer_plan_",
                         mutates_args=("kv_indptr", "kv_indices", "last_page_len", "packed_mask", "mask_indptr",
                                       "error_counts"))
def _flashinfer_plan_(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                      tree_mask: Optional[torch.Tensor], kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                      last_page_len: torch.Tensor, packed_mask: Optional[torch.Tensor],
                      mask_indptr: Optional[torch.Tensor], error_counts: torch.Tensor, page_size: int, num_tokens: int,
                      capacity: int, max_query_len: int = 0) -> None:
    _launch_flashinfer_plan(query_start_loc, seq_lens, block_table, tree_mask, kv_indptr, kv_indices, last_page_len,
                            packed_mask, mask_indptr, error_counts, page_size, num_tokens, capacity, max_query_len)


@_flashinfer_plan_.register_fake
def _(*args, **kwargs):
    return None


__all__ = ["flash_attn_plan", "flashinfer_plan"]
