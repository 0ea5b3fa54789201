"""Step cost table: what one speculative-decoding step costs, in milliseconds.

The planner (design section 4) picks a verification budget B by maximising
``Theta(B) = (R + P(B)) / step_cost(R, R + B)``. This module supplies the denominator:

    step_cost(r, n) = draft_cost(r) + verify_cost(n)

- ``r``: requests in the step (the drafter runs once per request, whatever is verified).
- ``n``: total query tokens of the target's verification forward (anchors + verified drafts + extra tokens).

Terms, as engines use them:

- *graph sizes*: the token counts at which the engine captured CUDA graphs. A batch of n tokens with
  n <= the largest graph size is padded up to the smallest graph size >= n and replayed, so it costs
  exactly what that graph size costs. The cost is a staircase, not a line.
- *eager region*: n above the largest graph size runs without a graph. Its cost is usually higher than
  the last graph step (the "graph/eager cliff"): launch overhead comes back.
- *max_tokens*: the engine's token capacity (``max_num_batched_tokens``); no step runs more.

Shape of the verify curve (decisions written out where design.md section 3 is silent):

1. Measured points are made monotone by a running max over increasing n (the *envelope*): a dip
   (tile effects, noise) would make extra tokens look free and the planner would chase it.
2. Envelope cost at a graph size g: linear interpolation over the envelope points with n <= largest graph
   size (the *graph-region points*). Flat below the first; past the last graph-region point, linear
   extrapolation from the last two graph-region points (flat if there is only one). If no point was
   measured in the graph region at all, every graph size costs the first measured point (flat below
   the first point, as everywhere else): we have no cheaper evidence.
3. n <= largest graph size (including n = 0): cost(n) = envelope cost at the smallest graph size >= n.
4. n > largest graph size: linear interpolation between the eager points (measured n > largest graph
   size), never across the cliff: between the largest graph size and the first eager point the cost is
   the first eager point's. Past the last eager point: linear extrapolation from the last two eager
   points (flat if only one). With no eager point, the graph-region points are extrapolated linearly.
5. No graph sizes: plain linear interpolation over all points, flat below the first (so n = 0 costs what
   the first point costs), linear extrapolation past the last.
6. The result is monotone non-decreasing in n and strictly positive. Every piece above is non-decreasing
   on its own (it interpolates or extrapolates non-decreasing envelope values); the one place the
   pieces can step down is the cliff, when an extrapolated last graph size costs more than the first
   eager point. A running max over the result closes that: for n > largest graph size,
   cost(n) = max(eager(n), cost(largest graph size)). Positivity follows from verify values > 0 and
   extrapolation only ever going upwards from the last point.

The drafter curve (``draft_ms`` as a dict over request counts) uses the same running-max envelope and
linear interpolation: flat below the first point (r = 0 included), linear between, linear extrapolation
above. It has no staircase: drafters that replay graphs should be profiled at their graph sizes, or
given as a constant. A float ``draft_ms`` is a constant drafter cost.

Floating point: interpolation is done in float64 with the same code for scalars and dense arrays, so
``verify_array(N)[n] == float32(verify_cost(n))`` holds exactly. Each interpolated value is clamped into
its segment's end points, so rounding can never make the curve step down at a measured point.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import itertools
import json
import math
import numbers
import operator
import os
import platform
import statistics
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["CostTable", "FORMAT_VERSION"]

#: Version of the JSON layout written by ``CostTable.to_json``. Bump it when the layout changes.
FORMAT_VERSION = 1

_JSON_KEYS = ("format_version", "verify_ms", "draft_ms", "graph_sizes", "max_tokens", "metadata")

# Smallest dense array built, so a decode loop that grows max_n by one token a step re-uploads rarely.
_MIN_DENSE_LEN = 256


# --------------------------------------------------------------------------------------------------
# Validation helpers: every message starts with the argument's name.
# --------------------------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _check_increasing_ints(name: str, values: Any, *, allow_empty: bool) -> tuple[int, ...]:
    """Positive ints, strictly increasing in the order given (an out-of-order entry is usually a typo)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    out: list[int] = []
    for v in values:
        if not _is_int(v):
            raise TypeError(f"{name} must contain ints, got {type(v).__name__} {v!r}")
        v = operator.index(v)
        if v < 1:
            raise ValueError(f"{name} must contain ints >= 1, got {v}")
        if out and v <= out[-1]:
            raise ValueError(f"{name} must be strictly increasing, got {v} after {out[-1]}")
        out.append(v)
    if not out and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return tuple(out)


def _check_ms(name: str, value: Any, *, what: str, positive: bool) -> float:
    if not _is_real(value):
        raise TypeError(f"{name}: {what} must be a real number of milliseconds, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: {what} must be finite, got {value!r}")
    if positive and value <= 0.0:
        raise ValueError(
            f"{name}: {what} must be > 0 ms (a free step makes the planner's ratio infinite), got {value!r}"
        )
    if value < 0.0:
        raise ValueError(f"{name}: {what} must be >= 0 ms, got {value!r}")
    return value


def _check_points(name: str, points: Any, *, positive: bool) -> tuple[tuple[int, float], ...]:
    """A mapping {count: ms} -> ((count, ms), ...), keys ints >= 1 strictly increasing as given."""
    if not isinstance(points, Mapping):
        raise TypeError(f"{name} must be a dict {{count: milliseconds}}, got {type(points).__name__}")
    if not points:
        raise ValueError(f"{name} must not be empty")
    out: list[tuple[int, float]] = []
    for k, v in points.items():
        if not _is_int(k):
            raise TypeError(f"{name}: keys must be int counts, got {type(k).__name__} {k!r}")
        k = operator.index(k)
        if k < 1:
            raise ValueError(f"{name}: keys must be >= 1, got {k}")
        if out and k <= out[-1][0]:
            raise ValueError(f"{name}: keys must be strictly increasing in the order given, got {k} after {out[-1][0]}")
        out.append((k, _check_ms(name, v, what=f"value at {k}", positive=positive)))
    return tuple(out)


def _check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0.0 or (value == 0.0 and not allow_zero):
        raise ValueError(f"{name}={value!r} must be finite and {'>= 0' if allow_zero else '> 0'}")
    return value


def _normalize_device(device: Any) -> torch.device:
    dev = torch.device("cpu") if device is None else torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        # "cuda" and "cuda:0" must share one cache entry.
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


# --------------------------------------------------------------------------------------------------
# Piecewise-linear pieces. xs strictly increasing ints, ys non-decreasing floats, len(xs) >= 1.
# --------------------------------------------------------------------------------------------------


def _running_max(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(itertools.accumulate(values, max))


def _segment(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    # Product before division keeps the result monotone in x under rounding; the clamp keeps it inside
    # [y0, y1] so the next segment (which starts at exactly y1) never steps down.
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return min(max(y, y0), y1)


def _extrapolate(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    # x > x1; slope >= 0 because ys are an envelope, so this only grows from y1.
    return max(y1 + (y1 - y0) * (x - x1) / (x1 - x0), y1)


def _interp(xs: tuple[int, ...], ys: tuple[float, ...], x: int) -> float:
    """Flat below xs[0], linear between points, linear extrapolation past xs[-1] (flat with one point)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        if x == xs[-1] or len(xs) == 1:
            return ys[-1]
        return _extrapolate(xs[-2], ys[-2], xs[-1], ys[-1], x)
    i = bisect.bisect_right(xs, x)  # xs[i - 1] <= x < xs[i]
    if xs[i - 1] == x:
        return ys[i - 1]
    return _segment(xs[i - 1], ys[i - 1], xs[i], ys[i], x)


class _DenseEntry:
    """A device tensor of costs for counts 0..len-1, and the tensors it replaced.

    Replaced tensors stay referenced for the table's lifetime: a CUDA graph captured while an older
    tensor was current keeps reading valid memory (its values for the counts it covered never change).
    """

    __slots__ = ("tensor", "retired", "last_view")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.retired: list[torch.Tensor] = []
        self.last_view: torch.Tensor | None = None


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


class CostTable:
    """Step cost model ``step_cost(r, n) = draft_cost(r) + verify_cost(n)`` in milliseconds.

    Build it with :meth:`from_points` (measured numbers), :meth:`profile` (measure a callable),
    :meth:`roofline` (planning model without a profile) or :meth:`from_json`. The table is immutable;
    the module docstring gives the exact shape of the curves.

    Attributes:
        graph_sizes: the engine's CUDA-graph capture sizes (token counts), increasing; () for none.
        max_tokens: token capacity of one step, or None (unbounded).
        metadata: read-only mapping (device, model, dtype, date, how measured, ...).
        verify_ms: the measured verify points as given, {n: ms} (before the envelope).
        draft_ms: the drafter points as given, {r: ms}, or a float for a constant drafter cost.
    """

    def __init__(self, *, _verify, _draft, _graph_sizes, _max_tokens, _metadata):
        # Private: use the classmethods, which validate. Arguments are already checked here.
        self._verify_points: tuple[tuple[int, float], ...] = _verify
        self._draft: float | tuple[tuple[int, float], ...] = _draft
        self._graph_sizes: tuple[int, ...] = _graph_sizes
        self._max_tokens: int | None = _max_tokens
        self._metadata: dict = _metadata

        xs = tuple(n for n, _ in _verify)
        ys = _running_max(ms for _, ms in _verify)
        if _graph_sizes:
            g_max = _graph_sizes[-1]
            split = bisect.bisect_right(xs, g_max)
            self._graph_xs, self._graph_ys = xs[:split], ys[:split]
            self._eager_xs, self._eager_ys = xs[split:], ys[split:]
            if self._graph_xs:
                graph_ms = (_interp(self._graph_xs, self._graph_ys, g) for g in _graph_sizes)
            else:
                graph_ms = (ys[0] for _ in _graph_sizes)
            self._graph_ms: tuple[float, ...] = _running_max(graph_ms)
        else:
            self._graph_xs, self._graph_ys = xs, ys
            self._eager_xs, self._eager_ys = (), ()
            self._graph_ms = ()

        if isinstance(_draft, float):
            self._draft_xs: tuple[int, ...] = ()
            self._draft_ys: tuple[float, ...] = ()
        else:
            self._draft_xs = tuple(r for r, _ in _draft)
            self._draft_ys = _running_max(ms for _, ms in _draft)

        self._dense: dict[tuple[str, torch.device], _DenseEntry] = {}
        self._host: dict[str, np.ndarray] = {}  # float32 values per kind, grown with the largest request
        self._shifted: dict[int, CostTable] = {}

    # ----------------------------------------------------------------------------------------------
    # Constructors
    # ----------------------------------------------------------------------------------------------

    @classmethod
    def from_points(
        cls,
        verify_ms: Mapping[int, float],
        draft_ms: Mapping[int, float] | float = 0.0,
        graph_sizes: Iterable[int] = (),
        max_tokens: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CostTable:
        """Build a table from measured points.

        Args:
            verify_ms: {n: ms}, total token count n (int >= 1) to verification-forward milliseconds
                (> 0). Keys strictly increasing in the order given: an out-of-order key in a profile
                is usually a typo, so it is an error rather than silently sorted.
            draft_ms: {r: ms} over request counts (ints >= 1, strictly increasing, values >= 0), or a
                constant float >= 0. An empty dict is an error (pass 0.0 for "no drafter cost").
            graph_sizes: the engine's CUDA-graph capture sizes, ints >= 1 strictly increasing.
            max_tokens: token capacity of one step (>= largest graph size), or None for unbounded.
                Measured points above max_tokens are allowed; they only shape the interpolation.
            metadata: JSON-serialisable dict (str keys), deep-copied. Tuples come back as lists
                after a JSON round trip.

        Raises:
            TypeError / ValueError naming the argument (first word of the message).
        """
        verify = _check_points("verify_ms", verify_ms, positive=True)
        if isinstance(draft_ms, Mapping):
            draft: float | tuple[tuple[int, float], ...] = _check_points("draft_ms", draft_ms, positive=False)
        elif _is_real(draft_ms):
            draft = _check_ms("draft_ms", draft_ms, what="constant", positive=False)
        else:
            raise TypeError(f"draft_ms must be a dict {{r: ms}} or a float, got {type(draft_ms).__name__}")
        sizes = _check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
        if max_tokens is not None:
            max_tokens = _check_int("max_tokens", max_tokens, minimum=1)
            if sizes and max_tokens < sizes[-1]:
                raise ValueError(f"max_tokens={max_tokens} is smaller than the largest graph size {sizes[-1]}")
        if metadata is None:
            meta: dict = {}
        elif isinstance(metadata, Mapping):
            for k in metadata:
                if not isinstance(k, str):
                    raise TypeError(f"metadata keys must be str (JSON), got {type(k).__name__} {k!r}")
            meta = copy.deepcopy(dict(metadata))
        else:
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        return cls(_verify=verify, _draft=draft, _graph_sizes=sizes, _max_tokens=max_tokens, _metadata=meta)

    @classmethod
    def profile(
        cls,
        step_fn: Callable[[int], Any],
        token_counts: Iterable[int],
        draft_fn: Callable[[int], Any] | None = None,
        request_counts: Iterable[int] | None = None,
        graph_sizes: Iterable[int] = (),
        reps: int = 5,
        warmup: int = 2,
        max_tokens: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        device: torch.device | str | None = None,
    ) -> CostTable:
        """Measure a table: each point is the median of ``reps`` timings after ``warmup`` untimed calls.

        Args:
            step_fn: ``step_fn(n)`` runs one verification forward at n total tokens.
            token_counts: the n to measure, ints >= 1 strictly increasing. Include the graph sizes
                and a few eager sizes above the largest one: the cost between measured points is
                interpolated as described in the module docstring.
            draft_fn: ``draft_fn(r)`` runs one drafter step at r requests. Without it the drafter cost
                is 0 and metadata["drafter"] says so (then step costs are verify costs only, which
                biases the planner towards verifying less; see design section 3).
            request_counts: the r to measure; required with draft_fn, an error without it.
            graph_sizes, max_tokens: as in :meth:`from_points`.
            reps: timed calls per point (>= 1); the median is used (mean of the middle two when even).
            warmup: untimed calls per point before timing (>= 0).
            metadata: user fields; they take precedence over the recorded ones (date, device, measured,
                source, torch, drafter).
            device: where the work runs. A CUDA device is timed with CUDA events on its current stream
                (the device is synchronised before each timed call, so earlier work is not counted);
                anything else with ``time.perf_counter_ns`` around the call, so the callable must be
                synchronous there. None: the current CUDA device if CUDA is available, else CPU.
        """
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        counts = _check_increasing_ints("token_counts", token_counts, allow_empty=False)
        if draft_fn is not None and not callable(draft_fn):
            raise TypeError(f"draft_fn must be callable or None, got {type(draft_fn).__name__}")
        if draft_fn is not None and request_counts is None:
            raise ValueError("request_counts must be given with draft_fn (the request counts to time)")
        if draft_fn is None and request_counts is not None:
            raise ValueError("draft_fn must be given with request_counts (nothing to time at those counts)")
        reqs = ()
        if request_counts is not None:
            reqs = _check_increasing_ints("request_counts", request_counts, allow_empty=False)
        reps = _check_int("reps", reps, minimum=1)
        warmup = _check_int("warmup", warmup, minimum=0)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = _normalize_device(device)
        sizes = _check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
        # Validate the remaining table arguments before spending time on measurements.
        cls.from_points({1: 1.0}, 0.0, sizes, max_tokens, metadata)

        timer, clock = _make_timer(dev)

        def measure(fn: Callable[[int], Any], arg: int) -> float:
            for _ in range(warmup):
                fn(arg)
            return float(statistics.median(timer(fn, arg) for _ in range(reps)))

        verify: dict[int, float] = {}
        for n in counts:
            ms = measure(step_fn, n)
            if not ms > 0.0:
                raise ValueError(f"step_fn at n={n} measured a median of {ms!r} ms; the clock cannot resolve it")
            verify[n] = ms
        draft: dict[int, float] | float = {r: measure(draft_fn, r) for r in reqs} if draft_fn is not None else 0.0

        recorded = {
            "source": "profile",
            "date": _now_iso(),
            "device": _device_name(dev),
            "measured": f"median of {reps} reps after {warmup} warmup, {clock}",
            "torch": torch.__version__,
        }
        if draft_fn is None:
            recorded["drafter"] = "none: no draft_fn given, draft cost 0"
        recorded.update(metadata or {})
        return cls.from_points(verify, draft, sizes, max_tokens, recorded)

    @classmethod
    def roofline(
        cls,
        *,
        hbm_gbps: float,
        tflops: float,
        weight_bytes: float,
        active_params: float,
        kv_bytes_per_token: float,
        context_len: int,
        graph_sizes: Iterable[int] = (),
        max_tokens: int | None = None,
        draft_ms: Mapping[int, float] | float = 0.0,
        overhead_ms: float = 0.0,
        token_counts: Iterable[int] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CostTable:
        """A planning model without a profile: ``overhead_ms + max(memory_ms, compute_ms)`` per step.

        - memory_ms = (weight_bytes + n * context_len * kv_bytes_per_token) / (hbm_gbps * 1e9) * 1e3.
          Simplification: every one of the n tokens is charged a full context's KV read, as if each
          token were its own request. Tokens of one request share their KV reads in a real kernel, so
          this overestimates KV traffic when requests verify many drafts; it is the conservative side.
        - compute_ms = 2 * active_params * n / (tflops * 1e12) * 1e3 (matmul FLOPs only; attention
          FLOPs and launch overhead are left to overhead_ms).

        The model is evaluated at ``token_counts`` and passed through :meth:`from_points`, so the graph
        staircase and the eager interpolation apply exactly as for a measured table. Default token
        counts: the graph sizes, the powers of two up to the limit, the largest graph size + 1 (so the
        eager region starts from its true cost instead of the next power of two's), and the limit
        itself, where the limit is max_tokens, or max(8192, largest graph size) when unbounded.

        Validation: hbm_gbps, tflops, weight_bytes, active_params > 0; kv_bytes_per_token, overhead_ms
        >= 0; context_len an int >= 0. metadata["roofline"] records all inputs.
        """
        hbm_gbps = _check_positive("hbm_gbps", hbm_gbps)
        tflops = _check_positive("tflops", tflops)
        weight_bytes = _check_positive("weight_bytes", weight_bytes)
        active_params = _check_positive("active_params", active_params)
        kv_bytes_per_token = _check_positive("kv_bytes_per_token", kv_bytes_per_token, allow_zero=True)
        overhead_ms = _check_positive("overhead_ms", overhead_ms, allow_zero=True)
        context_len = _check_int("context_len", context_len, minimum=0)
        sizes = _check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
        if max_tokens is not None:
            max_tokens = _check_int("max_tokens", max_tokens, minimum=1)
        if token_counts is None:
            limit = max_tokens if max_tokens is not None else max(8192, sizes[-1] if sizes else 0)
            default = set(sizes)
            default.update(1 << i for i in range(limit.bit_length()) if (1 << i) <= limit)
            default.add(limit)
            if sizes and sizes[-1] < limit:
                default.add(sizes[-1] + 1)
            counts = tuple(sorted(default))
        else:
            counts = _check_increasing_ints("token_counts", token_counts, allow_empty=False)

        bytes_per_ms = hbm_gbps * 1e9 / 1e3
        flops_per_ms = tflops * 1e12 / 1e3
        verify = {}
        for n in counts:
            memory_ms = (weight_bytes + n * context_len * kv_bytes_per_token) / bytes_per_ms
            compute_ms = 2.0 * active_params * n / flops_per_ms
            verify[n] = overhead_ms + max(memory_ms, compute_ms)
        recorded: dict[str, Any] = {
            "source": "roofline",
            "date": _now_iso(),
            "roofline": {
                "hbm_gbps": hbm_gbps,
                "tflops": tflops,
                "weight_bytes": weight_bytes,
                "active_params": active_params,
                "kv_bytes_per_token": kv_bytes_per_token,
                "context_len": context_len,
                "overhead_ms": overhead_ms,
            },
        }
        recorded.update(metadata or {})
        return cls.from_points(verify, draft_ms, sizes, max_tokens, recorded)

    # ----------------------------------------------------------------------------------------------
    # Scalar costs
    # ----------------------------------------------------------------------------------------------

    def verify_cost(self, n: int) -> float:
        """Milliseconds of one verification forward at n total tokens (int >= 0, <= max_tokens).

        n = 0 costs what the smallest graph size costs (no graphs: the first measured point).
        """
        n = _check_int("n", n, minimum=0)
        if self._max_tokens is not None and n > self._max_tokens:
            raise ValueError(f"n={n} exceeds max_tokens={self._max_tokens}, the engine's token capacity")
        return self._verify_unchecked(n)

    def draft_cost(self, r: int) -> float:
        """Milliseconds of one drafter step at r requests (int >= 0; r = 0 costs the first point)."""
        return self._draft_unchecked(_check_int("r", r, minimum=0))

    def step_cost(self, r: int, n: int) -> float:
        """draft_cost(r) + verify_cost(n): milliseconds of one whole step."""
        return self.draft_cost(r) + self.verify_cost(n)

    def shifted(self, tokens: int) -> CostTable:
        """The verify curve seen from ``tokens`` non-draft tokens already in the step (prompt chunks):
        ``n -> verify_cost(n + tokens) - verify_cost(tokens) + verify_cost(0)``, max_tokens reduced by
        ``tokens``, the same drafter cost. Cached per ``tokens``; ``shifted(0)`` is the table itself.

        For engines with chunked prefill: plan with ``plan_verification(..., cost_table=ct.shifted(X))``
        rather than ``extra_tokens=X``. Both charge a draft its true marginal time at the step's
        operating point, but extra_tokens also puts the prompt's time in Theta's denominator as a fixed
        cost of the step, so any draft whose survival beats the diluted tokens-per-ms gets verified; in a
        closed loop every output token brings its prompt's work along, so that time is not a cost a step
        can amortise. The simulator measured the difference (``adaptive_verify.sim.engine``).

        The shifted curve is sampled at every token count up to 4096 above the shift, and beyond that every
        8th count plus both sides of every graph size and measured point (the original curve is linear
        between those), then interpolated linearly: exact at every count up to 4096 above the shift.
        With max_tokens None the shifted table is unbounded too (sampled up to the last measured point or
        graph size, then extrapolated as the original is). Shifted tables are cached per ``tokens`` for
        the table's lifetime: a CUDA graph that captured a planner call keeps reading its cost array.
        ``shifted(x).verify_cost(0)`` is the first sampled point's cost, like any table's n = 0.
        """
        tokens = _check_int("tokens", tokens, minimum=0)
        if tokens == 0:
            return self
        if tokens not in self._shifted:
            last = max(self._verify_points[-1][0], self._graph_sizes[-1] if self._graph_sizes else 0)
            if self._max_tokens is not None:
                top = self._max_tokens - tokens
                if top < 1:
                    raise ValueError(f"tokens={tokens} leaves no room: the table's max_tokens is {self._max_tokens}")
            else:
                top = max(last - tokens, 2)
            ns = set(range(1, min(top, 4096) + 1))
            if top > 4096:
                ns.update(range(4096, top + 1, 8))
                for x in list(self._graph_sizes) + [n for n, _ in self._verify_points]:
                    ns.update(m for m in (x - tokens - 1, x - tokens, x - tokens + 1) if 1 <= m <= top)
                ns.add(top)
            base = self._verify_unchecked(tokens) - self._verify_unchecked(0)
            meta = copy.deepcopy(self._metadata)
            meta["shifted_by"] = tokens
            self._shifted[tokens] = CostTable.from_points(
                {n: self._verify_unchecked(n + tokens) - base for n in sorted(ns)}, self.draft_ms, (),
                top if self._max_tokens is not None else None, meta)
        return self._shifted[tokens]

    def _verify_unchecked(self, n: int) -> float:
        if not self._graph_sizes:
            return _interp(self._graph_xs, self._graph_ys, n)
        sizes = self._graph_sizes
        if n <= sizes[-1]:
            return self._graph_ms[bisect.bisect_left(sizes, n)]
        if self._eager_xs:
            # n below the first eager point takes its value: never interpolate across the cliff.
            eager = _interp(self._eager_xs, self._eager_ys, n)
        else:
            eager = _interp(self._graph_xs, self._graph_ys, n)
        return max(eager, self._graph_ms[-1])

    def _draft_unchecked(self, r: int) -> float:
        if isinstance(self._draft, float):
            return self._draft
        return _interp(self._draft_xs, self._draft_ys, r)

    # ----------------------------------------------------------------------------------------------
    # Dense arrays for kernels
    # ----------------------------------------------------------------------------------------------

    def verify_array(self, max_n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [max_n + 1]: element n = float32(verify_cost(n)), n = 0 included.

        If max_n > max_tokens the array has max_tokens + 1 entries only: callers must not index
        beyond max_tokens (no step can run more tokens).

        The result is a read-only view of a tensor cached per device and grown on demand (geometric
        growth), so repeated calls in a decode loop allocate no device memory; the same max_n returns
        the same view object. Do not write into it. A growth allocates on the device: under CUDA-graph
        capture, request the largest max_n once before capturing. Tensors replaced by a growth are kept
        alive, so previously captured pointers stay valid. device None means CPU.
        """
        max_n = _check_int("max_n", max_n, minimum=0)
        length = max_n + 1 if self._max_tokens is None else min(max_n, self._max_tokens) + 1
        return self._dense_view("verify", length, device)

    def draft_array(self, max_r: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [max_r + 1]: element r = float32(draft_cost(r)); cached like :meth:`verify_array`."""
        max_r = _check_int("max_r", max_r, minimum=0)
        return self._dense_view("draft", max_r + 1, device)

    def _host_values(self, kind: str, length: int) -> np.ndarray:
        have = self._host.get(kind)
        start = 0 if have is None else have.shape[0]
        if start >= length:
            return have[:length]
        fn = self._verify_unchecked if kind == "verify" else self._draft_unchecked
        # The scalar path itself, so the array can never disagree with verify_cost / draft_cost.
        new = np.array([fn(i) for i in range(start, length)], dtype=np.float64).astype(np.float32)
        values = new if have is None else np.concatenate([have, new])
        self._host[kind] = values
        return values

    def _dense_view(self, kind: str, length: int, device: Any) -> torch.Tensor:
        dev = _normalize_device(device)
        entry = self._dense.get((kind, dev))
        if entry is None or entry.tensor.shape[0] < length:
            cap = self._max_tokens + 1 if (kind == "verify" and self._max_tokens is not None) else None
            old = 0 if entry is None else entry.tensor.shape[0]
            grown = max(length, 2 * old, _MIN_DENSE_LEN)
            if cap is not None:
                grown = min(grown, cap)
            tensor = torch.from_numpy(self._host_values(kind, grown)).to(dev, copy=True)  # [grown]
            if entry is None:
                entry = self._dense[(kind, dev)] = _DenseEntry(tensor)
            else:
                entry.retired.append(entry.tensor)
                entry.tensor, entry.last_view = tensor, None
        view = entry.last_view
        if view is None or view.shape[0] != length:
            view = entry.last_view = entry.tensor[:length]
        return view

    # ----------------------------------------------------------------------------------------------
    # Serialisation
    # ----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict. Points are [count, ms] pairs in increasing order (JSON keys are strings)."""
        return {
            "format_version": FORMAT_VERSION,
            "verify_ms": [[n, ms] for n, ms in self._verify_points],
            "draft_ms": self._draft if isinstance(self._draft, float) else [[r, ms] for r, ms in self._draft],
            "graph_sizes": list(self._graph_sizes),
            "max_tokens": self._max_tokens,
            "metadata": copy.deepcopy(self._metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        """Inverse of :meth:`to_dict`. Unknown format versions and unknown keys are rejected."""
        if not isinstance(data, Mapping):
            raise TypeError(f"cost table data must be a dict, got {type(data).__name__}")
        if "format_version" not in data:
            raise ValueError(f"format_version missing: not an adaptive_verify cost table (keys: {sorted(data)})")
        version = data["format_version"]
        if not _is_int(version) or version != FORMAT_VERSION:
            raise ValueError(
                f"format_version={version!r} is not supported; this version of adaptive_verify reads {FORMAT_VERSION}"
            )
        unknown = sorted(set(data) - set(_JSON_KEYS))
        if unknown:
            raise ValueError(f"unknown keys {unknown} in a format_version {FORMAT_VERSION} cost table")

        def pairs(name: str, value: Any) -> dict:
            if not isinstance(value, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
                raise ValueError(f"{name} must be a list of [count, ms] pairs")
            out: dict = {}
            for k, v in value:
                if k in out:
                    raise ValueError(f"{name}: duplicate count {k!r}")
                out[k] = v
            return out

        draft = data.get("draft_ms", 0.0)
        return cls.from_points(
            verify_ms=pairs("verify_ms", data.get("verify_ms")),
            draft_ms=draft if _is_real(draft) else pairs("draft_ms", draft),
            graph_sizes=data.get("graph_sizes", ()),
            max_tokens=data.get("max_tokens"),
            metadata=data.get("metadata"),
        )

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the table as JSON (strict: no NaN). Written to a temporary file then renamed."""
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False, ensure_ascii=False) + "\n"
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(prefix=".cost-", suffix=".json", dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> CostTable:
        """Read a table written by :meth:`to_json`. Errors name the file."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{os.fspath(path)}: {e}") from e

    # ----------------------------------------------------------------------------------------------
    # Attributes
    # ----------------------------------------------------------------------------------------------

    @property
    def graph_sizes(self) -> tuple[int, ...]:
        return self._graph_sizes

    @property
    def max_tokens(self) -> int | None:
        return self._max_tokens

    @property
    def metadata(self) -> Mapping[str, Any]:
        return types.MappingProxyType(self._metadata)

    @property
    def verify_ms(self) -> dict[int, float]:
        return dict(self._verify_points)

    @property
    def draft_ms(self) -> dict[int, float] | float:
        return self._draft if isinstance(self._draft, float) else dict(self._draft)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CostTable):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable-looking metadata; equality is by value

    def __repr__(self) -> str:
        (n0, _), (n1, _) = self._verify_points[0], self._verify_points[-1]
        lo, hi = min(ms for _, ms in self._verify_points), max(ms for _, ms in self._verify_points)
        parts = [f"verify={len(self._verify_points)} points n={n0}..{n1} ({lo:.3g}..{hi:.3g} ms)"]
        if isinstance(self._draft, float):
            parts.append(f"draft={self._draft:.3g} ms")
        else:
            parts.append(f"draft={len(self._draft)} points r={self._draft[0][0]}..{self._draft[-1][0]}")
        sizes = self._graph_sizes
        if len(sizes) <= 6:
            parts.append(f"graph_sizes={list(sizes)}")
        else:
            parts.append(f"graph_sizes=[{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}] ({len(sizes)} sizes)")
        parts.append(f"max_tokens={self._max_tokens}")
        for key in ("device", "model", "source"):
            if key in self._metadata:
                parts.append(f"{key}={self._metadata[key]!r}")
        return f"CostTable({', '.join(parts)})"


# --------------------------------------------------------------------------------------------------
# Profiling helpers
# --------------------------------------------------------------------------------------------------


def _make_timer(dev: torch.device) -> tuple[Callable[[Callable[[int], Any], int], float], str]:
    """(time_once(fn, arg) -> ms, description of the clock)."""
    if dev.type == "cuda":
        stream = torch.cuda.current_stream(dev)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

        def time_cuda(fn: Callable[[int], Any], arg: int) -> float:
            with torch.cuda.device(dev):
                torch.cuda.synchronize(dev)
                start.record(stream)
                fn(arg)
                end.record(stream)
                end.synchronize()
            return float(start.elapsed_time(end))

        return time_cuda, "cuda events"

    def time_host(fn: Callable[[int], Any], arg: int) -> float:
        # Looked up on the module each call, so a test can substitute a fake clock.
        t0 = time.perf_counter_ns()
        fn(arg)
        t1 = time.perf_counter_ns()
        return (t1 - t0) / 1e6

    return time_host, "perf_counter_ns"


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return f"cpu ({platform.processor() or platform.machine()})"
    return str(dev)


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
