"""Measuring a step cost table: timers and the measurement loop behind ``CostTable.profile``."""
from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


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


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def measure(step_fn: Callable[[int], Any], counts: Sequence[int], draft_fn: Callable[[int], Any] | None,
            request_counts: Sequence[int], reps: int, warmup: int, dev: torch.device):
    """(verify points {n: ms}, draft points {r: ms} or 0.0, recorded metadata), each point the median of
    ``reps`` timings after ``warmup`` untimed calls. Arguments are already validated."""
    timer, clock = _make_timer(dev)

    def one(fn: Callable[[int], Any], arg: int) -> float:
        for _ in range(warmup):
            fn(arg)
        return float(statistics.median(timer(fn, arg) for _ in range(reps)))

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
