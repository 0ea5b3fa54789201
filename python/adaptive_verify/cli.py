"""The `adaptive-verify` command.

    adaptive-verify bench planner [options]   planner microbenchmark (CPU; CUDA too when available)
    adaptive-verify info                      how the extension was built and whether CUDA can run
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

BENCHMARKS = {"planner": "adaptive_verify.bench.planner"}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="adaptive-verify", description="Adaptive verification for speculative decoding.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run a benchmark", add_help=False)
    b.add_argument("area", choices=sorted(BENCHMARKS), help="which benchmark")
    sub.add_parser("info", help="build information")
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench":
        import importlib

        return importlib.import_module(BENCHMARKS[args.area]).main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    import adaptive_verify

    print(json.dumps(adaptive_verify.build_info(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
