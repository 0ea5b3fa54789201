"""The cost table's JSON form: the dict written by ``CostTable.to_dict`` / ``to_json`` and read back by
``from_dict`` / ``from_json`` (format version 4; versions 1 to 3 read with their defaults).

Reading never trusts the file: unknown versions and keys are rejected, every value goes through
``CostTable.from_points`` (so the bounds of checks.py apply), and a file nested too deeply for the JSON parser
is a ValueError naming the file, like any other unreadable file.

A leaf of the package: it works on plain values (the table hands over its fields, and builds itself from
:func:`from_dict`'s keyword arguments), so it imports no other cost module.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .._checks import is_int, is_real

#: Version of the JSON layout written by ``CostTable.to_json``. Version 2 added ``draft_interpolation``;
#: version 1 files (written when the drafter curve was always linear) are read as ``"linear"``. Version 3
#: added ``request_ms``; files before it are read with ``request_ms = 0`` (the step had no per-request term).
#: Version 4 added ``draft_levels``, ``draft_level_ms`` and ``draft_catch_up`` (a drafter that drafts level by
#: level); files before it describe a drafter whose cost does not depend on the levels drafted.
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
JSON_KEYS = ("format_version", "verify_ms", "draft_ms", "draft_interpolation", "request_ms", "draft_levels",
             "draft_level_ms", "draft_catch_up", "graph_sizes", "max_tokens", "metadata")
#: Keys each older version did not have yet (present in such a file: rejected as unknown).
KEYS_ADDED_IN = {"draft_interpolation": 2, "request_ms": 3, "draft_levels": 4, "draft_level_ms": 4,
                 "draft_catch_up": 4}


def to_dict(*, verify: Sequence[tuple[int, float]], draft: float | Sequence[tuple[int, float]],
            draft_interpolation: str, request_ms: float, graph_sizes: Sequence[int], max_tokens: int | None,
            metadata: Mapping[str, Any], draft_levels: int | None = None,
            draft_level: float | Sequence[tuple[int, float]] | None = None,
            draft_catch_up: bool = False) -> dict[str, Any]:
    """The JSON-ready dict of a table's fields. Points are [count, ms] pairs in increasing order (JSON keys are
    strings); metadata is deep-copied."""
    return {
        "format_version": FORMAT_VERSION,
        "verify_ms": [[n, ms] for n, ms in verify],
        "draft_ms": draft if isinstance(draft, float) else [[r, ms] for r, ms in draft],
        "draft_interpolation": draft_interpolation,
        "request_ms": request_ms,
        "draft_levels": draft_levels,
        "draft_level_ms": draft_level if draft_level is None or isinstance(draft_level, float) else
        [[r, ms] for r, ms in draft_level],
        "draft_catch_up": draft_catch_up,
        "graph_sizes": list(graph_sizes),
        "max_tokens": max_tokens,
        "metadata": copy.deepcopy(dict(metadata)),
    }


def _pairs(name: str, value: Any) -> dict:
    """[[count, ms], ...] -> {count: ms} (values checked by from_points)."""
    if not isinstance(value, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise ValueError(f"{name} must be a list of [count, ms] pairs")
    out: dict = {}
    for k, v in value:
        if not is_int(k):
            raise TypeError(f"{name}: counts must be ints, got {type(k).__name__} {k!r}")
        if k in out:
            raise ValueError(f"{name}: duplicate count {k!r}")
        out[k] = v
    return out


def from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`to_dict`: the keyword arguments of ``CostTable.from_points`` (which checks their values).
    Unknown format versions and unknown keys are rejected."""
    if not isinstance(data, Mapping):
        raise TypeError(f"cost table data must be a dict, got {type(data).__name__}")
    if "format_version" not in data:
        raise ValueError(f"format_version missing: not an adaptive_verify cost table (keys: {sorted(map(str, data))})")
    version = data["format_version"]
    if not is_int(version) or version not in READABLE_VERSIONS:
        raise ValueError(f"format_version={version!r} is not supported; this version of adaptive_verify "
                         f"reads {list(READABLE_VERSIONS)}")
    unknown = sorted(str(k) for k in set(data) - set(JSON_KEYS))
    unknown += [k for k, since in KEYS_ADDED_IN.items() if version < since and k in data]
    if unknown:
        raise ValueError(f"unknown keys {unknown} in a format_version {version} cost table")
    draft = data.get("draft_ms", 0.0)
    mode = data.get("draft_interpolation", "linear" if version == 1 else "staircase")
    return dict(
        verify_ms=_pairs("verify_ms", data.get("verify_ms")),
        draft_ms=draft if is_real(draft) else _pairs("draft_ms", draft),
        graph_sizes=data.get("graph_sizes", ()),
        max_tokens=data.get("max_tokens"),
        metadata=data.get("metadata"),
        draft_interpolation=mode,
        request_ms=data.get("request_ms", 0.0),
        draft_levels=data.get("draft_levels"),
        draft_level_ms=_levels(data.get("draft_level_ms")),
        draft_catch_up=data.get("draft_catch_up", False),
    )


def _levels(value: Any) -> Any:
    """draft_level_ms as from_points takes it: None, a number, or {r: ms} from its pairs."""
    return value if value is None or is_real(value) else _pairs("draft_level_ms", value)


def write_json(data: dict, path: str | os.PathLike) -> None:
    """Writes ``data`` as strict JSON (no NaN) to a temporary file in the same folder, then renames it."""
    text = json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".cost-", suffix=".json", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in the file written by ``to_json``. Errors name the file; JSON nested too deeply to parse is
    a ValueError."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except RecursionError as e:
            raise ValueError(f"{os.fspath(path)}: JSON nested too deeply") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{os.fspath(path)}: not valid JSON ({e})") from e


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raises a ValueError / TypeError of the block with the file's name in front (reading its contents)."""
    try:
        yield
    except (TypeError, ValueError) as e:
        raise type(e)(f"{os.fspath(path)}: {e}") from e
