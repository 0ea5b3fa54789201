"""choose_tree_shape microbenchmark: `adaptive-verify bench planner --tree-shape`.

For each R and beam width k, EAGLE-2-shaped trees of 4 levels (k + 3 k^2 nodes, at most 63), the decision of
(depth, width, budget) over depths 0..4 and widths 1..k on the example cost table priced per level (uniform), timed
as:

- kernel: the C++ CPU kernel through the extension with its parameter struct already filled (per width a walk and
  the width filter, then per depth the buckets counted again and the budget searched);
- op: the public ``choose_tree_shape`` including argument validation and the (W, D) costs;
- per-level kernel / op: the same with ``widths=tree_width_profiles(k, 3)``, every non-increasing per-level profile
  (C(k + 2, 3): 4 at k = 2, 20 at k = 4), the (width, depth) decision per level;
- one tree budget (the baseline, in the same process): the public budget-only tree planner call over the whole
  tree (choose_budget(parents=)), the decision the shape adds to; op / one budget says what deciding the shape
  costs a caller.

On a CUDA device also the CUDA kernel's device time, its time per call in a CUDA graph and the eager op.
Confidences: the top child U[0.4, 1], siblings splitting it.
"""
from __future__ import annotations

import ctypes
import torch

from .._ext import _C
from ..planner import choose_budget, choose_tree_shape, tree_survival, tree_width_profiles
from ..planner.launch import launch
from .planner_depth import depth_table
from .report import cpu_cuda_report, cpu_cuda_result
from .timing import cuda_graph_time_us, cuda_kernel_stats, cuda_time_us, host_time_us

R_VALUES = (1, 16, 64, 256)
K_VALUES = (2, 4)
LEVELS = 4

CPU_COLUMNS = [("R", "R"), ("k", "k"), ("nodes", "nodes"), ("depth", "depth"), ("width", "width"),
               ("budget", "budget"), ("kernel_us", "kernel (us)"), ("op_us", "op (us)"),
               ("level_kernel_us", "per-level kernel (us)"), ("level_op_us", "per-level op (us)"),
               ("one_budget_us", "one tree budget (us)"), ("op_over_budget", "op / one budget")]
CUDA_COLUMNS = [("R", "R"), ("k", "k"), ("kernel_us", "kernel (us)"), ("level_kernel_us", "per-level kernel (us)"),
                ("graph_us", "in graph (us)"),
                ("eager_op_us", "eager op (us)"), ("cpu_agrees", "== CPU kernel")]


def beam_trees(R: int, k: int, device) -> tuple:
    """(survival [R, N], parents [R, N], sizes [R]): full beam trees of LEVELS levels, nodes level by level, beam
    slot b the b-th node of the level before (siblings' confidences fall with their index, so that is its rank)."""
    g = torch.Generator().manual_seed(R * 31 + k)
    parents, level = [-1] * k, list(range(k))
    for _ in range(LEVELS - 1):
        nxt = []
        for p in level[:k]:
            parents += [p] * k
            nxt += list(range(len(parents) - k, len(parents)))
        level = nxt
    N = min(len(parents), _C.PLANNER_MAX_TREE_NODES)
    par = torch.tensor(parents[:N], dtype=torch.int32).repeat(R, 1)
    top = torch.rand(R, N, generator=g) * 0.6 + 0.4
    share = torch.tensor([0.6 ** (j % k) for j in range(N)])
    conf = top * share / sum(0.6 ** i for i in range(k))
    sizes = torch.full((R,), N, dtype=torch.int32)
    return tree_survival(conf, par, sizes).to(device), par.to(device), sizes.to(device)


def _captured_params(fn):
    """The parameter struct the op fills (its launch intercepted once), for timing the raw kernel."""
    from ..planner import tree_shape as module

    held = {}

    def grab(p, device, op):
        held["p"] = p
        return launch(p, device, op)

    real = module.launch
    module.launch = grab
    try:
        fn()
    finally:
        module.launch = real
    return held["p"]


def bench_cpu(R: int, k: int, *, min_time_s: float) -> dict:
    ct = depth_table(LEVELS)
    survival, parents, sizes = beam_trees(R, k, "cpu")
    out = tuple(torch.zeros((), dtype=torch.int32) for _ in range(3))
    op = lambda: choose_tree_shape(survival, parents, sizes, ct, max_width=k, out=out)  # noqa: E731
    p = _captured_params(op)
    address, plan = ctypes.addressof(p), _C.plan
    kernel = host_time_us(lambda: plan(address, False, 0), min_time_s=min_time_s)
    op_us = host_time_us(op, min_time_s=min_time_s)
    profiles = tree_width_profiles(k, LEVELS - 1)
    level_out = (out[0], torch.zeros(LEVELS, dtype=torch.int32), out[2])
    level_op = lambda: choose_tree_shape(survival, parents, sizes, ct, widths=profiles, out=level_out)  # noqa: E731
    lp = _captured_params(level_op)
    level_address = ctypes.addressof(lp)
    level_kernel = host_time_us(lambda: plan(level_address, False, 0), min_time_s=min_time_s)
    level_op_us = host_time_us(level_op, min_time_s=min_time_s)
    budget_out = torch.zeros((), dtype=torch.int32)
    one = host_time_us(lambda: choose_budget(survival, sizes, ct, parents=parents, out=budget_out),
                       min_time_s=min_time_s)
    op()
    return dict(R=R, k=k, nodes=int(sizes[0]), depth=int(out[0]), width=int(out[1]), budget=int(out[2]),
                kernel_us=kernel, op_us=op_us, level_kernel_us=level_kernel, level_op_us=level_op_us, one_budget_us=one,
                op_over_budget=op_us / one)


def bench_cuda(R: int, k: int) -> dict:
    dev = torch.device("cuda")
    ct = depth_table(LEVELS)
    survival, parents, sizes = beam_trees(R, k, dev)
    out = tuple(torch.zeros((), dtype=torch.int32, device=dev) for _ in range(3))
    op = lambda: choose_tree_shape(survival, parents, sizes, ct, max_width=k, out=out)  # noqa: E731
    p = _captured_params(op)
    run = lambda: launch(p, dev, "choose_tree_shape")  # noqa: E731
    launches, kernel_us = cuda_kernel_stats(run)
    level_out = (torch.zeros((), dtype=torch.int32, device=dev), torch.zeros(LEVELS, dtype=torch.int32, device=dev),
                 torch.zeros((), dtype=torch.int32, device=dev))
    profiles = tree_width_profiles(k, LEVELS - 1)
    lp = _captured_params(lambda: choose_tree_shape(survival, parents, sizes, ct, widths=profiles, out=level_out))
    _, level_kernel_us = cuda_kernel_stats(lambda: launch(lp, dev, "choose_tree_shape"))
    graph_us = cuda_graph_time_us(run)
    run()
    cpu = choose_tree_shape(survival.cpu(), parents.cpu(), sizes.cpu(), ct, max_width=k)
    agrees = tuple(int(x) for x in out) == tuple(int(x) for x in cpu)
    return dict(R=R, k=k, launches=launches, kernel_us=kernel_us, level_kernel_us=level_kernel_us,
                graph_us=graph_us, eager_op_us=cuda_time_us(op),
                cpu_agrees=agrees)


def run(r_values=R_VALUES, k_values=K_VALUES, *, use_cuda: bool = False, min_time_s: float = 0.2) -> dict:
    return cpu_cuda_result("tree_shape", [(R, k) for R in r_values for k in k_values], bench_cpu, bench_cuda,
                           use_cuda=use_cuda, min_time_s=min_time_s)


def report(result: dict) -> str:
    return cpu_cuda_report(
        "Tree shape: choose_tree_shape",
        f"Beam trees of {LEVELS} levels (k + {LEVELS - 1} k^2 nodes, at most 63), depths 0..{LEVELS}, widths 1..k, "
        "the example cost table priced per level (uniform). Medians per call. 'kernel': the C++ CPU kernel via the "
        "extension; 'op': the public call; 'one tree budget': the baseline, one choose_budget(parents=) call over "
        "the whole tree (the op, validation included).", result, CPU_COLUMNS, CUDA_COLUMNS)
