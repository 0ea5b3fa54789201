"""Argument checks of the cost table (every message starts with the argument's name) and its size bounds; a leaf of
the package (it imports no other cost module), so every module of cost/ may use it.

Bounds, so that every value a table hands to a kernel is a finite float32 and no table builds an unbounded
host array (docs/design.md, "Step cost"):
- token and request counts (measured points, graph sizes, max_tokens, shifts): [1, MAX_TOKENS_LIMIT], at most
  MAX_POINTS of them per sequence;
- milliseconds: finite, at most MAX_MS (the curve extrapolates linearly up to MAX_TOKENS_LIMIT tokens, so a
  bound on the points bounds every cost, and its float32 rounding, far below float32's largest value);
- metadata: JSON-serialisable (str keys, no NaN), nested at most METADATA_MAX_DEPTH levels.
"""
from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .._checks import is_int, is_real, to_float
from .._validate import device_arg

#: Largest token capacity (max_tokens) and dense array a table builds: 2^24 tokens per step is far beyond any
#: engine's max_num_batched_tokens, and keeps every host array a table may build under 256 MB.
MAX_TOKENS_LIMIT = 1 << 24
#: Largest milliseconds of a measured point, a constant drafter cost or request_ms: 10^9 ms is 11 days per step.
#: With slopes of at most MAX_MS per token over MAX_TOKENS_LIMIT tokens, every cost stays below 2^24 * 10^9 * 2,
#: a finite float32.
MAX_MS = 1e9
#: Most entries of a sequence of counts (graph sizes, measured or requested counts, a curve's points): profiles
#: have tens, and the bound keeps a mistyped range from being walked (strictly increasing counts up to
#: MAX_TOKENS_LIMIT would otherwise allow 2^24 of them).
MAX_POINTS = 1 << 16
#: Deepest nesting of metadata (dicts and lists): a table's metadata is a record of how it was measured, and a
#: bound keeps copying and writing it from exhausting the interpreter's recursion limit.
METADATA_MAX_DEPTH = 32


def check_increasing_ints(name: str, values: Any, *, allow_empty: bool) -> tuple[int, ...]:
    """Positive ints, strictly increasing in the order given (an out-of-order entry is usually a typo)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    out: list[int] = []
    for v in itertools.islice(values, MAX_POINTS + 1):
        if len(out) == MAX_POINTS:
            raise ValueError(f"{name} must hold at most {MAX_POINTS} entries")
        if not is_int(v):
            raise TypeError(f"{name} must contain ints, got {type(v).__name__} {v!r}")
        v = int(v)
        if not 1 <= v <= MAX_TOKENS_LIMIT:
            raise ValueError(f"{name} must contain ints in [1, {MAX_TOKENS_LIMIT}], got {v}")
        if out and v <= out[-1]:
            raise ValueError(f"{name} must be strictly increasing, got {v} after {out[-1]}")
        out.append(v)
    if not out and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return tuple(out)


def check_ms(name: str, value: Any, *, what: str, positive: bool) -> float:
    """Milliseconds: a finite real in [0, MAX_MS] ((0, MAX_MS] with ``positive``)."""
    if not is_real(value):
        raise TypeError(f"{name}: {what} must be a real number of milliseconds, got {type(value).__name__} {value!r}")
    value = to_float(name, value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: {what} must be finite, got {value!r}")
    # A subnormal cost (below 2.2e-308) is as bad as 0: its reciprocal overflows, so the ratio is infinite.
    if positive and not value >= sys.float_info.min:
        raise ValueError(
            f"{name}: {what} must be > 0 ms and at least {sys.float_info.min:.3g} (a free step, or one whose "
            f"reciprocal overflows, makes the planner's ratio infinite), got {value!r}"
        )
    if value < 0.0:
        raise ValueError(f"{name}: {what} must be >= 0 ms, got {value!r}")
    if value > MAX_MS:
        raise ValueError(f"{name}: {what} must be <= {MAX_MS:g} ms, got {value!r}")
    return value


def check_points(name: str, points: Any, *, positive: bool) -> tuple[tuple[int, float], ...]:
    """A mapping {count: ms} -> ((count, ms), ...), keys ints >= 1 strictly increasing as given."""
    if not isinstance(points, Mapping):
        raise TypeError(f"{name} must be a dict {{count: milliseconds}}, got {type(points).__name__}")
    if not points:
        raise ValueError(f"{name} must not be empty")
    if len(points) > MAX_POINTS:
        raise ValueError(f"{name} must hold at most {MAX_POINTS} points, got {len(points)}")
    out: list[tuple[int, float]] = []
    for k, v in points.items():
        if not is_int(k):
            raise TypeError(f"{name}: keys must be int counts, got {type(k).__name__} {k!r}")
        k = int(k)
        if not 1 <= k <= MAX_TOKENS_LIMIT:
            raise ValueError(f"{name}: keys must be in [1, {MAX_TOKENS_LIMIT}], got {k}")
        if out and k <= out[-1][0]:
            raise ValueError(f"{name}: keys must be strictly increasing in the order given, got {k} after {out[-1][0]}")
        out.append((k, check_ms(name, v, what=f"value at {k}", positive=positive)))
    return tuple(out)


def _depth(value: Any) -> int:
    """Nesting depth of dicts and lists (1 for a flat one), walked without recursion and stopping past the bound."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > METADATA_MAX_DEPTH:
            return deepest
        stack.extend((c, d + 1) for c in children)
    return deepest


def check_metadata(metadata: Any) -> dict:
    """metadata as a dict of JSON values (str keys), nested at most METADATA_MAX_DEPTH levels; {} for None."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    for k in metadata:
        if not isinstance(k, str):
            raise TypeError(f"metadata keys must be str (JSON), got {type(k).__name__} {k!r}")
    if _depth(metadata) > METADATA_MAX_DEPTH:
        raise ValueError(f"metadata must be nested at most {METADATA_MAX_DEPTH} levels deep")
    try:  # what to_json will write: fail here, with the argument's name, rather than when saving
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise type(e)(f"metadata must be JSON-serialisable: {e}") from None
    return dict(metadata)


def normalize_device(device: Any) -> torch.device:
    """torch.device of ``device`` (None: CPU), CPU or CUDA; ValueError / TypeError naming it otherwise."""
    if device is None:
        return torch.device("cpu")
    dev = device_arg("device", device, kernels=False)
    if dev.type == "cuda" and dev.index is None:
        # "cuda" and "cuda:0" must share one cache entry.
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_path(path: Any) -> str:
    """A file path as str; TypeError naming ``path`` otherwise (an int would be opened as a file descriptor)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    return path.decode() if isinstance(path, bytes) else path


def now_iso() -> str:
    """The current UTC time to the second, as metadata["date"] records it."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
