"""Planner microbenchmark: `adaptive-verify bench planner` (or `python benchmarks/bench_planner.py`).

For each R (requests) and K (drafts per request), times one plan (survival -> budget -> allocation ->
query_start_loc / token_req) in "global" mode, the heaviest (its budget needs the whole canonical order;
run on an earlier step's survivals it is the production lagged budget), with:

- kernel: the C++ CPU kernel called through the extension with its parameter struct already filled (the raw
  extension call: what an engine pays per step once its buffers are set up);
- op: the public ``plan_verification(..., out=)`` including argument validation;
- reference: the readable torch oracle (``adaptive_verify.reference``);
- chain: an engine-style torch op chain doing the same job without our kernel (cumprod, sort via topk,
  cumsum, Theta, argmax, scatter_add, cumsum), with no host sync.

On a CUDA device it also reports the CUDA kernel's device time (profiler kernel duration), its time per
call inside a CUDA graph, kernel launches per call, and the same chain on the GPU, against the cost of an
empty one-kernel launch measured in the same process (the launch-latency floor).
Inputs: confidences uniform in [0.4, 1], every request drafts K tokens, the bundled example cost table.

``--tree`` benchmarks the draft-tree planner instead (bench/planner_tree.py), ``--depth`` the draft-depth
decision, choose_draft_depth (bench/planner_depth.py), ``--tree-shape`` a tree's depth, width and budget,
choose_tree_shape (bench/planner_tree_shape.py).
"""
from __future__ import annotations

import datetime
import platform
import warnings
from typing import Optional

import torch

import ctypes

from .. import errors, reference
from .._ext import _C
from ..cost import CostTable
from ..planner import PlanArgs, VerifyPlan, plan_verification, prefix_survival, resolve_plan_args
from ..planner.launch import launch_plan, make_params
from .report import cli_main, markdown_table
from .timing import cuda_graph_time_us, cuda_kernel_stats, cuda_time_us, host_time_us

R_VALUES = (1, 16, 64, 256, 1024)
K_VALUES = (4, 8, 16)


def example_cost_table() -> CostTable:
    """A staircase typical of a 70B-class dense model at TP8 on H200 (illustrative, not measured)."""
    graph_sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    points = {1: 6.0, 64: 6.3, 128: 6.8, 256: 7.9, 512: 10.2, 1024: 15.1, 2048: 26.0, 4096: 49.0, 8192: 95.0,
              16384: 188.0, 32768: 375.0}
    return CostTable.from_points(points, draft_ms={1: 0.6, 64: 0.8, 256: 1.2, 1024: 2.5}, graph_sizes=graph_sizes,
                                 metadata={"what": "illustrative example for benchmarks, not a measurement"})


def make_inputs(R: int, K: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    conf = (torch.rand(R, K, generator=g) * 0.6 + 0.4).to(device)  # [R, K]
    drafts = torch.full((R,), K, dtype=torch.int32, device=device)  # [R]
    return conf, drafts


def torch_chain(conf: torch.Tensor, drafts: torch.Tensor, verify_cost: torch.Tensor, draft_cost: float):
    """Global-argmax budget + allocation + query_start_loc with plain torch ops and no host sync."""
    R, K = conf.shape
    surv = torch.cumprod(conf.clamp(0, 1), dim=1)  # [R, K]
    is_cand = torch.arange(K, device=conf.device)[None, :] < drafts[:, None]
    flat = surv.masked_fill(~is_cand, -1.0).flatten()  # [R*K]
    vals, idx = torch.topk(flat, R * K)  # sorted, descending
    gain = vals.clamp(min=0)
    n = torch.arange(R + 1, R + R * K + 1, device=conf.device).clamp(max=verify_cost.numel() - 1)
    theta = (R + torch.cumsum(gain, 0)) / (draft_cost + verify_cost[n])  # Theta(B), B = 1..N
    theta0 = (R / (draft_cost + verify_cost[R])).reshape(1)
    theta = torch.cat([theta0, theta.masked_fill(vals < 0, -1.0)])  # B = 0..N, non-candidates excluded
    budget = torch.argmax(theta)  # first maximum = smallest best budget
    keep = (torch.arange(R * K, device=conf.device) < budget).int()
    lens = torch.zeros(R, dtype=torch.int32, device=conf.device).scatter_add_(0, idx // K, keep)
    qsl = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.int32, device=conf.device), 1 + lens]), 0)
    return lens, qsl, budget


def _args(conf, drafts, ct) -> tuple[PlanArgs, torch.Tensor]:
    survival = prefix_survival(conf, drafts)
    return resolve_plan_args(survival, drafts, ct, mode="global"), survival


def bench_cpu(R: int, K: int, ct: CostTable, *, min_time_s: float) -> dict:
    conf, drafts = make_inputs(R, K, "cpu")
    a, survival = _args(conf, drafts, ct)
    out = VerifyPlan.allocate(a.num_reqs_padded, a.num_tokens_padded, "cpu")
    err = errors.error_buffer("cpu")
    params = make_params(a, out, out.budget, out.expected_tokens, err)
    address, plan = ctypes.addressof(params), _C.plan
    kernel = host_time_us(lambda: plan(address, False, 0), min_time_s=min_time_s)
    surv_out = torch.empty_like(survival)
    survival_us = host_time_us(lambda: prefix_survival(conf, drafts, out=surv_out), min_time_s=min_time_s)
    survival_torch_us = host_time_us(lambda: torch.cumprod(conf.clamp(0, 1), 1).masked_fill(
        torch.arange(K)[None, :] >= drafts[:, None], 0.0), min_time_s=min_time_s)
    op = host_time_us(lambda: plan_verification(survival, drafts, ct, mode="global", out=out), min_time_s=min_time_s)
    ref = host_time_us(lambda: reference.plan_verification(survival, drafts, ct, mode="global"), min_time_s=min_time_s,
                       warmup=2, max_iters=200)
    vc = ct.verify_array(a.R + a.budget_cap, "cpu")
    draft_cost = a.draft_cost
    chain = host_time_us(lambda: torch_chain(conf, drafts, vc, draft_cost), min_time_s=min_time_s)
    # The chain is only a fair baseline if it computes the same thing.
    lens, _, budget = torch_chain(conf, drafts, vc, draft_cost)
    plan = plan_verification(survival, drafts, ct, mode="global")
    same = int(budget) == int(plan.budget) and torch.equal(lens, plan.verify_lens)
    return dict(R=R, K=K, budget=int(plan.budget), kernel_us=kernel, op_us=op, reference_us=ref, chain_us=chain,
                survival_us=survival_us, survival_torch_us=survival_torch_us,
                chain_over_kernel=chain / kernel, chain_over_op=chain / op, reference_over_kernel=ref / kernel,
                chain_agrees=same)


PLAN_OUTPUTS = ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req")


def bench_cuda(R: int, K: int, ct: CostTable) -> dict:
    dev = torch.device("cuda")
    conf, drafts = make_inputs(R, K, dev)
    a, survival = _args(conf, drafts, ct)
    out = VerifyPlan.allocate(a.num_reqs_padded, a.num_tokens_padded, dev)
    err = errors.error_buffer(dev)
    run = lambda: launch_plan(a, out, out.budget, out.expected_tokens, err)  # noqa: E731
    launches, kernel_us = cuda_kernel_stats(run)
    graph_us = cuda_graph_time_us(run)
    run()
    cpu = plan_verification(survival.cpu(), drafts.cpu(), ct, mode="global")
    agrees = all(torch.equal(getattr(out, f).cpu(), getattr(cpu, f)) for f in PLAN_OUTPUTS)
    eager_us = cuda_time_us(lambda: plan_verification(survival, drafts, ct, mode="global", out=out))
    vc = ct.verify_array(a.R + a.budget_cap, dev)
    chain = lambda: torch_chain(conf, drafts, vc, a.draft_cost)  # noqa: E731
    chain_launches, chain_kernel_us = cuda_kernel_stats(chain)
    chain_graph_us = cuda_graph_time_us(chain)
    chain_eager_us = cuda_time_us(chain)
    return dict(R=R, K=K, launches=launches, kernel_us=kernel_us, graph_us=graph_us, eager_op_us=eager_us,
                chain_launches=chain_launches, chain_kernel_us=chain_kernel_us, chain_graph_us=chain_graph_us,
                chain_eager_us=chain_eager_us, chain_graph_over_graph=chain_graph_us / graph_us, cpu_agrees=agrees)


def launch_floor_us() -> float:
    """Per-call time of an empty one-kernel op inside a CUDA graph: the floor any single launch pays."""
    x = torch.zeros(1, device="cuda")
    return cuda_graph_time_us(lambda: x.add_(0))


CPU_COLUMNS = [("R", "R"), ("K", "K"), ("budget", "budget"), ("kernel_us", "kernel us"), ("op_us", "op us"),
               ("reference_us", "reference us"), ("chain_us", "torch chain us"),
               ("chain_over_kernel", "chain / kernel"), ("chain_over_op", "chain / op"),
               ("reference_over_kernel", "reference / kernel"), ("chain_agrees", "chain agrees"),
               ("survival_us", "prefix_survival us"), ("survival_torch_us", "torch cumprod us")]
CUDA_COLUMNS = [("R", "R"), ("K", "K"), ("launches", "launches/call"), ("kernel_us", "kernel us"),
                ("graph_us", "in graph us"), ("eager_op_us", "eager op us"), ("chain_launches", "chain launches"),
                ("chain_kernel_us", "chain kernels us"), ("chain_graph_us", "chain in graph us"),
                ("chain_eager_us", "chain eager us"), ("chain_graph_over_graph", "chain / ours (graph)"),
                ("cpu_agrees", "== CPU kernel")]


def run(r_values=R_VALUES, k_values=K_VALUES, *, device: str = "auto", min_time_s: float = 0.2) -> dict:
    warnings.filterwarnings("ignore", message=r"plan_verification\(mode='global'\)")  # one-hot timing only
    ct = example_cost_table()
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": [bench_cpu(R, K, ct, min_time_s=min_time_s) for R in r_values for K in k_values],
    }
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        from .._ext import cuda_available

        if not cuda_available():
            raise RuntimeError("CUDA benchmark requested but CUDA kernels cannot run here")
        result["gpu"] = torch.cuda.get_device_name()
        result["launch_floor_us"] = launch_floor_us()
        result["cuda"] = [bench_cuda(R, K, ct) for R in r_values for K in k_values]
        for row in result["cuda"]:
            row["graph_over_floor"] = row["graph_us"] / result["launch_floor_us"]
    return result


def report(result: dict) -> str:
    lines = [
        f"## Planner ({result['date']}, torch {result['torch']}, {result['threads']} CPU threads)",
        "",
        "Global mode, confidences U[0.4, 1], every request drafts K, example cost table. Times are medians per "
        "call. 'kernel' is the C++ CPU kernel via the extension with validated arguments; 'op' adds the public "
        "function's validation; 'chain' is an engine-style torch op chain computing the same budget and "
        "allocation ('chain agrees' checks it).",
        "",
        markdown_table(result["cpu"], CPU_COLUMNS),
    ]
    if "cuda" in result:
        lines += [
            "",
            f"### CUDA: {result['gpu']}",
            "",
            f"Launch-latency floor (empty one-kernel op, per call inside a CUDA graph): "
            f"{result['launch_floor_us']:.2f} us. 'kernel' is the profiler's kernel duration; 'in graph' the "
            "per-call time when captured in a CUDA graph (what an engine pays); 'eager op' the public call "
            "back to back; '== CPU kernel' checks the outputs against the C++ CPU kernel's.",
            "",
            markdown_table(result["cuda"], CUDA_COLUMNS + [("graph_over_floor", "ours / floor")]),
        ]
    return "\n".join(lines) + "\n"


def _use_cuda(device: str) -> bool:
    use = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use:
        from .._ext import cuda_available

        if not cuda_available():
            raise RuntimeError("CUDA benchmark requested but CUDA kernels cannot run here")
    return use


def _run_tree(args) -> dict:
    from . import planner_tree

    result = planner_tree.run(example_cost_table(), args.reqs or planner_tree.R_VALUES,
                              args.drafts or planner_tree.N_VALUES, use_cuda=_use_cuda(args.device),
                              min_time_s=args.min_time)
    result["tree"] = True
    return result


def _run_depth(args) -> dict:
    from . import planner_depth

    return planner_depth.run(args.reqs or planner_depth.R_VALUES, args.drafts or planner_depth.K_VALUES,
                             use_cuda=_use_cuda(args.device), min_time_s=args.min_time)


def _run_tree_shape(args) -> dict:
    from . import planner_tree_shape

    return planner_tree_shape.run(args.reqs or planner_tree_shape.R_VALUES,
                                  args.drafts or planner_tree_shape.K_VALUES, use_cuda=_use_cuda(args.device),
                                  min_time_s=args.min_time)


def _report(result: dict) -> str:
    if result.get("tree_shape"):
        from . import planner_tree_shape

        return planner_tree_shape.report(result)
    if result.get("depth"):
        from . import planner_depth

        return planner_depth.report(result)
    if result.get("tree"):
        from . import planner_tree

        return planner_tree.report(result)
    return report(result)


def main(argv: Optional[list[str]] = None) -> int:
    def add_arguments(ap):
        ap.add_argument("--reqs", type=int, nargs="+", default=None, help=f"R values (default {list(R_VALUES)}; "
                        "with --tree 1 64 256)")
        ap.add_argument("--drafts", type=int, nargs="+", default=None, help=f"K values (default {list(K_VALUES)}); "
                        "with --tree N, nodes per request (default 16 32 63)")
        ap.add_argument("--tree", action="store_true", help="the draft-tree planner (plan_tree_verification)")
        ap.add_argument("--depth", action="store_true", help="the draft-depth decision (choose_draft_depth)")
        ap.add_argument("--tree-shape", action="store_true", help="a draft tree's depth, width and budget "
                        "(choose_tree_shape; --drafts: the beam widths k)")
        ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
        ap.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per measurement")

    def run_args(a):
        if a.tree:
            return _run_tree(a)
        if a.depth:
            return _run_depth(a)
        if a.tree_shape:
            return _run_tree_shape(a)
        return run(a.reqs or R_VALUES, a.drafts or K_VALUES, device=a.device, min_time_s=a.min_time)

    return cli_main(argv, prog="adaptive-verify bench planner", description=__doc__.split("\n\n")[0],
                    add_arguments=add_arguments, report=_report, run=run_args)

if __name__ == "__main__":
    raise SystemExit(main())
