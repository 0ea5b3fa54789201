"""Curve maths of the step cost table: measured points -> a monotone cost at every count.

Everything here is float64 and torch-free (ShiftedCurve's float32 array is one pass of the extension).
:class:`VerifyCurve` is the target's verification forward over token counts (with the CUDA-graph staircase),
:class:`DraftCurve` the drafter over request counts, :class:`ShiftedCurve` a verify curve seen from some
prompt tokens already in the step. The rules they implement are written out in :mod:`adaptive_verify.cost`
(the package docstring).

Every curve evaluates one count with ``cost(n)`` and many with ``dense(length)`` (float64 values for
counts 0..length-1, cached and grown geometrically). The dense values come from ``cost_many``, which runs
the scalar path's float64 operations in the same order on numpy arrays (each numpy operation rounds once, as
each Python one does), so an array handed to a kernel never disagrees with ``verify_cost``, and building the
largest array a table allows (MAX_TOKENS_LIMIT counts) takes a fraction of a second, not a Python call per
count.
"""
from __future__ import annotations

import bisect
import itertools
from typing import Iterable, Sequence

import numpy as np

from .._ext import _C

# Smallest dense array built, so a decode loop that grows its largest count by one token a step rebuilds rarely.
MIN_DENSE_LEN = 256
# Counts evaluated per numpy pass: bounds the temporaries of cost_many to a few MB whatever the array's length.
_CHUNK = 1 << 18

DRAFT_MODES = ("staircase", "linear")


def running_max(values: Iterable[float]) -> tuple[float, ...]:
    """The envelope: a dip in a measured curve would make extra work look free."""
    return tuple(itertools.accumulate(values, max))


def segment(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    # Product before division keeps the result monotone in x under rounding; the clamp keeps it inside
    # [y0, y1] so the next segment (which starts at exactly y1) never steps down.
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return min(max(y, y0), y1)


def extrapolate(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    # x > x1; slope >= 0 because ys are an envelope, so this only grows from y1.
    return max(y1 + (y1 - y0) * (x - x1) / (x1 - x0), y1)


def interp(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """Flat below xs[0], linear between points, linear extrapolation past xs[-1] (flat with one point)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        if x == xs[-1] or len(xs) == 1:
            return ys[-1]
        return extrapolate(xs[-2], ys[-2], xs[-1], ys[-1], x)
    i = bisect.bisect_right(xs, x)  # xs[i - 1] <= x < xs[i]
    if xs[i - 1] == x:
        return ys[i - 1]
    return segment(xs[i - 1], ys[i - 1], xs[i], ys[i], x)


def segment_many(x0, y0, x1, y1, x) -> np.ndarray:
    """segment() elementwise: the same operations in the same order (int64 counts become float64 exactly)."""
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return np.minimum(np.maximum(y, y0), y1)


def extrapolate_many(x0: int, y0: float, x1: int, y1: float, x: np.ndarray) -> np.ndarray:
    """extrapolate() elementwise."""
    return np.maximum(y1 + (y1 - y0) * (x - x1) / (x1 - x0), y1)


def interp_many(xs: Sequence[int], ys: Sequence[float], x: np.ndarray) -> np.ndarray:
    """interp() at every count of the int64 array x."""
    xa, ya = np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    below, above = x <= xa[0], x >= xa[-1]
    out[below] = ya[0]
    if len(xs) == 1:
        out[above & ~below] = ya[-1]
    else:
        top = above & ~below
        out[top] = np.where(x[top] == xa[-1], ya[-1], extrapolate_many(xs[-2], ys[-2], xs[-1], ys[-1], x[top]))
    mid = ~(below | above)
    xm = x[mid]
    i = np.searchsorted(xa, xm, side="right")  # xs[i - 1] <= x < xs[i]
    x0, y0 = xa[i - 1], ya[i - 1]
    out[mid] = np.where(xm == x0, y0, segment_many(x0, y0, xa[i], ya[i], xm))
    return out


def staircase_many(xs: Sequence[int], ys: Sequence[float], x: np.ndarray) -> np.ndarray:
    """staircase() at every count of the int64 array x."""
    xa, ya = np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.float64)
    past = x > xa[-1]
    out = np.empty(x.shape, dtype=np.float64)
    out[~past] = ya[np.searchsorted(xa, x[~past], side="left")]
    out[past] = ya[-1] if len(xs) == 1 else extrapolate_many(xs[-2], ys[-2], xs[-1], ys[-1], x[past])
    return out


def staircase(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """The value at the smallest measured x' >= x (work padded up to a captured size), linear extrapolation
    past xs[-1] (flat with one point)."""
    if x > xs[-1]:
        return ys[-1] if len(xs) == 1 else extrapolate(xs[-2], ys[-2], xs[-1], ys[-1], x)
    return ys[bisect.bisect_left(xs, x)]


class _Dense:
    """float64 values of ``many`` (a curve's cost_many) at 0..n-1, grown geometrically on demand."""

    __slots__ = ("many", "values")

    def __init__(self, many):
        self.many = many
        self.values = np.zeros(0, dtype=np.float64)

    def get(self, length: int) -> np.ndarray:
        have = self.values.shape[0]
        if have < length:
            grown = max(length, 2 * have, MIN_DENSE_LEN)
            values = np.empty(grown, dtype=np.float64)
            values[:have] = self.values
            for lo in range(have, grown, _CHUNK):
                hi = min(lo + _CHUNK, grown)
                values[lo:hi] = self.many(np.arange(lo, hi, dtype=np.int64))
            self.values = values
        return self.values[:length]


class VerifyCurve:
    """The verification forward's cost over total token counts (rules 1-6 of the package docstring)."""

    def __init__(self, points: Sequence[tuple[int, float]], graph_sizes: Sequence[int]):
        xs = tuple(n for n, _ in points)
        ys = running_max(ms for _, ms in points)
        self.graph_sizes = tuple(graph_sizes)
        if self.graph_sizes:
            g_max = self.graph_sizes[-1]
            split = bisect.bisect_right(xs, g_max)
            self.graph_xs, self.graph_ys = xs[:split], ys[:split]
            self.eager_xs, self.eager_ys = xs[split:], ys[split:]
            if self.graph_xs:
                graph_ms = (interp(self.graph_xs, self.graph_ys, g) for g in self.graph_sizes)
            else:
                graph_ms = (ys[0] for _ in self.graph_sizes)
            self.graph_ms: tuple[float, ...] = running_max(graph_ms)
            # Past the last eager point the curve continues through the last two measured points: both
            # eager when there are two, else across the cliff from the last graph-region point (a single
            # eager point extrapolated flat would make every token past it look free).
            self.tail = (xs[-2:], ys[-2:]) if len(xs) >= 2 else (xs, ys)
        else:
            self.graph_xs, self.graph_ys = xs, ys
            self.eager_xs, self.eager_ys = (), ()
            self.graph_ms = ()
            self.tail = (xs, ys)
        self._dense = _Dense(self.cost_many)

    def cost(self, n: int) -> float:
        if not self.graph_sizes:
            return interp(self.graph_xs, self.graph_ys, n)
        sizes = self.graph_sizes
        if n <= sizes[-1]:
            return self.graph_ms[bisect.bisect_left(sizes, n)]
        if self.eager_xs:
            if n > self.eager_xs[-1] and len(self.tail[0]) == 2:
                (x0, x1), (y0, y1) = self.tail
                eager = extrapolate(x0, y0, x1, y1, n)
            else:
                # n below the first eager point takes its value: never interpolate across the cliff.
                eager = interp(self.eager_xs, self.eager_ys, n)
        else:
            eager = interp(self.graph_xs, self.graph_ys, n)
        return max(eager, self.graph_ms[-1])

    def cost_many(self, n: np.ndarray) -> np.ndarray:
        """cost() at every count of the int64 array n, branch by branch."""
        if not self.graph_sizes:
            return interp_many(self.graph_xs, self.graph_ys, n)
        sizes = self.graph_sizes
        out = np.empty(n.shape, dtype=np.float64)
        graph = n <= sizes[-1]
        out[graph] = np.asarray(self.graph_ms)[np.searchsorted(np.asarray(sizes), n[graph], side="left")]
        ne = n[~graph]
        if self.eager_xs:
            eager = interp_many(self.eager_xs, self.eager_ys, ne)
            if len(self.tail[0]) == 2:
                (x0, x1), (y0, y1) = self.tail
                past = ne > self.eager_xs[-1]
                eager[past] = extrapolate_many(x0, y0, x1, y1, ne[past])
        else:
            eager = interp_many(self.graph_xs, self.graph_ys, ne)
        out[~graph] = np.maximum(eager, self.graph_ms[-1])
        return out

    def dense(self, length: int) -> np.ndarray:
        return self._dense.get(length)


class ShiftedCurve:
    """``n -> base(n + shift) - base(shift) + base(0)``: the verify curve seen from ``shift`` prompt tokens
    already in the step. O(1) to build; its dense values are a slice of the base's (a subtraction and an addition).

    Evaluated in that order, left to right: the difference of two costs of a monotone curve is exactly >= 0, so
    every value is >= base(0) > 0. (Subtracting base(shift) - base(0) instead rounds to a free step, cost 0.0,
    when base(0) is tiny next to base(shift), as for a first point of 1e-300 ms.)"""

    def __init__(self, base: VerifyCurve, shift: int):
        self.base, self.shift = base, shift
        dense = base._dense.values  # cost_many equals cost bit for bit: read it where it is already built
        if shift < dense.shape[0]:
            self.at_shift, self.at_zero = float(dense[shift]), float(dense[0])
        else:
            self.at_shift, self.at_zero = base.cost(shift), base.cost(0)

    def cost(self, n: int) -> float:
        return self.base.cost(n + self.shift) - self.at_shift + self.at_zero

    def dense(self, length: int) -> np.ndarray:
        return self.base.dense(self.shift + length)[self.shift:] - self.at_shift + self.at_zero

    def dense32(self, length: int) -> np.ndarray:
        """float32 of dense(length), computed in float64 as there and rounded once (chunked prefill asks for a new
        shift almost every step)."""
        return self.dense32_into(np.empty(length, dtype=np.float32))

    def dense32_into(self, out: np.ndarray) -> np.ndarray:
        """dense32(len(out)) written into ``out`` (contiguous float32): one pass of the extension's shifted_costs (the
        same double operations in the same order as dense, so the same bits; numpy would take a pass per operation,
        microseconds each, every step of chunked prefill)."""
        _C.shifted_costs(self.base.dense(self.shift + out.shape[0]), self.shift, self.at_shift, self.at_zero, out)
        return out


class DraftCurve:
    """The drafter's cost over request counts: a constant, or an envelope of measured points that is a
    staircase (drafters replay padded CUDA graphs: r requests cost what the next measured count >= r costs)
    or linear between points; both extrapolate linearly past the last point."""

    def __init__(self, draft, mode: str):
        self.mode = mode
        if isinstance(draft, float):
            self.constant, self.xs, self.ys = draft, (), ()
        else:
            self.constant = None
            self.xs = tuple(r for r, _ in draft)
            self.ys = running_max(ms for _, ms in draft)
        self._dense = _Dense(self.cost_many)

    def cost(self, r: int) -> float:
        if self.constant is not None:
            return self.constant
        if self.mode == "staircase":
            return staircase(self.xs, self.ys, r)
        return interp(self.xs, self.ys, r)

    def cost_many(self, r: np.ndarray) -> np.ndarray:
        """cost() at every count of the int64 array r."""
        if self.constant is not None:
            return np.full(r.shape, self.constant, dtype=np.float64)
        if self.mode == "staircase":
            return staircase_many(self.xs, self.ys, r)
        return interp_many(self.xs, self.ys, r)

    def dense(self, length: int) -> np.ndarray:
        return self._dense.get(length)
