"""Shared test configuration: the one skip marker for GPU tests, and the tests directory on sys.path.

Mark a test ``@pytest.mark.cuda``: it runs where the extension has CUDA kernels and a GPU can run them
(adaptive_verify.cuda_available()), and is skipped elsewhere with the reason. CI machines have no GPU; the
host emulator (tests/emu) runs the CUDA sources there instead. Every run ends with how many tests were
skipped for want of a GPU (gpu_skips.py).
"""
import pytest

import adaptive_verify as av

pytest_plugins = ["gpu_skips", "pytester"]  # the closing "N tests skipped for want of a GPU" line; test_gpu_skips


def pytest_collection_modifyitems(config, items):
    if av.cuda_available():
        return
    reason = f"needs an NVIDIA GPU and a CUDA build ({av.build_info()['cuda_unusable_reason']})"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
