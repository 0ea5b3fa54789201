"""Guard regions: every tensor a fuzz case hands to an op lives in the middle of a larger buffer whose margins hold
a sentinel, so a write outside the tensor (an output's or an input's) changes a margin and is caught, and a read
outside an input meets poison (NaN, or an id far out of range) that shows up in the result.

A tensor is a view of its buffer, so torch sees an ordinary tensor with a storage larger than itself: exactly the
situation of an engine's slice of a persistent buffer, and the one where a kernel that ignores a stride or an
offset writes into a neighbour instead of faulting.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

#: Elements of margin on each side of a guarded tensor (and between rows of a strided one).
MARGIN = 64


def sentinel(dtype: torch.dtype):
    """The margin value of a buffer of ``dtype``: NaN for floats (poison for a read), a large odd int otherwise."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    if dtype == torch.uint8:
        return 0xA5
    return -0x5A5A5A5 if dtype == torch.int32 else -0x5A5A5A5A5A5A5A5


class Guards:
    """Allocates guarded tensors and checks, after a call, that no margin changed."""

    def __init__(self):
        self._buffers: list[tuple[str, torch.Tensor, torch.Tensor, object]] = []  # (name, buffer, mask, sentinel)

    def tensor(self, name: str, value: torch.Tensor, *, row_gap: int = 0, fill=None) -> torch.Tensor:
        """A copy of ``value`` placed in the middle of a guarded buffer. ``row_gap`` > 0 leaves that many guarded
        elements between consecutive rows (a strided tensor, last dim still contiguous); ``fill`` overrides the
        margin value (an output's margins may hold anything distinguishable)."""
        value = value.detach()
        shape = tuple(value.shape)
        fill = sentinel(value.dtype) if fill is None else fill
        if value.dim() == 0 or row_gap == 0:
            n = value.numel()
            buf = torch.full((n + 2 * MARGIN,), fill, dtype=value.dtype)
            view = buf[MARGIN:MARGIN + n].view(shape) if n else buf[MARGIN:MARGIN].view(shape)
            used = torch.zeros(buf.shape[0], dtype=torch.bool)
            used[MARGIN:MARGIN + n] = True
        else:
            inner = int(math.prod(shape[1:]))
            row = inner + row_gap
            n = shape[0] * row
            buf = torch.full((n + 2 * MARGIN,), fill, dtype=value.dtype)
            strides = (row,) + tuple(int(math.prod(shape[i + 1:])) for i in range(1, len(shape)))
            view = buf.as_strided(shape, strides, MARGIN)
            used = torch.zeros(buf.shape[0], dtype=torch.bool)
            if shape[0] and inner:
                idx = MARGIN + np.arange(shape[0])[:, None] * row + np.arange(inner)[None, :]
                used[torch.from_numpy(idx.reshape(-1))] = True
        view.copy_(value)
        self._buffers.append((name, buf, used, fill))
        return view

    def empty(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, fill=None) -> torch.Tensor:
        """An output buffer: guarded, and its own elements prefilled with the sentinel too, so an element the op
        should write but does not stays visible."""
        fill = sentinel(dtype) if fill is None else fill
        return self.tensor(name, torch.full(tuple(shape), fill, dtype=dtype), fill=fill)

    def violations(self) -> list[str]:
        """The tensors whose margins changed, with the first changed offset."""
        bad = []
        for name, buf, used, fill in self._buffers:
            margin = buf[~used]
            if margin.numel() == 0:
                continue
            if isinstance(fill, float) and math.isnan(fill):
                changed = ~torch.isnan(margin)
            else:
                changed = margin != fill
            if bool(changed.any()):
                where = int(torch.nonzero(~used)[int(torch.nonzero(changed)[0])])
                bad.append(f"{name}: {int(changed.sum())} margin element(s) written (first at buffer offset {where})")
        return bad


def as_tensor(array: np.ndarray, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A torch tensor of a numpy array (copied), optionally converted."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t if dtype is None else t.to(dtype)
