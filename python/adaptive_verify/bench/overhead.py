"""Host overhead of the Python layer: `adaptive-verify bench overhead`.

For each per-step public op, the eager host time of four calls on the same inputs, in one process:

- free: the free function (same buffers, ``out=`` where the op has it), which validates every argument every call;
- prepared: ``adaptive_verify.prepare`` of that call, built once, then ``handle.run()``: the fast path a decode
  loop takes (no row for draft_margin, which has no prepared form);
- raw: the extension entry point alone, on the parameter struct the prepared call holds (draft_margin: the struct
  its free call built, captured by standing in for ``_C``), so prepared - raw is what the layer costs on the fast
  path;
- torch: the closest chain of torch ops an engine would otherwise write.

Shapes are small on purpose (K = 8, hidden 64, vocabulary 64): the kernels' work is then small next to the
host path, which is what this table measures. Timing: the minimum over rounds of the mean wall time per call
of a batch of calls, rounds interleaving the three callers (the minimum discards rounds another process
interrupted). One torch thread. Targets (issue 15, CPU tensors, R = 256, K = 8): the prepared call at most 3 us
above raw for plan_verification, and survival + plan prepared at least 2x faster than the torch chain (cumprod,
topk, scatter_add, cumsum). On CUDA tensors the same table is the time to enqueue; under a CUDA
graph the layer costs nothing, since a replay runs no Python.
"""
from __future__ import annotations

import ctypes
import datetime
import importlib
import os
import platform
import time
from typing import Callable, Optional

import torch

from .. import _binding
from ..confidence import confidence, draft_margin
from ..cost import CostTable
from ..planner import VerifyPlan, choose_budget, plan_verification, prefix_survival
from .._ext import _C
from .._validate import stream_of
from ..planner.prepared import PreparedPlan
from ..prepared import Prepared, prepare
from ..sampling import rejection_sample, sample
from ..stats import AcceptanceStats
from .report import cli_main, markdown_table

R_VALUES = (1, 64, 256)
K = 8
HIDDEN = 64
VOCAB = 64

# _C entry point -> (modules calling it, its parameter struct)
_ENTRY_POINTS = {
    "prefix_survival": (("adaptive_verify.planner.survival",), _binding.SurvivalParams),
    "plan": (("adaptive_verify.planner.launch",), _binding.PlannerParams),
    "confidence": (("adaptive_verify.confidence",), _binding.ConfidenceParams),
    "draft_margin": (("adaptive_verify.confidence",), _binding.MarginParams),
    "stats_update": (("adaptive_verify.stats",), _binding.StatsParams),
    "rejection_sample": (("adaptive_verify.sampling",), _binding.RejectionParams),
    "sample": (("adaptive_verify.sampling",), _binding.SampleParams),
}


class _Recorder:
    """Stands in for _C in a module: runs the real entry point and keeps a copy of the struct it was given."""

    def __init__(self, real, name, struct):
        self._real, self._name, self._struct, self.copy = real, name, struct, None

    def __getattr__(self, attr):
        real = getattr(self._real, attr)
        if attr != self._name:
            return real

        def op(address, on_cuda, stream):
            self.copy = self._struct()
            ctypes.memmove(ctypes.addressof(self.copy), address, ctypes.sizeof(self.copy))
            self.on_cuda, self.stream = on_cuda, stream
            return real(address, on_cuda, stream)
        return op


def raw_of(handle) -> Callable[[], object]:
    """The extension entry point of a prepared call alone, on the struct the handle holds (and keeps alive, with
    every tensor it points to)."""
    if isinstance(handle, PreparedPlan):
        fn, addr, device = _C.plan, handle.call.addr, handle.call.a.device
    else:
        fn, addr, device = handle.fn, handle.addr, handle.device
    on_cuda = device.type == "cuda"
    stream = stream_of(device) if on_cuda else 0
    return lambda: (fn(addr, on_cuda, stream), handle)


def raw_call(entry: str, public: Callable[[], object]) -> Callable[[], object]:
    """The extension entry point ``entry`` alone, on the struct ``public()`` builds (every tensor it points to must
    outlive the returned callable: only for ops whose struct points at the caller's tensors and persistent
    buffers alone, as draft_margin's with ``out=``; a prepared call's is raw_of)."""
    modules, struct = _ENTRY_POINTS[entry]
    saved = []
    recorders = []
    for name in modules:
        module = importlib.import_module(name)
        rec = _Recorder(module._C, entry, struct)
        saved.append((module, module._C))
        recorders.append(rec)
        module._C = rec
    try:
        public()
    finally:
        for module, real in saved:
            module._C = real
    rec = next(r for r in recorders if r.copy is not None)
    fn, copy, on_cuda, stream = getattr(saved[0][1], entry), rec.copy, rec.on_cuda, rec.stream
    address = ctypes.addressof(copy)
    return lambda: (fn(address, on_cuda, stream), copy)


CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}


def min_time_us(fns: dict, *, rounds: int, calls: int, clock: str = "wall") -> dict:
    """Minimum over interleaved rounds of the mean time per call of each function. clock "wall" (the default)
    or "thread" (this thread's CPU time: on a shared machine it leaves out the time other processes ran)."""
    now = CLOCKS[clock]
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = now()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (now() - t0) / calls / 1e3)
    return best


def cost_table() -> CostTable:
    return CostTable.from_points({1: 4.0, 64: 4.5, 256: 6.0, 1024: 14.0, 4096: 48.0}, draft_ms=0.8)


def torch_plan_chain(conf, budget: int):
    """The issue's engine-style chain: survival, the top-B survivals, drafts per request, offsets."""
    R, Kd = conf.shape
    s = torch.cumprod(conf.clamp(0, 1), 1)
    _, idx = torch.topk(s.flatten(), budget)
    lens = torch.zeros(R, dtype=torch.int64, device=conf.device).scatter_add_(0, idx // Kd, torch.ones_like(idx))
    return torch.cumsum(lens + 1, 0)


def torch_budget_chain(conf, verify_cost, draft_cost: float):
    """Global budget in torch: survivals sorted, their prefix sums, the argmax of Theta."""
    R = conf.shape[0]
    s = torch.cumprod(conf.clamp(0, 1), 1).flatten()
    p = torch.cumsum(torch.sort(s, descending=True).values, 0)
    n = torch.arange(1, p.numel() + 1, device=conf.device) + R
    return torch.argmax((R + p) / (draft_cost + verify_cost[n]))


def cases(R: int, device) -> list:
    """(name, entry point, free, prepared or None, torch) per row, on inputs that persist across calls."""
    g = torch.Generator().manual_seed(R)
    conf = (torch.rand(R, K, generator=g) * 0.5 + 0.5).to(device)
    drafts = torch.full((R,), K, dtype=torch.int32, device=device)
    survival = torch.empty(R, K, device=device)
    plan = VerifyPlan.allocate(R, R + R * K, device)
    budget_out = torch.empty((), dtype=torch.int32, device=device)
    ct = cost_table()
    verify_cost = ct.verify_array(R + R * K + 1, device)
    B = R * K // 3
    hidden = torch.randn(R, K, HIDDEN, generator=g).to(torch.bfloat16).to(device)
    weight = (torch.randn(HIDDEN, generator=g) / HIDDEN ** 0.5).to(device)
    temperature_k = torch.ones(K, device=device)
    conf_out = torch.empty(R, K, device=device)
    draft_logits = torch.randn(R, K, VOCAB, generator=g).to(torch.bfloat16).to(device)
    margin_out = torch.empty(R, K, device=device)
    T = R * (K + 1)
    logits = torch.randn(T, VOCAB, generator=g).to(torch.bfloat16).to(device)
    qsl = torch.arange(0, T + 1, K + 1, dtype=torch.int32, device=device)
    draft_tokens = torch.randint(0, VOCAB, (R, K), generator=g, dtype=torch.int32).to(device)
    temperature_r = torch.ones(R, device=device)
    seeds = torch.arange(R, dtype=torch.int64, device=device)
    emitted = torch.empty(R, K + 1, dtype=torch.int32, device=device)
    num_emitted = torch.empty(R, dtype=torch.int32, device=device)
    sampled = torch.empty(R, dtype=torch.int32, device=device)
    rows = logits[:R]  # one persistent view: a new slice every call would be a new object (the validating path)
    stats = AcceptanceStats(K, device=device)
    verify_lens = torch.full((R,), K, dtype=torch.int32, device=device)
    accepted = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32).to(device)
    draft_cost = float(ct.draft_cost(R))

    def torch_margin():
        top2 = torch.topk(draft_logits.float(), 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]

    def torch_rejection():
        probs = torch.softmax(logits.float().view(R, K + 1, VOCAB), -1)
        p_x = probs[:, :K].gather(2, draft_tokens.long()[..., None]).squeeze(2)
        acc = torch.cumprod((torch.rand_like(p_x) < p_x).int(), 1).sum(1)
        return torch.multinomial(probs[:, K], 1), acc

    def torch_stats():
        pos = torch.arange(K, device=device)[None, :]
        tried = (pos < verify_lens[:, None]).float()
        ok = (pos < accepted[:, None]).float()
        return (conf * tried).sum(0), ok.sum(0), tried.sum(0)

    surv_args, surv_kw = (conf, drafts), dict(out=survival)
    budget_args, budget_kw = (None, drafts, ct), dict(conf=conf, mode="global", out=budget_out)
    fixed_args, fixed_kw = (survival, drafts), dict(mode="fixed", budget=B, out=plan)
    greedy_args, greedy_kw = (None, drafts, ct), dict(conf=conf, survival_out=survival, mode="greedy", out=plan)
    conf_args, conf_kw = (hidden, weight), dict(bias=0.1, temperature=temperature_k, survival=True, out=conf_out)
    rej_args = (logits, qsl, draft_tokens)
    rej_kw = dict(temperature=temperature_r, seeds=seeds, out=(emitted, num_emitted))
    stats_args = (conf, verify_lens, accepted)
    surv_h = prepare(prefix_survival, *surv_args, **surv_kw)
    fixed_h = prepare(plan_verification, *fixed_args, **fixed_kw)
    return [
        ("prefix_survival", "prefix_survival", lambda: prefix_survival(*surv_args, **surv_kw), surv_h,
         lambda: torch.cumprod(conf.clamp(0, 1), 1)),
        ("choose_budget (conf=, global)", "plan", lambda: choose_budget(*budget_args, **budget_kw),
         prepare(choose_budget, *budget_args, **budget_kw),
         lambda: torch_budget_chain(conf, verify_cost, draft_cost)),
        ("plan_verification (fixed B)", "plan", lambda: plan_verification(*fixed_args, **fixed_kw), fixed_h,
         lambda: torch_plan_chain(conf, B)),
        ("plan_verification (conf=, greedy)", "plan", lambda: plan_verification(*greedy_args, **greedy_kw),
         prepare(plan_verification, *greedy_args, **greedy_kw), lambda: torch_plan_chain(conf, B)),
        ("prefix_survival + plan_verification (fixed B)", None,
         lambda: (prefix_survival(*surv_args, **surv_kw), plan_verification(*fixed_args, **fixed_kw)),
         lambda: (surv_h.run(), fixed_h.run()), lambda: torch_plan_chain(conf, B)),
        ("confidence (H=64, bf16)", "confidence", lambda: confidence(*conf_args, **conf_kw),
         prepare(confidence, *conf_args, **conf_kw),
         lambda: torch.cumprod(torch.sigmoid((hidden.float() @ weight + 0.1) / temperature_k), 1)),
        ("draft_margin (V=64, bf16)", "draft_margin", lambda: draft_margin(draft_logits, out=margin_out), None,
         torch_margin),
        ("rejection_sample (V=64, bf16)", "rejection_sample", lambda: rejection_sample(*rej_args, **rej_kw),
         prepare(rejection_sample, *rej_args, **rej_kw), torch_rejection),
        ("sample (V=64, bf16)", "sample", lambda: sample(rows, temperature_r, seeds, out=sampled),
         prepare(sample, rows, temperature_r, seeds, out=sampled),
         lambda: torch.multinomial(torch.softmax(rows.float(), -1), 1)),
        ("AcceptanceStats.update", "stats_update", lambda: stats.update(*stats_args),
         prepare(stats.update, *stats_args), torch_stats),
    ]


def run(r_values=R_VALUES, *, device: str = "cpu", rounds: int = 30, calls: int = 200, clock: str = "wall") -> dict:
    dev = torch.device(device)
    load = os.getloadavg()[0]  # how shared the machine was: the figures mean most on an idle one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for R in r_values:
            for name, entry, free, prepared, chain in cases(R, dev):
                fns = {"free": free, "torch": chain}
                if prepared is not None:
                    fns["prepared"] = prepared.run if isinstance(prepared, Prepared) else prepared
                if entry is not None:
                    fns["raw"] = raw_of(prepared) if isinstance(prepared, Prepared) else raw_call(entry, free)
                t = min_time_us(fns, rounds=rounds, calls=calls, clock=clock)
                fast = t.get("prepared", t["free"])  # the fastest public path of the op
                row = dict(op=name, R=R, K=K, free_us=t["free"], prepared_us=t.get("prepared"), raw_us=t.get("raw"),
                           torch_us=t["torch"])
                row["overhead_us"] = None if row["raw_us"] is None else fast - row["raw_us"]
                row["torch_over_fast"] = row["torch_us"] / fast
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return dict(date=datetime.date.today().isoformat(), device=str(dev), machine=platform.machine(),
                processor=platform.processor() or platform.machine(), torch=torch.__version__, rounds=rounds,
                calls=calls, clock=clock, load=load, rows=rows)


def targets(result: dict) -> list[str]:
    """The issue's two targets at R = 256, as sentences (met or missed, by how much)."""
    rows = {(r["op"], r["R"]): r for r in result["rows"]}
    out = []
    plan = rows.get(("plan_verification (fixed B)", 256))
    if plan is not None:
        met = "met" if plan["overhead_us"] <= 3.0 else "MISSED"
        out.append(f"plan_verification prepared - raw at R=256: {plan['overhead_us']:.2f} us (target <= 3 us: {met})")
    pair = rows.get(("prefix_survival + plan_verification (fixed B)", 256))
    if pair is not None:
        met = "met" if pair["torch_over_fast"] >= 2.0 else "MISSED"
        out.append(f"survival + plan, torch chain / prepared at R=256: {pair['torch_over_fast']:.2f}x "
                   f"(target >= 2x: {met})")
    return out


def report(result: dict) -> str:
    lines = [f"# Host overhead per call ({result['date']}, {result['processor']}, torch {result['torch']}, "
             f"{result['device']} tensors, one torch thread)", "",
             f"Minimum over {result['rounds']} interleaved rounds of the mean of {result['calls']} calls, "
             f"{result['clock']} clock, load average {result['load']:.1f} at the start. free: the free function (full "
             "validation every call); prepared: adaptive_verify.prepare's handle.run(); raw: the extension entry "
             "point on the struct the prepared call holds (draft_margin: the one its free call builds); torch: the "
             "closest torch chain. fast: prepared where the op has it, else free.", ""]
    cols = [("op", "op"), ("R", "R"), ("free_us", "free us"), ("prepared_us", "prepared us"), ("raw_us", "raw us"),
            ("overhead_us", "fast - raw us"), ("torch_us", "torch us"), ("torch_over_fast", "torch / fast")]
    lines.append(markdown_table(result["rows"], cols))
    lines.append("")
    lines.extend(f"- {t}" for t in targets(result))
    return "\n".join(lines) + "\n"


def _add_arguments(p):
    p.add_argument("--R", type=int, nargs="+", default=list(R_VALUES), help="requests per step (default 1 64 256)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    p.add_argument("--calls", type=int, default=200, help="calls per round (default 200)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall (default) or thread (CPU time of this thread: for shared machines)")


def _run(args) -> dict:
    return run(args.R, device=args.device, rounds=args.rounds, calls=args.calls, clock=args.clock)


def main(argv: Optional[list[str]] = None) -> int:
    return cli_main(argv, prog="adaptive-verify bench overhead", description=__doc__.split("\n")[0],
                    add_arguments=_add_arguments, run=_run, report=report)

