"""fp8 KV caches for the attention ops (docs/design.md, "fp8 KV caches"): the cache element types and the scales.

A ``torch.float8_e4m3fn`` cache holds value / scale, with a float32 scale per tensor or per KV head, as vLLM keeps
its ``k_scale`` / ``v_scale``. Here each scale argument becomes the parameter struct's fields (``k_scale`` /
``k_scales`` / ``k_scale_stride``, params.h ``kv_scale``):

- ``None``: 1.0 (vLLM's default when a checkpoint has no scales);
- a Python float: per tensor, kept on the host (no device memory, nothing to sync), checked finite and > 0;
- a float32 tensor on the cache's device of shape [] or [1] (per tensor: vLLM's ``layer._k_scale``) or [Hkv] (per
  KV head). On CPU its values are checked (finite and > 0: ValueError naming the argument). On CUDA they cannot be
  checked without a sync: the kernels use them as given and count each KV head whose scale is NaN, infinite or
  <= 0 in ``error_counts()["kv_scale_out_of_range"]``.

Decisions: the scales apply to fp8 caches only; passing one with a bf16/fp16 cache is a ValueError (a silent
no-op would hide a wrong cache dtype). Quantisation (``write_kv``) divides in float32 and rounds to nearest even,
saturating at +-448 (NaN stays NaN), as vLLM's and CUDA's saturating conversions do.
"""
from __future__ import annotations

import struct
from typing import Optional, Union

import torch

from ._checks import check_real
from ._validate import check_tensor

FP8 = torch.float8_e4m3fn
#: Cache element type codes (dtype.h DType): q's dtype, or float8_e4m3fn.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, FP8: 3}

Scale = Union[None, float, torch.Tensor]


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def check_cache_dtype(name: str, cache: torch.Tensor, q_dtype: torch.dtype) -> bool:
    """Whether ``cache`` (of q_dtype or float8_e4m3fn, else TypeError naming ``name``) is an fp8 cache."""
    if cache.dtype not in (q_dtype, FP8):
        raise TypeError(f"{name} must have q's dtype {q_dtype} or torch.float8_e4m3fn, got {cache.dtype}")
    return cache.dtype == FP8


def kv_scale_fields(name: str, scale: Scale, fp8: bool, num_kv_heads: int, device: torch.device):
    """(value, tensor or None) of one checked scale argument (module docstring)."""
    if not fp8:
        if scale is not None:
            raise ValueError(f"{name} applies to float8_e4m3fn caches only; this cache is not fp8 (pass None)")
        return 1.0, None
    if scale is None:
        return 1.0, None
    if not isinstance(scale, torch.Tensor):
        value = check_real(name, scale, lo=0.0, lo_open=True, float32=True)
        if _float32(value) == 0.0:
            raise ValueError(f"{name} must be > 0 in float32, got {value!r}")
        return value, None
    check_tensor(name, scale, dtypes=(torch.float32,), device=device, inner_contiguous=False)
    if scale.dim() > 1 or scale.numel() not in (1, num_kv_heads):
        raise ValueError(f"{name} must have shape [], [1] or [Hkv] = [{num_kv_heads}], got {tuple(scale.shape)}")
    if scale.device.type == "cpu":
        bad = ~(torch.isfinite(scale) & (scale > 0))
        if bool(bad.any()):
            raise ValueError(f"{name} must be finite and > 0, got {scale.flatten()[bad.flatten()][0].item()!r}")
    return 1.0, scale


def _stride(tensor: Optional[torch.Tensor], num_kv_heads: int) -> int:
    per_head = tensor is not None and tensor.dim() == 1 and tensor.numel() == num_kv_heads > 1
    return tensor.stride(0) if per_head else 0


def set_kv_scales(p, k_value: float, k_tensor: Optional[torch.Tensor], v_value: float,
                  v_tensor: Optional[torch.Tensor], num_kv_heads: int) -> None:
    """Fills p's scale fields (AttentionParams or WriteKvParams) from checked kv_scale_fields results."""
    p.k_scale, p.v_scale = k_value, v_value
    p.k_scale_stride, p.v_scale_stride = _stride(k_tensor, num_kv_heads), _stride(v_tensor, num_kv_heads)
    p.k_scales = 0 if k_tensor is None else k_tensor.data_ptr()
    p.v_scales = 0 if v_tensor is None else v_tensor.data_ptr()
