"""CostTable: the immutable step cost model the planner prices budgets with (rules in the package docstring).

The package's one hub: this module imports checks, curve, profile, roofline and serialize, and none of them
imports it back (tests/test_layout.py checks that the package's import graph has no cycle)."""
from __future__ import annotations

import collections
import copy
import os
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from .._checks import check_bool, check_int, is_real
from . import levels as _levels
from . import profile as _profile
from . import roofline as _roofline
from . import serialize as _serialize
from .checks import (MAX_TOKENS_LIMIT, check_increasing_ints, check_metadata, check_ms, check_path, check_points,
                     normalize_device)
from .curve import DRAFT_MODES, DraftCurve, ShiftedCurve, VerifyCurve
from .serialize import FORMAT_VERSION

__all__ = ["CostTable", "FORMAT_VERSION", "MAX_TOKENS_LIMIT"]

#: Shifted views kept per table (least recently used first out); views used under CUDA-graph capture are kept
#: for the table's lifetime, since a captured planner call reads their cost array at every replay.
SHIFTED_CACHE_SIZE = 64


def _capturing(dev: torch.device) -> bool:
    return dev.type == "cuda" and torch.cuda.is_current_stream_capturing()


class _DenseEntry:
    """A device tensor of float32 costs for counts 0..len-1, and the tensors it replaced.

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
    """Step cost model ``step_cost(r, n) = fixed_cost(r) + verify_cost(n)`` in milliseconds, where
    ``fixed_cost(r) = draft_cost(r) + request_ms * r`` is what a step of r requests pays whatever it verifies.

    Build it with :meth:`from_points` (measured numbers), :meth:`profile` / :meth:`load_or_profile` (measure
    a callable, with a cache file), :meth:`roofline` (planning model without a profile) or
    :meth:`from_json`. The table is immutable; :mod:`adaptive_verify.cost` gives the exact shape of the curves.

    Attributes:
        graph_sizes: the engine's CUDA-graph capture sizes (token counts), increasing; () for none.
        max_tokens: token capacity of one step, or None (unbounded).
        metadata: read-only mapping (device, model, dtype, date, how measured, ...).
        verify_ms: the measured verify points as given, {n: ms} (before the envelope).
        draft_ms: the drafter points as given, {r: ms}, or a float for a constant drafter cost.
        draft_interpolation: "staircase" (default: r requests cost the next measured count >= r, since
            drafters replay padded CUDA graphs) or "linear" (between measured counts).
        request_ms: milliseconds per request per step outside the drafter and the verify forward (sampling,
            scheduling, per-request host work), 0.0 unless given.
        draft_levels: the levels of the full draft (K) of a drafter that drafts level by level (EAGLE, multi-step
            MTP: one drafter forward per level), whose cost then depends on the levels drafted
            (:meth:`draft_cost`); None for a block drafter (one forward whatever is drafted).
        draft_level_ms: the cost of one level after the first, {r: ms} or a float, or None (every level costs the
            same: draft_ms / draft_levels).
        shifted_by, unshifted: a :meth:`shifted` view's prompt tokens and the table it views (0 and the table
            itself otherwise).
        verify_curve: the float64 verify curve the costs come from (read-only).
    """

    def __init__(self, *, _verify, _draft, _draft_mode, _graph_sizes, _max_tokens, _metadata, _curve=None,
                 _request_ms=0.0, _draft_curve=None, _draft_levels=None, _draft_level=None, _draft_catch_up=False):
        # Private: use the classmethods, which validate. Arguments are already checked here.
        self._verify_points: tuple[tuple[int, float], ...] = _verify
        self._draft = _draft
        self._draft_mode: str = _draft_mode
        self._request_ms: float = _request_ms
        self._graph_sizes: tuple[int, ...] = _graph_sizes
        self._max_tokens: int | None = _max_tokens
        self._metadata: dict | None = _metadata  # None on a shifted view until asked for (see _meta)
        self._curve = _curve if _curve is not None else VerifyCurve(_verify, _graph_sizes)
        self._draft_curve = _draft_curve if _draft_curve is not None else DraftCurve(_draft, _draft_mode)
        self._draft_levels: int | None = _draft_levels
        self._draft_level = _draft_level  # None (uniform levels), a float or ((r, ms), ...)
        self._level_curve = None if _draft_level is None else DraftCurve(_draft_level, _draft_mode)
        self._draft_catch_up: bool = _draft_catch_up
        self._dense: dict[tuple[str, torch.device], _DenseEntry] = {}
        self._shifted: collections.OrderedDict[int, CostTable] = collections.OrderedDict()
        self._shifted_pinned: dict[int, CostTable] = {}
        self._base: CostTable | None = None  # set on shifted views
        self._shift = 0

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
        *,
        draft_interpolation: str = "staircase",
        request_ms: float = 0.0,
        draft_levels: int | None = None,
        draft_level_ms: Mapping[int, float] | float | None = None,
        draft_catch_up: bool = False,
    ) -> CostTable:
        """Build a table from measured points.

        Args:
            verify_ms: {n: ms}, total token count n (int in [1, MAX_TOKENS_LIMIT]) to verification-forward
                milliseconds (> 0). Keys strictly increasing in the order given: an out-of-order key in a
                profile is usually a typo, so it is an error rather than silently sorted.
            draft_ms: {r: ms} over request counts (ints >= 1, strictly increasing, values >= 0), or a
                constant float >= 0. An empty dict is an error (pass 0.0 for "no drafter cost").
            graph_sizes: the engine's CUDA-graph capture sizes, ints >= 1 strictly increasing.
            max_tokens: token capacity of one step (>= largest graph size, <= MAX_TOKENS_LIMIT), or None
                for unbounded. Measured points above max_tokens are allowed; they only shape the curve.
            metadata: JSON-serialisable dict (str keys), deep-copied. Tuples come back as lists
                after a JSON round trip.
            draft_interpolation: between measured request counts, "staircase" (default: the cost of the
                next measured count >= r, as for a drafter replaying padded CUDA graphs; vLLM prices it so)
                or "linear" (for a drafter curve that is a model rather than graph measurements).
            request_ms: milliseconds per request per step (>= 0), added to the drafter's cost in
                :meth:`fixed_cost`: step work that grows with the batch's requests but not with its tokens.
                Default 0.0 (a table measured by timing the forward and the drafter alone has none).
            draft_levels: for a drafter that drafts level by level (EAGLE, multi-step MTP), the levels K its full
                draft (``draft_ms``) has, an int in [1, 32]; None (default) for a block drafter, whose cost does not
                depend on the levels drafted. See :meth:`draft_cost`.
            draft_level_ms: with draft_levels, the cost of one level after the first ({r: ms} like draft_ms, on
                the same interpolation, or a float), measured by timing one more drafter forward; None: every level
                costs draft_ms / draft_levels. (draft_levels - 1) levels may not cost more than the full draft at
                any measured request count.
            draft_catch_up: the drafter's first forward runs every step, drafting or not (it reads the step's
                accepted tokens to keep its own KV cache in step: vLLM's EAGLE proposer runs it at 0 speculative
                tokens too), so drafting 0 levels costs what 1 does. Default False: 0 levels cost nothing.

        Raises:
            TypeError / ValueError naming the argument (first word of the message).
        """
        verify = check_points("verify_ms", verify_ms, positive=True)
        if isinstance(draft_ms, Mapping):
            draft: float | tuple[tuple[int, float], ...] = check_points("draft_ms", draft_ms, positive=False)
        elif is_real(draft_ms):
            draft = check_ms("draft_ms", draft_ms, what="constant", positive=False)
        else:
            raise TypeError(f"draft_ms must be a dict {{r: ms}} or a float, got {type(draft_ms).__name__}")
        if not isinstance(draft_interpolation, str) or draft_interpolation not in DRAFT_MODES:
            raise ValueError(f"draft_interpolation must be one of {DRAFT_MODES}, got {draft_interpolation!r}")
        request_ms = check_ms("request_ms", request_ms, what="per-request cost", positive=False)
        sizes = check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
        if max_tokens is not None:
            max_tokens = check_int("max_tokens", max_tokens, lo=1, hi=MAX_TOKENS_LIMIT)
            if sizes and max_tokens < sizes[-1]:
                raise ValueError(f"max_tokens={max_tokens} is smaller than the largest graph size {sizes[-1]}")
        levels, level = _levels.check_levels(draft_levels, draft_level_ms, draft, draft_interpolation)
        catch_up = check_bool("draft_catch_up", draft_catch_up)
        meta = copy.deepcopy(check_metadata(metadata))
        return cls(_verify=verify, _draft=draft, _draft_mode=draft_interpolation, _graph_sizes=sizes,
                   _max_tokens=max_tokens, _metadata=meta, _request_ms=request_ms, _draft_levels=levels,
                   _draft_level=level, _draft_catch_up=catch_up)

    @classmethod
    def profile(
        cls,
        step_fn: Callable[[int], Any],
        token_counts: Iterable[int] | None = None,
        draft_fn: Callable[[int], Any] | None = None,
        request_counts: Iterable[int] | None = None,
        graph_sizes: Iterable[int] = (),
        reps: int = 5,
        warmup: int = 2,
        max_tokens: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        device: torch.device | str | None = None,
        *,
        draft_interpolation: str = "staircase",
        draft_levels: int | None = None,
        draft_level_fn: Callable[[int], Any] | None = None,
    ) -> CostTable:
        """Measure a table: each point is the median of ``reps`` timings after ``warmup`` untimed calls.

        Args:
            step_fn: ``step_fn(n)`` runs one verification forward at n total tokens.
            token_counts: the n to measure, ints >= 1 strictly increasing; default
                :meth:`profile_points` of graph_sizes and max_tokens (every graph size, then an eager
                tail in 1.5x steps up to the capacity), which needs graph_sizes or max_tokens.
            draft_fn: ``draft_fn(r)`` runs one drafter step at r requests. Without it the drafter cost
                is 0 and metadata["drafter"] says so (then step costs are verify costs only, which
                biases the planner towards verifying less; see docs/design.md, "Step cost").
            request_counts: the r to measure; required with draft_fn, an error without it. For a drafter
                that replays CUDA graphs, measure its graph sizes (the staircase prices every r in between).
            graph_sizes, max_tokens, draft_interpolation, draft_levels: as in :meth:`from_points`.
            draft_level_fn: for a level-by-level drafter (draft_levels given, draft_fn timing its full draft),
                ``draft_level_fn(r)`` runs one drafter level after the first at r requests; timed at request_counts,
                it gives ``draft_level_ms`` (without it every level costs the same share of the full draft).
            reps: timed calls per point (in [1, 10000]); the median is used (mean of the middle two when even).
            warmup: untimed calls per point before timing (in [0, 10000]).
            metadata: user fields; they take precedence over the recorded ones (date, device, measured,
                source, torch, drafter).
            device: where the work runs. A CUDA device is timed with CUDA events on its current stream
                (the device is synchronised before each timed call, so earlier work is not counted);
                anything else with ``time.perf_counter_ns`` around the call, so the callable must be
                synchronous there. None: the current CUDA device if CUDA is available, else CPU.
        """
        return _profile.profile_table(cls, step_fn, token_counts, draft_fn, request_counts, graph_sizes, reps, warmup,
                                      max_tokens, metadata, device, draft_interpolation, draft_levels, draft_level_fn)

    @staticmethod
    def profile_points(graph_sizes: Iterable[int], max_tokens: int | None, *, growth: float = 1.5) -> list[int]:
        """Token counts worth measuring for an engine with these CUDA-graph sizes and capacity: every graph
        size (each is a step of the staircase), then an eager tail from the largest graph size + 1 in
        ``growth``x steps up to max_tokens (two eager points at least, so the eager slope is measured rather
        than extrapolated across the graph/eager cliff)."""
        return _profile.profile_points(graph_sizes, max_tokens, growth)

    @classmethod
    def load_or_profile(
        cls,
        path: str | os.PathLike,
        step_fn: Callable[[int], Any],
        *,
        expect: Mapping[str, Any] | None = None,
        graph_sizes: Iterable[int] = (),
        max_tokens: int | None = None,
        **profile_kwargs: Any,
    ) -> CostTable:
        """The table cached at ``path`` if it still describes this deployment, else a fresh profile saved there.

        ``expect``: what the cached file must match, e.g. ``{"device": "NVIDIA H200", "model": "...",
        "graph_sizes": [...]}``: ``graph_sizes`` and ``max_tokens`` are compared with the table's own, every
        other key with ``metadata[key]``. ``graph_sizes`` / ``max_tokens`` given here are compared the same
        way. A missing, unreadable or mismatching file is reprofiled (the reason is logged on the
        "adaptive_verify" logger) with :meth:`profile` (``profile_kwargs`` go there; token_counts default to
        :meth:`profile_points`), the ``expect`` entries are recorded in the new table's metadata, and the file
        is written atomically. Errors in the arguments raise before any measurement.
        """
        return _profile.load_or_profile(cls, path, step_fn, expect, graph_sizes, max_tokens, profile_kwargs)

    @classmethod
    def roofline(cls, *, hbm_gbps: float, tflops: float, weight_bytes: float, active_params: float,
                 kv_bytes_per_token: float, context_len: int, graph_sizes: Iterable[int] = (),
                 max_tokens: int | None = None, draft_ms: Mapping[int, float] | float = 0.0,
                 overhead_ms: float = 0.0, token_counts: Iterable[int] | None = None,
                 metadata: Mapping[str, Any] | None = None, draft_interpolation: str = "staircase",
                 request_ms: float = 0.0, draft_levels: int | None = None,
                 draft_level_ms: Mapping[int, float] | float | None = None, draft_catch_up: bool = False) -> CostTable:
        """A planning model without a profile: ``overhead_ms + max(memory_ms, compute_ms)`` per step
        (:func:`adaptive_verify.cost.roofline.roofline_points` says exactly how), evaluated at
        ``token_counts`` and passed through :meth:`from_points`, so the graph staircase and the eager
        interpolation apply exactly as for a measured table. metadata["roofline"] records all inputs;
        draft_ms, draft_interpolation, request_ms, draft_levels, draft_level_ms and draft_catch_up go to
        :meth:`from_points` as they are."""
        sizes = check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
        if max_tokens is not None:
            max_tokens = check_int("max_tokens", max_tokens, lo=1, hi=MAX_TOKENS_LIMIT)
        counts = None if token_counts is None else check_increasing_ints("token_counts", token_counts,
                                                                          allow_empty=False)
        verify, recorded = _roofline.roofline_points(
            hbm_gbps=hbm_gbps, tflops=tflops, weight_bytes=weight_bytes, active_params=active_params,
            kv_bytes_per_token=kv_bytes_per_token, context_len=context_len, graph_sizes=sizes,
            max_tokens=max_tokens, overhead_ms=overhead_ms, token_counts=counts)
        recorded.update(metadata or {})
        return cls.from_points(verify, draft_ms, sizes, max_tokens, recorded, draft_interpolation=draft_interpolation,
                               request_ms=request_ms, draft_levels=draft_levels, draft_level_ms=draft_level_ms,
                               draft_catch_up=draft_catch_up)

    # ----------------------------------------------------------------------------------------------
    # Scalar costs
    # ----------------------------------------------------------------------------------------------

    @property
    def token_limit(self) -> int:
        """The largest total token count this table prices: max_tokens, or for a table without one
        MAX_TOKENS_LIMIT less the prompt tokens of a shifted view (the step, prompt included, stays within
        MAX_TOKENS_LIMIT, which bounds every array the table builds)."""
        return self._max_tokens if self._max_tokens is not None else MAX_TOKENS_LIMIT - self._shift

    def verify_cost(self, n: int) -> float:
        """Milliseconds of one verification forward at n total tokens (int in [0, token_limit]).

        n = 0 costs what the smallest graph size costs (no graphs: the first measured point).
        """
        n = check_int("n", n, lo=0)
        if self._max_tokens is not None and n > self._max_tokens:
            raise ValueError(f"n={n} exceeds max_tokens={self._max_tokens}, the engine's token capacity")
        if n > self.token_limit:
            raise ValueError(f"n={n} exceeds the {self.token_limit} tokens a step can hold (MAX_TOKENS_LIMIT)")
        return self._curve.cost(n)

    def draft_cost(self, r: int, levels: int | None = None) -> float:
        """Milliseconds of the drafter's work in a step of r requests (int in [0, MAX_TOKENS_LIMIT]; r = 0 costs the
        first point) drafting ``levels`` levels: None, the full draft ``draft_ms(r)`` (every table's meaning before
        draft depths); else in [0, draft_levels] (a block drafter's: [0, 32]) as :func:`cost.levels.level_cost`
        says (0 levels: nothing, or with ``draft_catch_up`` one level's cost)."""
        r = check_int("r", r, lo=0, hi=MAX_TOKENS_LIMIT)
        full = self._draft_curve.cost(r)
        if levels is None:
            return full
        L = self._draft_levels
        levels = check_int("levels", levels, lo=0, hi=L if L is not None else _levels.MAX_DRAFT_LEVELS)
        return _levels.level_cost(full, self._level_curve, r, L, max(levels, int(self._draft_catch_up)))

    def fixed_cost(self, r: int, levels: int | None = None) -> float:
        """draft_cost(r, levels) + request_ms * r: what a step of r requests drafting ``levels`` levels (None: the
        full draft) costs whatever it verifies (int r in [0, MAX_TOKENS_LIMIT]). The planner's Theta uses it as
        the step's fixed term."""
        return self.draft_cost(r, levels) + self._request_ms * r

    def step_cost(self, r: int, n: int) -> float:
        """fixed_cost(r) + verify_cost(n): milliseconds of one whole step."""
        return self.fixed_cost(r) + self.verify_cost(n)

    def shifted(self, tokens: int) -> CostTable:
        """The verify curve seen from ``tokens`` non-draft tokens already in the step (prompt chunks):
        ``n -> verify_cost(n + tokens) - verify_cost(tokens) + verify_cost(0)``, exact at every n,
        max_tokens reduced by ``tokens``, graph sizes seen from the shift, the same drafter cost.
        ``shifted(0)`` is the table itself.

        For engines with chunked prefill: plan with ``plan_verification(..., cost_table=ct.shifted(X))``
        rather than ``extra_tokens=X``. Both charge a draft its true marginal time at the step's
        operating point, but extra_tokens also puts the prompt's time in Theta's denominator as a fixed
        cost of the step, so any draft whose survival beats the diluted tokens-per-ms gets verified; in a
        closed loop every output token brings its prompt's work along, so that time is not a cost a step
        can amortise. The simulator measured the difference on 2026-11-29 (benchmarks/results/2026-11-29-sim.md);
        AdaptiveVerifier prices prompt chunks this way (``extra_tokens`` there means the shifted table).

        Cost per call: O(1). The view evaluates the base curve lazily; its dense array for the planner is
        one slice-and-subtract of the base's cached array. Views are cached per ``tokens`` in a bounded LRU
        (SHIFTED_CACHE_SIZE); a view whose cost array was requested during CUDA-graph capture is kept for
        the table's lifetime (a captured planner call reads it at every replay).
        """
        tokens = check_int("tokens", tokens, lo=0, hi=MAX_TOKENS_LIMIT)
        if tokens == 0:
            return self
        if self._base is not None:  # a view of a view is a view of the base
            return self._base.shifted(self._shift + tokens)
        hit = self._shifted_pinned.get(tokens)
        if hit is None:
            hit = self._shifted.get(tokens)
            if hit is not None:
                self._shifted.move_to_end(tokens)
        if hit is not None:
            return hit
        if self.token_limit - tokens < 1:
            what = "max_tokens" if self._max_tokens is not None else "token limit (MAX_TOKENS_LIMIT)"
            raise ValueError(f"tokens={tokens} leaves no room: the table's {what} is {self.token_limit}")
        top = None if self._max_tokens is None else self._max_tokens - tokens
        # A view shares the base's curves and builds its metadata only when asked (_meta): chunked prefill makes a
        # new view almost every step, so its construction is a few attribute writes.
        # (__init__'s fields, set directly: the base's, with these replaced; a view keeps no views of its own, since
        # shifted() on it asks its base)
        view = object.__new__(CostTable)
        view.__dict__.update(self.__dict__)
        view.__dict__.update(_graph_sizes=tuple(g - tokens for g in self._graph_sizes if g > tokens), _max_tokens=top,
                             _metadata=None, _curve=ShiftedCurve(self._curve, tokens), _dense={}, _shifted=None,
                             _shifted_pinned=None, _base=self, _shift=tokens)
        self._shifted[tokens] = view
        while len(self._shifted) > SHIFTED_CACHE_SIZE:
            self._shifted.popitem(last=False)
        return view

    def _meta(self) -> dict:
        """The metadata dict (a shifted view's: the base's, deep-copied, plus shifted_by; made on first use)."""
        if self._metadata is None:
            meta = copy.deepcopy(self._base._meta())
            meta["shifted_by"] = self._shift
            self._metadata = meta
        return self._metadata

    def _pin(self) -> None:
        """Keeps this shifted view alive for the base table's lifetime (its array is in a captured graph)."""
        if self._base is not None:
            self._base._shifted_pinned[self._shift] = self

    # ----------------------------------------------------------------------------------------------
    # Dense arrays for kernels
    # ----------------------------------------------------------------------------------------------

    def verify_array(self, max_n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [max_n + 1]: element n = float32(verify_cost(n)), n = 0 included.

        If max_n > token_limit (max_tokens, else MAX_TOKENS_LIMIT less a shifted view's shift) the array has
        token_limit + 1 entries only: callers must not index beyond it (no step can run more tokens). max_n
        is at most MAX_TOKENS_LIMIT.

        The result is a read-only view of a tensor cached per device and grown on demand (geometric
        growth), so repeated calls in a decode loop allocate no device memory; the same max_n returns
        the same view object. Do not write into it. A growth allocates on the device: under CUDA-graph
        capture, request the largest max_n once before capturing. Tensors replaced by a growth are kept
        alive, so previously captured pointers stay valid. device None means CPU.
        """
        max_n = check_int("max_n", max_n, lo=0, hi=MAX_TOKENS_LIMIT)
        return self._dense_view("verify", min(max_n, self.token_limit) + 1, device)

    def draft_array(self, max_r: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [max_r + 1]: element r = float32(draft_cost(r)); cached like :meth:`verify_array`."""
        max_r = check_int("max_r", max_r, lo=0, hi=MAX_TOKENS_LIMIT)
        return self._dense_view("draft", max_r + 1, device)

    def _dense_view(self, kind: str, length: int, device: Any) -> torch.Tensor:
        # The planner asks with a torch.device every step: a CPU one needs no normalising (and cannot capture).
        if type(device) is torch.device and device.type == "cpu":
            dev = device
        else:
            dev = normalize_device(device)
            if _capturing(dev):
                self._pin()
        entry = self._dense.get((kind, dev))
        if entry is None or entry.tensor.shape[0] < length:
            cap = self.token_limit + 1 if kind == "verify" else None
            old = 0 if entry is None else entry.tensor.shape[0]
            shifted_verify = kind == "verify" and self._base is not None
            # A shifted view is typically asked once per step of its prompt chunk: its exact length, no growth.
            grown = length if shifted_verify else max(length, 2 * old, 256)
            if cap is not None:
                grown = min(grown, cap)
            curve = self._curve if kind == "verify" else self._draft_curve
            # float64 -> float32 once, as verify_cost rounds
            values = curve.dense32(grown) if shifted_verify else curve.dense(grown).astype(np.float32)
            # [grown]; astype made a new array, so a CPU tensor may share it
            tensor = torch.from_numpy(values) if dev.type == "cpu" else torch.from_numpy(values).to(dev)
            if entry is None:
                entry = self._dense[(kind, dev)] = _DenseEntry(tensor)
            else:
                entry.retired.append(entry.tensor)
                entry.tensor, entry.last_view = tensor, None
        view = entry.last_view
        if view is None or view.shape[0] != length:
            view = entry.last_view = entry.tensor if entry.tensor.shape[0] == length else entry.tensor[:length]
        return view

    # ----------------------------------------------------------------------------------------------
    # Serialisation
    # ----------------------------------------------------------------------------------------------

    def _points(self) -> tuple[tuple[int, float], ...]:
        """The measured points, or for a shifted view its curve sampled where it can bend: every count up to 4096
        above the shift, then every 8th plus both sides of every graph size and measured point of the base (the
        base is linear between those), and the top."""
        if self._base is None:
            return self._verify_points
        base, x = self._base, self._shift
        top = self._max_tokens if self._max_tokens is not None else \
            max(max(base._verify_points[-1][0], base._graph_sizes[-1] if base._graph_sizes else 0) - x, 2)
        ns = set(range(1, min(top, 4096) + 1))
        if top > 4096:
            ns.update(range(4096, top + 1, 8))
            for b in list(base._graph_sizes) + [n for n, _ in base._verify_points]:
                ns.update(m for m in (b - x - 1, b - x, b - x + 1) if 1 <= m <= top)
            ns.add(top)
        return tuple((n, self._curve.cost(n)) for n in sorted(ns))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict. Points are [count, ms] pairs in increasing order (JSON keys are strings). A shifted
        view is written as the table its curve is (sampled; graph sizes are already in its values)."""
        return _serialize.to_dict(verify=self._points(), draft=self._draft, draft_interpolation=self._draft_mode,
                                  request_ms=self._request_ms, draft_levels=self._draft_levels,
                                  draft_level=self._draft_level, draft_catch_up=self._draft_catch_up,
                                  graph_sizes=self._graph_sizes if self._base is None else (),
                                  max_tokens=self._max_tokens, metadata=self._meta())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        """Inverse of :meth:`to_dict`. Unknown format versions and unknown keys are rejected."""
        return cls.from_points(**_serialize.from_dict(data))

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the table as JSON (strict: no NaN). Written to a temporary file then renamed."""
        _serialize.write_json(self.to_dict(), check_path(path))

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> CostTable:
        """Read a table written by :meth:`to_json`. Errors (ValueError / TypeError) name the file; JSON
        nested too deeply to parse is a ValueError."""
        path = check_path(path)
        data = _serialize.read_json(path)
        with _serialize.naming(path):
            return cls.from_dict(data)

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
        return types.MappingProxyType(self._meta())

    @property
    def verify_ms(self) -> dict[int, float]:
        return dict(self._points())

    @property
    def draft_ms(self) -> dict[int, float] | float:
        return self._draft if isinstance(self._draft, float) else dict(self._draft)

    @property
    def draft_interpolation(self) -> str:
        return self._draft_mode

    @property
    def request_ms(self) -> float:
        return self._request_ms

    @property
    def draft_levels(self) -> int | None:
        """The full draft's levels of a level-by-level drafter, None for a block drafter (:meth:`draft_cost`)."""
        return self._draft_levels

    @property
    def draft_catch_up(self) -> bool:
        """Whether drafting 0 levels still pays the drafter's first forward (:meth:`from_points`)."""
        return self._draft_catch_up

    @property
    def draft_level_ms(self) -> dict[int, float] | float | None:
        """The cost of one level after the first as given ({r: ms} or a float), None for uniform levels."""
        level = self._draft_level
        return level if level is None or isinstance(level, float) else dict(level)

    @property
    def shifted_by(self) -> int:
        """The prompt tokens a :meth:`shifted` view sees its curve from (metadata["shifted_by"]); 0 for a table that
        is not a view."""
        return self._shift

    @property
    def unshifted(self) -> CostTable:
        """The table a :meth:`shifted` view is a view of (its step's real cost is ``unshifted.verify_cost(n +
        shifted_by)``); the table itself when it is not a view."""
        return self._base if self._base is not None else self

    @property
    def verify_curve(self) -> VerifyCurve | ShiftedCurve:
        """The float64 verify curve behind :meth:`verify_cost` and :meth:`verify_array` (``curve.py``: a
        VerifyCurve, or for a shifted view a ShiftedCurve of its base's), for callers that fill their own cost
        arrays (``dense32_into``). Shared, not copied: read it, never change it."""
        return self._curve

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CostTable):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable-looking metadata; equality is by value

    def __repr__(self) -> str:
        (n0, _), (n1, _) = self._verify_points[0], self._verify_points[-1]
        lo, hi = min(ms for _, ms in self._verify_points), max(ms for _, ms in self._verify_points)
        parts = [f"verify={len(self._verify_points)} points n={n0}..{n1} ({lo:.3g}..{hi:.3g} ms)"]
        if self._base is not None:
            parts.append(f"shifted_by={self._shift}")
        if isinstance(self._draft, float):
            parts.append(f"draft={self._draft:.3g} ms")
        else:
            parts.append(f"draft={len(self._draft)} points r={self._draft[0][0]}..{self._draft[-1][0]} "
                         f"({self._draft_mode})")
        if self._request_ms:
            parts.append(f"request_ms={self._request_ms:.3g}")
        if self._draft_levels is not None:
            parts.append(f"draft_levels={self._draft_levels}")
        if self._draft_catch_up:
            parts.append("draft_catch_up=True")
        sizes = self._graph_sizes
        if len(sizes) <= 6:
            parts.append(f"graph_sizes={list(sizes)}")
        else:
            parts.append(f"graph_sizes=[{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}] ({len(sizes)} sizes)")
        parts.append(f"max_tokens={self._max_tokens}")
        for key in ("device", "model", "source"):
            if key in self._meta():
                parts.append(f"{key}={self._meta()[key]!r}")
        return f"CostTable({', '.join(parts)})"
