"""Lossless varlen rejection sampling (docs/design.md, "Sampling").

After the target's verification forward, request r has 1 + L[r] logit rows starting at query_start_loc[r]:
row j judges draft j, row L[r] gives the bonus token. ``rejection_sample`` accepts the longest prefix of
drafts that passes the rejection test and emits one more token: at the first rejection a sample from the
residual distribution normalise(max(p - q, 0)), or the bonus sample when every draft passed. The emitted
tokens follow the target's distribution exactly, whatever the drafter proposed.

Terms: *accepted* drafts pass the test; the *recovered* token replaces the first rejected draft; the *bonus*
token follows a fully accepted block. ``num_emitted = accepted + 1``.

How (csrc/include/adaptive_verify/sampling/math.h has the exact arithmetic):
- greedy requests (temperature 0) accept draft x iff x is the row's argmax (ties: smallest id);
- one-hot drafts (``draft_probs=None``: drafts taken by argmax or otherwise without a distribution) run one
  exponential race per row, which samples the target distribution: accept iff it lands on the draft,
  else its winner is the recovered token (for one-hot q this is the same law as u * q(x) < p(x) followed by
  a residual sample);
- with ``draft_probs``, accept iff u * q(x) < p(x); on rejection an exponential race over max(p - q, 0).
No probability tensor is materialised: each needed row is streamed once or twice, and rows past a request's
first rejection are never read (by the default CUDA kernel; ``cuda_kernel="splitv"`` splits every row's vocabulary
over several blocks, which may also read rows past the first rejection, whose results are then ignored).
Random numbers come from Philox4x32-10 keyed by (seed[r], offset, position), not by the request's place in the
batch, so results are reproducible, batch-invariant and CUDA-graph safe (pass ``offset`` as a 0-d int64 device
tensor and advance it in place between replays).

Sampling parameters (per request, as engines pass them every step): ``top_k`` [R] int32 (0 = off), ``top_p``
[R] float32 (1.0 = off), ``min_p`` [R] float32 (0 = off). The target is softmax(logits / T) restricted to the
kept tokens and renormalised, and every emitted token is lossless with respect to it. Filters apply in vLLM's
order: min-p (p_v >= min_p * p_max), then top-k, then top-p on the top-k set renormalised (the smallest
prefix whose mass reaches top_p). Ranking is logit descending, then id ascending, so ties at a threshold keep
the lower ids and top-k keeps exactly k tokens. top-p masses are summed in 32.32 fixed point (exact in any
order: the CPU and CUDA kernels keep the same set); terms below 2^-32 of the top token's weigh 0. No sort of
the vocabulary and no probability tensor: each filter is a threshold found by exact histograms over the rank
key, one pass over the row per 8 bits resolved (csrc/include/adaptive_verify/sampling/algorithm.h). Greedy
requests ignore them (the argmax is always kept); top_k = 1 at any temperature gives the greedy tokens.
``logprobs=True`` also returns the log-probability of every emitted token under softmax(logits / T),
untruncated (T = 1 for greedy requests: the raw logits), -inf past num_emitted. Calls with sampling
parameters or logprobs run the "v1" CUDA kernel whatever ``cuda_kernel`` says.

``SamplingParams`` (sampling_params.py) holds the per-request parameters, these three with temperature and seeds,
in one object: each sampler takes it as ``params=`` in place of the five keywords. The draft-tree sampler,
``tree_rejection_sample``, lives in sampling_tree.py and is imported from here like the others.

Safe handling of values that cannot be checked without a host sync (counted in ``error_counts()``):
draft ids outside [0, V) are rejected and never used as an index (``draft_id_out_of_range``); q_len > K + 1
is clamped to K drafts and q_len < 0 or rows past T make a padding row (``query_len_out_of_range``). Non-finite
logits follow one rule in every op (docs/design.md, "Non-finite logits"): NaN never wins (``nan_logits``, once
per row read for a decision); a row with +inf logits samples uniformly among them (the limit of softmax; every
other token has probability 0, logprobs log(1/n) and -inf); a row with only -inf and NaN emits id 0. The CPU path raises ValueError for negative temperatures and for sampling parameters out of range; on
CUDA a negative or NaN temperature means greedy, and top_k < 0, top_p outside (0, 1] or min_p outside [0, 1]
(NaN included) turn that filter off for the request (``sampling_param_out_of_range``).
"""
from __future__ import annotations

import ctypes
from typing import Optional, Union

import torch

from torch import Tensor

from . import errors
from ._binding import RejectionParams, SampleParams
from .prepared import capture, preparing, refuse_copy, register
from ._ext import _C, check_status
from ._validate import DTYPE_CODES, check_tensor, kernel_choice, logits_shape, ptr, stream_of
# The ops below look these names up here at call time (a test replaces _truncation to reach a kernel's own
# handling of bad values); the tree sampler and the limits are re-exported, so adaptive_verify.sampling stays the
# one place to import the samplers from.
from .sampling_params import (MAX_VOCAB_TOP_P, PreparedSampler, SamplingParams, _merge, _offset, _per_request,
                              _seeds, _truncation)
from .sampling_tree import MAX_TREE_TOKENS, tree_rejection_sample

__all__ = ["CUDA_KERNEL", "MAX_TREE_TOKENS", "MAX_VOCAB_TOP_P", "SAMPLER_KERNELS", "SamplingParams", "rejection_sample",
           "sample", "tree_rejection_sample"]

# CUDA sampler kernels (sampling/params.h SamplerKernel): "v1" (the default, validated on an H200) one block
# per request walking whole rows (kernel.cuh); "splitv" (the candidate, not yet run on a GPU) rows split into
# vocabulary chunks whose partials are merged in a fixed order (kernel_splitv.cuh). Both give the CPU kernel's
# integers; the CPU kernel ignores the choice (the name is still checked).
SAMPLER_KERNELS = dict(_C.SAMPLER_KERNELS)
#: The CUDA kernel used when a call passes cuda_kernel=None (set it once, e.g. after validating "splitv").
CUDA_KERNEL = "v1"


def _kernel_id(cuda_kernel) -> int:
    return kernel_choice(cuda_kernel, "adaptive_verify.sampling.CUDA_KERNEL", CUDA_KERNEL, SAMPLER_KERNELS)


def _workspace(kernel: int, device, dtype_code: int, V: int, slots: int, num_reqs: int):
    """(workspace tensor or None, its bytes) of the split-vocabulary kernel: [slots, chunks] partials of 16 B,
    then for rejection_sample (num_reqs > 0) per-row chunk counters and per-request early-exit states, which
    must start at zero. Sized from host-known bounds, so a captured graph replays with the same grid."""
    if kernel == 0 or device.type != "cuda":
        return None, 0
    nbytes = _C.sampler_splitv_workspace_bytes(dtype_code, V, slots, num_reqs)
    alloc = torch.zeros if num_reqs > 0 else torch.empty
    return alloc(max(nbytes, 16), dtype=torch.uint8, device=device), nbytes


@register
def rejection_sample(
    target_logits: torch.Tensor,
    query_start_loc: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    params: Optional[SamplingParams] = None,
    temperature: Optional[torch.Tensor] = None,
    seeds: Optional[torch.Tensor] = None,
    offset: Union[int, torch.Tensor] = 0,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
    logprobs: bool = False,
    out: Optional[tuple] = None,
    cuda_kernel: Optional[str] = None,
) -> tuple:
    """Accepts a prefix of each request's verified drafts and emits one more token, losslessly.

    Args:
        target_logits: [T, V] bf16, fp16 or fp32 (last dim contiguous); row query_start_loc[r] + j judges
            draft j of request r, row query_start_loc[r] + L[r] gives the bonus (L[r] = q_len[r] - 1).
        query_start_loc: [R + 1] int32 (the planner's); q_len 0 marks a padding row.
        draft_tokens: [R, K] int32 or int64 (last dim contiguous).
        draft_probs: [R, K, V] float32, the distribution each draft was sampled from, or None for one-hot
            drafts.
        params: :class:`SamplingParams`, the five per-request parameters below (temperature, top_k, top_p, min_p,
            seeds) in one object, in place of their keywords. A field it leaves None may still come as a keyword; a
            field given both ways raises ValueError naming both. Errors name a field by its name (``top_k``).
        temperature: [R] float32; 0 = greedy; None = every request greedy.
        seeds: [R] int64, one per request: seeded requests are reproducible and batch-invariant. None: the
            requests are unseeded and each draws an independent stream (seeds from torch's default
            generator, so ``torch.manual_seed`` makes a run reproducible). A batch mixing seeded and
            unseeded requests passes seeds for all, drawing the unseeded ones' afresh each step (e.g.
            ``torch.randint``), as engines do.
        offset: int or 0-d int64 tensor, advanced by the engine every step.
        top_k: [R] int32 (int64 is converted), 0 = off; top_p: [R] float32 in (0, 1], 1 = off; min_p: [R]
            float32 in [0, 1], 0 = off (module docstring: the truncated target).
        logprobs: also return logprobs [R, K + 1] float32 (module docstring).
        out: (output_tokens [R, K + 1] int32, num_emitted [R] int32[, logprobs [R, K + 1] float32]) to write
            into.
        cuda_kernel: "v1" or "splitv" (see SAMPLER_KERNELS); None takes ``adaptive_verify.sampling.CUDA_KERNEL``.
    Returns:
        output_tokens [R, K + 1] int32 (accepted drafts then the recovered/bonus token, -1 padded) and
        num_emitted [R] int32, then logprobs [R, K + 1] float32 when ``logprobs``.
    """
    if params is not None:
        temperature, seeds, top_k, top_p, min_p = _merge(params, temperature, seeds, top_k, top_p, min_p)
    seeds_arg = seeds
    kernel = _kernel_id(cuda_kernel)
    device, T, V = logits_shape("target_logits", target_logits)
    check_tensor("draft_tokens", draft_tokens, dtypes=(torch.int32, torch.int64), device=device, ndim=2)
    R, K = draft_tokens.shape
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), device=device, shape=(R + 1,),
                 inner_contiguous=False)
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=(torch.float32,), device=device, shape=(R, K, V))
    temperature = _per_request("temperature", temperature, R, device, torch.float32)
    trunc = _truncation(top_k, top_p, min_p, R, V, device)
    if not isinstance(logprobs, bool):
        raise TypeError(f"logprobs must be a bool, got {type(logprobs).__name__}")
    if trunc.any() or logprobs:
        kernel = 0  # only the v1 kernel implements them (module docstring)
    seeds = _seeds(seeds, temperature, R, device)
    host_offset, offset_t = _offset(offset, device)
    n_out = 3 if logprobs else 2
    if out is None:
        out = (torch.empty(R, K + 1, dtype=torch.int32, device=device), torch.empty(R, dtype=torch.int32, device=device))
        if logprobs:
            out += (torch.empty(R, K + 1, dtype=torch.float32, device=device),)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != n_out:
            raise TypeError("out must be a tuple (output_tokens, num_emitted" + (", logprobs)" if logprobs else ")"))
        check_tensor("out[0] (output_tokens)", out[0], dtypes=(torch.int32,), device=device, shape=(R, K + 1),
                     inner_contiguous=False)
        check_tensor("out[1] (num_emitted)", out[1], dtypes=(torch.int32,), device=device, shape=(R,),
                     inner_contiguous=False)
        if logprobs:
            check_tensor("out[2] (logprobs)", out[2], dtypes=(torch.float32,), device=device, shape=(R, K + 1),
                         inner_contiguous=False)
    err = errors.error_buffer(device)
    args = (target_logits, query_start_loc, draft_tokens, draft_probs, temperature, seeds, offset_t, trunc.top_k,
            trunc.top_p, trunc.min_p, out[0], out[1], out[2] if logprobs else None, err, host_offset, kernel)
    if torch.compiler.is_compiling():
        _rejection_sample_into(*args)
        return tuple(out)
    p, ws = _rejection_params(*args)
    if preparing():
        if trunc.top_k is not top_k:
            refuse_copy("rejection_sample", "top_k")
        inputs = {"target_logits": (target_logits, "logits"), "query_start_loc": (query_start_loc, "query_start_loc"),
                  "draft_tokens": (draft_tokens, "draft_tokens"), "draft_probs": (draft_probs, "draft_probs"),
                  "temperature": (temperature, "temperature"), "seeds": (seeds_arg, "seeds"),
                  "offset": (offset_t, "offset_ptr"), "top_k": (top_k, "top_k"), "top_p": (top_p, "top_p"),
                  "min_p": (min_p, "min_p")}
        held = {f"out[{i}]": t for i, t in enumerate(out)}
        held["workspace"] = ws
        capture(PreparedSampler("rejection_sample", _C.rejection_sample, p, device, inputs, held, tuple(out), _MESSAGES,
                                fresh=seeds_arg is None and seeds is not None, n=R, zero=ws))
        return tuple(out)
    _run(_C.rejection_sample, p, device, "rejection_sample")
    return tuple(out)


_MESSAGES = {_C.STATUS_QUERY_LEN: "query_start_loc must be non-decreasing within [0, T], with at most K + 1 rows "
                                  "per request"}


def _run(fn, p, device, op) -> None:
    on_cuda = device.type == "cuda"
    status = fn(ctypes.addressof(p), on_cuda, stream_of(device) if on_cuda else 0)
    if status:
        check_status(status, op, device, _MESSAGES)


def _launch_rejection(*args) -> None:
    p, _ws = _rejection_params(*args)
    _run(_C.rejection_sample, p, args[0].device, "rejection_sample")


def _rejection_params(target_logits, query_start_loc, draft_tokens, draft_probs, temperature, seeds, offset_t,
                      top_k, top_p, min_p, output_tokens, num_emitted, logprobs, err, host_offset, kernel):
    """(struct, workspace tensor or None) of one rejection_sample launch."""
    p = RejectionParams()
    p.num_tokens, p.vocab = target_logits.shape
    p.num_reqs, p.max_drafts = draft_tokens.shape
    dtype_code = DTYPE_CODES[target_logits.dtype]
    ws, ws_bytes = _workspace(kernel, target_logits.device, dtype_code, p.vocab, p.num_reqs * (p.max_drafts + 1),
                              p.num_reqs)
    p.logits, p.logits_stride, p.dtype = target_logits.data_ptr(), target_logits.stride(0), dtype_code
    p.query_start_loc = query_start_loc.data_ptr()
    p.draft_tokens, p.draft_tokens_stride = draft_tokens.data_ptr(), draft_tokens.stride(0)
    p.draft_tokens_int64 = int(draft_tokens.dtype == torch.int64)
    if draft_probs is not None:
        p.draft_probs, p.draft_probs_stride_r, p.draft_probs_stride_k = (draft_probs.data_ptr(), draft_probs.stride(0),
                                                                         draft_probs.stride(1))
    p.temperature, p.seeds, p.offset, p.offset_ptr = ptr(temperature), ptr(seeds), host_offset, ptr(offset_t)
    p.top_k, p.top_p, p.min_p = ptr(top_k), ptr(top_p), ptr(min_p)
    p.output_tokens, p.num_emitted, p.error_counts = output_tokens.data_ptr(), num_emitted.data_ptr(), err.data_ptr()
    p.logprobs = ptr(logprobs)
    p.kernel, p.workspace, p.workspace_bytes = kernel, ptr(ws), ws_bytes
    return p, ws


@torch.library.custom_op("adaptive_verify::rejection_sample_into",
                         mutates_args=("output_tokens", "num_emitted", "logprobs", "error_counts"))
def _rejection_sample_into(target_logits: Tensor, query_start_loc: Tensor, draft_tokens: Tensor,
                           draft_probs: Optional[Tensor], temperature: Optional[Tensor], seeds: Optional[Tensor],
                           offset: Optional[Tensor], top_k: Optional[Tensor], top_p: Optional[Tensor],
                           min_p: Optional[Tensor], output_tokens: Tensor, num_emitted: Tensor,
                           logprobs: Optional[Tensor], error_counts: Tensor, host_offset: int, kernel: int) -> None:
    _launch_rejection(target_logits, query_start_loc, draft_tokens, draft_probs, temperature, seeds, offset, top_k,
                      top_p, min_p, output_tokens, num_emitted, logprobs, error_counts, host_offset, kernel)


@_rejection_sample_into.register_fake
def _(*args, **kwargs):
    return None


@register
def sample(
    logits: torch.Tensor,
    temperature: Optional[torch.Tensor] = None,
    seeds: Optional[torch.Tensor] = None,
    offset: Union[int, torch.Tensor] = 0,
    *,
    params: Optional[SamplingParams] = None,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
    logprobs: bool = False,
    out=None,
    cuda_kernel: Optional[str] = None,
):
    """One token per row of logits [N, V] (rows without drafts, e.g. prefill completions): argmax where
    temperature is 0 (or None), else an exponential race over the row's kept tokens on the same generator as
    rejection_sample (its own stream, so the two never share random numbers). ``seeds`` as in
    :func:`rejection_sample` (None: unseeded, an independent stream per row); ``top_k``, ``top_p``, ``min_p``
    [N], ``params`` (a :class:`SamplingParams` of [N] tensors in place of those keywords, temperature and seeds
    included) and ``logprobs`` as there. Returns tokens [N] int32, or (tokens, logprobs [N] float32) with
    ``logprobs``; ``out`` is tokens, or the pair with ``logprobs``."""
    if params is not None:
        temperature, seeds, top_k, top_p, min_p = _merge(params, temperature, seeds, top_k, top_p, min_p)
    seeds_arg = seeds
    kernel = _kernel_id(cuda_kernel)
    device, N, V = logits_shape("logits", logits)
    temperature = _per_request("temperature", temperature, N, device, torch.float32)
    trunc = _truncation(top_k, top_p, min_p, N, V, device)
    if not isinstance(logprobs, bool):
        raise TypeError(f"logprobs must be a bool, got {type(logprobs).__name__}")
    if trunc.any() or logprobs:
        kernel = 0
    seeds = _seeds(seeds, temperature, N, device)
    host_offset, offset_t = _offset(offset, device)
    if out is None:
        tokens = torch.empty(N, dtype=torch.int32, device=device)
        lp = torch.empty(N, dtype=torch.float32, device=device) if logprobs else None
    elif logprobs:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("out must be a tuple (tokens, logprobs) with logprobs=True")
        tokens, lp = out
        check_tensor("out[1] (logprobs)", lp, dtypes=(torch.float32,), device=device, shape=(N,),
                     inner_contiguous=False)
    else:
        tokens, lp = out, None
    check_tensor("out" if not logprobs else "out[0] (tokens)", tokens, dtypes=(torch.int32,), device=device,
                 shape=(N,), inner_contiguous=False)
    err = errors.error_buffer(device)
    args = (logits, temperature, seeds, offset_t, trunc.top_k, trunc.top_p, trunc.min_p, tokens, lp, err, host_offset,
            kernel)
    if torch.compiler.is_compiling():
        _sample_into(*args)
        return (tokens, lp) if logprobs else tokens
    p, ws = _sample_params(*args)
    result = (tokens, lp) if logprobs else tokens
    if preparing():
        if trunc.top_k is not top_k:
            refuse_copy("sample", "top_k")
        inputs = {"logits": (logits, "logits"), "temperature": (temperature, "temperature"),
                  "seeds": (seeds_arg, "seeds"), "offset": (offset_t, "offset_ptr"), "top_k": (top_k, "top_k"),
                  "top_p": (top_p, "top_p"), "min_p": (min_p, "min_p")}
        held = {"tokens": tokens, "logprobs": lp, "workspace": ws}
        capture(PreparedSampler("sample", _C.sample, p, device, inputs, held, result, _MESSAGES,
                                fresh=seeds_arg is None and seeds is not None, n=N))
        return result
    _run(_C.sample, p, device, "sample")
    return result


def _launch_sample(*args) -> None:
    p, _ws = _sample_params(*args)
    _run(_C.sample, p, args[0].device, "sample")


def _sample_params(logits, temperature, seeds, offset_t, top_k, top_p, min_p, out, logprobs, err, host_offset,
                   kernel):
    """(struct, workspace tensor or None) of one sample launch."""
    p = SampleParams()
    p.num_rows, p.vocab = logits.shape
    p.dtype = DTYPE_CODES[logits.dtype]
    ws, ws_bytes = _workspace(kernel, logits.device, p.dtype, p.vocab, p.num_rows, 0)
    p.logits, p.logits_stride = logits.data_ptr(), logits.stride(0)
    p.temperature, p.seeds, p.offset, p.offset_ptr = ptr(temperature), ptr(seeds), host_offset, ptr(offset_t)
    p.top_k, p.top_p, p.min_p = ptr(top_k), ptr(top_p), ptr(min_p)
    p.tokens, p.logprobs, p.error_counts = out.data_ptr(), ptr(logprobs), err.data_ptr()
    p.kernel, p.workspace, p.workspace_bytes = kernel, ptr(ws), ws_bytes
    return p, ws


@torch.library.custom_op("adaptive_verify::sample_into", mutates_args=("out", "logprobs", "error_counts"))
def _sample_into(logits: Tensor, temperature: Optional[Tensor], seeds: Optional[Tensor], offset: Optional[Tensor],
                 top_k: Optional[Tensor], top_p: Optional[Tensor], min_p: Optional[Tensor], out: Tensor,
                 logprobs: Optional[Tensor], error_counts: Tensor, host_offset: int, kernel: int) -> None:
    _launch_sample(logits, temperature, seeds, offset, top_k, top_p, min_p, out, logprobs, error_counts, host_offset,
                   kernel)


@_sample_into.register_fake
def _(*args, **kwargs):
    return None
