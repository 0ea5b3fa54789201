"""`adaptive-verify sweep` and `adaptive-verify profiles`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

SWEEP_HELP = """\
Simulate a serving loop at each concurrency for no speculation, every fixed k and the adaptive planner
(greedy, lagged, and global as an upper bound), and show the throughput / per-user-speed Pareto frontier.
The library's real planner (its C++ CPU kernel) makes every adaptive decision.

Inputs: a bundled profile (--profile NAME, see `adaptive-verify profiles`), a profile JSON file
(--profile FILE.json), or your own cost table and acceptance model (--cost-table FILE --acceptance FILE):
  cost table   CostTable.to_json() output, e.g. from CostTable.profile on your GPU; its max_tokens is the
               token capacity per step
  acceptance   {"acceptance": {"conditional": [...], ...}, "drafter": {"num_drafts": K, "kind": "block"},
                "workload": {"prompt_len": 1024, "output_len": 512}}   (workload optional)

Writes OUT/sweep.csv, OUT/sweep.json and OUT/sweep.png (Pareto frontier and throughput vs concurrency).
Exit status: 0 on success; 1 when an input cannot be used (the message says why); 2 on a bad command line.
"""


class _InputError(Exception):
    pass


def _int_list(name: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise _InputError(f"{name} must be a comma-separated list of ints, got {text!r}") from None
    if not vals:
        raise _InputError(f"{name} must list at least one value")
    for v in vals:
        if v < 1:
            raise _InputError(f"{name} values must be >= 1, got {v}")
    return vals


def add_parsers(sub) -> None:
    s = sub.add_parser("sweep", help="simulate policies x concurrency; Pareto frontier", description=SWEEP_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help="bundled profile name or profile JSON (default dsv4-pro-8xb300)")
    s.add_argument("--cost-table", metavar="FILE", help="CostTable JSON (with --acceptance)")
    s.add_argument("--acceptance", metavar="FILE", help="acceptance/drafter/workload JSON (with --cost-table)")
    s.add_argument("--concurrency", default=None, metavar="LIST", help="e.g. 1,2,4,...,256 (the default)")
    s.add_argument("--policies", default=None, metavar="LIST",
                   help="e.g. none,k1,k7,greedy,lagged,global (default: none, every k, greedy, lagged, global)")
    s.add_argument("--steps", type=int, default=400, help="measured steps per point (default %(default)s; "
                   "concurrency c < 16 runs steps * (16 // c))")
    s.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    s.add_argument("--out", default=None, metavar="DIR", help="output folder (default sweep-<profile name>)")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("profiles", help="list the bundled simulator profiles")


def _load(args):
    from ..cost import CostTable
    from .model import Acceptance, Drafter, Profile, Workload, load_profile_file
    from .profiles import PROFILES, get_profile

    if args.cost_table or args.acceptance:
        if args.profile is not None:
            raise _InputError("give either --profile or --cost-table with --acceptance, not both")
        if not (args.cost_table and args.acceptance):
            raise _InputError("--cost-table and --acceptance go together: give both")
        for path in (args.cost_table, args.acceptance):
            if not os.path.isfile(path):
                raise _InputError(f"{path}: no such file")
        table = CostTable.from_json(args.cost_table)
        try:
            with open(args.acceptance) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise _InputError(f"{args.acceptance}: not valid JSON ({e})") from None
        where = args.acceptance
        if not isinstance(data, dict):
            raise _InputError(f"{where}: expected a JSON object with 'acceptance' and 'drafter'")
        for key in ("acceptance", "drafter"):
            if key not in data:
                raise _InputError(f"{where}: missing key {key!r}")
        name = os.path.splitext(os.path.basename(args.cost_table))[0]
        return Profile(name=name, description=f"{args.cost_table} + {args.acceptance}", cost_table=table,
                       acceptance=Acceptance.from_dict(data["acceptance"], f"{where}: acceptance"),
                       drafter=Drafter.from_dict(data["drafter"], f"{where}: drafter"),
                       workload=Workload.from_dict(data["workload"], f"{where}: workload") if "workload" in data
                       else Workload())
    name = args.profile or "dsv4-pro-8xb300"
    if name in PROFILES:
        return get_profile(name)
    if name.endswith(".json") or os.path.sep in name:
        if not os.path.isfile(name):
            raise _InputError(f"{name}: no such file")
        return load_profile_file(name)
    raise _InputError(f"unknown profile {name!r}; bundled profiles: {', '.join(sorted(PROFILES))} "
                      "(or give a profile .json file)")


def run_sweep(args) -> int:
    from .sweep import DEFAULT_CONCURRENCY, sweep

    prog = "adaptive-verify sweep"
    try:
        profile = _load(args)
        cs = _int_list("--concurrency", args.concurrency) if args.concurrency else list(DEFAULT_CONCURRENCY)
        pols = [p for p in args.policies.replace(" ", "").split(",") if p] if args.policies else None
        if args.steps < 1:
            raise _InputError(f"--steps must be >= 1, got {args.steps}")
        if args.seed < 0:
            raise _InputError(f"--seed must be >= 0, got {args.seed}")
        start = time.perf_counter()
        result = sweep(profile, concurrency=cs, policies=pols, steps=args.steps, seed=args.seed,
                       progress=not args.quiet)
        elapsed = time.perf_counter() - start
        out = args.out or f"sweep-{profile.name}"
        paths = result.write(out, plot=not args.no_plot)
    except (_InputError, ValueError, TypeError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    print(f"profile {profile.name}: {profile.description}")
    print(result.table())
    print(f"\n{len(result.rows)} points in {elapsed:.1f} s; wrote {', '.join(paths.values())}")
    return 0


def run_profiles() -> int:
    from .profiles import list_profiles

    for name, desc in list_profiles():
        print(f"{name:<20} {desc}")
    return 0
