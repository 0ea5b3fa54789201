"""Where adaptive verification falls below the best fixed k, under each adaptive-overhead preset.

    python benchmarks/sim_overheads.py [--seeds 3] [--steps 400] [--profiles dsv4-pro-8xb300,llama3-70b-8xh200]

For each bundled profile and each seed, `sweep` runs no speculation, every fixed k and the adaptive
policies (greedy, lagged) at the default concurrencies; no speculation and fixed k do not depend on the
preset (they pay no adaptive overhead), so they run once per seed. Per concurrency the table gives the best
fixed k (highest mean tokens/s over the seeds) and, per preset, adaptive / best fixed k: the mean over
seeds of the per-seed ratio (paired: the same seed's draws for both) and its range over the seeds.
Prints markdown.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from adaptive_verify.sim import get_profile, sweep
from adaptive_verify.sim.overhead import OVERHEAD_PRESETS

ADAPTIVE = ("lagged", "greedy")


def run(profile_name: str, seeds: int, steps: int) -> dict:
    prof = get_profile(profile_name)
    K = prof.drafter.num_drafts
    fixed = ["none"] + [f"k{k}" for k in range(1, K + 1)]
    out = {"fixed": [], "adaptive": {p: [] for p in OVERHEAD_PRESETS}}
    for s in range(seeds):
        out["fixed"].append(sweep(prof, policies=fixed, steps=steps, seed=s))
        for preset in OVERHEAD_PRESETS:
            out["adaptive"][preset].append(sweep(prof, policies=list(ADAPTIVE), steps=steps, seed=s, overhead=preset))
    return out


def table(name: str, res: dict) -> str:
    cs = res["fixed"][0].concurrencies()
    ks = [p for p in res["fixed"][0].policies() if p.startswith("k")]
    tput = lambda r, p, c: r.get(p, c)["tokens_per_s"]  # noqa: E731
    lines = [f"### {name}", "", "| c | best fixed k (tok/s) | " + " | ".join(
        f"{a} / best k, {p}" for a in ADAPTIVE for p in OVERHEAD_PRESETS) + " |",
        "|---:|---|" + "---:|" * (len(ADAPTIVE) * len(OVERHEAD_PRESETS))]
    for c in cs:
        best = max(ks, key=lambda k: np.mean([tput(r, k, c) for r in res["fixed"]]))
        best_t = np.mean([tput(r, best, c) for r in res["fixed"]])
        cells = []
        for a in ADAPTIVE:
            for p in OVERHEAD_PRESETS:
                ratios = [tput(ra, a, c) / tput(rf, best, c) for ra, rf in zip(res["adaptive"][p], res["fixed"])]
                mean = np.mean(ratios)
                cells.append(f"{100 * (mean - 1):+.1f}% ({100 * (min(ratios) - 1):+.1f}..{100 * (max(ratios) - 1):+.1f})")
        lines.append(f"| {c} | {best} ({best_t:.0f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--profiles", default="dsv4-pro-8xb300,llama3-70b-8xh200")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    for name in args.profiles.split(","):
        print(table(name, run(name, args.seeds, args.steps)), end="\n\n", flush=True)
    print(f"({time.perf_counter() - start:.0f} s; seeds 0..{args.seeds - 1}, {args.steps} steps per point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
