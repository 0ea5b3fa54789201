"""Planner microbenchmark; same as `adaptive-verify bench planner` (see adaptive_verify/bench/planner.py)."""
import sys

from adaptive_verify.bench.planner import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
