"""choose_draft_depth microbenchmark: `adaptive-verify bench planner --depth`.

For each R and K, the decision of (depth, budget) over depths 0..K on the bundled example cost table priced per
level (uniform levels), timed as:

- kernel: the C++ CPU kernel through the extension with its parameter struct already filled (one walk, then per
  depth the buckets counted again and the budget searched);
- op: the public ``choose_draft_depth`` including argument validation and the per-depth costs;
- per-depth budgets (the baseline, in the same process): what a caller without the op would run, one
  ``choose_budget`` kernel call per depth (max_verify = D, the fixed cost of depth D), K + 1 raw calls, plus the
  host's comparison of their Theta (not timed: the baseline is only faster for it);
- one budget: a single choose_budget kernel call, the floor the depth decision adds to.

On a CUDA device also the CUDA kernel's device time, its time per call in a CUDA graph and the eager op.
Inputs: confidences uniform in [0.4, 1], every request may draft K.
"""
from __future__ import annotations

import ctypes
import torch

from .. import errors
from .._ext import _C
from ..cost import CostTable
from ..planner import choose_draft_depth, resolve_plan_args
from ..planner.depth import depth_costs, fill_depths
from ..planner.launch import launch, make_params, workspace_for
from .planner import example_cost_table, make_inputs
from .report import cpu_cuda_report, cpu_cuda_result
from .timing import cuda_graph_time_us, cuda_kernel_stats, cuda_time_us, host_time_us

R_VALUES = (1, 16, 64, 256, 1024)
K_VALUES = (4, 8)

CPU_COLUMNS = [("R", "R"), ("K", "K"), ("depth", "depth"), ("budget", "budget"), ("kernel_us", "kernel (us)"),
               ("op_us", "op (us)"), ("per_depth_us", "K+1 budgets (us)"), ("one_budget_us", "one budget (us)"),
               ("per_depth_over_kernel", "K+1 budgets / kernel")]
CUDA_COLUMNS = [("R", "R"), ("K", "K"), ("kernel_us", "kernel (us)"), ("graph_us", "in graph (us)"),
                ("eager_op_us", "eager op (us)"), ("cpu_agrees", "== CPU kernel")]


def depth_table(K: int) -> CostTable:
    """The example table with its drafter priced per level (K levels, uniform)."""
    d = example_cost_table().to_dict()
    d["draft_levels"] = K
    return CostTable.from_dict(d)


def _depth_params(survival, drafts, ct, out):
    a = resolve_plan_args(survival, drafts, ct, mode="global", allowed_modes=("global",))
    p = make_params(a, None, out[1], out[1], errors.error_buffer(survival.device))
    p.expected_tokens = None
    fill_depths(p, a, ct, depth_costs(ct, a.R, a.K), 0, a.K, None)
    p.depth_out = out[0].data_ptr()
    return a, p


def bench_cpu(R: int, K: int, *, min_time_s: float) -> dict:
    ct = depth_table(K)
    conf, drafts = make_inputs(R, K, "cpu")
    survival = torch.cumprod(conf, 1)
    out = (torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int32))
    _, p = _depth_params(survival, drafts, ct, out)
    address, plan = ctypes.addressof(p), _C.plan
    kernel = host_time_us(lambda: plan(address, False, 0), min_time_s=min_time_s)
    op = host_time_us(lambda: choose_draft_depth(survival, drafts, ct, out=out), min_time_s=min_time_s)
    # The baseline: one budget-only planner call per depth, each with its depth's fixed cost.
    budgets = []
    for d in range(1, K + 1):
        a = resolve_plan_args(survival, drafts, ct, mode="global", max_verify=d, allowed_modes=("global",))
        a.draft_cost = float(ct.fixed_cost(R, d))
        q = make_params(a, None, out[1], out[1], errors.error_buffer("cpu"))
        q.expected_tokens = None
        budgets.append((q, ctypes.addressof(q)))
    addresses = [addr for _, addr in budgets]
    per_depth = host_time_us(lambda: [plan(x, False, 0) for x in addresses], min_time_s=min_time_s)
    one = host_time_us(lambda: plan(addresses[-1], False, 0), min_time_s=min_time_s)
    depth, budget = choose_draft_depth(survival, drafts, ct)
    return dict(R=R, K=K, depth=int(depth), budget=int(budget), kernel_us=kernel, op_us=op, per_depth_us=per_depth,
                one_budget_us=one, per_depth_over_kernel=per_depth / kernel)


def bench_cuda(R: int, K: int) -> dict:
    dev = torch.device("cuda")
    ct = depth_table(K)
    conf, drafts = make_inputs(R, K, dev)
    survival = torch.cumprod(conf, 1)
    out = (torch.zeros((), dtype=torch.int32, device=dev), torch.zeros((), dtype=torch.int32, device=dev))
    a, p = _depth_params(survival, drafts, ct, out)
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    run = lambda: launch(p, dev, "choose_draft_depth")  # noqa: E731
    launches, kernel_us = cuda_kernel_stats(run)
    graph_us = cuda_graph_time_us(run)
    run()
    cpu = choose_draft_depth(survival.cpu(), drafts.cpu(), ct)
    agrees = (int(out[0]), int(out[1])) == (int(cpu[0]), int(cpu[1]))
    eager_us = cuda_time_us(lambda: choose_draft_depth(survival, drafts, ct, out=out))
    return dict(R=R, K=K, launches=launches, kernel_us=kernel_us, graph_us=graph_us, eager_op_us=eager_us,
                cpu_agrees=agrees)


def run(r_values=R_VALUES, k_values=K_VALUES, *, use_cuda: bool = False, min_time_s: float = 0.2) -> dict:
    return cpu_cuda_result("depth", [(R, K) for R in r_values for K in k_values], bench_cpu, bench_cuda,
                           use_cuda=use_cuda, min_time_s=min_time_s)


def report(result: dict) -> str:
    return cpu_cuda_report(
        "Draft depth: choose_draft_depth",
        "Depths 0..K, confidences U[0.4, 1], every request may draft K, the example cost table priced per level "
        "(uniform). Medians per call. 'kernel': the C++ CPU kernel via the extension; 'op': the public call; "
        "'K+1 budgets': the baseline, one budget-only kernel call per depth 1..K (depth 0 needs none), raw; "
        "'one budget': a single choose_budget kernel call.", result, CPU_COLUMNS, CUDA_COLUMNS)
