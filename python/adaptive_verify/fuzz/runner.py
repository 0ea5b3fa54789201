"""The parent side of a campaign: cases in chunks, each chunk in a fresh worker process, a chunk that dies or
stalls rerun one case per process to name the case responsible, and the counts per op and outcome.

Why chunks: starting Python and importing torch costs about two seconds, so one process per call would spend a
100,000-call campaign mostly starting processes. A chunk's worker reports each case as it finishes; when the
worker dies (a crash) or passes its time limit (a hang), the cases it did not report run again, each in its own
process, so a crash or a hang is attributed to exactly one case (and one that does not reproduce alone is
reported with the chunk it failed in).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from .core import FAIL, PASS
from .ops import OPS

#: Seconds a single case may run before it is a hang (the slowest valid cases, the attention reference on the
#: largest problems, take a second or two on a loaded 2-core machine).
CASE_TIMEOUT_S = 60.0
#: Seconds a worker may take to start (Python, torch and the extension imported) on a loaded machine.
STARTUP_S = 30.0
#: Average seconds per case a chunk is allowed (most take milliseconds): a chunk past it is treated as a hang and
#: its unreported cases run alone, each with CASE_TIMEOUT_S.
CHUNK_S_PER_CASE = 4.0


@dataclasses.dataclass
class Report:
    seed: int
    counts: dict  # op -> outcome -> n
    kinds: dict  # op -> kind -> n
    failures: list  # records of failing cases
    seconds: float
    processes: int

    @property
    def calls(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def failing(self) -> list:
        return list(self.failures)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"calls": self.calls}


def _worker_cmd() -> list:
    return [sys.executable, "-m", "adaptive_verify.fuzz.worker"]


def _env() -> dict:
    env = dict(os.environ)
    # The worker must import this very package (an editable install of another checkout may be on sys.path).
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_chunk(seed: int, cases: list, timeout: float) -> tuple[list, Optional[str]]:
    """Runs cases in one worker: (records it reported, why it stopped early or None)."""
    job = json.dumps({"seed": seed, "cases": cases})
    proc = subprocess.Popen(_worker_cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), text=True, start_new_session=True)
    try:
        out, err = proc.communicate(job, timeout=timeout)
        why = None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        why = f"timeout after {timeout:.0f} s"
    records = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "outcome" in rec:
                records.append(rec)
    if why is None and proc.returncode != 0:
        rc = proc.returncode
        why = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        why += f"; stderr: {err.strip()[-400:]}" if err.strip() else ""
    if why is None and len(records) < len(cases):
        why = f"stopped after {len(records)} of {len(cases)} cases; stderr: {err.strip()[-400:]}"
    return records, why


def _isolate(seed: int, case: list, chunk_why: str, case_timeout: float, startup: float) -> dict:
    """A case the chunk did not report, alone in a process: its own outcome, or crash / hang."""
    records, why = run_chunk(seed, [case], startup + case_timeout)
    if records:
        rec = records[0]
        if rec["outcome"] in PASS and why is None:
            rec["detail"] = (rec.get("detail") or "") + f" (passed alone; its chunk stopped: {chunk_why})"
        return rec
    op, index = case
    outcome = "hang" if why and why.startswith("timeout") else "crash"
    return dict(op=op, index=index, kind="?", outcome=outcome, detail=why or chunk_why, what="",
                seconds=0.0)


def run_campaign(seed: int = 0, *, ops: Optional[list] = None, calls: Optional[int] = None,
                 minutes: Optional[float] = None, chunk: int = 200, jobs: int = 1,
                 progress: Optional[Callable[[Report], None]] = None, case_timeout: float = CASE_TIMEOUT_S,
                 startup: float = STARTUP_S) -> Report:
    """Runs cases until ``calls`` have run or ``minutes`` have passed (whichever is given; both: the first).
    ``case_timeout``: seconds a case may take alone before it is a hang; ``startup``: seconds a worker may take
    to start."""
    if calls is None and minutes is None:
        raise ValueError("give calls or minutes")
    ops = list(ops or OPS)
    deadline = time.monotonic() + 60 * minutes if minutes is not None else float("inf")
    t0 = time.monotonic()
    counts: dict = {op: collections.Counter() for op in ops}
    kinds: dict = {op: collections.Counter() for op in ops}
    failures: list = []
    processes = 0
    # ids are generated per chunk from a running position, so a time-bounded campaign never materialises them all
    position = 0
    counter: collections.Counter = collections.Counter()
    weights = [OPS[op][1] if op in OPS else 1 for op in ops]
    cycle = [op for op, w in zip(ops, weights) for _ in range(w)]

    def next_chunk() -> list:
        nonlocal position
        size = chunk if calls is None else min(chunk, calls - position)
        ids = []
        for _ in range(size):
            op = cycle[position % len(cycle)]
            ids.append([op, counter[op]])
            counter[op] += 1
            position += 1
        return ids

    def work(ids: list) -> tuple[list, int]:
        timeout = startup + case_timeout + CHUNK_S_PER_CASE * len(ids)
        records, why = run_chunk(seed, ids, timeout)
        n_proc = 1
        if why is not None:
            done = {(r["op"], r["index"]) for r in records}
            for case in ids:
                if (case[0], case[1]) not in done:
                    records.append(_isolate(seed, case, why, case_timeout, startup))
                    n_proc += 1
        return records, n_proc

    def add(records: list) -> None:
        for rec in records:
            op = rec["op"]
            counts.setdefault(op, collections.Counter())[rec["outcome"]] += 1
            kinds.setdefault(op, collections.Counter())[rec["kind"]] += 1
            if rec["outcome"] not in PASS:
                rec = dict(rec, seed=seed, repro=f"python -m adaptive_verify.fuzz --seed {seed} --case "
                                                 f"'{op}:{rec['index']}'")
                failures.append(rec)

    def report() -> Report:
        return Report(seed, {k: dict(v) for k, v in counts.items()}, {k: dict(v) for k, v in kinds.items()},
                      failures, time.monotonic() - t0, processes)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending: set = set()
        while True:
            while len(pending) < jobs and time.monotonic() < deadline and (calls is None or position < calls):
                ids = next_chunk()
                if not ids:
                    break
                pending.add(pool.submit(work, ids))
            if not pending:
                break
            done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                records, n_proc = fut.result()
                processes += n_proc
                add(records)
            if progress is not None:
                progress(report())
    return report()


def markdown(report: Report) -> str:
    """The counts per op and outcome as a markdown table (docs/fuzzing.md)."""
    outcomes = [o for o in PASS + FAIL + ("generator_error",) if any(o in c for c in report.counts.values())]
    head = "| op | calls | " + " | ".join(outcomes) + " |\n|---|---:|" + "---:|" * len(outcomes) + "\n"
    rows = []
    for op, c in report.counts.items():
        rows.append(f"| {op} | {sum(c.values())} | " + " | ".join(str(c.get(o, 0)) for o in outcomes) + " |")
    total = collections.Counter()
    for c in report.counts.values():
        total.update(c)
    rows.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(f"**{total.get(o, 0)}**" for o in outcomes)
                + " |")
    return head + "\n".join(rows) + "\n"


__all__ = ["CASE_TIMEOUT_S", "FAIL", "Report", "markdown", "run_campaign", "run_chunk"]
