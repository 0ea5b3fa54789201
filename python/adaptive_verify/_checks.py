"""Scalar argument checks shared by every module (torch-free): each message starts with the argument's name
and says what was given, so ``pytest.raises(..., match=r"^name\\b")`` and a user's traceback agree.

Integers that reach a kernel are also bounded by the type they are narrowed to (``INT32_MAX``, ``INT64_MAX``);
sizes that drive host work or allocations have documented upper bounds at their call sites.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Optional

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
#: Most draft positions a statistics or calibration object keeps (AcceptanceStats, OnlineSTS, MarginEstimator): a
#: chain's 32 drafts, a tree's depth of up to 63 nodes, plus room; their per-position arrays are sized from it.
MAX_POSITIONS = 64
#: Largest finite float32: a host float that a kernel reads as float32 must stay within it, or it arrives as inf.
FLOAT32_MAX = 3.4028234663852886e38


def is_int(x: Any) -> bool:
    """An integral number that is not a bool (numpy integers count)."""
    t = type(x)
    if t is int:  # the common case, without the abstract-class check (a decode loop asks thousands of times a step)
        return True
    return t is not bool and isinstance(x, numbers.Integral)


def is_real(x: Any) -> bool:
    """A real number that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_int(name: str, value: Any, *, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """``value`` as a Python int in [lo, hi]; TypeError for a non-integer (bools included), ValueError out of
    range."""
    if type(value) is not int:
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        value = operator.index(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def check_real(name: str, value: Any, *, lo: Optional[float] = None, hi: Optional[float] = None,
               lo_open: bool = False, float32: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] (or (lo, hi] with lo_open); with ``float32`` also finite once rounded
    to float32 (a kernel's float field)."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = to_float(name, value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if float32 and abs(value) > FLOAT32_MAX:
        raise ValueError(f"{name} must be finite in float32 (|{name}| <= {FLOAT32_MAX:.7g}), got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value!r}")
    return value


def to_float(name: str, value: Any) -> float:
    """float(value) for a real number; an int too large for a float64 is a ValueError naming ``name``, not
    Python's OverflowError."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got a number too large for a float64") from None


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value
