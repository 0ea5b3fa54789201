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


def check_status(status: int, op: str, device: torch.device, messages: dict | None = None) -> None:
    """Turns a kernel status into an exception. CPU statuses name the offending argument (``messages``: an op's
    own wording for some statuses)."""
    if status == _C.STATUS_OK:
        return
    if messages and device.type != "cuda" and status in messages:
        raise ValueError(f"adaptive_verify.{op}: {messages[status]}")
    if device.type == "cuda":
        raise RuntimeError(f"adaptive_verify.{op}: CUDA launch failed: {_C.error_string(status)}")
    messages = {
        _C.STATUS_DRAFTS_OUT_OF_RANGE: "drafts: every value must lie in [0, K] where K = survival.shape[1]",
        _C.STATUS_BAD_PARENT: "parents: every parents[r, j] with j < tree_sizes[r] must lie in [-1, j) (parents "
                              "before children, -1 for the anchor)",
        _C.STATUS_DUPLICATE_SIBLING: "draft_tokens: two children of one node carry the same token (siblings must "
                                     "be distinct)",
        _C.STATUS_ACCEPTED_PATH: "accepted_offsets / num_accepted: for every request, num_accepted[r] must lie in "
                                 f"[0, min(accepted_offsets.shape[1] - 1, {_C.PLANNER_MAX_TREE_NODES})], "
                                 "context_lens[r] >= 0, accepted_offsets[r, 1..num_accepted[r]] must increase strictly "
                                 f"from >= 1 and stay below {_C.SAMPLER_MAX_TREE_TOKENS}, and both context_lens + "
                                 "offset and context_lens + depth must fall in the request's blocks (block ids in "
                                 "[0, num_blocks))",
        _C.STATUS_BLOCK_TABLE_TOO_SHORT: (
            "block_table: too few blocks per request for context_lens + q_len positions "
            "(or a negative context length)"
        ),
        _C.STATUS_CONTEXT_LEN: "context_lens: every value must lie in [0, 2^31 - 65] (positions and seq_lens "
                               "are int32)",
        _C.STATUS_TOKEN_PARENT: "token_parent: within each request, the token at offset i >= 1 must have its "
                                "parent's offset in [0, i) (the anchor at offset 0, parents before children)",
        _C.STATUS_BAD_ARGUMENT: "internal: an argument the Python layer should have rejected",
        _C.STATUS_TEMPERATURE: "temperature must be >= 0 (0 = greedy) and not NaN",
        _C.STATUS_TOP_K: "top_k must be >= 0 (0 = off)",
        _C.STATUS_TOP_P: "top_p must be in (0, 1] (1 = off)",
        _C.STATUS_MIN_P: "min_p must be in [0, 1] (0 = off)",
        _C.STATUS_WEIGHTS: "weights must be finite and >= 0",
    }
    raise ValueError(f"adaptive_verify.{op}: {messages.get(status, f'unknown status {status}')}")
