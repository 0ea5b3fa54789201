"""Per-request sampling parameters, and the per-call inputs the chain and tree samplers share.

``SamplingParams`` groups the tensors an engine passes every step (one entry per request, e.g. from its
persistent batch buffers) so that ``rejection_sample``, ``tree_rejection_sample`` and ``sample`` take one
argument for them: ``params=SamplingParams(temperature=t, top_k=k)``. The ops still take each as a keyword.

The rest is shared by sampling.py and sampling_tree.py: validation of the per-request tensors, of the offset and
of the truncation filters, the seeds of unseeded requests, and ``PreparedSampler``, the samplers' prepared call
(adaptive_verify.prepare), whose per-run inputs (the host offset, fresh seeds, new logits) are read on every run.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ._validate import check_tensor
from .prepared import PreparedLaunch

#: The fields of SamplingParams, in the order ``_merge`` takes and returns them.
_FIELDS = ("temperature", "seeds", "top_k", "top_p", "min_p")


@dataclasses.dataclass(frozen=True, eq=False)
class SamplingParams:
    """Per-request sampling parameters of one batch: [R] tensors, entry r for request r (R = the op's
    requests, or rows for ``sample``), any of them None. Like vLLM's ``SamplingMetadata`` (tensors for a batch),
    not its per-request ``SamplingParams``.

    Fields (the meaning of each is the ops', adaptive_verify.sampling's module docstring):
        temperature: [R] float32; 0 = greedy; None = every request greedy.
        top_k: [R] int32 (int64 is converted per call), 0 = off.
        top_p: [R] float32 in (0, 1], 1 = off.
        min_p: [R] float32 in [0, 1], 0 = off.
        seeds: [R] int64; None = unseeded requests (an independent stream each).

    Construction checks only that each field is a tensor or None; the ops check dtypes, shapes, devices and
    values on every call, as they do for the keywords, and name a field by its name (``top_k``), which is also
    its keyword's name. An op given ``params`` also takes a field's keyword when ``params`` leaves that field None
    (e.g. fresh ``seeds`` for a step); a field given both ways raises ValueError.

    The object holds the tensors, not copies: build it once around the engine's persistent buffers and update
    their values in place (a prepared sampler call holds the tensors this holds, and reads their values at every
    run). It is frozen; ``dataclasses.replace(params, seeds=s)`` makes a new one.
    """

    temperature: Optional[torch.Tensor] = None
    top_k: Optional[torch.Tensor] = None
    top_p: Optional[torch.Tensor] = None
    min_p: Optional[torch.Tensor] = None
    seeds: Optional[torch.Tensor] = None

    def __post_init__(self):
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(f"SamplingParams.{name} must be a torch.Tensor or None, got {type(value).__name__}")


def _merge(params, temperature, seeds, top_k, top_p, min_p) -> tuple:
    """(temperature, seeds, top_k, top_p, min_p) of a call given ``params`` (not None) and the keywords: each from
    whichever of the two gives it (the objects themselves, so a prepared call holds the same tensors)."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be an adaptive_verify.SamplingParams, got {type(params).__name__}")
    t, s, k, p, m = params.temperature, params.seeds, params.top_k, params.top_p, params.min_p
    if ((t is None or temperature is None) and (s is None or seeds is None) and (k is None or top_k is None)
            and (p is None or top_p is None) and (m is None or min_p is None)):
        return (t if temperature is None else temperature, s if seeds is None else seeds,
                k if top_k is None else top_k, p if top_p is None else top_p, m if min_p is None else min_p)
    both = [name for name, kw in zip(_FIELDS, (temperature, seeds, top_k, top_p, min_p))
            if kw is not None and getattr(params, name) is not None]
    raise ValueError(" and ".join(f"{name}= and params.{name}" for name in both)
                     + " are both given: pass each parameter once")


def _offset(offset, device):
    """(host offset, 0-d int64 device tensor or None)."""
    if isinstance(offset, torch.Tensor):
        check_tensor("offset", offset, dtypes=(torch.int64,), device=device, shape=(), inner_contiguous=False)
        return 0, offset
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int or a 0-d int64 tensor, got {type(offset).__name__}")
    if not 0 <= offset < 2**64:
        raise ValueError(f"offset must be in [0, 2^64), got {offset}")
    return offset, None


def _seeds(seeds, temperature, n, device):
    """seeds [n] int64, or for unseeded requests (seeds None) fresh ones from torch's default generator of
    ``device``, as engines seed unseeded requests, so that two identical unseeded requests draw independent
    streams (one small randint op, drawn only when some request samples: temperature given). Graph-safe: a
    captured call draws new seeds at every replay through torch's graph-aware generator."""
    if seeds is not None:
        return _per_request("seeds", seeds, n, device, torch.int64)
    if temperature is None or n == 0:
        return None  # every request greedy: no random numbers are used
    return torch.randint(-2**63, 2**63 - 1, (n,), dtype=torch.int64, device=device)


def _per_request(name, t, n, device, dtype):
    if t is None:
        return None
    check_tensor(name, t, dtypes=(dtype,), device=device, shape=(n,), inner_contiguous=False)
    return t


#: Largest vocabulary with top_p: the fixed-point mass of a row (< V * 2^32) must stay exact in a double.
MAX_VOCAB_TOP_P = 1 << 21


class _Truncation:
    """Validated per-request sampling parameters (tensors on the device, or None)."""

    __slots__ = ("top_k", "top_p", "min_p")

    def __init__(self, top_k, top_p, min_p):
        self.top_k, self.top_p, self.min_p = top_k, top_p, min_p

    def any(self) -> bool:
        return self.top_k is not None or self.top_p is not None or self.min_p is not None


def _truncation(top_k, top_p, min_p, n: int, V: int, device) -> _Truncation:
    if isinstance(top_k, torch.Tensor) and top_k.dtype == torch.int64:
        top_k = top_k.clamp(-1, 2**31 - 1).to(torch.int32)  # clamp first: no wrap-around into range
    top_k = _per_request("top_k", top_k, n, device, torch.int32)
    top_p = _per_request("top_p", top_p, n, device, torch.float32)
    min_p = _per_request("min_p", min_p, n, device, torch.float32)
    if top_p is not None and V > MAX_VOCAB_TOP_P:
        raise ValueError(f"top_p needs a vocabulary of at most {MAX_VOCAB_TOP_P} tokens, got V = {V}")
    # Values are checked by the CPU kernel (ValueError naming the argument) and counted by the CUDA kernels.
    return _Truncation(top_k, top_p, min_p)


class PreparedSampler(PreparedLaunch):
    """A prepared rejection_sample, tree_rejection_sample or sample (adaptive_verify.prepare).

    ``run(offset=None, **inputs)`` launches it and returns the prepared outputs. ``offset``: this step's host offset
    (an int; a call prepared with a 0-d offset tensor reads that tensor, advanced in place, or one of its layout passed
    here). Inputs, each of the prepared one's layout: the logits (``target_logits`` / ``logits``), the call's index
    tensors (``query_start_loc``, ``draft_tokens``, ``draft_probs``; trees: ``token_parent``, ``input_ids``) and the
    sampling parameters that were given (``temperature``, ``seeds``, ``top_k``, ``top_p``, ``min_p``). Unseeded
    requests (seeds None, temperature given) draw fresh seeds every run, as every call of the op does."""

    __slots__ = ("fresh", "n", "zero")

    def __init__(self, op, fn, params, device, inputs: dict, held: dict, result, messages, *, fresh: bool, n: int,
                 zero=None):
        super().__init__(op, fn, params, device, inputs, held, result, messages)
        self.fresh, self.n, self.zero = fresh, n, zero  # zero: a workspace that must start at zero (splitv)

    def run(self, offset=None, **inputs):
        p = self.params
        if isinstance(offset, torch.Tensor):
            inputs["offset"] = offset
        elif offset is not None:
            if "offset" in self._slots:
                raise TypeError(f"{self.op}: offset was prepared as a 0-d tensor: advance it in place, or pass a "
                                "tensor of its layout")
            p.offset = _offset(offset, self.device)[0]
        self._bind(inputs)
        fresh = None
        if self.fresh:  # unseeded requests: fresh seeds each run, as every call draws them
            fresh = _seeds(None, True, self.n, self.device)
            p.seeds = fresh.data_ptr()
        if self.zero is not None:
            self.zero.zero_()
        self.launch()
        del fresh  # (CUDA: the caching allocator reuses it only after this stream's kernel)
        return self.result
