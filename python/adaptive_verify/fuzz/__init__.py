"""Fuzzing the public API: no input may crash the process, hang, write outside its tensors, disagree with the
reference, or fail with anything but a ValueError / TypeError that names the argument (docs/fuzzing.md).

Run a campaign with ``python -m adaptive_verify.fuzz --minutes N`` (or ``--calls N``; ``benchmarks/fuzz.py`` is the
same command); ``tests/test_fuzz.py`` runs a seeded one of about a minute in CI.

Where things are: ``core.py`` what a case is and how it is judged (the outcomes), ``guards.py`` guard regions
around every tensor, ``values.py`` adversarial scalars and tensors, ``tables.py`` random cost tables, one
``*_cases.py`` per area (planner, confidence, attention, sampling, host-side classes), ``ops.py`` the op registry
and how a case is rebuilt from its id, ``worker.py`` the subprocess that runs a chunk of cases, ``runner.py``
the campaign (chunks, crash and hang isolation, counts), ``__main__.py`` the command line.
"""
from .core import FAIL, PASS, Case, run_case
from .ops import OPS, SELFTEST_OPS, make_case
from .runner import Report, markdown, run_campaign

__all__ = ["Case", "FAIL", "OPS", "PASS", "Report", "SELFTEST_OPS", "make_case", "markdown", "run_campaign",
           "run_case"]
