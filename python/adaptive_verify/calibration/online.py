"""OnlineSTS: temperatures refreshed from AcceptanceStats while serving."""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Union

import torch

from .._checks import MAX_POSITIONS, to_float
from .._validate import device_arg
from .metrics import ArrayLike, _check_grid, _check_temperatures, _is_real

from .sts import _pick

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
    so the sequential fit of docs/design.md, "Confidence and calibration" decouples here: left to right, T_j is the grid value
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
        if not isinstance(num_positions, numbers.Integral) or isinstance(num_positions, bool) or \
                not 1 <= num_positions <= MAX_POSITIONS:
            raise ValueError(f"num_positions must be an int in [1, {MAX_POSITIONS}], got {num_positions!r}")
        if not isinstance(refresh_every, numbers.Integral) or isinstance(refresh_every, bool) or refresh_every < 1:
            raise ValueError(f"refresh_every must be an int >= 1, got {refresh_every!r}")
        if not _is_real(decay) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
        if not _is_real(min_trials) or not 0 <= to_float("min_trials", min_trials) < math.inf:
            raise ValueError(f"min_trials must be a number >= 0, got {min_trials!r}")
        if not isinstance(stats_conf, str) or stats_conf not in ("calibrated", "raw"):
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
        self.temperatures = start.to(device=device_arg("device", device, kernels=False), dtype=torch.float32)
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
