"""Imports every peer module that tests/integration imports, so that a package missing from peers.txt fails
here, naming the module that could not be found, instead of as a skip or an error deep inside a test.

Run by install_peers.sh after every install and every time in CI (about 15 s on 2 cores). Standalone on
purpose: it runs before pytest is installed. test_peer_imports.py checks that MODULES holds every module the
tests import, so the list cannot fall behind them.

Usage: python tests/integration/check_imports.py
"""
from __future__ import annotations

import importlib
import logging
import os
import sys

# The vLLM, SGLang and FlashAttention-4 modules tests/integration imports (through peers.import_peer or importlib).
MODULES = (
    "vllm.utils.torch_utils",
    "vllm.v1.attention.backend",
    "vllm.v1.core.sched.output",
    "vllm.v1.outputs",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.spec_decode.llm_base_proposer",
    "vllm.v1.spec_decode.metadata",
    "vllm.v1.utils",
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
    "vllm.v1.worker.gpu_model_runner",
    "sglang.kernels.ops.speculative.dspark.dspark_schedule",
    "sglang.kernels.ops.speculative.eagle",
    "sglang.kernels.ops.speculative.spec_tree",
    "sglang.srt.speculative.adaptive_runtime_state",
    "sglang.srt.speculative.ragged_verify",
    "sglang.srt.utils.async_probe",
    "sglang.srt.utils.common",
    "flash_attn.cute.interface",
)


def main() -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM warns that its CUDA extension is absent
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        return _import_all()
    finally:
        logging.disable(previous)


def _import_all() -> int:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing = getattr(e, "name", None)
            print(f"check_imports: importing {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            if isinstance(e, ModuleNotFoundError) and missing:
                print(f"check_imports: the package that provides '{missing.split('.')[0]}' is missing from "
                      "tests/integration/peers.txt (install_peers.sh installs only what is listed there)",
                      file=sys.stderr)
            return 1
    print(f"check_imports: all {len(MODULES)} vLLM, SGLang and FA4 modules the tests use import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
