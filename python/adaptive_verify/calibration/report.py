"""Calibration reports: ECE and AUC per position before and after temperatures, and the reliability diagram."""
from __future__ import annotations

import math
import os
from typing import Optional, Union

import numpy as np
import torch

from .metrics import ArrayLike, _bin_index, _check_bins, _check_temperatures, auc, expected_calibration_error
from .sts import _sts_inputs

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
