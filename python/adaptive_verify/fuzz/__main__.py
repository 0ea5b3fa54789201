"""python -m adaptive_verify.fuzz: a seeded fuzz campaign of the public API (see the package docstring).

    python -m adaptive_verify.fuzz --minutes 10                 # as many calls as fit
    python -m adaptive_verify.fuzz --calls 100000 --jobs 2 --json campaign.json --markdown campaign.md
    python -m adaptive_verify.fuzz --seed 3 --case 'plan_verification:117'   # one case, in this process

Exit status 1 when a case failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from .core import PASS, run_case
from .ops import OPS, known, make_case
from .runner import markdown, run_campaign


def _one(seed: int, spec: str) -> int:
    op, _, index = spec.rpartition(":")
    if not known(op) or not index.isdigit():
        print(f"--case must be 'op:index' with op one of {sorted(OPS)}, got {spec!r}", file=sys.stderr)
        return 2
    case = make_case(seed, op, int(index))
    outcome, detail = run_case(case)
    print(f"{op}:{index} ({case.kind}, {case.what}): {outcome} {detail}")
    if outcome not in PASS:
        print("the call again, uncaught:")
        try:
            result = make_case(seed, op, int(index)).call()
            print(f"returned {type(result).__name__}")
        except Exception:  # noqa: BLE001 - shown to the person debugging
            traceback.print_exc()
    return 0 if outcome in PASS else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptive_verify.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, help="run until this much time has passed")
    ap.add_argument("--calls", type=int, help="run this many cases (the first of --minutes and --calls ends it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", help=f"comma-separated subset of: {', '.join(OPS)}")
    ap.add_argument("--chunk", type=int, default=250, help="cases per worker process")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    ap.add_argument("--json", help="write the report (counts, failures) here")
    ap.add_argument("--markdown", help="write the counts table here")
    ap.add_argument("--case", help="run one case 'op:index' in this process and show its outcome")
    args = ap.parse_args(argv)
    if args.case:
        return _one(args.seed, args.case)
    if args.minutes is None and args.calls is None:
        ap.error("give --minutes or --calls")
    ops = None
    if args.ops:
        ops = [o.strip() for o in args.ops.split(",")]
        unknown = [o for o in ops if o not in OPS]
        if unknown:
            ap.error(f"unknown ops {unknown}; choose from {list(OPS)}")
    last = [0.0]

    def progress(rep):
        if time.monotonic() - last[0] > 30:
            last[0] = time.monotonic()
            print(f"[{rep.seconds:7.0f} s] {rep.calls} calls, {len(rep.failing())} failures", flush=True)

    rep = run_campaign(args.seed, ops=ops, calls=args.calls, minutes=args.minutes, chunk=args.chunk, jobs=args.jobs,
                       progress=progress)
    table = markdown(rep)
    print(table)
    print(f"{rep.calls} calls in {rep.seconds:.0f} s ({rep.processes} processes), seed {rep.seed}")
    for f in rep.failures:
        print(f"{f['outcome']}: {f['op']}:{f['index']} ({f['what']}) "
              f"{f['detail'][:300]}\n    {f['repro']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep.to_json(), fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table)
    return 1 if rep.failing() else 0


if __name__ == "__main__":
    sys.exit(main())
