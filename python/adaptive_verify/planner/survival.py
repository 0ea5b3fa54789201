"""prefix_survival and tree_survival: confidences -> survival of each draft (docs/design.md, "Planner") or of each
tree node ("Draft trees"), thin wrappers over one kernel (_C.prefix_survival; parents set for trees)."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from .. import errors
from .._binding import SurvivalParams
from ..prepared import PreparedLaunch, capture, preparing, refuse_copy, register
from .._ext import _C, check_status
from .._validate import check_tensor, stream_of
from .args import parents_tensor, survival_and_drafts
from .tree_plan import tree_status_messages

TREE_STATUS = tree_status_messages(_C)


@register
def prefix_survival(conf: torch.Tensor, drafts: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a[r, j] = prod_{i <= j} clamp(conf[r, i], 0, 1) for j < drafts[r], else 0.

    conf: [R, K] float32 (last dim contiguous); drafts: [R] int32 (int64 is converted) in [0, K].
    Returns survival [R, K] float32 (into ``out`` when given). The product is a left-to-right float32
    loop, identical on CPU and GPU. NaN confidences count as 0 and are counted in
    ``error_counts()["nan_survival"]``; drafts outside [0, K] raise ValueError on CPU and are clamped
    and counted on CUDA. Each call validates; a decode loop's fast path is ``adaptive_verify.prepare``
    (docs/design.md, "Host overhead").
    """
    R, K, device, drafts32 = survival_and_drafts(conf, drafts, name="conf")
    if out is None:
        out = torch.empty(R, K, dtype=torch.float32, device=device)
    else:
        check_tensor("out", out, dtypes=(torch.float32,), device=device, shape=(R, K), inner_contiguous=False)
    err = errors.error_buffer(device)
    if torch.compiler.is_compiling():
        _prefix_survival_into(conf, drafts32, out, err)
        return out
    params = _params(conf, drafts32, out, err)
    if preparing():
        if drafts32 is not drafts:
            refuse_copy("prefix_survival", "drafts")
        capture(PreparedLaunch("prefix_survival", _C.prefix_survival, params, device,
                               {"conf": (conf, "conf"), "drafts": (drafts, "drafts")}, {"out": out}, out))
        return out
    _run(params, device)
    return out


@register
def tree_survival(conf: torch.Tensor, parents: torch.Tensor, tree_sizes: torch.Tensor, *,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Survival of each draft-tree node: a[r, j] = a[r, parents[r, j]] * clamp(conf[r, j], 0, 1), the anchor
    (parent -1) surviving with 1, for j < tree_sizes[r]; 0 for j >= tree_sizes[r] (docs/design.md, "Draft trees").

    conf: [R, N] float32 (last dim contiguous), the probability that node j is accepted given that its parent was;
    parents: [R, N] int32 (int64 is converted), topological (parents[r, j] in [-1, j)); tree_sizes: [R] int32 in
    [0, N]; N <= 63. Returns survival [R, N] float32 (into ``out`` when given). Each product is one float32
    multiplication, parent first, identical on CPU and GPU, so a chain (parents j - 1) gives
    :func:`prefix_survival`'s bits. NaN confidences count as 0 and are counted in
    ``error_counts()["nan_survival"]``. On CPU, tree_sizes outside [0, N] or a parent outside [-1, j) raise
    ValueError naming the argument; on CUDA tree sizes are clamped (counted in "drafts_out_of_range") and a node
    with a bad parent gets survival 0, as do its descendants (counted in "bad_parent").
    """
    R, N, device, sizes32 = survival_and_drafts(conf, tree_sizes, name="conf", tree=True)
    parents32 = parents_tensor(parents, R, N, device)
    if out is None:
        out = torch.empty(R, N, dtype=torch.float32, device=device)
    else:
        check_tensor("out", out, dtypes=(torch.float32,), device=device, shape=(R, N), inner_contiguous=False)
    err = errors.error_buffer(device)
    if torch.compiler.is_compiling():
        _prefix_survival_into(conf, sizes32, out, err, parents32)
        return out
    params = _params(conf, sizes32, out, err, parents32)
    if preparing():
        for name, given, used in (("tree_sizes", tree_sizes, sizes32), ("parents", parents, parents32)):
            if used is not given:
                refuse_copy("tree_survival", name)
        capture(PreparedLaunch("tree_survival", _C.prefix_survival, params, device,
                               {"conf": (conf, "conf"), "parents": (parents, "parents"),
                                "tree_sizes": (tree_sizes, "drafts")}, {"out": out}, out, TREE_STATUS))
        return out
    _run(params, device, "tree_survival")
    return out


def _params(conf: Tensor, drafts: Tensor, out: Tensor, err: Tensor, parents: Optional[Tensor] = None) -> SurvivalParams:
    p = SurvivalParams()
    p.num_reqs, p.max_drafts = conf.shape
    p.conf, p.conf_stride, p.drafts = conf.data_ptr(), conf.stride(0), drafts.data_ptr()
    p.survival, p.error_counts = out.data_ptr(), err.data_ptr()
    if parents is not None:
        p.parents, p.parents_stride = parents.data_ptr(), parents.stride(0)
    return p


def _run(params: SurvivalParams, device: torch.device, op: str = "prefix_survival") -> None:
    on_cuda = device.type == "cuda"
    status = _C.prefix_survival(ctypes.addressof(params), on_cuda, stream_of(device) if on_cuda else 0)
    if status:
        check_status(status, op, device, TREE_STATUS if params.parents else None)


@torch.library.custom_op("adaptive_verify::prefix_survival_into", mutates_args=("survival", "error_counts"))
def _prefix_survival_into(conf: Tensor, drafts: Tensor, survival: Tensor, error_counts: Tensor,
                          parents: Optional[Tensor] = None) -> None:
    """parents given: tree_survival (drafts are the tree sizes)."""
    _run(_params(conf, drafts, survival, error_counts, parents), conf.device,
         "prefix_survival" if parents is None else "tree_survival")


@_prefix_survival_into.register_fake
def _(*args, **kwargs):
    return None
