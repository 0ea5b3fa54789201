"""Loads the compiled extension and says how it was built and whether CUDA kernels can run."""
from __future__ import annotations

import functools

try:
    from . import _C  # noqa: F401  (torch-free pybind11 module)
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "adaptive_verify._C is missing: install the package with `pip install .` (or `pip install -e .`) "
        "so that CMake builds the extension"
    ) from exc

import torch


@functools.lru_cache(maxsize=None)
def _cuda_status() -> tuple[bool, str]:
    info = _C.build_info()
    if not info["with_cuda"]:
        return False, info["cpu_only_reason"] or "built without CUDA"
    count, err = _C.device_count()
    if count == 0:
        return False, f"no usable CUDA device ({err or 'none found'})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} has no CUDA support"
    return True, ""


def cuda_available() -> bool:
    """True when the extension has CUDA kernels and a CUDA device (and torch) can run them here."""
    return _cuda_status()[0]


def build_info() -> dict:
    """How the extension was built: ``with_cuda``, ``cuda_archs`` (e.g. ``"90a,100a,103a"``),
    ``cuda_compiler_version``, ``cuda_runtime_version``, ``compiler``, and ``cuda_unusable_reason``
    (empty when CUDA kernels can run here)."""
    info = dict(_C.build_info())
    info["cuda_unusable_reason"] = _cuda_status()[1]
    return info


def check_status(status: int, op: str, device: torch.device) -> None:
    """Turns a kernel status into an exception. CPU statuses name the offending argument."""
    if status == _C.STATUS_OK:
        return
    if device.type == "cuda":
        raise RuntimeError(f"adaptive_verify.{op}: CUDA launch failed: {_C.error_string(status)}")
    messages = {
        _C.STATUS_DRAFTS_OUT_OF_RANGE: "drafts: every value must lie in [0, K] where K = survival.shape[1]",
        _C.STATUS_BLOCK_TABLE_TOO_SHORT: (
            "block_table: too few blocks per request for context_lens + q_len positions "
            "(or a negative context length)"
        ),
        _C.STATUS_CONTEXT_LEN: "context_lens: every value must lie in [0, 2^31 - 65] (positions and seq_lens "
                               "are int32)",
        _C.STATUS_BAD_ARGUMENT: "internal: an argument the Python layer should have rejected",
    }
    raise ValueError(f"adaptive_verify.{op}: {messages.get(status, f'unknown status {status}')}")
