"""What a fuzz case is, what can come of it, and how one is run and judged (inside a worker process).

A case is one call of a public op (or a short sequence, for ops with state) on inputs drawn from a seeded
generator, with what its inputs entitle the caller to:

- ``valid``: the call must succeed, leave every guard region intact, and give the reference's result (integers
  exactly, floats within the tests' tolerances) with the documented error counts;
- ``safe``: inputs whose result is documented rather than an error (NaN confidences, out-of-range ids on the
  device): the call must succeed with that documented result and the matching ``error_counts()``;
- ``invalid``: the call must raise ValueError or TypeError whose message names the offending argument;
- ``maybe``: adversarial inputs where either is acceptable: a ValueError / TypeError naming the argument, or
  success with every guard region intact (and the case's invariants, when it has some).

Outcomes. Passing: ``ok`` (valid), ``safe``, ``rejected`` (invalid or maybe, the right error), ``accepted``
(maybe, succeeded cleanly). Failing: ``mismatch`` (a result differs from the reference or the documented one),
``guard`` (a write outside a tensor), ``bad_error`` (another exception type, or a message naming none of the
arguments), ``unexpected_error`` (a valid or safe call raised), ``not_rejected`` (an invalid call succeeded), and,
decided by the parent process, ``crash`` (the process died) and ``hang`` (the case ran past its time limit).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Optional

import torch

from .. import errors
from .guards import Guards

PASS = ("ok", "safe", "rejected", "accepted")
FAIL = ("mismatch", "guard", "bad_error", "unexpected_error", "not_rejected", "crash", "hang")
KINDS = ("valid", "safe", "invalid", "maybe")


class Mismatch(Exception):
    """Raised by a case's check when the result is not the reference's (or the documented) one."""


@dataclasses.dataclass
class Case:
    kind: str
    call: Callable[[], Any]
    check: Optional[Callable[[Any], None]] = None  # valid / safe / maybe-accepted: raises Mismatch
    names: tuple = ()  # invalid / maybe: the argument names an error message may name
    guards: Optional[Guards] = None
    what: str = ""  # the input's gist, for a failure's report

    def __post_init__(self):
        assert self.kind in KINDS, self.kind


def run_case(case: Case) -> tuple[str, str]:
    """(outcome, detail) of one case: the call, then its guards, then its check."""
    errors.reset_error_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # live "global" warns once by design
        try:
            result = case.call()
        except (ValueError, TypeError) as e:
            bad = case.guards.violations() if case.guards else []
            if bad:
                return "guard", f"raised {type(e).__name__} after writing outside: {'; '.join(bad)}"
            if case.kind in ("invalid", "maybe"):
                if any(name in str(e) for name in case.names):
                    return "rejected", ""
                return "bad_error", f"{type(e).__name__}: {str(e)[:300]} (names none of {list(case.names)})"
            return "unexpected_error", f"{type(e).__name__}: {str(e)[:300]}"
        except Exception as e:  # noqa: BLE001 - every other type is what this fuzzer looks for
            return ("bad_error" if case.kind in ("invalid", "maybe") else "unexpected_error"), \
                f"{type(e).__name__}: {str(e)[:300]}"
        bad = case.guards.violations() if case.guards else []
        if bad:
            return "guard", "; ".join(bad)
        if case.kind == "invalid":
            return "not_rejected", "the call succeeded"
        try:
            if case.check is not None:
                case.check(result)
        except Mismatch as e:
            return "mismatch", str(e)[:500]
        except Exception as e:  # noqa: BLE001 - a check (or the reference) failing on an accepted input
            return "mismatch", f"check raised {type(e).__name__}: {str(e)[:300]}"
    return {"valid": "ok", "safe": "safe", "maybe": "accepted"}[case.kind], ""


# ----------------------------------------------------------------------------------------------------
# comparison helpers for checks
# ----------------------------------------------------------------------------------------------------


def same(name: str, got: Optional[torch.Tensor], want: Optional[torch.Tensor]) -> None:
    """Exact equality (NaN equals NaN), dtype and shape included."""
    if (got is None) != (want is None):
        raise Mismatch(f"{name}: got {'None' if got is None else 'a tensor'}, want {'None' if want is None else 'a tensor'}")
    if got is None:
        return
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        raise Mismatch(f"{name}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
    g, w = got.detach().cpu(), want.detach().cpu()
    eq = g == w
    if g.is_floating_point():
        eq |= torch.isnan(g) & torch.isnan(w)
    if not bool(eq.all()):
        i = int(torch.nonzero(~eq.reshape(-1))[0])
        raise Mismatch(f"{name}: {int((~eq).sum())} element(s) differ, first at flat index {i}: "
                       f"got {g.reshape(-1)[i].item()!r}, want {w.reshape(-1)[i].item()!r}")


def close(name: str, got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor | float) -> None:
    """|got - want| <= tol elementwise (tol broadcast), non-finite values equal exactly."""
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    if tuple(g.shape) != tuple(w.shape):
        raise Mismatch(f"{name}: got shape {tuple(g.shape)}, want {tuple(w.shape)}")
    finite = torch.isfinite(w)
    special_ok = (g == w) | (torch.isnan(g) & torch.isnan(w))
    err = torch.where(finite, (g - w).abs(), torch.zeros_like(w))
    ok = torch.where(finite, err <= tol, special_ok)
    ok &= ~(finite & ~torch.isfinite(g))
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok.reshape(-1))[0])
        t = tol if isinstance(tol, float) else torch.as_tensor(tol).expand_as(w).reshape(-1)[i].item()
        raise Mismatch(f"{name}: {int((~ok).sum())} element(s) off, first at flat index {i}: got "
                       f"{g.reshape(-1)[i].item()!r}, want {w.reshape(-1)[i].item()!r} (tolerance {t:.3g})")


def counts(want: dict) -> None:
    """error_counts() on the CPU equals ``want`` for the named counters and 0 for every other one."""
    got = errors.error_counts("cpu")
    full = {name: 0 for name in got}
    full.update(want)
    if got != full:
        diff = {k: (got[k], full[k]) for k in got if got[k] != full[k]}
        raise Mismatch(f"error_counts (got, want): {diff}")


def finite_or_nan(x: float) -> bool:
    return math.isfinite(x) or math.isnan(x)
