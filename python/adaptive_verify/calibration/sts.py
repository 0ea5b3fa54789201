"""Sequential temperature scaling (offline fit, docs/design.md "Confidence and calibration") and temperature files."""
from __future__ import annotations

import datetime
import json
import math
import numbers
import os
from typing import Any, Optional, Union

import torch

from .metrics import (
    FORMAT_VERSION,
    MIN_ROWS,
    ArrayLike,
    _as_tensor,
    _bin_index,
    _check_bins,
    _check_grid,
    _check_temperatures,
    _count_tensor,
    _ece_from_bins,
    _float_tensor,
    _is_real,
)

# ----------------------------------------------------------------------------------------------------
# sequential temperature scaling
# ----------------------------------------------------------------------------------------------------

# Temperatures whose ECE is within this of the grid minimum count as tied; among them the one closest to
# T = 1 (in log scale) wins, so a flat objective leaves the drafter's own scale alone.
_TIE_TOL = 1e-12

# Grid points evaluated at once are chunked so a [chunk, rows] float64 block stays near 32 MB.
_CHUNK_ELEMS = 1 << 22


def _pick(grid: torch.Tensor, ece: torch.Tensor) -> float:
    ece = torch.nan_to_num(ece, nan=math.inf)
    tied = ece <= ece.min() + _TIE_TOL
    closeness = torch.where(tied, grid.log().abs(), torch.full_like(grid, math.inf))
    return float(grid[int(torch.argmin(closeness))])


def _grid_ece_rows(
    grid: torch.Tensor, prefix: torch.Tensor, logit: torch.Tensor, outcome: torch.Tensor, num_bins: int
) -> torch.Tensor:
    """ECE[g] of prefix * sigmoid(logit / grid[g]) against outcome, per grid value (rows along dim 0)."""
    n = prefix.numel()
    out = torch.empty(grid.numel(), dtype=torch.float64)
    chunk = max(1, _CHUNK_ELEMS // max(n, 1))
    for s in range(0, grid.numel(), chunk):
        g = grid[s : s + chunk]
        # [G, n]
        a = prefix * torch.sigmoid(logit / g[:, None])
        b = _bin_index(a, num_bins) + torch.arange(g.numel())[:, None] * num_bins
        sums = torch.zeros(3, g.numel() * num_bins, dtype=torch.float64)
        sums[0].index_add_(0, b.reshape(-1), torch.ones(a.numel(), dtype=torch.float64))
        sums[1].index_add_(0, b.reshape(-1), a.reshape(-1))
        sums[2].index_add_(0, b.reshape(-1), outcome.expand_as(a).reshape(-1))
        sums = sums.view(3, g.numel(), num_bins)
        out[s : s + g.numel()] = _ece_from_bins(sums[0], sums[1], sums[2])
    return out


def _sts_inputs(
    logits: Any, accepted: Any, verified: Any, name: str = "logits"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, K] float64, accepted [N] int64, verified [N] int64 (K when None), all checked."""
    l = _float_tensor(name, logits, 2)
    N, K = l.shape
    if K < 1:
        raise ValueError(f"{name} must have at least one position, got shape {tuple(l.shape)}")
    if verified is None:
        v = torch.full((N,), K, dtype=torch.long)
    else:
        v = _count_tensor("verified", verified, N, torch.tensor(K), f"K = {name}.shape[1]")
    a = _count_tensor("accepted", accepted, N, v, "verified (K when verified is None)")
    # Logits are read only where j < verified[n]; there they must not be NaN (+-inf is a sure accept/reject).
    used = torch.arange(K)[None, :] < v[:, None]
    if bool((torch.isnan(l) & used).any()):
        n, j = (torch.isnan(l) & used).nonzero()[0].tolist()
        raise ValueError(f"{name} must not be NaN at verified positions, got NaN at row {n}, position {j}")
    return l, a, v


def fit_sts(
    logits: ArrayLike,
    accepted: ArrayLike,
    verified: Optional[ArrayLike] = None,
    grid: Optional[ArrayLike] = None,
    *,
    num_bins: int = 15,
    min_rows: int = MIN_ROWS,
) -> torch.Tensor:
    """Sequential temperature scaling: per-position temperatures T [K] (float32, > 0).

    logits: [N, K] float (any float dtype; a tensor or numpy array), the drafter's confidence logits, so
    c[n, j] = sigmoid(logits[n, j] / T_j). accepted: [N] integer, the accepted length of row n (0..K).
    verified: [N] integer, drafts verified for row n (default: K for every row); accepted[n] <= verified[n].
    grid: candidate temperatures (default :func:`default_grid`: geometric 0.05..20, 200 points).

    Left to right, T_j = the grid value minimising the ECE (``num_bins`` equal-width bins) of the cumulative
    survival prod_{i <= j} sigmoid(logits[n, i] / T_i) against the event accepted[n] > j, over the rows with
    j < verified[n], T_0..T_{j-1} fixed at their fitted values. Ties (flat stretches of the ECE) go to the
    tied value closest to T = 1. Temperatures are positive, so they never reorder a position's candidates.

    Inputs on a GPU are copied to the host (this is an offline tool); the result is a CPU tensor.
    Raises ValueError naming the position when fewer than ``min_rows`` rows (default :data:`MIN_ROWS`) have
    j < verified[n]: fit a shorter block (logits[:, :j]) or collect more data. Other errors name the argument.
    """
    l, a, v = _sts_inputs(logits, accepted, verified)
    g = _check_grid(grid)
    num_bins = _check_bins(num_bins)
    if not isinstance(min_rows, numbers.Integral) or isinstance(min_rows, bool) or min_rows < 1:
        raise ValueError(f"min_rows must be an int >= 1, got {min_rows!r}")
    N, K = l.shape
    temps = torch.ones(K, dtype=torch.float64)
    prefix = torch.ones(N, dtype=torch.float64)  # prod_{i < j} sigmoid(l_i / T_i) with fitted T_i
    for j in range(K):
        rows = v > j
        n_rows = int(rows.sum())
        if n_rows < min_rows:
            raise ValueError(
                f"position {j}: only {n_rows} rows have j < verified (need at least min_rows={min_rows}); "
                f"collect more data or fit the first {j} positions only"
            )
        ece = _grid_ece_rows(g, prefix[rows], l[rows, j], (a[rows] > j).double(), num_bins)
        temps[j] = _pick(g, ece)
        prefix = prefix * torch.sigmoid(l[:, j] / temps[j])
    return temps.float()


# ----------------------------------------------------------------------------------------------------
# temperature files
# ----------------------------------------------------------------------------------------------------


def save_temperatures(path: Union[str, os.PathLike], temperatures: ArrayLike, **metadata: Any) -> None:
    """Write temperatures [K] as JSON: {"format_version", "temperatures", "metadata"} (date added).

    NaN / inf in metadata (an AUC with one class) are written as null, so the file is strict JSON.
    """
    t = _as_tensor("temperatures", temperatures)
    if t.dim() != 1:
        raise ValueError(f"temperatures must have shape [K], got {tuple(t.shape)}")
    t = _check_temperatures("temperatures", t, t.numel())
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    meta.update(metadata)
    data = {"format_version": FORMAT_VERSION, "temperatures": t.tolist(), "metadata": _json_safe(meta)}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, allow_nan=False) + "\n")


def load_temperatures(path: Union[str, os.PathLike]) -> torch.Tensor:
    """Temperatures [K] float32 from a file written by :func:`save_temperatures`. Errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            t = json.load(f)["temperatures"]
        if not isinstance(t, list) or not all(_is_real(x) for x in t):
            raise TypeError(f"'temperatures' must be a list of numbers, got {t!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{os.fspath(path)}: not a temperatures file ({type(e).__name__}: {e})") from None
    return _check_temperatures(f"{os.fspath(path)}: temperatures", t, len(t)).float()


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
