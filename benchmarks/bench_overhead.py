"""Host time per call of each per-step op: public call vs raw extension call vs torch; same as
`adaptive-verify bench overhead` (see adaptive_verify/bench/overhead.py)."""
import sys

from adaptive_verify.bench.overhead import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
