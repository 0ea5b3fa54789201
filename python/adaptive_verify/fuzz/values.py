"""Adversarial values: scalars of every wrong type and every boundary of the types arguments are narrowed to,
and the ways a tensor argument can be wrong (dtype, device, rank, shape, layout, not a tensor at all).

Each generator returns (value, kind): ``invalid`` when the documented contract rejects the value whatever the
other arguments are, ``maybe`` when only the combination decides (the fuzz case then accepts either a named
error or a clean success).
"""
from __future__ import annotations

import fractions
from typing import Optional, Sequence

import numpy as np
import torch

from .._checks import INT32_MAX, INT64_MAX

# Integers around every width a kernel field or a torch index may narrow to: a value that wraps to a small one
# (2^32 + 16 acts as 16 in an int32 field) is the dangerous kind.
BOUNDARY_INTS = (-1, -2, -(2**31), -(2**31) - 1, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**32 + 16, 2**53 + 1,
                 2**63 - 1, 2**63, 2**64, 2**64 + 3, 2**70, -(2**63) - 1, 10**30)
NON_INTS = (1.0, 2.5, float("nan"), float("inf"), True, False, "3", b"3", [1], (2,), {1: 2}, object(),
            fractions.Fraction(2, 1), complex(1, 0), np.float64(2.0), torch.tensor(3), torch.tensor([3]))
NON_REALS = (float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e39, 10**400, "1.0", None, [1.0], True,
             complex(1, 1), torch.tensor([1.0, 2.0]))


def int_arg(rng: np.random.Generator, lo: int, hi: int, *, heavy: bool = False, none_ok: bool = False):
    """A value for an int argument documented in [lo, hi]: out of range or of another type (invalid), or, unless
    ``heavy`` (values near hi would allocate or compute in proportion), an in-range edge (maybe)."""
    pick = rng.integers(0, 10)
    if pick < 5:
        v = BOUNDARY_INTS[rng.integers(0, len(BOUNDARY_INTS))]
        if lo <= v <= hi:
            return (v, "maybe") if not heavy else (hi + 1, "invalid")
        return v, "invalid"
    if pick < 8:
        v = NON_INTS[rng.integers(0, len(NON_INTS))]
        if isinstance(v, torch.Tensor) and v.dim() == 0 and lo <= int(v) <= hi:
            return v, "maybe"  # a 0-d integer tensor is an int to operator.index (some arguments take it)
        return v, "invalid"
    if pick == 8 and none_ok:
        return None, "maybe"
    if heavy:
        return rng.choice([lo - 1, hi + 1]).item(), "invalid"
    return rng.choice([lo, hi, np.int64(lo), np.int32(max(min(hi, INT32_MAX), lo))]), "maybe"


def real_arg(rng: np.random.Generator):
    """A value for a finite-float argument: non-finite, beyond float32, huge ints, wrong types (all invalid for an
    argument a kernel reads as float32; the caller decides)."""
    return NON_REALS[rng.integers(0, len(NON_REALS))]


_NO_NUMPY = (torch.bfloat16, torch.float8_e4m3fn)  # dtypes numpy has no type for


def tensor_variants(t: torch.Tensor, *, allowed_dtypes: Sequence[torch.dtype]) -> list:
    """Ways ``t`` (a valid argument) can be wrong: (description, value, kind)."""
    out = [
        ("list", t.tolist(), "invalid"),
        ("numpy", t.numpy() if t.device.type == "cpu" and t.dtype not in _NO_NUMPY else t.tolist(), "invalid"),
        ("None", None, "maybe"),
        ("meta", t.to("meta"), "invalid"),
        ("unsqueezed", t.unsqueeze(0), "maybe"),
        ("scalar", torch.tensor(0, dtype=t.dtype), "maybe"),
    ]
    if t.dim() >= 1:
        out.append(("flattened" if t.dim() > 1 else "2-d", t.reshape(-1) if t.dim() > 1 else t[None, :], "maybe"))
        out.append(("one row less", t[:-1] if t.shape[0] else t, "maybe"))
        out.append(("one row more", torch.cat([t, t[:1]]) if t.shape[0] else t, "maybe"))
        if t.shape[0]:
            out.append(("expanded rows", t[:1].expand(t.shape[0], *t.shape[1:]), "maybe"))
    if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
        out.append(("last dim strided", t.transpose(-1, -2).contiguous().transpose(-1, -2), "maybe"))
    if t.dim() >= 1 and t.numel() > 1:
        out.append(("every other element", torch.repeat_interleave(t, 2, dim=-1)[..., ::2], "maybe"))
    for dt in (torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.uint8,
               torch.bool, torch.complex64):
        if dt not in allowed_dtypes and dt != t.dtype:
            try:
                out.append((f"dtype {dt}", t.to(dt), "invalid" if dt in (torch.bool, torch.complex64) else "maybe"))
            except RuntimeError:
                pass
    if t.layout == torch.strided and t.dim() >= 1 and t.dtype not in (torch.bfloat16,):
        try:
            out.append(("sparse", t.to_sparse(), "invalid"))
        except RuntimeError:
            pass
    if t.dtype.is_floating_point:
        out.append(("requires_grad", t.clone().requires_grad_(True), "maybe"))
    return out


def pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(0, len(items)))]


def maybe(rng: np.random.Generator, p: float) -> bool:
    return bool(rng.random() < p)


def ints(rng: np.random.Generator, lo: int, hi: int, shape, dtype=torch.int32) -> torch.Tensor:
    """Uniform ints in [lo, hi] as a torch tensor."""
    return torch.from_numpy(rng.integers(lo, hi + 1, size=shape, dtype=np.int64)).to(dtype)


def floats(rng: np.random.Generator, shape, lo: float = 0.0, hi: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(rng.uniform(lo, hi, size=shape)).to(dtype)


def sprinkle(rng: np.random.Generator, t: torch.Tensor, p: float, values: Sequence[float]) -> torch.Tensor:
    """t with a fraction p of its elements replaced by values drawn from ``values`` (NaN, inf, ...)."""
    if t.numel() == 0 or p <= 0:
        return t
    mask = torch.from_numpy(rng.random(tuple(t.shape)) < p)
    repl = torch.tensor([float(v) for v in values], dtype=torch.float64)[
        torch.from_numpy(rng.integers(0, len(values), size=tuple(t.shape)))].to(t.dtype)
    return torch.where(mask, repl, t)


def small_int(rng: np.random.Generator, hi: int, edge: Optional[Sequence[int]] = None) -> int:
    """An int in [0, hi], biased to 0, 1 and hi."""
    r = rng.random()
    if r < 0.15:
        return 0
    if r < 0.3:
        return min(1, hi)
    if r < 0.4:
        return hi
    if edge and r < 0.5:
        return int(pick(rng, edge))
    return int(rng.integers(0, hi + 1))


__all__ = ["BOUNDARY_INTS", "INT64_MAX", "NON_INTS", "NON_REALS", "floats", "int_arg", "ints", "maybe", "pick",
           "real_arg", "small_int", "sprinkle", "tensor_variants"]
