"""Confidence-head benchmark; same as `adaptive-verify bench confidence` (see adaptive_verify/bench/confidence.py)."""
import sys

from adaptive_verify.bench.confidence import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
