"""Calibration metrics (ECE, AUC), the temperature grid and the argument checks the calibration tools share."""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .._checks import to_float

#: logit 20-fold, 20 flattens it 20-fold: wide enough for any drafter we have seen, fine enough that the
#: grid step is well inside the 15% a fitted temperature is expected to be good to.
DEFAULT_GRID = (0.05, 20.0, 200)

#: A position needs at least this many rows with j < verified[n] for fit_sts (ECE over 15 bins from fewer
#: rows is mostly noise, and the fitted temperature with it).
MIN_ROWS = 50

#: Version of the JSON layout written by save_temperatures.
FORMAT_VERSION = 1

#: Most grid temperatures and bins: each drives host arrays (and the grid search's work) in proportion.
MAX_GRID_POINTS = 100_000
MAX_BINS = 1 << 14

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]


def default_grid(
    t_min: float = DEFAULT_GRID[0], t_max: float = DEFAULT_GRID[1], points: int = DEFAULT_GRID[2]
) -> torch.Tensor:
    """Geometric grid of ``points`` temperatures from ``t_min`` to ``t_max`` (float64, ascending)."""
    if not (_is_real(t_min) and _is_real(t_max)) or \
            not (0.0 < to_float("grid", t_min) <= to_float("grid", t_max) < math.inf):
        raise ValueError(f"grid bounds must satisfy 0 < t_min <= t_max < inf, got t_min={t_min!r}, t_max={t_max!r}")
    t_min, t_max = float(t_min), float(t_max)
    if not isinstance(points, numbers.Integral) or isinstance(points, bool) or not 1 <= points <= MAX_GRID_POINTS:
        raise ValueError(f"grid points must be an int in [1, {MAX_GRID_POINTS}], got {points!r}")
    if points == 1 or t_min == t_max:
        return torch.full((int(points),), float(t_min), dtype=torch.float64).unique()
    return torch.logspace(math.log10(t_min), math.log10(t_max), int(points), dtype=torch.float64)


# ----------------------------------------------------------------------------------------------------
# validation helpers: every message names the argument
# ----------------------------------------------------------------------------------------------------


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _as_tensor(name: str, x: Any) -> torch.Tensor:
    """Tensor, ndarray or nested list -> CPU tensor (these are host-side tools; a device tensor is copied)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"{name} must be a numeric array, got dtype object")
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, (list, tuple)):
        try:
            return torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a tensor, array or list of numbers: {e}") from None
    raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def _float_tensor(name: str, x: Any, ndim: int) -> torch.Tensor:
    t = _as_tensor(name, x)
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if t.dim() != ndim:
        want = "[N]" if ndim == 1 else "[N, K]"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    return t.double()


def _count_tensor(name: str, x: Any, n: int, hi: Optional[torch.Tensor], hi_name: str) -> torch.Tensor:
    """Integer counts [N] in [0, hi] (hi a scalar tensor or per row)."""
    t = _as_tensor(name, x)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must have an integer dtype (a count of drafts per row), got {t.dtype}")
    if tuple(t.shape) != (n,):
        raise ValueError(f"{name} must have shape [N] = ({n},) (one entry per row), got {tuple(t.shape)}")
    t = t.long()
    if n and int(t.min()) < 0:
        row = int(torch.argmin(t))
        raise ValueError(f"{name} must be >= 0, got {int(t[row])} at row {row}")
    bad = (t > hi).nonzero()
    if bad.numel():
        row = int(bad[0])
        bound = int(hi) if hi.dim() == 0 else int(hi[row])
        raise ValueError(f"{name} must be <= {hi_name}, got {int(t[row])} > {bound} at row {row}")
    return t


def _check_grid(grid: Any) -> torch.Tensor:
    if grid is None:
        return default_grid()
    g = _as_tensor("grid", grid).double().reshape(-1)
    if g.numel() == 0:
        raise ValueError("grid must contain at least one temperature")
    if g.numel() > MAX_GRID_POINTS:
        raise ValueError(f"grid must contain at most {MAX_GRID_POINTS} temperatures, got {g.numel()}")
    bad = (~torch.isfinite(g) | (g <= 0)).nonzero()
    if bad.numel():
        raise ValueError(f"grid must contain finite temperatures > 0, got {float(g[int(bad[0])])!r}")
    return torch.unique(g)  # sorted ascending


def _check_temperatures(name: str, temperatures: Any, K: int) -> torch.Tensor:
    t = _as_tensor(name, temperatures)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    t = t.double()
    if K < 1:
        raise ValueError(f"{name} must not be empty")
    if tuple(t.shape) != (K,):
        raise ValueError(f"{name} must have shape [K] = ({K},), got {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        bad = int(((t <= 0) | ~torch.isfinite(t)).nonzero()[0])
        raise ValueError(f"{name} must be finite and > 0, got {float(t[bad])!r} at position {bad}")
    return t


def _check_bins(num_bins: Any) -> int:
    if not isinstance(num_bins, numbers.Integral) or isinstance(num_bins, bool) or not 1 <= num_bins <= MAX_BINS:
        raise ValueError(f"num_bins must be an int in [1, {MAX_BINS}], got {num_bins!r}")
    return int(num_bins)


# ----------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------


def _pred_outcome(pred: ArrayLike, outcome: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    p = _as_tensor("pred", pred).double().reshape(-1)
    y = _as_tensor("outcome", outcome).double().reshape(-1)
    if p.numel() != y.numel():
        raise ValueError(f"pred and outcome must have the same number of elements, got {p.numel()} and {y.numel()}")
    if bool(((p < 0) | (p > 1) | torch.isnan(p)).any()):
        raise ValueError("pred must contain probabilities in [0, 1] (no NaN)")
    if bool(((y != 0) & (y != 1)).any()):
        raise ValueError("outcome must contain only 0/1 (or False/True)")
    return p, y


def _ece_from_bins(count: torch.Tensor, pred_sum: torch.Tensor, outcome_sum: torch.Tensor) -> torch.Tensor:
    """ECE from per-bin sums along the last dim: sum_b |pred_sum_b - outcome_sum_b| / sum_b count_b.

    (n_b / N) * |pred_sum_b / n_b - outcome_sum_b / n_b| simplifies to |pred_sum_b - outcome_sum_b| / N,
    so empty bins need no special case. Returns NaN where there are no rows at all.
    """
    total = count.sum(-1)
    return (pred_sum - outcome_sum).abs().sum(-1) / total.where(total > 0, torch.full_like(total, math.nan))


def _bin_index(p: torch.Tensor, num_bins: int) -> torch.Tensor:
    return (p * num_bins).long().clamp_(0, num_bins - 1)


def expected_calibration_error(pred: ArrayLike, outcome: ArrayLike, num_bins: int = 15) -> float:
    """ECE of probabilities ``pred`` against 0/1 ``outcome`` with ``num_bins`` equal-width bins.

    Bin of p: ``min(floor(p * num_bins), num_bins - 1)``. ECE = sum_b (n_b / N) |mean pred_b - mean outcome_b|.
    Inputs are flattened; NaN for no data.
    """
    num_bins = _check_bins(num_bins)
    p, y = _pred_outcome(pred, outcome)
    b = _bin_index(p, num_bins)
    zeros = torch.zeros(num_bins, dtype=torch.float64)
    count = zeros.index_add(0, b, torch.ones_like(p))
    return float(_ece_from_bins(count, zeros.index_add(0, b, p), zeros.index_add(0, b, y)))


def auc(pred: ArrayLike, outcome: ArrayLike) -> float:
    """Area under the ROC curve: P(pred of a random positive > pred of a random negative), ties count 1/2.

    Mann-Whitney U with average ranks: (sum of positives' ranks - P (P + 1) / 2) / (P * N).
    NaN when only one class is present (or no data).
    """
    p, y = _pred_outcome(pred, outcome)
    n_pos = float(y.sum())
    n_neg = float(y.numel()) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    _, inverse, counts = torch.unique(p, return_inverse=True, return_counts=True)
    # 1-based average rank of each group of tied values: last rank of the group minus (size - 1) / 2.
    avg_rank = torch.cumsum(counts, 0).double() - (counts.double() - 1.0) / 2.0
    rank_sum_pos = float((avg_rank[inverse] * y).sum())
    return (rank_sum_pos - n_pos * (n_pos + 1.0) / 2.0) / (n_pos * n_neg)
