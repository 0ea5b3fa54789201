"""Confidence for drafters without a confidence head (EAGLE, MTP, n-gram): a margin -> acceptance model.

docs/design.md, "Confidence and calibration": an online estimator maps a cheap per-draft feature to the *conditional* acceptance
probability of each drafted position, refit from observed outcomes, and verifies full blocks until it has
data. The feature is the margin between the drafter's top-1 and top-2 logits (``draft_margin``): a drafter
that barely prefers its token is more often overruled by the target. Any other per-draft feature where
larger means "more likely accepted" can be given instead.

Model, per position j: conf = sigmoid(a_j + b_j * min(margin, max_margin)). Margins are capped because a
drafter with one candidate (V == 1) or a saturated softmax gives +inf / huge margins that carry no more
information than a large one.

Outcomes follow the trial definition of ``AcceptanceStats``: for request r, position j is a *trial* iff
j < verify_lens[r] and j <= num_accepted[r] (draft j was verified and every earlier draft accepted), and
the trial *succeeds* iff j < num_accepted[r].

The estimator is a model, not an op: it takes the feature as a tensor and imports no op (``draft_margin``, the
op that computes the margin, is the caller's to run: ``adaptive_verify.draft_margin(draft_logits)``).

Decode-loop cost: ``predict`` and ``observe`` run on the margins' device without a host synchronisation
(``observe`` writes whole rows into a ring buffer on the device). Every ``refit_every``-th ``observe`` copies
the buffer to the host once and refits each position by Newton's method in float64.
"""
from __future__ import annotations

import math
import numbers
from typing import Union

import torch

from ._checks import FLOAT32_MAX, MAX_POSITIONS, to_float
from ._validate import device_arg

__all__ = ["MarginEstimator"]

# Newton iterations per refit: logistic regression with an L2 term converges quadratically, so a handful
# suffices; the cap only matters for (nearly) separable data, where the L2 term bounds the solution.
_NEWTON_ITERS = 50
_NEWTON_TOL = 1e-10


#: Bounds of the sizes that allocate: the ring buffer is [buffer_rows, num_positions] float32 + uint8 (at most
#: 320 MB; positions: _checks.MAX_POSITIONS, as AcceptanceStats).
MAX_BUFFER_ROWS = 1 << 20


def _check_pos_int(name, v, hi=None):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v!r}")
    return int(v)


def _check_positive_real(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0 < to_float(name, v) < math.inf):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


class MarginEstimator:
    """Per-position logistic regression from a draft feature (top-1 minus top-2 logit) to acceptance.

    num_positions: K, the drafter's block size (at most 64). refit_every: refit after this many ``observe`` calls.
    min_samples: trials a position needs before it is fitted; until then ``predict`` returns exactly 1
    there (verify everything: the planner then behaves like fixed-k for that position, which also
    produces the outcomes to learn from). l2: ridge strength on both coefficients of the mean log-loss
    (minimised: mean NLL + l2 / 2 * (a^2 + b^2)); it keeps the fit finite when a position saw only
    accepts or only rejects. device: where ``predict`` returns and where the ring buffer lives.
    max_margin: margins are clamped to this before the model (+inf included). buffer_rows: the ring
    buffer keeps the last ``buffer_rows`` observed request rows (with all their positions), so the fit
    forgets old behaviour; later positions have fewer trials in it, as they have in the decode loop (at most
    2^20 rows).

    Usage::

        est = MarginEstimator(K, device="cuda")
        margin = adaptive_verify.draft_margin(draft_logits)  # [R, K] float32, or any such feature
        conf = est.predict(margin)                           # [R, K] float32
        survival = adaptive_verify.prefix_survival(conf, drafts)
        ... plan, verify, rejection-sample ...
        est.observe(margin, verify_lens, num_accepted)
    """

    def __init__(
        self,
        num_positions: int,
        refit_every: int = 100,
        min_samples: int = 200,
        l2: float = 1e-3,
        device: Union[str, torch.device] = "cpu",
        max_margin: float = 30.0,
        buffer_rows: int = 100_000,
    ) -> None:
        self.num_positions = _check_pos_int("num_positions", num_positions, MAX_POSITIONS)
        self.refit_every = _check_pos_int("refit_every", refit_every)
        self.min_samples = _check_pos_int("min_samples", min_samples)
        self.buffer_rows = _check_pos_int("buffer_rows", buffer_rows, MAX_BUFFER_ROWS)
        self.l2 = _check_positive_real("l2", l2)
        self.max_margin = _check_positive_real("max_margin", max_margin)
        if self.max_margin > FLOAT32_MAX:  # margins are float32: clamping them to a larger bound cannot be expressed
            raise ValueError(f"max_margin must be <= {FLOAT32_MAX:.7g} (float32), got {max_margin!r}")
        self.device = device_arg("device", device, kernels=False)
        K = self.num_positions
        # Model, on the device: intercept a_j, slope b_j, fitted_j (False: predict 1).
        self.intercept = torch.zeros(K, dtype=torch.float32, device=self.device)
        self.slope = torch.zeros(K, dtype=torch.float32, device=self.device)
        self.fitted = torch.zeros(K, dtype=torch.bool, device=self.device)
        # Ring buffer of observed rows: [buffer_rows, K] margins, and outcome codes
        # 0 = no trial, 1 = trial rejected, 2 = trial accepted.
        self._margin = torch.zeros(self.buffer_rows, K, dtype=torch.float32, device=self.device)
        self._code = torch.zeros(self.buffer_rows, K, dtype=torch.uint8, device=self.device)
        self._next = 0  # next ring slot (host int: rows per call are known on the host, no sync)
        self._filled = 0
        self.observe_calls = 0
        self.refits = 0
        #: trials per position in the buffer at the last refit (host ints).
        self.samples = [0] * K

    # ------------------------------------------------------------------------------------------------

    def _check_margin(self, margin) -> torch.Tensor:
        if not isinstance(margin, torch.Tensor):
            raise TypeError(f"margin must be a torch.Tensor, got {type(margin).__name__}")
        if not margin.is_floating_point():
            raise TypeError(f"margin must have a floating dtype, got {margin.dtype}")
        if margin.dim() != 2 or not 1 <= margin.shape[1] <= self.num_positions:
            raise ValueError(
                f"margin must have shape [R, K'] with 1 <= K' <= {self.num_positions}, got {tuple(margin.shape)}"
            )
        if margin.device != self.device:
            raise ValueError(f"margin must be on {self.device} (the estimator's device), got {margin.device}")
        return margin

    def predict(self, margin: torch.Tensor) -> torch.Tensor:
        """Conditional acceptance conf [R, K'] float32 for margins [R, K'] (K' <= num_positions).

        sigmoid(a_j + b_j * min(margin, max_margin)) where position j is fitted, exactly 1.0 elsewhere.
        No host synchronisation; NaN margins give NaN (which ``prefix_survival`` treats as 0).
        """
        m = self._check_margin(margin).float().clamp(max=self.max_margin)
        k = m.shape[1]
        z = self.intercept[:k] + self.slope[:k] * m
        return torch.where(self.fitted[:k], torch.sigmoid(z), torch.ones_like(z))

    def observe(self, margin: torch.Tensor, verify_lens: torch.Tensor, num_accepted: torch.Tensor) -> bool:
        """Record one step's outcomes; refits every ``refit_every``-th call. Returns whether it refitted.

        margin [R, K'] (the features ``predict`` saw), verify_lens [R] and num_accepted [R] integer, on the
        estimator's device. Trials and successes as in the module docstring.
        """
        m = self._check_margin(margin)
        R, k = m.shape
        for name, t in (("verify_lens", verify_lens), ("num_accepted", num_accepted)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name} must have dtype int32 or int64, got {t.dtype}")
            if tuple(t.shape) != (R,):
                raise ValueError(f"{name} must have shape [R] = ({R},) like margin, got {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} must be on {self.device} (the estimator's device), got {t.device}")
        if R:
            j = torch.arange(k, device=self.device)[None, :]
            trial = (j < verify_lens[:, None]) & (j <= num_accepted[:, None])
            code = trial.to(torch.uint8) * (1 + (j < num_accepted[:, None]).to(torch.uint8))
            if R > self.buffer_rows:  # only the newest rows fit
                m, code, R = m[-self.buffer_rows :], code[-self.buffer_rows :], self.buffer_rows
            slots = (self._next + torch.arange(R, device=self.device)) % self.buffer_rows
            self._margin[:, :k].index_copy_(0, slots, m.float())
            self._code[:, :k].index_copy_(0, slots, code)
            if k < self.num_positions:
                self._code[:, k:].index_fill_(0, slots, 0)
            self._next = (self._next + R) % self.buffer_rows
            self._filled = min(self._filled + R, self.buffer_rows)
        self.observe_calls += 1
        if self.observe_calls % self.refit_every:
            return False
        self.refit()
        return True

    def refit(self) -> None:
        """Refit every position with at least ``min_samples`` trials in the buffer (one host sync)."""
        margin = self._margin[: self._filled].double().cpu().clamp(max=self.max_margin)
        code = self._code[: self._filled].cpu()
        a = self.intercept.double().cpu()
        b = self.slope.double().cpu()
        fitted = self.fitted.cpu()
        for j in range(self.num_positions):
            trial = (code[:, j] > 0) & torch.isfinite(margin[:, j])  # a NaN feature teaches nothing
            self.samples[j] = int(trial.sum())
            if self.samples[j] < self.min_samples:
                continue
            x = margin[trial, j]
            y = (code[trial, j] == 2).double()
            start = (float(a[j]), float(b[j])) if bool(fitted[j]) else (0.0, 0.0)
            a[j], b[j] = _fit_logistic(x, y, self.l2, start)
            fitted[j] = True
        self.intercept.copy_(a.float())
        self.slope.copy_(b.float())
        self.fitted.copy_(fitted)
        self.refits += 1


def _fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float, start: tuple[float, float]) -> tuple[float, float]:
    """argmin over (a, b) of mean NLL(sigmoid(a + b x), y) + l2 / 2 (a^2 + b^2): Newton with step halving."""
    X = torch.stack([torch.ones_like(x), x], 1)  # [n, 2]
    n = x.numel()
    w = torch.tensor(start, dtype=torch.float64)
    eye = torch.eye(2, dtype=torch.float64)

    def loss(w):
        z = X @ w
        # mean of log(1 + e^z) - y z, written stably
        return float((torch.nn.functional.softplus(z) - y * z).mean() + 0.5 * l2 * (w @ w))

    f = loss(w)
    for _ in range(_NEWTON_ITERS):
        p = torch.sigmoid(X @ w)
        grad = X.T @ (p - y) / n + l2 * w
        hess = (X.T * (p * (1 - p))) @ X / n + l2 * eye
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while True:
            w_new = w - t * step
            f_new = loss(w_new)
            if f_new <= f or t < 1e-6:
                break
            t *= 0.5
        converged = float(step.abs().max()) * t < _NEWTON_TOL
        w, f = w_new, f_new
        if converged:
            break
    return float(w[0]), float(w[1])
