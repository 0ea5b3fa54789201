"""Measuring a step cost table: timers, the measurement loop, and the bodies of ``CostTable.profile``,
``profile_points`` and ``load_or_profile`` (their docstrings, the public ones, stay on CostTable)."""
from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .._checks import check_int, check_real
from .checks import MAX_TOKENS_LIMIT, check_increasing_ints, check_path, normalize_device, now_iso

#: Most timed (and warmup) calls per point: a bound on how long a mistyped profile can run.
MAX_REPS = 10_000

_log = logging.getLogger("adaptive_verify")


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


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return f"cpu ({platform.processor() or platform.machine()})"
    return str(dev)


def _point_timer(timer, reps: int, warmup: int) -> Callable:
    """one(fn, arg): the median of ``reps`` timings of fn(arg) after ``warmup`` untimed calls, in ms."""
    def one(fn: Callable[[int], Any], arg: int) -> float:
        for _ in range(warmup):
            fn(arg)
        return float(statistics.median(timer(fn, arg) for _ in range(reps)))
    return one


def measure_points(fn: Callable[[int], Any], counts: Sequence[int], reps: int, warmup: int,
                   dev: torch.device) -> dict[int, float]:
    """{count: ms} of fn at each count, timed as :func:`measure` times its points (draft_level_fn's)."""
    one = _point_timer(_make_timer(dev)[0], reps, warmup)
    return {c: one(fn, c) for c in counts}


def measure(step_fn: Callable[[int], Any], counts: Sequence[int], draft_fn: Callable[[int], Any] | None,
            request_counts: Sequence[int], reps: int, warmup: int, dev: torch.device):
    """(verify points {n: ms}, draft points {r: ms} or 0.0, recorded metadata), each point the median of
    ``reps`` timings after ``warmup`` untimed calls. Arguments are already validated."""
    timer, clock = _make_timer(dev)
    one = _point_timer(timer, reps, warmup)
    verify: dict[int, float] = {}
    for n in counts:
        ms = one(step_fn, n)
        if not ms > 0.0:
            raise ValueError(f"step_fn at n={n} measured a median of {ms!r} ms; the clock cannot resolve it")
        verify[n] = ms
    draft: dict[int, float] | float = {r: one(draft_fn, r) for r in request_counts} if draft_fn is not None else 0.0
    recorded = {
        "source": "profile",
        "date": now_iso(),
        "device": device_name(dev),
        "measured": f"median of {reps} reps after {warmup} warmup, {clock}",
        "torch": torch.__version__,
    }
    if draft_fn is None:
        recorded["drafter"] = "none: no draft_fn given, draft cost 0"
    return verify, draft, recorded


def profile_table(cls, step_fn, token_counts, draft_fn, request_counts, graph_sizes, reps, warmup, max_tokens,
                  metadata, device, draft_interpolation, draft_levels=None, draft_level_fn=None):
    """The body of ``CostTable.profile`` (arguments documented there): every argument is checked before the
    first measurement."""
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    sizes = check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
    if token_counts is None:
        token_counts = profile_points(sizes, max_tokens)
    counts = check_increasing_ints("token_counts", token_counts, allow_empty=False)
    if draft_fn is not None and not callable(draft_fn):
        raise TypeError(f"draft_fn must be callable or None, got {type(draft_fn).__name__}")
    if draft_fn is not None and request_counts is None:
        raise ValueError("request_counts must be given with draft_fn (the request counts to time)")
    if draft_fn is None and request_counts is not None:
        raise ValueError("draft_fn must be given with request_counts (nothing to time at those counts)")
    if draft_level_fn is not None:
        if not callable(draft_level_fn):
            raise TypeError(f"draft_level_fn must be callable or None, got {type(draft_level_fn).__name__}")
        if draft_fn is None or draft_levels is None:
            raise ValueError("draft_level_fn needs draft_fn and draft_levels (it times one level of that drafter)")
    reqs = ()
    if request_counts is not None:
        reqs = check_increasing_ints("request_counts", request_counts, allow_empty=False)
    reps = check_int("reps", reps, lo=1, hi=MAX_REPS)
    warmup = check_int("warmup", warmup, lo=0, hi=MAX_REPS)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = normalize_device(device)
    # Validate the remaining table arguments before spending time on measurements.
    cls.from_points({1: 1.0}, 0.0, sizes, max_tokens, metadata, draft_interpolation=draft_interpolation,
                    draft_levels=draft_levels)
    verify, draft, recorded = measure(step_fn, counts, draft_fn, reqs, reps, warmup, dev)
    level = None
    if draft_level_fn is not None:  # the same timer and counts as the full draft
        level = measure_points(draft_level_fn, reqs, reps, warmup, dev)
        recorded["draft_levels"] = f"{draft_levels} levels; one level after the first timed by draft_level_fn"
    recorded.update(metadata or {})
    return cls.from_points(verify, draft, sizes, max_tokens, recorded, draft_interpolation=draft_interpolation,
                           draft_levels=draft_levels, draft_level_ms=level)


def profile_points(graph_sizes, max_tokens, growth=1.5) -> list[int]:
    """The body of ``CostTable.profile_points``: every graph size, then an eager tail in ``growth``x steps."""
    sizes = check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
    if max_tokens is None and not sizes:
        raise ValueError("max_tokens or graph_sizes must be given to propose token counts")
    cap = check_int("max_tokens", max_tokens, lo=1, hi=MAX_TOKENS_LIMIT) if max_tokens is not None \
        else 2 * sizes[-1]
    growth = check_real("growth", growth, lo=1.0, lo_open=True)
    points = [g for g in sizes if g <= cap]
    n = (sizes[-1] + 1) if sizes else 1
    while n < cap:
        points.append(n)
        n = max(n + 1, int(math.ceil(n * growth)))
    if not points or points[-1] < cap:
        points.append(cap)
    return sorted(set(points))


def load_or_profile(cls, path, step_fn, expect, graph_sizes, max_tokens, profile_kwargs):
    """The body of ``CostTable.load_or_profile`` (documented there)."""
    if expect is not None and not isinstance(expect, Mapping):
        raise TypeError(f"expect must be a dict or None, got {type(expect).__name__}")
    expect = dict(expect or {})
    for k in expect:
        if not isinstance(k, str):
            raise TypeError(f"expect keys must be str, got {type(k).__name__} {k!r}")
    sizes = check_increasing_ints("graph_sizes", graph_sizes, allow_empty=True)
    if sizes:
        expect.setdefault("graph_sizes", list(sizes))
    if max_tokens is not None:
        expect.setdefault("max_tokens", max_tokens)
    if "graph_sizes" in expect:
        sizes = check_increasing_ints("expect['graph_sizes']", expect["graph_sizes"], allow_empty=True)
        expect["graph_sizes"] = list(sizes)
    max_tokens = expect.get("max_tokens", max_tokens)
    path = check_path(path)
    reason = "no file"
    if os.path.exists(path):
        try:
            cached = cls.from_json(path)
        except (OSError, ValueError, TypeError) as e:
            reason = f"unreadable ({e})"
        else:
            reason = mismatch(cached, expect)
            if reason is None:
                return cached
    _log.info("CostTable.load_or_profile: profiling %s (%s)", path, reason)
    meta = {k: v for k, v in expect.items() if k not in ("graph_sizes", "max_tokens")}
    meta.update(profile_kwargs.pop("metadata", None) or {})
    table = cls.profile(step_fn, graph_sizes=sizes, max_tokens=max_tokens, metadata=meta, **profile_kwargs)
    table.to_json(path)
    return table


def mismatch(table, expect: Mapping[str, Any]) -> str | None:
    """Why a cached table does not describe the deployment ``expect`` describes (None: it does)."""
    for key, want in expect.items():
        if key == "graph_sizes":
            have: Any = list(table.graph_sizes)
        elif key == "max_tokens":
            have = table.max_tokens
        else:
            have = table.metadata.get(key, "<missing>")
        if have != want:
            return f"{key} is {have!r}, expected {want!r}"
    return None
