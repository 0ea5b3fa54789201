"""Online acceptance statistics: how often drafts survive, per position and per predicted probability.

Every step, after rejection sampling, ``AcceptanceStats.update(conf, verify_lens, num_accepted)`` adds:

- a *trial* at (request r, position j) iff draft j was verified and every earlier draft was accepted:
  ``j < verify_lens[r] and j <= num_accepted[r]``;
- a *survival* iff draft j was accepted: ``j < num_accepted[r]``;

binned by the predicted conditional acceptance ``conf[r, j]`` into ``num_bins`` equal-width bins of [0, 1].
With ``positions`` ([R]), row r's entries count at positions ``positions[r] + j`` instead of j: rows are then
samples placed anywhere (a draft tree's nodes at their depths: conf [T, 1], verify_lens 1 for a trial,
num_accepted 1 for a survival), and ``totals`` are left to the caller.
The update is one kernel on the tensors' device, with no host sync, so it can run inside a captured CUDA
graph. Confidence sums are kept in 32.32 fixed point (exact, so the counts do not depend on the order
the GPU's atomics land in). NaN confidences are skipped and counted in ``error_counts()["nan_confidence"]``.
``report()`` syncs and returns calibration (ECE) and ranking quality (AUC) per position.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor

from . import errors
from ._ext import _C, check_status
from ._binding import StatsParams, call
from ._checks import INT32_MAX, MAX_POSITIONS, check_int
from ._validate import check_tensor, device_arg, stream_of
from .prepared import PreparedLaunch, capture, preparing, refuse_copy, register

_FIXED_ONE = 2.0**32
#: Most bins (and positions, _checks.MAX_POSITIONS): the counts are three int64 [num_positions, num_bins] tensors
#: (at most 24 MB), and the kernel's fields are int32.
MAX_BINS = 1 << 14


class AcceptanceStats:
    """Binned per-position acceptance counts on a device. See the module docstring for the semantics.

    Attributes (tensors on ``device``): ``trials`` and ``survivals`` int64 [num_positions, num_bins];
    ``conf_sum`` float64 [num_positions, num_bins] (sum of conf over the trials of each cell); ``totals`` int64 [2]:
    drafts verified and drafts accepted over every update, sum_r verify_lens[r] and sum_r min(num_accepted[r],
    verify_lens[r]) of every row as given (counted by the same kernel; rows of a conf with no columns add nothing).
    """

    def __init__(self, num_positions: int, num_bins: int = 16, device: Union[str, torch.device] = "cpu"):
        self.num_positions = check_int("num_positions", num_positions, lo=1, hi=MAX_POSITIONS)
        self.num_bins = check_int("num_bins", num_bins, lo=1, hi=MAX_BINS)
        self.device = device_arg("device", device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        shape = (num_positions, num_bins)
        self.trials = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.survivals = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self._conf_fixed = torch.zeros(shape, dtype=torch.int64, device=self.device)  # 32.32 fixed point
        self.totals = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._errors = errors.error_buffer(self.device)

    @property
    def conf_sum(self) -> torch.Tensor:
        return self._conf_fixed.double() / _FIXED_ONE

    @register
    def update(self, conf: torch.Tensor, verify_lens: torch.Tensor, num_accepted: torch.Tensor, *,
               positions: Optional[torch.Tensor] = None) -> None:
        """Adds one step's outcomes. conf [R, K'] float32 (K' <= num_positions, last dim contiguous),
        verify_lens [R] int32 (drafts verified), num_accepted [R] int32 (drafts accepted).

        positions: [R] int32 on the device, or None: row r's entry j counts at position positions[r] + j (see the
        module docstring); totals are then not added. A trial placed outside [0, num_positions) is a ValueError
        naming positions on the CPU (nothing is added) and is skipped and counted in
        ``error_counts()["stats_position_out_of_range"]`` on CUDA."""
        check_tensor("conf", conf, dtypes=(torch.float32,), device=self.device, ndim=2)
        R, K = conf.shape
        if R > INT32_MAX:
            raise ValueError(f"conf has {R} rows; at most {INT32_MAX} are supported")
        if K > self.num_positions:
            raise ValueError(f"conf has {K} positions but the stats track num_positions={self.num_positions}")
        v32 = _int32("verify_lens", verify_lens, self.device, R)
        a32 = _int32("num_accepted", num_accepted, self.device, R)
        p32 = None if positions is None else _int32("positions", positions, self.device, R)
        args = (conf, v32, a32, self.trials, self.survivals, self._conf_fixed, self._errors,
                self.totals if positions is None else None, p32)
        if torch.compiler.is_compiling():
            _stats_update_(*args)
            return
        params = _update_params(*args)
        if preparing():
            for name, given, used in (("verify_lens", verify_lens, v32), ("num_accepted", num_accepted, a32),
                                      ("positions", positions, p32)):
                if used is not given:  # an int64 input's int32 copy is per call
                    refuse_copy("AcceptanceStats.update", name)
            inputs = {"conf": (conf, "conf"), "verify_lens": (verify_lens, "verify_lens"),
                      "num_accepted": (num_accepted, "num_accepted"), "positions": (positions, "row_position")}
            capture(PreparedLaunch("AcceptanceStats.update", _C.stats_update, params, self.device, inputs, None, None,
                                   _MESSAGES))  # (the counts are this object's own: reset() zeroes them in place)
            return
        check_status(call(_C.stats_update, params, self.device.type == "cuda", stream_of(self.device)),
                     "AcceptanceStats.update", self.device, _MESSAGES)

    def reset(self) -> None:
        """Zeroes every count (asynchronously on CUDA)."""
        self.trials.zero_()
        self.survivals.zero_()
        self._conf_fixed.zero_()
        self.totals.zero_()

    def snapshot(self) -> tuple:
        """A copy of the counts (trials, survivals, confidence sums), for ``report(since=...)``: the figures of the
        updates after it, while the counts keep running (a caller that reads the per-position acceptance, as
        AdaptiveVerifier.plan_draft does, cannot have them zeroed)."""
        return self.trials.clone(), self.survivals.clone(), self._conf_fixed.clone()

    def report(self, since: Optional[tuple] = None) -> dict:
        """Host-side summary (syncs): per position j and overall,

        - ``ece``: sum over bins of |survivals - sum of conf| / trials, i.e. the trial-weighted gap between
          observed and predicted acceptance (the expected calibration error over these bins);
        - ``auc``: probability that a surviving trial got a higher bin than a failed one (ties count half),
          nan when a position has only one outcome;
        - ``acceptance``: observed survival rate given a trial; ``trials``: number of trials.

        since: a :meth:`snapshot`: the figures of the updates after it.
        """
        trials, survivals, conf = self.trials, self.survivals, self._conf_fixed
        if since is not None:
            trials, survivals, conf = trials - since[0], survivals - since[1], conf - since[2]
        n = trials.cpu().double()
        s = survivals.cpu().double()
        c = conf.cpu().double() / _FIXED_ONE
        per = [_summary(n[j], s[j], c[j]) for j in range(self.num_positions)]
        overall = _summary(n.sum(0), s.sum(0), c.sum(0))
        return {
            "ece": [p["ece"] for p in per],
            "auc": [p["auc"] for p in per],
            "acceptance": [p["acceptance"] for p in per],
            "trials": [int(p["trials"]) for p in per],
            "ece_overall": overall["ece"],
            "auc_overall": overall["auc"],
            "acceptance_overall": overall["acceptance"],
            "trials_overall": int(overall["trials"]),
        }


def _summary(n: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> dict:
    """ECE, AUC and acceptance of one row of bins (float64 [num_bins] counts)."""
    total = float(n.sum())
    if total == 0:
        return {"ece": math.nan, "auc": math.nan, "acceptance": math.nan, "trials": 0}
    ece = float((s - c).abs().sum()) / total
    pos, neg = s, n - s
    neg_below = torch.cumsum(neg, 0) - neg  # failed trials in lower bins
    p_tot, n_tot = float(pos.sum()), float(neg.sum())
    auc = math.nan
    if p_tot > 0 and n_tot > 0:
        auc = float((pos * neg_below).sum() + 0.5 * (pos * neg).sum()) / (p_tot * n_tot)
    return {"ece": ece, "auc": auc, "acceptance": p_tot / total, "trials": total}


def _int32(name, t, device, R):
    if isinstance(t, torch.Tensor) and t.dtype == torch.int64:
        t = t.to(torch.int32)
    return check_tensor(name, t, dtypes=(torch.int32,), device=device, shape=(R,), inner_contiguous=False)


def _launch_update(conf, verify_lens, num_accepted, trials, survivals, conf_fixed, err, totals, positions):
    p = _update_params(conf, verify_lens, num_accepted, trials, survivals, conf_fixed, err, totals, positions)
    check_status(call(_C.stats_update, p, conf.is_cuda, stream_of(conf.device)), "AcceptanceStats.update",
                 conf.device, _MESSAGES)


_MESSAGES = {_C.STATUS_STATS_POSITION: "positions: every trial's positions[r] + j must lie in [0, num_positions)"}


def _update_params(conf, verify_lens, num_accepted, trials, survivals, conf_fixed, err, totals, positions):
    p = StatsParams()
    p.num_reqs, p.max_drafts = conf.shape
    p.num_positions, p.num_bins = trials.shape
    p.conf, p.conf_stride = conf.data_ptr(), conf.stride(0)
    p.verify_lens, p.num_accepted = verify_lens.data_ptr(), num_accepted.data_ptr()
    p.trials, p.survivals, p.conf_sum, p.error_counts = (trials.data_ptr(), survivals.data_ptr(),
                                                          conf_fixed.data_ptr(), err.data_ptr())
    p.totals = 0 if totals is None else totals.data_ptr()
    p.row_position = 0 if positions is None else positions.data_ptr()
    return p


@torch.library.custom_op("adaptive_verify::stats_update_",
                         mutates_args=("trials", "survivals", "conf_fixed", "error_counts", "totals"))
def _stats_update_(conf: Tensor, verify_lens: Tensor, num_accepted: Tensor, trials: Tensor, survivals: Tensor,
                   conf_fixed: Tensor, error_counts: Tensor, totals: Optional[Tensor],
                   positions: Optional[Tensor] = None) -> None:
    _launch_update(conf, verify_lens, num_accepted, trials, survivals, conf_fixed, error_counts, totals, positions)


@_stats_update_.register_fake
def _(*args, **kwargs):
    return None
