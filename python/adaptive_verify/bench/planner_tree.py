"""Draft-tree planner microbenchmark: `adaptive-verify bench planner --tree`.

For each R (requests) and N (nodes per request), times one tree plan (budget -> allocation -> query_start_loc,
token_req, positions, tree_mask, token_parent / node / depth) in "global" mode with:

- kernel: the C++ CPU kernel called through the extension with its parameter struct already filled;
- op: ``adaptive_verify.prepare(plan_tree_verification, ..., out=)``'s run (the fast path of a decode loop);
- reference: the readable torch oracle (``adaptive_verify.reference.plan_tree_verification``, Python loops);
- chain: an engine-style torch op chain doing the same job without our kernel and without a host sync (global
  top-B by topk, Theta, argmax, a scatter for the verified nodes, ancestor sets by repeated squaring of the
  parent matrix, the 64-bit masks by a weighted sum, tokens scattered to their offsets).

On a CUDA device it also reports the CUDA kernel's device time, its time per call inside a CUDA graph, and the chain
in a graph. Inputs: EAGLE-2 style trees (4 nodes per level, each under a random node of the level above),
confidences uniform in [0.4, 1] through tree_survival, every request drafts N nodes, the example cost table.
"""
from __future__ import annotations

import ctypes
import datetime
import platform

import torch

from .. import errors, reference
from .._ext import _C
from ..planner import TreeVerifyPlan, plan_tree_verification, resolve_plan_args, tree_survival
from ..planner.launch import launch_plan, make_params
from ..prepared import prepare
from .report import markdown_table
from .timing import cuda_graph_time_us, cuda_kernel_stats, host_time_us

R_VALUES = (1, 64, 256)
N_VALUES = (16, 32, 63)
LEVEL_WIDTH = 4  # nodes per tree level (an EAGLE-2 / SGLang topk=4 tree)


def make_tree_inputs(R: int, N: int, device, seed: int = 0):
    """(conf [R, N], parents [R, N], tree_sizes [R]): level d's 4 nodes each hang from a random node of level d-1."""
    g = torch.Generator().manual_seed(seed)
    j = torch.arange(N)
    level = j // LEVEL_WIDTH
    pick = torch.randint(0, LEVEL_WIDTH, (R, N), generator=g)
    parents = torch.where(level[None, :] == 0, torch.full((R, N), -1), (level[None, :] - 1) * LEVEL_WIDTH + pick)
    parents = parents.clamp(max=N - 1).minimum(j[None, :] - 1).maximum(torch.full((R, N), -1))  # topological
    conf = torch.rand(R, N, generator=g) * 0.6 + 0.4
    sizes = torch.full((R,), N, dtype=torch.int32)
    return conf.to(device), parents.to(torch.int32).to(device), sizes.to(device)


def torch_tree_chain(survival, parents, sizes, verify_cost, draft_cost, num_tokens_padded):
    """Global-argmax budget, allocation and the tree layout's masks with plain torch ops and no host sync.
    Returns (verify_lens [R], budget, tree_mask [T_pad]) (T_pad lanes past the tokens are 0)."""
    R, N = survival.shape
    dev = survival.device
    node = torch.arange(N, device=dev)
    is_cand = node[None, :] < sizes[:, None]
    flat = survival.masked_fill(~is_cand, -1.0).flatten()  # [R*N]
    vals, idx = torch.topk(flat, R * N)  # descending survival: the global order
    gain = vals.clamp(min=0)
    n = torch.arange(R + 1, R + R * N + 1, device=dev).clamp(max=verify_cost.numel() - 1)
    theta = (R + torch.cumsum(gain, 0)) / (draft_cost + verify_cost[n])
    theta0 = (R / (draft_cost + verify_cost[R])).reshape(1)
    budget = torch.argmax(torch.cat([theta0, theta.masked_fill(vals < 0, -1.0)]))
    keep = torch.arange(R * N, device=dev) < budget
    verified = torch.zeros(R * N, dtype=torch.bool, device=dev).scatter_(0, idx, keep).view(R, N)
    lens = verified.sum(1).to(torch.int32)
    # ancestor-or-self sets: A = I + P, squared until paths of any depth are covered (2^6 > 63)
    one_hot = torch.zeros(R, N, N + 1, device=dev).scatter_(2, (parents.long() % (N + 1))[..., None], 1.0)[..., :N]
    A = (torch.eye(N, device=dev)[None] + one_hot).clamp(max=1)
    for _ in range(6):
        A = torch.bmm(A, A).clamp(max=1)
    offset = torch.cumsum(verified.long(), 1)  # 1-based offset of each verified node (the anchor is 0)
    weight = torch.where(verified, torch.ones_like(offset) << offset, torch.zeros_like(offset))  # [R, N]
    masks = 1 + (A.long() * weight[:, None, :]).sum(2)  # [R, N]: the anchor, itself and its verified ancestors
    starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long, device=dev), 1 + lens.long()]), 0)  # [R + 1]
    tree_mask = torch.zeros(num_tokens_padded + 1, dtype=torch.long, device=dev)
    tree_mask.scatter_(0, starts[:R], torch.ones(R, dtype=torch.long, device=dev))  # anchors
    dest = torch.where(verified, starts[:R, None] + offset, torch.full_like(offset, num_tokens_padded))
    tree_mask.scatter_(0, dest.flatten(), masks.flatten())
    return lens, budget, tree_mask[:num_tokens_padded]


def bench_tree_cpu(R: int, N: int, ct, *, min_time_s: float) -> dict:
    conf, parents, sizes = make_tree_inputs(R, N, "cpu")
    survival = tree_survival(conf, parents, sizes)
    a = resolve_plan_args(survival, sizes, ct, mode="global", parents=parents)
    out = TreeVerifyPlan.allocate(a.num_reqs_padded, a.num_tokens_padded, "cpu")
    params = make_params(a, out, out.budget, out.expected_tokens, errors.error_buffer("cpu"))
    address, plan = ctypes.addressof(params), _C.plan
    kernel = host_time_us(lambda: plan(address, False, 0), min_time_s=min_time_s)
    op = host_time_us(prepare(plan_tree_verification, survival, parents, sizes, ct, out=out).run,
                      min_time_s=min_time_s)
    ref = host_time_us(lambda: reference.plan_tree_verification(survival, parents, sizes, ct), min_time_s=min_time_s,
                       warmup=1, max_iters=20)
    vc = ct.verify_array(a.R + a.budget_cap, "cpu")
    Tp = a.num_tokens_padded
    chain = host_time_us(lambda: torch_tree_chain(survival, parents, sizes, vc, a.draft_cost, Tp), min_time_s=min_time_s)
    survival_us = host_time_us(lambda: tree_survival(conf, parents, sizes), min_time_s=min_time_s)
    # The chain is only a fair baseline if it computes the same thing (ties aside: these survivals have none).
    lens, budget, mask = torch_tree_chain(survival, parents, sizes, vc, a.draft_cost, Tp)
    got = plan_tree_verification(survival, parents, sizes, ct)
    agrees = int(budget) == int(got.budget) and torch.equal(lens, got.verify_lens) and torch.equal(mask, got.tree_mask)
    return dict(R=R, N=N, budget=int(got.budget), kernel_us=kernel, op_us=op, reference_us=ref, chain_us=chain,
                chain_over_kernel=chain / kernel, reference_over_kernel=ref / kernel, chain_agrees=agrees,
                tree_survival_us=survival_us)


def bench_tree_cuda(R: int, N: int, ct) -> dict:
    dev = torch.device("cuda")
    conf, parents, sizes = make_tree_inputs(R, N, dev)
    survival = tree_survival(conf, parents, sizes)
    a = resolve_plan_args(survival, sizes, ct, mode="global", parents=parents)
    out = TreeVerifyPlan.allocate(a.num_reqs_padded, a.num_tokens_padded, dev)
    err = errors.error_buffer(dev)
    run = lambda: launch_plan(a, out, out.budget, out.expected_tokens, err)  # noqa: E731
    launches, kernel_us = cuda_kernel_stats(run)
    graph_us = cuda_graph_time_us(run)
    run()
    cpu = plan_tree_verification(survival.cpu(), parents.cpu(), sizes.cpu(), ct)
    agrees = all(torch.equal(getattr(out, f).cpu(), getattr(cpu, f)) for f in ("verify_lens", "budget", "token_req",
                                                                                "tree_mask", "token_node"))
    vc = ct.verify_array(a.R + a.budget_cap, dev)
    chain = lambda: torch_tree_chain(survival, parents, sizes, vc, a.draft_cost, a.num_tokens_padded)  # noqa: E731
    chain_launches, _ = cuda_kernel_stats(chain)
    chain_graph_us = cuda_graph_time_us(chain)
    return dict(R=R, N=N, launches=launches, kernel_us=kernel_us, graph_us=graph_us, chain_launches=chain_launches,
                chain_graph_us=chain_graph_us, chain_graph_over_graph=chain_graph_us / graph_us, cpu_agrees=agrees)


CPU_COLUMNS = [("R", "R"), ("N", "N"), ("budget", "budget"), ("kernel_us", "kernel us"), ("op_us", "op us"),
               ("reference_us", "reference us"), ("chain_us", "torch chain us"), ("chain_over_kernel", "chain / kernel"),
               ("reference_over_kernel", "reference / kernel"), ("chain_agrees", "chain agrees"),
               ("tree_survival_us", "tree_survival us")]
CUDA_COLUMNS = [("R", "R"), ("N", "N"), ("launches", "launches/call"), ("kernel_us", "kernel us"),
                ("graph_us", "in graph us"), ("chain_launches", "chain launches"), ("chain_graph_us", "chain in graph us"),
                ("chain_graph_over_graph", "chain / ours (graph)"), ("cpu_agrees", "== CPU kernel")]


def run(ct, r_values=R_VALUES, n_values=N_VALUES, *, use_cuda: bool, min_time_s: float = 0.2) -> dict:
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": [bench_tree_cpu(R, N, ct, min_time_s=min_time_s) for R in r_values for N in n_values],
    }
    if use_cuda:
        result["gpu"] = torch.cuda.get_device_name()
        result["cuda"] = [bench_tree_cuda(R, N, ct) for R in r_values for N in n_values]
    return result


def report(result: dict) -> str:
    lines = [
        f"## Tree planner ({result['date']}, torch {result['torch']}, {result['threads']} CPU threads)",
        "",
        "Global mode, EAGLE-2 style trees (4 nodes per level), confidences U[0.4, 1] through tree_survival, every "
        "request drafts N nodes, example cost table. Times are medians per call. 'kernel' is the C++ CPU kernel via "
        "the extension; 'op' the prepared call's run (adaptive_verify.prepare); 'chain' an engine-style torch op chain "
        "computing the same budget, verify_lens and tree_mask ('chain agrees' checks all three).",
        "",
        markdown_table(result["cpu"], CPU_COLUMNS),
    ]
    if "cuda" in result:
        lines += ["", f"### CUDA: {result['gpu']}", "", markdown_table(result["cuda"], CUDA_COLUMNS)]
    return "\n".join(lines) + "\n"
