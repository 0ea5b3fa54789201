"""Calibration of draft confidences: metrics, sequential temperature scaling (offline and online), reports.

Terms (design.md sections 2 and 5):

- *conditional confidence* c[n, j]: the drafter's estimate that draft j is accepted given that drafts
  0..j-1 were. With logits l[n, j] and per-position temperatures T_j: c[n, j] = sigmoid(l[n, j] / T_j).
- *cumulative survival* a[n, j] = prod_{i <= j} c[n, i]: the estimate that drafts 0..j are all accepted.
  This is what the planner ranks, so it is what the offline tools calibrate and report.
- *accepted length* accepted[n] in [0, K]: accepted drafts of row n (the target's first rejection, or
  verified[n] when every verified draft passed). The observed event "draft j survived" is accepted[n] > j.
- *verified* verified[n] in [0, K]: drafts of row n that the target judged. Row n says something about
  position j only when j < verified[n]; its logits at positions >= verified[n] are never read (they may be
  padding, even NaN).

Metrics (reused by every tool here, by the command line and by the tests):

- :func:`expected_calibration_error`: equal-width bins on [0, 1]; a prediction p goes to bin
  ``min(floor(p * num_bins), num_bins - 1)`` (the binning of ``AcceptanceStats``);
  ECE = sum over bins of (rows in bin / rows) * |mean prediction - mean outcome|.
- :func:`auc`: the probability that a random positive outranks a random negative (Mann-Whitney U over
  average ranks, so ties count one half); NaN when only one class is present.

Offline fit, :func:`fit_sts` (design section 5): left to right, T_j is the grid value minimising the ECE of
the cumulative survival at position j over the rows with j < verified[n], T_0..T_{j-1} fixed at their fitted
values. Every T_j is positive, so within a position the order of candidates never changes.

Online fit, :class:`OnlineSTS`: the same grid search on the binned counts of an ``AcceptanceStats``,
refreshed every N decode steps from exponentially decayed counts.
"""
from __future__ import annotations

import datetime
import json
import math
import numbers
import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

__all__ = [
    "DEFAULT_GRID",
    "MIN_ROWS",
    "OnlineSTS",
    "auc",
    "calibration_report",
    "default_grid",
    "expected_calibration_error",
    "fit_sts",
    "load_temperatures",
    "save_temperatures",
]

#: Default temperature grid: geometric, 0.05 to 20 in 200 points (neighbours 3.1% apart). 0.05 sharpens a
#: logit 20-fold, 20 flattens it 20-fold: wide enough for any drafter we have seen, fine enough that the
#: grid step is well inside the 15% a fitted temperature is expected to be good to.
DEFAULT_GRID = (0.05, 20.0, 200)

#: A position needs at least this many rows with j < verified[n] for fit_sts (ECE over 15 bins from fewer
#: rows is mostly noise, and the fitted temperature with it).
MIN_ROWS = 50

#: Version of the JSON layout written by save_temperatures.
FORMAT_VERSION = 1

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]


def default_grid(
    t_min: float = DEFAULT_GRID[0], t_max: float = DEFAULT_GRID[1], points: int = DEFAULT_GRID[2]
) -> torch.Tensor:
    """Geometric grid of ``points`` temperatures from ``t_min`` to ``t_max`` (float64, ascending)."""
    if not (_is_real(t_min) and _is_real(t_max)) or not (0.0 < t_min <= t_max < math.inf):
        raise ValueError(f"grid bounds must satisfy 0 < t_min <= t_max < inf, got t_min={t_min!r}, t_max={t_max!r}")
    if not isinstance(points, numbers.Integral) or isinstance(points, bool) or points < 1:
        raise ValueError(f"grid points must be an int >= 1, got {points!r}")
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
    if not isinstance(num_bins, numbers.Integral) or isinstance(num_bins, bool) or num_bins < 1:
        raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
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
# report and reliability diagram
# ----------------------------------------------------------------------------------------------------


def _survival_metrics(cum: torch.Tensor, a: torch.Tensor, v: torch.Tensor, num_bins: int) -> dict:
    """ECE / AUC of cumulative survival cum [N, K] against accepted > j, over rows with j < verified."""
    K = cum.shape[1]
    used = torch.arange(K)[None, :] < v[:, None]
    survived = (a[:, None] > torch.arange(K)[None, :]).double()
    ece, area, acceptance, predicted, trials = [], [], [], [], []
    for j in range(K):
        rows = used[:, j]
        p, y = cum[rows, j], survived[rows, j]
        trials.append(int(rows.sum()))
        ece.append(expected_calibration_error(p, y, num_bins) if trials[-1] else math.nan)
        area.append(auc(p, y))
        acceptance.append(float(y.mean()) if trials[-1] else math.nan)
        predicted.append(float(p.mean()) if trials[-1] else math.nan)
    p_all, y_all = cum[used], survived[used]
    return {
        "ece": ece,
        "auc": area,
        "ece_overall": expected_calibration_error(p_all, y_all, num_bins) if p_all.numel() else math.nan,
        "auc_overall": auc(p_all, y_all),
        "acceptance": acceptance,
        "predicted": predicted,
        "trials": trials,
    }


def calibration_report(
    conf_or_logits: ArrayLike,
    accepted: ArrayLike,
    verified: Optional[ArrayLike] = None,
    *,
    is_logits: bool = False,
    temperatures: Optional[ArrayLike] = None,
    num_bins: int = 15,
    plot: Optional[Union[str, os.PathLike]] = None,
) -> dict:
    """ECE and AUC of the cumulative survival per position and overall; optionally a reliability diagram.

    conf_or_logits: [N, K] conditional confidences in [0, 1] (default), or logits with ``is_logits=True``
    (an explicit keyword: a block of confidences and a block of logits can look alike, and guessing from
    the values would silently change what is measured; confidences outside [0, 1] raise ValueError).
    accepted / verified: as in :func:`fit_sts`. Every metric is of the *cumulative* survival
    a[n, j] = prod_{i <= j} c[n, i] against the observed survival accepted[n] > j, over the rows with
    j < verified[n]; "overall" pools all those (row, position) pairs.

    temperatures: [K] STS temperatures. Confidences are first turned back into logits (logit(c); 0 and 1
    give -inf / +inf and stay 0 / 1), then c = sigmoid(logit / T_j).

    Returns a dict with the numbers as given (before calibration):
        "ece" [K], "auc" [K], "ece_overall", "auc_overall",
        "acceptance" [K] (observed survival rate), "predicted" [K] (mean cumulative survival),
        "trials" [K] (rows with j < verified), "num_rows", "num_positions", "num_bins",
    and, when temperatures are given, "temperatures" [K] and "after": the same metric keys after calibration.
    AUC is NaN where a position saw only one outcome. plot=PATH writes a PNG (matplotlib) with one panel per
    position: observed survival rate against mean predicted survival per bin, before (and after) calibration.
    """
    num_bins = _check_bins(num_bins)
    if not isinstance(is_logits, bool):
        raise TypeError(f"is_logits must be a bool, got {type(is_logits).__name__}")
    name = "conf_or_logits"
    x, a, v = _sts_inputs(conf_or_logits, accepted, verified, name)
    N, K = x.shape
    used = torch.arange(K)[None, :] < v[:, None]
    if is_logits:
        logit = x
        conf = torch.sigmoid(x)
    else:
        outside = used & ((x < 0) | (x > 1))
        if bool(outside.any()):
            n, j = outside.nonzero()[0].tolist()
            raise ValueError(
                f"{name} must hold confidences in [0, 1] (pass is_logits=True for logits), got {float(x[n, j])!r} "
                f"at row {n}, position {j}"
            )
        conf = x
        logit = torch.logit(x)
    # Unused positions (j >= verified) may hold anything: make them neutral so they cannot poison a product.
    conf = torch.where(used, conf, torch.ones_like(conf))
    report = _survival_metrics(torch.cumprod(conf, 1), a, v, num_bins)
    report.update(num_rows=N, num_positions=K, num_bins=num_bins)
    after_cum = None
    if temperatures is not None:
        t = _check_temperatures("temperatures", temperatures, K)
        conf_after = torch.where(used, torch.sigmoid(logit / t), torch.ones_like(conf))
        after_cum = torch.cumprod(conf_after, 1)
        report["temperatures"] = t.tolist()
        report["after"] = _survival_metrics(after_cum, a, v, num_bins)
    if plot is not None:
        _reliability_plot(plot, torch.cumprod(conf, 1), after_cum, a, v, num_bins, report)
    return report


def _reliability_curve(p: torch.Tensor, y: torch.Tensor, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Per non-empty bin: mean prediction, observed rate."""
    b = _bin_index(p, num_bins)
    zeros = torch.zeros(num_bins, dtype=torch.float64)
    n = zeros.index_add(0, b, torch.ones_like(p))
    keep = n > 0
    mean_p = zeros.index_add(0, b, p)[keep] / n[keep]
    rate = zeros.index_add(0, b, y)[keep] / n[keep]
    return mean_p.numpy(), rate.numpy()


def _reliability_plot(path, before, after, a, v, num_bins, report) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("calibration_report(plot=...) needs matplotlib: pip install matplotlib") from e
    K = before.shape[1]
    cols = min(K, 4)
    rows = (K + cols - 1) // cols
    # Figure + Agg canvas directly: no pyplot, so the caller's backend and figure state are left alone.
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    survived = (a[:, None] > torch.arange(K)[None, :]).double()
    for j in range(K):
        ax = fig.add_subplot(rows, cols, j + 1)
        ax.plot([0, 1], [0, 1], color="0.6", linewidth=1, linestyle="--", label="perfect")
        sel = v > j
        curves = [("before", before, report, "tab:red")]
        if after is not None:
            curves.append(("after", after, report["after"], "tab:blue"))
        for label, cum, rep, color in curves:
            if not bool(sel.any()):
                continue
            mp, rate = _reliability_curve(cum[sel, j], survived[sel, j], num_bins)
            ax.plot(mp, rate, marker="o", markersize=3, color=color, label=f"{label}: ECE {rep['ece'][j]:.3f}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"position {j} ({report['trials'][j]} rows)", fontsize=9)
        ax.set_xlabel("predicted survival", fontsize=8)
        ax.set_ylabel("observed survival", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
    title = "Reliability of cumulative survival" + (" (before / after STS)" if after is not None else "")
    fig.suptitle(title, fontsize=10)
    fig.savefig(os.fspath(path), format="png", dpi=100)


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


# ----------------------------------------------------------------------------------------------------
# online variant
# ----------------------------------------------------------------------------------------------------


class OnlineSTS:
    """Temperatures refreshed from an ``AcceptanceStats`` every ``refresh_every`` decode steps.

    Usage, once per decode step, after rejection sampling (``stats_conf="calibrated"``, the default: the
    stats see the confidences the planner used, so ``stats.report()`` measures what is deployed)::

        conf = adaptive_verify.confidence(hidden, w, bias=b, temperature=sts.temperatures)
        ... plan with conf, verify, rejection-sample ...
        stats.update(conf, verify_lens, num_accepted)
        sts.step(stats)

    With ``stats_conf="raw"`` the stats must instead be fed uncalibrated confidences (temperature None).

    ``temperatures`` [num_positions] float32 lives on ``device``; it starts at all ones (cold start: the
    drafter's own scale) or at ``initial`` (e.g. offline :func:`fit_sts` temperatures), and is updated in
    place, so a captured CUDA graph that reads it sees new values. Treat it as read-only: refreshes start
    from a host copy.

    Host synchronisation: ``step`` only counts calls, except every ``refresh_every``-th call, which reads
    the stats' counts to the host once (one device-to-host copy), refits on the host and copies the new
    temperatures back. Nothing else syncs.

    Windows and drift: each refresh takes the counts added since the previous refresh (a ``stats.reset()``
    in between is detected: counts going down mean the stats restarted, and the current counts are taken
    as new) as one *window*, tagged with the temperature its confidences were computed with (the current
    T_j in "calibrated" mode, 1 in "raw" mode). All earlier windows are scaled by ``decay`` first: data k
    refreshes old weighs decay**k, so the fit remembers about refresh_every / (1 - decay) steps (500 with
    the defaults) and follows a drafter whose calibration changes. Windows with the same tag are summed
    exactly; past ``max_windows`` per position the two oldest are merged (the older one's bin means moved
    into the newer one's temperature, an approximation confined to data that has mostly decayed away).

    Fit: the stats hold *conditional* counts (position j's trials are rows whose drafts 0..j-1 were all
    accepted), binned by confidence. Which trials reach position j does not depend on the temperatures,
    so the sequential fit of design section 5 decouples here: left to right, T_j is the grid value
    minimising the ECE over the cells (window x bin) of sigmoid(logit(cell's mean confidence) * tag / T_j)
    against the cell's observed survival rate (ties to the value closest to 1). A position with fewer than
    ``min_trials`` decayed trials keeps its temperature.

    Why "calibrated" is the default, besides monitoring: a bin stands for every logit inside it, and the
    logit of a bin's mean confidence is not the bins' mean logit. For a strongly overconfident drafter
    nearly everything lands in the two end bins, which span unbounded logit ranges, and a fit on raw
    counts comes out biased towards T = 1 (measured with 16 bins: T = 3 fits as about 2.4, T = 5 as 3.2).
    Calibrated confidences are spread over the bins, and once T_j is right every bin's observed rate
    equals its mean confidence, so the fixed point of the refresh is unbiased.
    """

    def __init__(
        self,
        num_positions: int,
        refresh_every: int = 100,
        decay: float = 0.8,
        min_trials: float = 200,
        grid: Optional[ArrayLike] = None,
        device: Union[str, torch.device] = "cpu",
        stats_conf: str = "calibrated",
        max_windows: int = 32,
        initial: Optional[ArrayLike] = None,
    ) -> None:
        if not isinstance(num_positions, numbers.Integral) or isinstance(num_positions, bool) or num_positions < 1:
            raise ValueError(f"num_positions must be an int >= 1, got {num_positions!r}")
        if not isinstance(refresh_every, numbers.Integral) or isinstance(refresh_every, bool) or refresh_every < 1:
            raise ValueError(f"refresh_every must be an int >= 1, got {refresh_every!r}")
        if not _is_real(decay) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
        if not _is_real(min_trials) or min_trials < 0:
            raise ValueError(f"min_trials must be a number >= 0, got {min_trials!r}")
        if stats_conf not in ("calibrated", "raw"):
            raise ValueError(f"stats_conf must be 'calibrated' or 'raw', got {stats_conf!r}")
        if not isinstance(max_windows, numbers.Integral) or isinstance(max_windows, bool) or max_windows < 1:
            raise ValueError(f"max_windows must be an int >= 1, got {max_windows!r}")
        self.num_positions = int(num_positions)
        self.refresh_every = int(refresh_every)
        self.decay = float(decay)
        self.min_trials = float(min_trials)
        self.grid = _check_grid(grid)
        self.stats_conf = stats_conf
        self.max_windows = int(max_windows)
        start = torch.ones(self.num_positions, dtype=torch.float64)
        if initial is not None:
            start = _check_temperatures("initial", initial, self.num_positions)
        self._host_temperatures = start  # host mirror, so a refresh never reads the device copy back
        self.temperatures = start.to(device=device, dtype=torch.float32)
        self.steps = 0
        self.refreshes = 0
        # Per position, oldest first: [tag, trials [bins], survivals [bins], conf sums [bins]] (host float64).
        self._windows: list[list[list]] = [[] for _ in range(self.num_positions)]
        self._last: Optional[torch.Tensor] = None  # the stats' cumulative counts at the previous refresh

    def step(self, stats: Any) -> bool:
        """Count one decode step; every ``refresh_every``-th call refreshes. Returns whether it refreshed."""
        self.steps += 1
        if self.steps % self.refresh_every:
            return False
        self.refresh(stats)
        return True

    def refresh(self, stats: Any) -> torch.Tensor:
        """Refit now from ``stats`` (one host sync). Returns ``temperatures``."""
        for attr in ("trials", "survivals", "conf_sum"):
            if not isinstance(getattr(stats, attr, None), torch.Tensor):
                raise TypeError(f"stats must be an AcceptanceStats (missing tensor attribute {attr!r})")
        shape = tuple(stats.trials.shape)
        if len(shape) != 2 or shape[0] != self.num_positions:
            raise ValueError(f"stats must count {self.num_positions} positions, got trials of shape {shape}")
        # One device-to-host copy of all three count tables: [3, K, bins].
        cur = torch.stack([stats.trials.double(), stats.survivals.double(), stats.conf_sum.double()]).cpu()
        if self._last is None or self._last.shape != cur.shape or bool((cur[0] < self._last[0]).any()):
            new = cur  # first refresh, other binning, or the stats were reset since the previous refresh
            if self._last is not None and self._last.shape != cur.shape:
                self._windows = [[] for _ in range(self.num_positions)]
        else:
            new = cur - self._last
        self._last = cur
        temps = self._host_temperatures.clone()
        for j in range(self.num_positions):
            tag = float(temps[j]) if self.stats_conf == "calibrated" else 1.0
            self._add_window(j, tag, new[0, j], new[1, j], new[2, j])
            temps[j] = self._fit(j, float(temps[j]))
        self._host_temperatures = temps
        self.temperatures.copy_(temps.to(torch.float32))
        self.refreshes += 1
        return self.temperatures

    def _add_window(self, j: int, tag: float, trials, survivals, conf_sum) -> None:
        windows = self._windows[j]
        for w in windows:
            for i in (1, 2, 3):
                w[i] = w[i] * self.decay
        if windows and windows[-1][0] == tag:
            windows[-1][1:] = [windows[-1][1] + trials, windows[-1][2] + survivals, windows[-1][3] + conf_sum]
        else:
            windows.append([tag, trials.clone(), survivals.clone(), conf_sum.clone()])
        if len(windows) > self.max_windows:
            old, newer = windows.pop(0), windows[0]
            # Move the older window's bin means to the newer window's temperature, then add the counts.
            n = old[1]
            moved = torch.sigmoid(torch.logit((old[3] / n.clamp(min=1e-300)).clamp(0.0, 1.0)) * old[0] / newer[0])
            newer[1:] = [newer[1] + n, newer[2] + old[2], newer[3] + torch.where(n > 0, n * moved, torch.zeros_like(n))]

    def _fit(self, j: int, current: float) -> float:
        tags = torch.cat([torch.full_like(w[1], w[0]) for w in self._windows[j]])
        n = torch.cat([w[1] for w in self._windows[j]])
        if float(n.sum()) < max(self.min_trials, 1e-12):
            return current
        s = torch.cat([w[2] for w in self._windows[j]])
        c = torch.cat([w[3] for w in self._windows[j]])
        keep = n > 0
        n, s, c, tags = n[keep], s[keep], c[keep], tags[keep]
        raw_logit = torch.logit((c / n).clamp(0.0, 1.0)) * tags
        # [G, cells]; ECE over the cells, each cell its own bin
        pred = torch.sigmoid(raw_logit[None, :] / self.grid[:, None])
        ece = (n * (pred - s / n).abs()).sum(-1) / n.sum()
        return _pick(self.grid, ece)
