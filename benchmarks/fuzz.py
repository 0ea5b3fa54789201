"""A seeded fuzz campaign of the public API, each chunk of calls in its own process; the same command as
`python -m adaptive_verify.fuzz` (see adaptive_verify/fuzz/ and docs/fuzzing.md), e.g.

    python benchmarks/fuzz.py --calls 100000 --jobs 2 --json campaign.json --markdown campaign.md
"""
import sys

from adaptive_verify.fuzz.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
