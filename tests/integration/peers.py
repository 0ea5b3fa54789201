"""Helpers of tests/integration: the pinned peer versions (peers.txt), the gate that skips or fails a test file
when they are missing, and the import that undoes the peers' environment side effects (see conftest.py)."""
from __future__ import annotations

import importlib
import logging
import os
from importlib import metadata
from pathlib import Path

import pytest

REQUIRED = os.environ.get("AV_REQUIRE_PEERS") == "1"
HERE = Path(__file__).resolve().parent


def pins() -> dict[str, str]:
    """{distribution: version} from peers.txt."""
    out = {}
    for line in (HERE / "peers.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[name] = version
    return out


PINS = pins()


def missing(*dists: str) -> list[str]:
    """The distributions (with their pinned version) that are absent or at another version."""
    out = []
    for d in dists:
        try:
            have = metadata.version(d)
        except metadata.PackageNotFoundError:
            have = "absent"
        if have != PINS[d]:
            out.append(f"{d}=={PINS[d]} (installed: {have})")
    return out


def require_peers(*dists: str) -> None:
    """Module-level gate of a test file: skip it when a peer package is missing, or fail the collection when
    AV_REQUIRE_PEERS=1. Checks installed versions only (importlib.metadata), imports nothing."""
    gone = missing(*dists)
    if not gone:
        return
    msg = f"peer packages not installed: {', '.join(gone)}; run bash tests/integration/install_peers.sh"
    if REQUIRED:
        pytest.fail(msg + " (AV_REQUIRE_PEERS=1)", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def import_peer(name: str):
    """importlib.import_module with the peer's environment side effects undone and its import-time warnings
    (no CUDA extension, no GPU) silenced."""
    saved = dict(os.environ)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        return importlib.import_module(name)
    finally:
        logging.disable(previous)
        os.environ.clear()
        os.environ.update(saved)


def vllm_on_cpu(mp: pytest.MonkeyPatch) -> None:
    """vLLM on this CPU-only machine detects no platform (UnspecifiedPlatform), which claims pinned memory;
    its host-to-device helpers would then ask torch for pinned buffers, which a CPU torch cannot allocate.
    Tell those helpers the truth (``PIN_MEMORY = False``) for the duration of ``mp``; nothing else changes."""
    mp.setattr(importlib.import_module("vllm.utils.torch_utils"), "PIN_MEMORY", False)
    mp.setattr(importlib.import_module("vllm.v1.utils"), "PIN_MEMORY", False)


class SGLangScheduleConfig:
    """The fields and the one method of SGLang's ``DSparkScheduleConfig`` that its verify-length schedule reads.
    Its module (``sglang.srt.speculative.dspark_components.dspark_planner``) does not import on a CPU torch:
    it pulls torchvision in through ``sglang.srt.configs``. Defaults as SGLang's."""

    def __init__(self, gamma: int, min_verify_len: int = 1, max_verify_len: int = 0, survival_eps: float = 1e-6):
        self.gamma, self.min_verify_len = gamma, min_verify_len
        self.max_verify_len, self.survival_eps = max_verify_len, survival_eps

    def resolved_max_verify_len(self) -> int:
        return self.max_verify_len or (self.gamma + 1)
