"""Pytest plugin (loaded by tests/conftest.py): closes every run with how many tests were skipped for want of
a GPU, so that a reader of a CPU machine's log (CI's) sees what did not run.

A test counts when it carries the ``cuda`` marker and was skipped; the line is printed even when the count is
zero, so its absence in a log means the plugin did not load."""
from __future__ import annotations


def gpu_skips(terminalreporter) -> int:
    return sum(1 for r in terminalreporter.stats.get("skipped", ()) if "cuda" in getattr(r, "keywords", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = gpu_skips(terminalreporter)
    others = len(terminalreporter.stats.get("skipped", ())) - n
    terminalreporter.write_line(
        f"GPU: {n} test{'s' * (n != 1)} skipped for want of a GPU (marked cuda); {others} other skip{'s' * (others != 1)}")
