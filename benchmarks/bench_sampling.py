"""Rejection-sampling benchmark; same as `adaptive-verify bench sampling` (see adaptive_verify/bench/sampling.py)."""
import sys

from adaptive_verify.bench.sampling import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
