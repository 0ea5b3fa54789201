"""AdaptiveVerifier host cost and lagged regret; same as `adaptive-verify bench verifier`
(see adaptive_verify/bench/verifier.py)."""
import sys

from adaptive_verify.bench.verifier import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
