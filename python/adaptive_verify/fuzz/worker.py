"""The fuzz worker process: ``python -m adaptive_verify.fuzz.worker`` reads a job, ``{"seed": S, "cases": [[op,
index], ...]}``, as JSON on stdin and prints one JSON line per case as soon as it is judged (so when the process
dies, the parent knows exactly which cases finished and which one was running).

Each line: ``{"op", "index", "kind", "outcome", "detail", "what", "seconds"}``. A generator that
raises (a bug of the fuzzer, not of the library) reports the outcome ``generator_error``.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback

#: Address space a worker may map: an op that allocates without bound fails with MemoryError (a finding) rather
#: than taking the machine down.
ADDRESS_SPACE_BYTES = 12 << 30


def _limit_memory() -> None:
    # Under AddressSanitizer (tests/sanitize.sh sets AV_SANITIZE=1) the process has already reserved terabytes of
    # address space for ASan's shadow memory, so an address-space limit would fail every allocation; the bound
    # there is ASan's own (ASAN_OPTIONS max_allocation_size_mb and allocator_may_return_null, set by the script).
    if os.environ.get("AV_SANITIZE") == "1":
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = ADDRESS_SPACE_BYTES if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ValueError, OSError):  # not allowed here: run without the limit
        pass


def run_job(job: dict, emit) -> None:
    import torch

    from .core import run_case
    from .ops import make_case

    torch.set_num_threads(1)  # the parent runs workers side by side
    seed = int(job["seed"])
    for op, index in job["cases"]:
        t0 = time.perf_counter()
        try:
            case = make_case(seed, op, int(index))
        except Exception as e:  # noqa: BLE001 - reported as the fuzzer's own bug
            emit(dict(op=op, index=index, kind="?", outcome="generator_error", what="",
                      detail=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"[:1500],
                      seconds=time.perf_counter() - t0))
            continue
        outcome, detail = run_case(case)
        emit(dict(op=op, index=index, kind=case.kind, outcome=outcome, detail=detail, what=case.what,
                  seconds=time.perf_counter() - t0))


def main() -> None:
    _limit_memory()
    job = json.loads(sys.stdin.read())
    out = sys.stdout

    def emit(record: dict) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    run_job(job, emit)


if __name__ == "__main__":
    main()
