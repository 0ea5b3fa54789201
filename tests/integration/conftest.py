"""Tests against the real vLLM and SGLang packages (installed by install_peers.sh, pinned in peers.txt).

Without the packages every test here skips, so a plain ``pytest tests`` works on a machine that never ran
install_peers.sh. With ``AV_REQUIRE_PEERS=1`` (set by .ci/run) a missing or differently versioned package is a
collection error instead, and any test here that skips for whatever reason is reported as failed: CI cannot
pass with the peer tests silently skipped.

The peers are imported lazily (peers.import_peer, inside module fixtures), never at collection, and the environment variables their
imports set (vLLM sets TORCHINDUCTOR_COMPILE_THREADS, SGLang CUDA_CACHE_PATH, ...) are restored afterwards,
so the rest of the suite runs in the environment it would have without them.
"""
from __future__ import annotations

import pytest

from peers import REQUIRED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"AV_REQUIRE_PEERS=1: tests/integration must not skip ({report.longrepr})"
