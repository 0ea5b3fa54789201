"""Verification-attention benchmark; same as `adaptive-verify bench attention` (see adaptive_verify/bench/attention.py)."""
import sys

from adaptive_verify.bench.attention import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
