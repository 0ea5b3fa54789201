"""Timing helpers shared by the benchmarks: medians, CUDA events, launch counts."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def host_time_us(fn: Callable[[], object], *, min_time_s: float = 0.2, warmup: int = 20, max_iters: int = 20000) -> float:
    """Median over 5 batches of the wall time per call (microseconds), on the host clock."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    iters = max(1, min(max_iters, int(min_time_s / 5 / once)))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def cuda_time_us(fn: Callable[[], object], *, iters: int = 200, warmup: int = 20) -> float:
    """Median per-call time (microseconds) of back-to-back calls on the current stream, by CUDA events.

    Includes host launch overhead whenever the host is slower than the device (eager chains)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(samples)


def cuda_graph_time_us(fn: Callable[[], object], *, calls_per_graph: int = 50, replays: int = 20) -> float:
    """Per-call device time with host overhead removed: fn captured calls_per_graph times in one CUDA
    graph, the graph replayed, median per-call time."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls_per_graph)
    return statistics.median(samples)


def cuda_kernel_stats(fn: Callable[[], object], *, calls: int = 10) -> tuple[float, float]:
    """(kernel launches per call, summed kernel duration per call in us) from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name
               and "Memset" not in e.name]
    total_us = sum(e.device_time for e in kernels) if kernels else float("nan")
    return len(kernels) / calls, total_us / calls


def copy_bandwidth_gbps(device, nbytes: int = 1 << 30) -> float:
    """Achieved bandwidth (GB/s, read + write bytes) of a plain tensor copy on `device`: the ceiling a
    streaming kernel is compared with, measured in the same process."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    if src.is_cuda:
        us = cuda_time_us(lambda: dst.copy_(src), iters=10, warmup=3)
    else:
        us = host_time_us(lambda: dst.copy_(src), min_time_s=0.3, warmup=2, max_iters=20)
    return 2 * nbytes / (us * 1e-6) / 1e9
