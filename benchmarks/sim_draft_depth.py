"""The draft depth in the simulator: adaptive chains that draft only what plan_draft decides, against the best fixed
k and against the same policies drafting every level (``full_draft``), on the bundled profiles.

    python benchmarks/sim_draft_depth.py --seeds 3 --steps 300 --out benchmarks/results/DATE-sim-draft-depth.md

Every number is adaptive_verify.sim.sweep's (``adaptive-verify sweep --profile P --policies ... --seeds N
--steps S [--full-draft]`` prints the same rows): mean tokens/s over the seeds. The best fixed k is the k with the
highest mean at that concurrency; the gains are ratios of those means.
"""
from __future__ import annotations

import argparse
import datetime
import time

from adaptive_verify.sim import get_profile, sweep

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROFILES = ("llama3-70b-8xh200", "dsv4-pro-8xb300")


def table(name: str, seeds: int, steps: int) -> str:
    profile = get_profile(name)
    K = profile.drafter.num_drafts
    fixed = [f"k{k}" for k in range(1, K + 1)]
    depth = sweep(profile, concurrency=CONCURRENCY, policies=fixed + ["lagged", "global"], steps=steps, seeds=seeds)
    full = sweep(profile, concurrency=CONCURRENCY, policies=["lagged", "global"], steps=steps, seeds=seeds,
                 full_draft=True)
    rows = {(r["policy"], r["concurrency"]): r for r in depth.rows}
    rows.update({(r["policy"] + " full", r["concurrency"]): r for r in full.rows})
    lines = [f"### {name} (K = {K}, drafter: {profile.drafter.kind}, draft_levels = "
             f"{profile.cost_table.draft_levels})", "",
             "| c | best fixed k | tokens/s | lagged | vs best | depth | global | vs best | lagged, full draft | vs best |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in CONCURRENCY:
        best = max(fixed, key=lambda p: rows[(p, c)]["tokens_per_s"])
        b = rows[(best, c)]["tokens_per_s"]
        lag, glob, lag_full = (rows[(p, c)] for p in ("lagged", "global", "lagged full"))
        gain = lambda r: f"{100 * (r['tokens_per_s'] / b - 1):+.1f}%"  # noqa: E731
        lines.append(f"| {c} | {best} | {b:.0f} | {lag['tokens_per_s']:.0f} | {gain(lag)} | "
                     f"{lag['depth_per_step']:.2f} | {glob['tokens_per_s']:.0f} | {gain(glob)} | "
                     f"{lag_full['tokens_per_s']:.0f} | {gain(lag_full)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    start = time.perf_counter()
    parts = [f"## Draft depth in the simulator ({datetime.date.today()}, {a.seeds} seeds, {a.steps} measured steps)",
             ""]
    for name in a.profiles.split(","):
        parts.append(table(name, a.seeds, a.steps))
    parts.append(f"(`python benchmarks/sim_draft_depth.py --seeds {a.seeds} --steps {a.steps}`, "
                 f"{time.perf_counter() - start:.0f} s)")
    text = "\n".join(parts) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
