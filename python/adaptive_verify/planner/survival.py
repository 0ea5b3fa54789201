"""prefix_survival: confidences -> prefix survival (docs/design.md, "Planner"), a thin wrapper over _C."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from .. import errors
from .._binding import SurvivalParams
from .._callcache import CallCache
from .._ext import _C, check_status
from .._validate import check_tensor, stream_of
from .args import survival_and_drafts

# (conf, drafts, out) of a decode loop's calls -> their filled struct (see _callcache.py)
_CALLS = CallCache()


def prefix_survival(conf: torch.Tensor, drafts: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a[r, j] = prod_{i <= j} clamp(conf[r, i], 0, 1) for j < drafts[r], else 0.

    conf: [R, K] float32 (last dim contiguous); drafts: [R] int32 (int64 is converted) in [0, K].
    Returns survival [R, K] float32 (into ``out`` when given). The product is a left-to-right float32
    loop, identical on CPU and GPU. NaN confidences count as 0 and are counted in
    ``error_counts()["nan_survival"]``; drafts outside [0, K] raise ValueError on CPU and are clamped
    and counted on CUDA. A repeated call with the same tensors (``out=`` given) skips validation
    (docs/design.md, "Host overhead").
    """
    compiling = torch.compiler.is_compiling()
    remember = out is not None and not compiling
    if remember:
        key = (id(conf), id(drafts), id(out))
        hit = _CALLS.get(key)
        if hit is not None:
            params, on_cuda = hit
            status = _C.prefix_survival(ctypes.addressof(params), on_cuda, stream_of(conf.device) if on_cuda else 0)
            if status:
                check_status(status, "prefix_survival", conf.device)
            return out
    R, K, device, drafts32 = survival_and_drafts(conf, drafts, name="conf")
    if out is None:
        out = torch.empty(R, K, dtype=torch.float32, device=device)
    else:
        check_tensor("out", out, dtypes=(torch.float32,), device=device, shape=(R, K), inner_contiguous=False)
    err = errors.error_buffer(device)
    if compiling:
        _prefix_survival_into(conf, drafts32, out, err)
        return out
    params = _params(conf, drafts32, out, err)
    _run(params, device)
    if remember and drafts32 is drafts:  # an int64 input's int32 copy is per call: never remembered
        _CALLS.put(key, (conf, drafts, out), (conf, drafts, out), (params, device.type == "cuda"))
    return out


def _params(conf: Tensor, drafts: Tensor, out: Tensor, err: Tensor) -> SurvivalParams:
    p = SurvivalParams()
    p.num_reqs, p.max_drafts = conf.shape
    p.conf, p.conf_stride, p.drafts = conf.data_ptr(), conf.stride(0), drafts.data_ptr()
    p.survival, p.error_counts = out.data_ptr(), err.data_ptr()
    return p


def _run(params: SurvivalParams, device: torch.device) -> None:
    on_cuda = device.type == "cuda"
    status = _C.prefix_survival(ctypes.addressof(params), on_cuda, stream_of(device) if on_cuda else 0)
    check_status(status, "prefix_survival", device)


@torch.library.custom_op("adaptive_verify::prefix_survival_into", mutates_args=("survival", "error_counts"))
def _prefix_survival_into(conf: Tensor, drafts: Tensor, survival: Tensor, error_counts: Tensor) -> None:
    _run(_params(conf, drafts, survival, error_counts), conf.device)


@_prefix_survival_into.register_fake
def _(*args, **kwargs):
    return None
