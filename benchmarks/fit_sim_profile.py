"""The default simulator profile's fit, as a use of `adaptive-verify fit`, and how it compares with the bundled one.

    python benchmarks/fit_sim_profile.py [--out FILE.json] [--seeds N] [--steps N]

Runs exactly this command on vLLM's published DeepSeek-V4-Pro-0813 points (benchmarks/data/):

    adaptive-verify fit benchmarks/data/dsv4-pro-8xb300-published.csv --drafts 7 --tensor-parallel 8 \\
        --prompt-len 192:320 --output-len 384:640 --prefill-chunk 512 --capacity 2048 \\
        --acceptance benchmarks/data/dsv4-pro-8xb300-acceptance.json --out dsv4-pro-8xb300.fit.json

then simulates the bundled dsv4-pro-8xb300 profile at the same points with the same seeds and steps and
prints, per point, the published value, the bundled profile's and the fitted one's, and the fitted
profile's distance from the bundled one (tests/test_sim_fit.py holds that distance to its tolerance).
The acceptance model, workload and capacity are the bundled profile's (set by hand there, see its notes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
POINTS = os.path.join(HERE, "data", "dsv4-pro-8xb300-published.csv")
ACCEPTANCE = os.path.join(HERE, "data", "dsv4-pro-8xb300-acceptance.json")
FIT_ARGS = ["--drafts", "7", "--tensor-parallel", "8", "--prompt-len", "192:320", "--output-len", "384:640",
            "--prefill-chunk", "512", "--capacity", "2048", "--acceptance", ACCEPTANCE]


def compare(fitted_path: str, seeds: int, steps: int) -> list[dict]:
    """Per published point: the bundled profile's and the fitted profile's simulated value (mean over seeds)."""
    from adaptive_verify.sim import get_profile, load_profile_file
    from adaptive_verify.sim.fit import _simulate
    from adaptive_verify.sim.fit_inputs import read_points_csv

    fitted, bundled = load_profile_file(fitted_path), get_profile("dsv4-pro-8xb300")
    rows = []
    for p in read_points_csv(POINTS, 7):
        for metric, published in (("tokens_per_s", p.tokens_per_s), ("tpot_ms", p.tpot_ms)):
            if published is None:
                continue
            sim = {}
            for label, prof in (("bundled", bundled), ("fitted", fitted)):
                runs = [_simulate(prof, p, 7, steps, s)[metric] for s in range(seeds)]
                sim[label] = sum(runs) / len(runs)
            rows.append(dict(policy=p.policy, concurrency=p.concurrency, metric=metric, published=published,
                             held_back=p.policy not in ("none",) and not p.policy.startswith("k"), **sim,
                             fitted_vs_bundled=sim["fitted"] / sim["bundled"] - 1))
    return rows


def main(argv=None) -> int:
    from adaptive_verify import cli

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="dsv4-pro-8xb300.fit.json", help="fitted profile (default %(default)s)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    rc = cli.main(["fit", POINTS, *FIT_ARGS, "--seeds", str(args.seeds), "--steps", str(args.steps),
                   "--out", args.out])
    if rc:
        return rc
    rows = compare(args.out, args.seeds, args.steps)
    print("\n| point | published | bundled profile | fitted profile | fitted vs bundled |\n|---|---:|---:|---:|---:|")
    for r in rows:
        tag = " (held back)" if r["held_back"] else ""
        print(f"| {r['policy']} c={r['concurrency']} {r['metric']}{tag} | {r['published']:.4g} | {r['bundled']:.4g} "
              f"| {r['fitted']:.4g} | {100 * r['fitted_vs_bundled']:+.1f}% |")
    print(json.dumps({"max_abs_fitted_vs_bundled_tokens_per_s": max(
        abs(r["fitted_vs_bundled"]) for r in rows if r["metric"] == "tokens_per_s" and not r["held_back"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
