"""Draft-tree rejection sampling: ``tree_rejection_sample`` (docs/design.md, "Draft trees", Sampling).

The tree's tokens are the tree plan's; the target, the random stream and the handling of bad values are the chain
sampler's (adaptive_verify.sampling's module docstring), so a chain given as a tree gives ``rejection_sample``'s
tokens. csrc/include/adaptive_verify/sampling/tree.h has the walk.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Union

import torch

from torch import Tensor

from . import errors
from ._binding import TreeSampleParams
from .prepared import capture, preparing, refuse_copy, register
from ._ext import _C, check_status
from ._validate import DTYPE_CODES, check_tensor, logits_shape, ptr, stream_of
from .sampling_params import PreparedSampler, SamplingParams, _merge, _offset, _per_request, _seeds, _truncation

#: Most tokens of one request's verified tree, 64: the anchor and 63 nodes (sampling/tree.h kMaxTreeTokens).
MAX_TREE_TOKENS: int = _C.SAMPLER_MAX_TREE_TOKENS


@register
def tree_rejection_sample(
    target_logits: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_parent: torch.Tensor,
    input_ids: torch.Tensor,
    max_query_len: int,
    *,
    params: Optional[SamplingParams] = None,
    temperature: Optional[torch.Tensor] = None,
    seeds: Optional[torch.Tensor] = None,
    offset: Union[int, torch.Tensor] = 0,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
    logprobs: bool = False,
    out: Optional[tuple] = None,
) -> tuple:
    """Samples each request's verified draft tree one-hot ("sample and match"), losslessly.

    The tokens are :func:`adaptive_verify.plan_tree_verification`'s: request r's block starts at
    query_start_loc[r] with the anchor (offset 0), then its verified nodes, parents before children. From the anchor:
    draw y from the current token's row of the (truncated) target, softmax(logits / T) (its argmax at T = 0); if a
    child of the current token carries y (input_ids), move to that child and repeat; else emit y and stop. So each
    emitted token follows the target given the tokens before it, whichever nodes were drafted or verified. A draw is
    keyed by (seed, offset, depth) on rejection_sample's stream, so a chain (token_parent = offset - 1) gives exactly
    :func:`rejection_sample`'s tokens with ``draft_probs=None``. Only the accepted path's rows are read.

    Args:
        target_logits: [T, V] bf16, fp16 or fp32 (last dim contiguous); row t judges token t.
        query_start_loc: [R + 1] int32 (the tree plan's); q_len 0 marks a padding row.
        token_parent: [T] int32, the plan's: offset of each token's parent within its request (the anchor's entry is
            not read).
        input_ids: [T] int32 or int64, the plan's: each token's id (the anchor's is not read).
        max_query_len: int in [1, 64], at least every request's q_len: the outputs' width.
        params, temperature, seeds, offset, top_k, top_p, min_p, logprobs: as in :func:`rejection_sample` (params
            a :class:`SamplingParams` in place of the five per-request keywords; seeds None: unseeded requests, each
            an independent stream from torch's default generator).
        out: (output_tokens, num_emitted, accepted_offsets[, logprobs]) of the shapes below, int32 (logprobs
            float32) contiguous, to write into.
    Returns:
        output_tokens [R, max_query_len] int32: the accepted nodes' ids then the last draw (recovered, or the bonus
            after a leaf), -1 padded;
        num_emitted [R] int32 (0 for padding rows);
        accepted_offsets [R, max_query_len] int32: entry d the offset of the path's token at depth d (entry 0 the
            anchor's 0, then the accepted nodes), num_emitted[r] entries, -1 padded. With num_accepted =
            (num_emitted - 1).clamp(min=0) it is :func:`commit_tree_kv`'s input as it stands;
        then with ``logprobs`` logprobs [R, max_query_len] float32: each emitted token's log-probability under the
            untruncated softmax(logits / T) of the row it was drawn from (T = 1 for greedy requests), -inf past
            num_emitted (one more pass over each row read).

    Bad values (module docstring for the shared ones): the CPU raises ValueError for a q_len above max_query_len and
    for a token at offset i >= 1 whose parent is not in [0, i); on CUDA that request's tokens past max_query_len
    are left out (``query_len_out_of_range``) and such a token is never entered (``token_parent_out_of_range``).
    An id outside [0, V) is never matched (``draft_id_out_of_range``, on both). Two children of one token with the
    same id (a planned tree has none): the first is followed.
    """
    if params is not None:
        temperature, seeds, top_k, top_p, min_p = _merge(params, temperature, seeds, top_k, top_p, min_p)
    seeds_arg = seeds
    device, T, V = logits_shape("target_logits", target_logits)
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"max_query_len must be an int, got {type(max_query_len).__name__}")
    if not 1 <= max_query_len <= MAX_TREE_TOKENS:
        raise ValueError(f"max_query_len must be in [1, {MAX_TREE_TOKENS}] (the anchor and at most "
                         f"{MAX_TREE_TOKENS - 1} nodes), got {max_query_len}")
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), device=device, ndim=1,
                 inner_contiguous=False)
    R = query_start_loc.shape[0] - 1
    if R < 0:
        raise ValueError("query_start_loc must have R + 1 >= 1 entries, got shape (0,)")
    check_tensor("token_parent", token_parent, dtypes=(torch.int32,), device=device, shape=(T,),
                 inner_contiguous=False)
    check_tensor("input_ids", input_ids, dtypes=(torch.int32, torch.int64), device=device, shape=(T,),
                 inner_contiguous=False)
    temperature = _per_request("temperature", temperature, R, device, torch.float32)
    trunc = _truncation(top_k, top_p, min_p, R, V, device)
    if not isinstance(logprobs, bool):
        raise TypeError(f"logprobs must be a bool, got {type(logprobs).__name__}")
    seeds = _seeds(seeds, temperature, R, device)
    host_offset, offset_t = _offset(offset, device)
    W = max_query_len
    fields = (("output_tokens", (R, W), torch.int32), ("num_emitted", (R,), torch.int32),
              ("accepted_offsets", (R, W), torch.int32)) + ((("logprobs", (R, W), torch.float32),) if logprobs else ())
    if out is None:
        out = tuple(torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in fields)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != len(fields):
            raise TypeError("out must be a tuple (output_tokens, num_emitted, accepted_offsets"
                            + (", logprobs)" if logprobs else ")"))
        for i, (name, shape, dtype) in enumerate(fields):
            check_tensor(f"out[{i}] ({name})", out[i], dtypes=(dtype,), device=device, shape=shape,
                         inner_contiguous=False)
    err = errors.error_buffer(device)
    args = (target_logits, query_start_loc, token_parent, input_ids, temperature, seeds, offset_t, trunc.top_k,
            trunc.top_p, trunc.min_p, out[0], out[1], out[2], out[3] if logprobs else None, err, host_offset, W)
    if torch.compiler.is_compiling():
        _tree_rejection_sample_into(*args)
        return tuple(out)
    p = _tree_params(*args)
    if preparing():
        if trunc.top_k is not top_k:
            refuse_copy("tree_rejection_sample", "top_k")
        inputs = {"target_logits": (target_logits, "logits"), "query_start_loc": (query_start_loc, "query_start_loc"),
                  "token_parent": (token_parent, "token_parent"), "input_ids": (input_ids, "input_ids"),
                  "temperature": (temperature, "temperature"), "seeds": (seeds_arg, "seeds"),
                  "offset": (offset_t, "offset_ptr"), "top_k": (top_k, "top_k"), "top_p": (top_p, "top_p"),
                  "min_p": (min_p, "min_p")}
        capture(PreparedSampler("tree_rejection_sample", _C.tree_rejection_sample, p, device, inputs,
                                {f"out[{i}]": t for i, t in enumerate(out)}, tuple(out), _TREE_MESSAGES,
                                fresh=seeds_arg is None and seeds is not None, n=R))
        return tuple(out)
    _run_tree(p, device)
    return tuple(out)


_TREE_MESSAGES = {_C.STATUS_QUERY_LEN: "query_start_loc must be non-decreasing within [0, T], with at most "
                                       "max_query_len tokens per request"}


def _run_tree(p, device) -> None:
    on_cuda = device.type == "cuda"
    status = _C.tree_rejection_sample(ctypes.addressof(p), on_cuda, stream_of(device) if on_cuda else 0)
    if status:
        check_status(status, "tree_rejection_sample", device, _TREE_MESSAGES)


def _tree_params(target_logits, query_start_loc, token_parent, input_ids, temperature, seeds, offset_t, top_k,
                 top_p, min_p, output_tokens, num_emitted, accepted_offsets, logprobs, err, host_offset,
                 max_query_len):
    """The struct of one tree_rejection_sample launch."""
    p = TreeSampleParams()
    p.num_tokens, p.vocab = target_logits.shape
    p.logits, p.logits_stride = target_logits.data_ptr(), target_logits.stride(0)
    p.dtype = DTYPE_CODES[target_logits.dtype]
    p.query_start_loc, p.num_reqs = query_start_loc.data_ptr(), query_start_loc.shape[0] - 1
    p.token_parent, p.input_ids = token_parent.data_ptr(), input_ids.data_ptr()
    p.input_ids_int64 = int(input_ids.dtype == torch.int64)
    p.temperature, p.seeds, p.offset, p.offset_ptr = ptr(temperature), ptr(seeds), host_offset, ptr(offset_t)
    p.max_query_len = max_query_len
    p.top_k, p.top_p, p.min_p = ptr(top_k), ptr(top_p), ptr(min_p)
    p.output_tokens, p.num_emitted = output_tokens.data_ptr(), num_emitted.data_ptr()
    p.accepted_offsets, p.logprobs, p.error_counts = accepted_offsets.data_ptr(), ptr(logprobs), err.data_ptr()
    return p


@torch.library.custom_op("adaptive_verify::tree_rejection_sample_into",
                         mutates_args=("output_tokens", "num_emitted", "accepted_offsets", "logprobs", "error_counts"))
def _tree_rejection_sample_into(target_logits: Tensor, query_start_loc: Tensor, token_parent: Tensor,
                                input_ids: Tensor, temperature: Optional[Tensor], seeds: Optional[Tensor],
                                offset: Optional[Tensor], top_k: Optional[Tensor], top_p: Optional[Tensor],
                                min_p: Optional[Tensor], output_tokens: Tensor, num_emitted: Tensor,
                                accepted_offsets: Tensor, logprobs: Optional[Tensor], error_counts: Tensor,
                                host_offset: int, max_query_len: int) -> None:
    _run_tree(_tree_params(target_logits, query_start_loc, token_parent, input_ids, temperature, seeds, offset, top_k,
                           top_p, min_p, output_tokens, num_emitted, accepted_offsets, logprobs, error_counts,
                           host_offset, max_query_len), target_logits.device)


@_tree_rejection_sample_into.register_fake
def _(*args, **kwargs):
    return None
