"""Adapters between this library's structures and those of serving engines.

- :mod:`adaptive_verify.integrations.vllm`: vLLM v1 (``SpecDecodeMetadata``, ``CommonAttentionMetadata``-style
  attention fields, the rejection sampler's per-request output lists) and vLLM's own adaptive verification
  (``patch_manager``).
- :mod:`adaptive_verify.integrations.sglang`: SGLang's EAGLE verify path, chain drafts (``topk == 1``) and EAGLE
  trees (``topk > 1``: its draft tokens, retrieve pointers and custom mask to our parents / tree_sizes and back;
  :mod:`adaptive_verify.integrations.sglang_tree`), and DSpark's ragged verify layout.

Neither module imports its engine: they work on plain tensors, lists and duck-typed objects, and return
dicts whose keys are the engine's field names (``SomeEngineClass(**d)`` builds the real object where it is
importable). They are tested against stand-in objects (tests/test_integrations.py) and against the real vLLM 0.33.0
and SGLang 0.5.23 packages (tests/integration/, installed by tests/integration/install_peers.sh). The one engine
module touched at run time is the patched manager's own (``patch_manager``'s GPU path takes vLLM's
``AdmittedDraftCounts`` from it when called), never at import.

The helpers below are shared by both adapters. Every error is a ``ValueError`` naming the argument.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["vllm", "sglang"]


def _check_int(name: str, value, *, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise ValueError(f"{name} must be an int, got {type(value).__name__}") from None
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def _check_tensor(name: str, t, *, ndim: Optional[int] = None, integer: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if integer and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    return t


def _plan_field(plan, field: str, *, needs: str = "") -> torch.Tensor:
    """A tensor field of a VerifyPlan (or any object with the same attributes)."""
    t = getattr(plan, field, None)
    if t is None:
        hint = f" (pass {needs} to plan_verification / AdaptiveVerifier.plan)" if needs else ""
        raise ValueError(f"plan.{field} is missing{hint}")
    return _check_tensor(f"plan.{field}", t)


def _num_reqs(plan, num_reqs: Optional[int]) -> int:
    """R: the real requests, the first rows of the plan (later rows are padding with q_len 0)."""
    vl = _plan_field(plan, "verify_lens")
    rows = vl.shape[0]
    if num_reqs is None:
        return rows
    return _check_int("num_reqs", num_reqs, lo=0, hi=rows)


def _host_verify_lens(plan, R: int, verify_lens_host) -> list:
    """verify_lens[:R] on the host: the caller's copy, or one device-to-host copy (a sync on CUDA)."""
    if verify_lens_host is None:
        return [int(x) for x in plan.verify_lens[:R].tolist()]
    if isinstance(verify_lens_host, torch.Tensor):
        verify_lens_host = verify_lens_host.tolist()
    try:
        vl = [int(x) for x in verify_lens_host]
    except (TypeError, ValueError):
        raise ValueError("verify_lens_host must be a sequence of ints") from None
    if len(vl) != R:
        raise ValueError(f"verify_lens_host must have num_reqs = {R} entries, got {len(vl)}")
    if any(x < 0 for x in vl):
        raise ValueError(f"verify_lens_host must be >= 0, got {vl}")
    return vl


def _relative_starts(plan, R: int) -> torch.Tensor:
    """query_start_loc[:R + 1] - query_start_loc[0] as int64 on the plan's device: each request's first row
    among this step's decode tokens (the plan's token_offset removed)."""
    qsl = _plan_field(plan, "query_start_loc")
    if qsl.dim() != 1 or qsl.shape[0] < R + 1:
        raise ValueError(f"plan.query_start_loc must have at least num_reqs + 1 = {R + 1} entries, "
                         f"got shape {tuple(qsl.shape)}")
    q = qsl[: R + 1].to(torch.int64)
    return q - q[:1]
