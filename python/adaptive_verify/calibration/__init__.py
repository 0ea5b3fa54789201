"""Calibration of draft confidences: metrics, sequential temperature scaling (offline and online), reports.

Terms (docs/design.md, "Terms" and "Confidence and calibration"):

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

Offline fit, :func:`fit_sts` (docs/design.md, "Confidence and calibration"): left to right, T_j is the grid value minimising the ECE of
the cumulative survival at position j over the rows with j < verified[n], T_0..T_{j-1} fixed at their fitted
values. Every T_j is positive, so within a position the order of candidates never changes.

Online fit, :class:`OnlineSTS`: the same grid search on the binned counts of an ``AcceptanceStats``,
refreshed every N decode steps from exponentially decayed counts.

Where things are: ``metrics.py`` (ECE, AUC, the grid, argument checks), ``sts.py`` (the offline fit and the
temperature files), ``report.py`` (calibration_report and the reliability diagram), ``online.py`` (OnlineSTS).
"""
from .metrics import DEFAULT_GRID, MIN_ROWS, auc, default_grid, expected_calibration_error
from .online import OnlineSTS
from .report import calibration_report
from .sts import FORMAT_VERSION, fit_sts, load_temperatures, save_temperatures

__all__ = ["DEFAULT_GRID", "FORMAT_VERSION", "MIN_ROWS", "OnlineSTS", "auc", "calibration_report", "default_grid",
           "expected_calibration_error", "fit_sts", "load_temperatures", "save_temperatures"]
