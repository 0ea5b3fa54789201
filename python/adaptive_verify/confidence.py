"""Confidence scores: the drafter's estimate, per drafted position, that the draft survives given that
every earlier draft survived (docs/design.md, "Confidence and calibration").

- ``confidence``: the fused linear head, sigmoid((h . w_h + m . w_m + b) / T_j), from the drafter's hidden
  states (and optional Markov-head features), straight into survival when asked;
- ``confidence_from_logits``: sigmoid(logit / T_j) when the head's logits are already computed;
- ``draft_margin``: the top-1 minus top-2 gap of the drafter's logits, the feature of
  :class:`adaptive_verify.MarginEstimator` for drafters without a confidence head.

Each op runs the CUDA kernel on CUDA tensors and the C++ CPU kernel on CPU tensors; the torch oracle is
in ``adaptive_verify.reference``. Outputs are float32 [R, K]; ``out=`` takes a preallocated buffer.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from . import errors
from ._binding import ConfidenceParams, LogitParams, MarginParams, call
from ._checks import INT32_MAX, check_real
from ._ext import _C, check_status
from ._validate import DTYPE_CODES, MAX_DRAFTS, check_device, check_tensor, check_temperature, ptr, run_op, stream_of
from .prepared import PreparedLaunch, capture, preparing, refuse_copy, register


def _out(out, R, K, device):
    if out is None:
        return torch.empty(R, K, dtype=torch.float32, device=device)
    return check_tensor("out", out, dtypes=(torch.float32,), device=device, shape=(R, K), inner_contiguous=False)


def _check_k(name, R, K):
    if not 1 <= K <= MAX_DRAFTS:
        raise ValueError(f"{name}.shape[1] (K, drafts per request) must be in [1, {MAX_DRAFTS}], got {K}")
    if R > INT32_MAX:  # num_reqs is an int32 field of the kernels' structs
        raise ValueError(f"{name}.shape[0] (R, requests) must be <= {INT32_MAX}, got {R}")


@register
def confidence(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: Union[float, torch.Tensor, None] = None,
    markov: Optional[torch.Tensor] = None,
    temperature=None,
    survival: bool = False,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """conf [R, K] float32 = sigmoid((hidden . weight[:H] + markov . weight[H:] + bias) / temperature[j]).

    Args:
        hidden: [R, K, H] bf16, fp16 or fp32; the last dim contiguous, other strides arbitrary.
        weight: [H + Q] (or [H] without markov), converted to float32 if it is not (pass float32 to
            avoid a conversion per call).
        bias: a finite float within float32's range, or a 0-d tensor on hidden's device (default 0).
        markov: [R, K, Q] features of a sequential (Markov) head, same dtype and device as hidden.
        temperature: [K] per-position STS temperatures (> 0), or None.
        survival: return the cumulative product along K (prefix survival) instead.
    Accumulation is fp32. A decode loop's fast path is ``adaptive_verify.prepare(confidence, ...)``, whose run
    takes new ``hidden`` and ``markov`` of the prepared layout. Temperatures on the CPU are checked (finite, > 0)
    at every call and at prepare; a CUDA tensor's, and a prepared call's later in-place values, are not read on the
    host: a position whose temperature is not finite and > 0 gets a NaN confidence, which the planner counts
    (``nan_survival``) and never verifies.
    With survival=True the result equals ``cumprod`` of the confidences computed
    left to right in float32.
    """
    weight_arg = weight
    check_tensor("hidden", hidden, dtypes=tuple(DTYPE_CODES), ndim=3)
    device = check_device("hidden", hidden)
    R, K, H = hidden.shape
    _check_k("hidden", R, K)
    Q = 0
    if markov is not None:
        check_tensor("markov", markov, dtypes=(hidden.dtype,), device=device, ndim=3)
        if markov.shape[:2] != hidden.shape[:2]:
            raise ValueError(f"markov must have shape [R, K, Q] = [{R}, {K}, Q], got {tuple(markov.shape)}")
        Q = markov.shape[2]
    check_tensor("weight", weight, ndim=1, inner_contiguous=False)
    if not weight.is_floating_point():
        raise TypeError(f"weight must be floating point, got {weight.dtype}")
    if weight.shape[0] != H + Q:
        raise ValueError(f"weight must have H + Q = {H + Q} elements (H={H}, Q={Q}), got {weight.shape[0]}")
    if weight.device != device:
        raise ValueError(f"weight must be on {device} (like hidden), got {weight.device}")
    weight = weight.to(torch.float32)
    bias_value, bias_t = 0.0, None
    if isinstance(bias, torch.Tensor):
        if bias.dim() != 0 or not bias.is_floating_point():
            raise ValueError(f"bias must be a float or a 0-d floating tensor, got shape {tuple(bias.shape)} {bias.dtype}")
        if bias.device != device:
            raise ValueError(f"bias must be on {device} (like hidden), got {bias.device}")
        bias_t = bias.to(torch.float32)
    elif bias is not None:
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise TypeError(f"bias must be a float or a 0-d tensor, got {type(bias).__name__}")
        # The kernel's bias is float32: 1e308 would arrive as inf, and inf + (-inf) logits make NaN.
        bias_value = check_real("bias", bias, float32=True)
    temperature_arg = temperature
    temperature = check_temperature("temperature", temperature, K, device)
    out = _out(out, R, K, device)
    if torch.compiler.is_compiling():
        _confidence_into(hidden, weight, bias_t, markov, temperature, out, bias_value, survival)
        return out
    params = _confidence_params(hidden, weight, bias_t, markov, temperature, out, bias_value, survival)
    if preparing():
        # The struct must hold the caller's own tensors: no converted weight, bias or temperature.
        for name, given, used in (("weight", weight_arg, weight), ("bias", bias, bias_t),
                                  ("temperature", temperature_arg, temperature)):
            if used is not None and used is not given:
                refuse_copy("confidence", name)
        capture(PreparedLaunch("confidence", _C.confidence, params, device,
                               {"hidden": (hidden, "hidden"), "markov": (markov, "markov")},
                               {"weight": weight, "bias": bias_t, "temperature": temperature, "out": out}, out))
        return out
    check_status(call(_C.confidence, params, device.type == "cuda", stream_of(device)), "confidence", device)
    return out


def _launch_confidence(hidden, weight, bias_t, markov, temperature, out, bias_value, survival):
    p = _confidence_params(hidden, weight, bias_t, markov, temperature, out, bias_value, survival)
    check_status(call(_C.confidence, p, hidden.is_cuda, stream_of(hidden.device)), "confidence", hidden.device)


def _confidence_params(hidden, weight, bias_t, markov, temperature, out, bias_value, survival):
    p = ConfidenceParams()
    p.num_reqs, p.max_drafts, p.hidden_size = hidden.shape
    p.hidden, p.hidden_stride_r, p.hidden_stride_k = hidden.data_ptr(), hidden.stride(0), hidden.stride(1)
    if markov is not None:
        p.markov, p.markov_stride_r, p.markov_stride_k = markov.data_ptr(), markov.stride(0), markov.stride(1)
        p.markov_size = markov.shape[2]
    p.dtype = DTYPE_CODES[hidden.dtype]
    p.weight, p.bias, p.bias_ptr, p.temperature = weight.data_ptr(), bias_value, ptr(bias_t), ptr(temperature)
    p.survival, p.out = int(survival), out.data_ptr()
    return p


@torch.library.custom_op("adaptive_verify::confidence_into", mutates_args=("out",))
def _confidence_into(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], markov: Optional[Tensor],
                     temperature: Optional[Tensor], out: Tensor, bias_value: float, survival: bool) -> None:
    _launch_confidence(hidden, weight, bias, markov, temperature, out, bias_value, survival)


@_confidence_into.register_fake
def _(*args, **kwargs):
    return None


def confidence_from_logits(
    logits: torch.Tensor, temperature=None, *, survival: bool = False, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """conf [R, K] float32 = sigmoid(logits / temperature[j]) (cumulative product along K with survival=True).

    logits: [R, K] bf16, fp16 or fp32 with a contiguous last dim; temperature: [K] (> 0) or None.
    """
    check_tensor("logits", logits, dtypes=tuple(DTYPE_CODES), ndim=2)
    device = check_device("logits", logits)
    R, K = logits.shape
    _check_k("logits", R, K)
    temperature = check_temperature("temperature", temperature, K, device)
    out = _out(out, R, K, device)
    run_op(_from_logits_into, _launch_from_logits, logits, temperature, out, survival)
    return out


def _launch_from_logits(logits, temperature, out, survival):
    p = LogitParams()
    p.num_reqs, p.max_drafts = logits.shape
    p.logits, p.logits_stride, p.dtype = logits.data_ptr(), logits.stride(0), DTYPE_CODES[logits.dtype]
    p.temperature, p.survival, p.out = ptr(temperature), int(survival), out.data_ptr()
    check_status(call(_C.confidence_from_logits, p, logits.is_cuda, stream_of(logits.device)),
                 "confidence_from_logits", logits.device)


@torch.library.custom_op("adaptive_verify::confidence_from_logits_into", mutates_args=("out",))
def _from_logits_into(logits: Tensor, temperature: Optional[Tensor], out: Tensor, survival: bool) -> None:
    _launch_from_logits(logits, temperature, out, survival)


@_from_logits_into.register_fake
def _(*args, **kwargs):
    return None


def draft_margin(draft_logits: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """margin [R, K] float32: top-1 minus top-2 of each drafted position's logits over the vocabulary.

    draft_logits: [R, K, V] bf16, fp16 or fp32, last dim contiguous. NaN logits are ignored and counted
    in ``error_counts()["nan_logits"]``; V == 1 gives +inf (a certain draft), a row of NaNs gives NaN.
    """
    check_tensor("draft_logits", draft_logits, dtypes=tuple(DTYPE_CODES), ndim=3)
    device = check_device("draft_logits", draft_logits)
    R, K, V = draft_logits.shape
    if R * K > 2**31 - 1:
        raise ValueError(f"draft_logits has R * K = {R * K} rows; at most 2^31 - 1 are supported")
    if V < 1:
        raise ValueError(f"draft_logits must have a vocabulary of at least 1, got shape {tuple(draft_logits.shape)}")
    out = _out(out, R, K, device)
    err = errors.error_buffer(device)
    run_op(_draft_margin_into, _launch_margin, draft_logits, out, err)
    return out


def _launch_margin(draft_logits, out, err):
    p = MarginParams()
    p.num_reqs, p.max_drafts, p.vocab = draft_logits.shape
    p.logits, p.stride_r, p.stride_k = draft_logits.data_ptr(), draft_logits.stride(0), draft_logits.stride(1)
    p.dtype, p.out, p.error_counts = DTYPE_CODES[draft_logits.dtype], out.data_ptr(), err.data_ptr()
    check_status(call(_C.draft_margin, p, draft_logits.is_cuda, stream_of(draft_logits.device)), "draft_margin",
                 draft_logits.device)


@torch.library.custom_op("adaptive_verify::draft_margin_into", mutates_args=("out", "error_counts"))
def _draft_margin_into(draft_logits: Tensor, out: Tensor, error_counts: Tensor) -> None:
    _launch_margin(draft_logits, out, error_counts)


@_draft_margin_into.register_fake
def _(*args, **kwargs):
    return None
