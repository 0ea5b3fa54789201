"""Latency targets (policy slo<ms>) and priority classes (--priority) on a bundled profile.

    python benchmarks/sim_slo_priority.py [--profile dsv4-pro-8xb300] [--seeds 3] [--steps 400]

Part 1, step-time targets: `sweep` with none, k3, lagged and slo<ms> at each target; per point the mean over
the seeds of tokens/s, TPOT, the 99th percentile and the longest step. Then seed 0 again with each step
traced: how many steps of each slo policy went over its target, and how many of those could not have
stayed under it (their decodes and prompt chunks alone, verifying no draft, already cost more).

Part 2, priorities: `sweep --priority FRACTION:W` for each weight W (1: the classes differ by chance only),
TPOT per class and total tokens/s (the same numbers as `adaptive-verify sweep --priority F:W --seeds N`).
Prints markdown.
"""
from __future__ import annotations

import argparse
import sys
import time

from adaptive_verify.sim import get_profile, parse_policy, simulate, sweep


def slo_tables(profile, cs, targets, seeds, steps) -> str:
    slos = [f"slo{t:g}" for t in targets]
    res = sweep(profile, concurrency=cs, policies=["none", "k3", "lagged", *slos], steps=steps, seeds=seeds)
    lines = ["| c | policy | tokens/s | TPOT ms | p99 step ms | longest step ms |", "|---:|---|---:|---:|---:|---:|"]
    for c in cs:
        for p in res.policies():
            r = res.get(p, c)
            lines.append(f"| {c} | {p} | {r['tokens_per_s']:.0f} | {r['tpot_ms']:.1f} | {r['p99_step_ms']:.1f} | "
                         f"{r['longest_step_ms']:.1f} |")
    lines += ["", "| c | policy | steps | over the target | of which the B_min step was over |", "|---:|---|---:|---:|---:|"]
    ct, o = profile.cost_table, profile.overhead
    scale = lambda c: max(1, 16 // c)  # noqa: E731  (as sweep: low concurrencies run longer)
    for c in cs:
        for t, p in zip(targets, slos):
            trace: list = []
            simulate(profile, parse_policy(p, profile.drafter.num_drafts), c, steps=steps * scale(c),
                     warmup=(steps // 4) * scale(c), seed=0, trace=trace)
            over = unavoidable = 0
            for R, n, f, _, _, prompt in trace:
                fixed = f * ct.draft_cost(R) + ct.request_ms * R + o.cost(R)
                if fixed + ct.verify_cost(n) > t:
                    over += 1
                    unavoidable += fixed + ct.verify_cost(R + prompt) > t
            lines.append(f"| {c} | {p} | {len(trace)} | {over} | {unavoidable} |")
    return "\n".join(lines)


def priority_table(profile, cs, fraction, weights, seeds, steps) -> str:
    lines = [f"| c | policy | weight | tokens/s | TPOT ms high ({fraction:g}) | TPOT ms low | high / low |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    runs = {w: sweep(profile, concurrency=cs, policies=["none", "k3", "greedy", "lagged"], steps=steps, seeds=seeds,
                     priority=f"{fraction}:{w}") for w in weights}
    for c in cs:
        for p in runs[weights[0]].policies():
            for w in (weights[:1] if p in ("none", "k3") else weights):  # weights do not reach none and fixed k
                r = runs[w].get(p, c)
                lines.append(f"| {c} | {p} | {w:g} | {r['tokens_per_s']:.0f} | {r['tpot_ms_high']:.1f} | "
                             f"{r['tpot_ms_low']:.1f} | {r['tpot_ms_high'] / r['tpot_ms_low']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="dsv4-pro-8xb300")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--concurrency", default="16,64,128,256")
    ap.add_argument("--targets", default="40,60", help="slo targets in ms")
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--weights", default="1,2,4,8")
    args = ap.parse_args(argv)
    profile = get_profile(args.profile)
    cs = [int(x) for x in args.concurrency.split(",")]
    start = time.perf_counter()
    print(f"## {args.profile}: step-time targets\n")
    print(slo_tables(profile, cs, [float(x) for x in args.targets.split(",")], args.seeds, args.steps))
    print(f"\n## {args.profile}: priority classes, fraction {args.fraction:g}\n")
    print(priority_table(profile, cs, args.fraction, [float(x) for x in args.weights.split(",")], args.seeds,
                         args.steps))
    print(f"\n({time.perf_counter() - start:.0f} s; seeds 0..{args.seeds - 1}, {args.steps} steps per point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
