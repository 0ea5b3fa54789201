"""`adaptive-verify fit`: a simulator profile from a deployment's own serving benchmark.

Input: measured no-speculation and fixed-k points (:mod:`adaptive_verify.sim.fit_inputs`) and what the user
knows (drafts per step, prompt and output lengths, acceptance, token capacity). Output: a profile whose
simulated none / k<N> points land on the measured ones, so that ``adaptive-verify sweep --profile`` can
predict what adaptive verification would do on that deployment.

What is fitted: the verification forward's cost at fixed token counts (``VERIFY_KNOTS_PER_OCTAVE`` knots
from 1 token to the capacity, linear in between), the drafter's cost at 1 request and at the largest
measured concurrency (linear in between), and optionally ``request_ms`` (a per-request term of every step).
The acceptance model, workload and capacity are given (the capacity is otherwise the smallest of
``CAPACITY_CANDIDATES`` whose fit error is within ``CAPACITY_TIE`` of the lowest).

Why it takes seconds, not the 23 minutes a search over simulations took: for no speculation and fixed k,
nothing the simulator decides depends on the step's cost, only on the capacity. Each measured point is
simulated once per seed with a trace of its steps (:func:`~adaptive_verify.sim.engine.simulate`), and its
time is then a linear function of the cost knots: each step's forward cost is a weighted sum of the two
knots around its token count, its drafter cost the same over request counts. The fit is a small smooth
optimisation over those sums (torch L-BFGS, float64), and ``simulate`` on the written profile gives
exactly the numbers the fit reports (tests hold it to that).

Objective: the sum over measured metrics (tokens/s, and TPOT where given) of the squared log error of the
mean over seeds, plus a small penalty on bends of the cost curve (each knot's change of slope, in units of
the typical measured step), which decides the knots the data does not (points are few; knots are many).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

from .._checks import check_int, check_real
from ..cost import CostTable
from .engine import ADAPTIVE, parse_policy, simulate
from .fit_inputs import MeasuredPoint
from .model import Acceptance, Drafter, Profile, Workload
from .overhead import DEFAULT_OVERHEAD, Overhead, overhead_preset

__all__ = ["FitResult", "fit_profile", "CAPACITY_CANDIDATES", "VERIFY_KNOTS_PER_OCTAVE", "DEFAULT_PENALTY"]

#: Token capacities tried when the user does not know it (vLLM's max_num_batched_tokens is usually one),
#: and how close (relative) to the lowest error a smaller capacity may be and still be chosen.
CAPACITY_CANDIDATES = (1024, 2048, 4096, 8192, 16384)
CAPACITY_TIE = 0.02
#: Verify-cost knots: 1 token, then 2 per doubling from 16 tokens to the capacity (the capacity included).
VERIFY_KNOTS_PER_OCTAVE = 2
#: Weight of the squared bends of the verify curve against the squared log errors of the points. A bend
#: is how far the curve leaves the straight line through the knot before, over the knot's span, in units
#: of the typical measured step; at 0.1, a bend of a tenth of a step costs as much as a 3% miss on one
#: point (0.1 * 0.1**2 = 0.03**2). It decides the curve only where no measured step ran.
DEFAULT_PENALTY = 0.1


def verify_knots(capacity: int) -> list[int]:
    knots, x = [1], 16.0
    while x < capacity:
        if int(round(x)) > knots[-1]:
            knots.append(int(round(x)))
        x *= 2 ** (1.0 / VERIFY_KNOTS_PER_OCTAVE)
    return knots + [capacity]


def _hat(xs: Sequence[int], values: np.ndarray) -> np.ndarray:
    """[len(values), len(xs)] weights w with w @ ys = linear interpolation of (xs, ys) at values, flat below
    xs[0] and above xs[-1] (CostTable's rule between and below its points; no value here lies above)."""
    xs_a = np.asarray(xs, dtype=np.float64)
    v = np.clip(np.asarray(values, dtype=np.float64), xs_a[0], xs_a[-1])
    out = np.zeros((v.size, len(xs)))
    if len(xs) == 1:
        out[:, 0] = 1.0
        return out
    i = np.clip(np.searchsorted(xs_a, v, side="right") - 1, 0, len(xs) - 2)
    t = (v - xs_a[i]) / (xs_a[i + 1] - xs_a[i])
    rows = np.arange(v.size)
    out[rows, i] = 1.0 - t
    out[rows, i + 1] += t
    return out


@dataclass
class _Runs:
    """Every simulated run of one capacity as linear functionals of theta = [verify knots, draft knots,
    request_ms]: time_ms = time @ theta, the TPOT numerator = weighted @ theta (each step's time x R)."""

    time: np.ndarray  # [runs, params]
    weighted: np.ndarray  # [runs, params]
    tokens: np.ndarray  # [runs] output tokens
    decode_tokens: np.ndarray  # [runs]
    step_tokens: np.ndarray  # [runs] mean tokens per step: where on the cost curve the run operates
    point: np.ndarray  # [runs] index of the measured point


def _trace_runs(base: Profile, points: Sequence[MeasuredPoint], vk: list[int],
                draft_features: Callable[[np.ndarray], np.ndarray], steps: int, seeds: Sequence[int],
                tick: Callable[[str], None]) -> _Runs:
    """draft_features(R) -> [steps, draft params]: each step's drafter cost as weights of the draft parameters
    (before the step's draft factor)."""
    rows_t, rows_w, tokens, decode, step_tokens, which = [], [], [], [], [], []
    K = base.drafter.num_drafts
    for p_idx, p in enumerate(points):
        for s in seeds:
            trace: list = []
            _simulate(base, p, K, steps, s, trace)
            tr = np.asarray(trace, dtype=np.float64)  # [steps, 6]: R, n, draft factor, output, decode, prompt tokens
            R, n, f = tr[:, 0], tr[:, 1], tr[:, 2]
            per_step = np.concatenate([_hat(vk, n), f[:, None] * draft_features(R), R[:, None]], axis=1)
            rows_t.append(per_step.sum(axis=0))
            rows_w.append((per_step * R[:, None]).sum(axis=0))
            tokens.append(tr[:, 3].sum())
            decode.append(tr[:, 4].sum())
            step_tokens.append(n.mean())
            which.append(p_idx)
            tick(f"{p.policy} c={p.concurrency}")
    return _Runs(np.array(rows_t), np.array(rows_w), np.array(tokens), np.array(decode), np.array(step_tokens),
                 np.array(which))


def _simulate(profile: Profile, p: MeasuredPoint, K: int, steps: int, seed: int, trace=None) -> dict:
    scale = max(1, 16 // p.concurrency)  # as sweep: low concurrencies run longer
    return simulate(profile, parse_policy(p.policy, K), p.concurrency, steps=steps * scale,
                    warmup=(steps // 4) * scale, seed=seed, trace=trace)


class _Model:
    """theta from free parameters: knots as cumulative sums of positive increments (monotone curves); the
    drafter's knots fixed instead when the user measured them."""

    def __init__(self, nv: int, nd: int, request_term: bool, fixed_draft: Optional[Sequence[float]]):
        self.nv, self.nd, self.request_term = nv, nd, request_term
        self.fixed_draft = None if fixed_draft is None else torch.tensor(fixed_draft, dtype=torch.float64)

    @property
    def num_free(self) -> int:
        return self.nv + (self.nd if self.fixed_draft is None else 0) + int(self.request_term)

    def theta(self, phi: torch.Tensor) -> torch.Tensor:
        nv, nd = self.nv, self.nd
        verify = torch.cumsum(torch.exp(phi[:nv]), 0)
        if self.fixed_draft is None:
            draft, rest = torch.cumsum(torch.exp(phi[nv:nv + nd]), 0), phi[nv + nd:]
        else:
            draft, rest = self.fixed_draft, phi[nv:]
        req = torch.exp(rest[:1]) if self.request_term else torch.zeros(1, dtype=phi.dtype)
        return torch.cat([verify, draft, req])


def _predictor(runs: _Runs, num_points: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """theta -> (tokens/s, TPOT) per measured point, each the mean over its seeds (as sweep --seeds)."""
    time_m, weighted = torch.as_tensor(runs.time), torch.as_tensor(runs.weighted)  # [runs, params]
    tokens, decode = torch.as_tensor(runs.tokens), torch.as_tensor(runs.decode_tokens)  # [runs]
    mean = torch.zeros(num_points, len(runs.point), dtype=torch.float64)  # [points, runs]
    mean[torch.as_tensor(runs.point), torch.arange(len(runs.point))] = 1.0
    mean /= mean.sum(dim=1, keepdim=True)

    def predict(theta: torch.Tensor):
        return mean @ (1000.0 * tokens / (time_m @ theta)), mean @ ((weighted @ theta) / decode)

    return predict


def _solve(runs: _Runs, points: Sequence[MeasuredPoint], vk: list[int], nd: int, request_term: bool,
           fixed_draft: Optional[Sequence[float]], penalty: float):
    """(theta as numpy, squared log error of each point) minimising the points' squared log errors +
    ``penalty`` x the squared bends. nd: drafter parameters (fixed to fixed_draft when it is given)."""
    model = _Model(len(vk), nd, request_term, fixed_draft)
    y_tput = torch.tensor([p.tokens_per_s for p in points], dtype=torch.float64)
    has_tpot = torch.tensor([p.tpot_ms is not None for p in points])
    y_tpot = torch.tensor([p.tpot_ms or 1.0 for p in points], dtype=torch.float64)
    x = torch.tensor(vk, dtype=torch.float64)
    dx = x[1:] - x[:-1]
    span = (x[2:] - x[:-2]) / 2 if len(vk) > 2 else None

    predict = _predictor(runs, len(points))

    def point_errors(theta):
        tput, tpot = predict(theta)
        err = torch.log(tput / y_tput) ** 2
        return err + torch.where(has_tpot, torch.log(tpot / y_tpot) ** 2, torch.zeros_like(err))

    # The typical measured step: each run's measured time over its steps (its verify weights sum to one
    # per step), the median over runs. It scales the bend penalty and the start.
    measured_ms = 1000.0 * runs.tokens / np.array([points[i].tokens_per_s for i in runs.point])
    step_ms = float(np.median(measured_ms / runs.time[:, :len(vk)].sum(axis=1)))

    def loss(phi):
        theta = model.theta(phi)
        total = point_errors(theta).sum()
        if span is not None:
            v = theta[:len(vk)]
            slope = (v[1:] - v[:-1]) / dx
            # how far the curve leaves the straight line through the knot before, in typical steps
            bend = (slope[1:] - slope[:-1]) * span / step_ms
            total = total + penalty * (bend ** 2).sum()
        return total

    # One fixed start (the fit is deterministic): a nearly flat curve at the typical step, a drafter at a
    # twentieth of it.
    inc = [step_ms] + [step_ms * 0.5 / len(vk)] * (len(vk) - 1)
    if fixed_draft is None:
        inc += [step_ms * 0.05] + [step_ms * 0.05 / nd] * (nd - 1)
    phi0 = [math.log(v) for v in inc] + ([math.log(step_ms * 1e-3)] if request_term else [])
    phi = torch.tensor(phi0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([phi], lr=1.0, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-14,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = loss(phi)
        value.backward()
        return value

    for _ in range(2):  # a restart from where L-BFGS stopped, with a fresh history (it can stall on the exp scale)
        opt.step(closure)
    with torch.no_grad():
        theta = model.theta(phi)
        return theta.numpy().copy(), point_errors(theta).numpy().copy()


@dataclass
class FitResult:
    """profile: the fitted profile's dict (Profile.from_dict takes it). rows: one per measured metric, with
    policy, concurrency, step_tokens (mean tokens per simulated step), metric, measured, fitted (the mean
    over seeds of simulate() on the written profile), error (fitted / measured - 1), held_back (an
    adaptive point: simulated, not fitted). capacities: {capacity tried: sum of squared log errors}."""

    profile: dict
    rows: list[dict]
    capacities: dict[int, float]
    seconds: float
    settings: dict = field(default_factory=dict)

    def table(self) -> str:
        """The fit's quality, one line per metric; held-back (adaptive) points are predictions."""
        head = f"{'policy':>8} {'c':>5} {'tokens/step':>11} {'metric':>12} {'measured':>10} {'simulated':>10} {'error':>8}"
        lines = [head]
        for r in self.rows:
            tag = "  held back: predicted, not fitted" if r["held_back"] else ""
            lines.append(f"{r['policy']:>8} {r['concurrency']:>5} {r['step_tokens']:>11.0f} {r['metric']:>12} "
                         f"{r['measured']:>10.4g} {r['fitted']:>10.4g} {100 * r['error']:>+7.1f}%{tag}")
        errs = [abs(r["error"]) for r in self.rows if not r["held_back"]]
        lines.append(f"fitted points: mean |error| {100 * sum(errs) / len(errs):.1f}%, largest {100 * max(errs):.1f}%")
        held = [abs(r["error"]) for r in self.rows if r["held_back"]]
        if held:
            lines.append(f"held-back points: mean |error| {100 * sum(held) / len(held):.1f}%")
        return "\n".join(lines)


def _rows(points, tput, tpot, step_tokens, held_back: bool) -> list[dict]:
    rows = []
    for i, p in enumerate(points):
        for metric, measured, fitted in (("tokens_per_s", p.tokens_per_s, tput[i]), ("tpot_ms", p.tpot_ms, tpot[i])):
            if measured is not None:
                rows.append(dict(policy=p.policy, concurrency=p.concurrency, step_tokens=float(step_tokens[i]),
                                 metric=metric, measured=measured, fitted=float(fitted),
                                 error=float(fitted) / measured - 1, held_back=held_back))
    return rows


def fit_profile(points: Sequence[MeasuredPoint], *, num_drafts: int, acceptance: Acceptance,
                prompt_len: tuple[int, int], output_len: tuple[int, int], prefill_chunk: int = 2048,
                drafter_kind: str = "block", capacity: Optional[int] = None, request_term: bool = False,
                draft_ms: Optional[dict[int, float]] = None, penalty: float = DEFAULT_PENALTY,
                overhead: Union[str, Overhead] = DEFAULT_OVERHEAD, tensor_parallel: Optional[int] = None,
                seed: int = 0, seeds: int = 3, steps: int = 400, name: str = "fitted", source: str = "",
                assumed: Sequence[str] = (), progress: Optional[Callable[[int, int, str], None]] = None) -> FitResult:
    """Fits a profile to the none / k<N> ``points`` (see the module docstring); deterministic for ``seed``.

    Adaptive points (policy greedy, lagged or global) are held back: simulated on the fitted profile and
    reported next to their measurement, never fitted. seeds: simulated runs per point (seeds seed ..
    seed + seeds - 1), averaged as ``sweep --seeds`` does. steps: measured steps per run (times 16 // c
    below concurrency 16, as sweep). capacity: the token capacity per step, or None to try
    CAPACITY_CANDIDATES (those >= the largest concurrency). draft_ms: the drafter's measured cost
    {requests: ms} (linear in between, flat outside), not fitted; None fits it at 1 request and the largest
    concurrency. request_term: also fit CostTable.request_ms. penalty: the bend penalty (DEFAULT_PENALTY).
    overhead: the adaptive overhead written into the profile (a preset name or an Overhead). source and
    assumed are recorded in the profile's notes. progress(done, total, label) is called after each run.
    Errors (ValueError / TypeError) name the argument.
    """
    start = time.perf_counter()
    num_drafts = check_int("num_drafts", num_drafts, lo=1, hi=32)
    seeds = check_int("seeds", seeds, lo=1)
    seed = check_int("seed", seed, lo=0)
    steps = check_int("steps", steps, lo=4)
    penalty = check_real("penalty", penalty, lo=0.0)
    if not isinstance(acceptance, Acceptance):
        raise TypeError(f"acceptance must be an adaptive_verify.sim.Acceptance, got {type(acceptance).__name__}")
    if isinstance(overhead, str):
        overhead = overhead_preset(overhead)
    if not isinstance(overhead, Overhead):
        raise TypeError(f"overhead must be a preset name or an Overhead, got {type(overhead).__name__}")
    points = list(points)
    for i, p in enumerate(points):
        if not isinstance(p, MeasuredPoint):
            raise TypeError(f"points[{i}] must be a MeasuredPoint, got {type(p).__name__}")
        parse_policy(p.policy, num_drafts)  # a k<N> beyond num_drafts names itself
    fit_points = [p for p in points if p.policy not in ADAPTIVE]
    held = [p for p in points if p.policy in ADAPTIVE]
    if not fit_points:
        raise ValueError("points must include at least one none or k<N> point (adaptive points are held back)")
    cmax = max(p.concurrency for p in points)
    if capacity is None:
        caps = [c for c in CAPACITY_CANDIDATES if c >= cmax]
        if not caps:
            raise ValueError(f"capacity: concurrency {cmax} exceeds every capacity tried {CAPACITY_CANDIDATES}; "
                             "give the capacity")
    else:
        capacity = check_int("capacity", capacity, lo=1)
        if capacity < cmax:
            raise ValueError(f"capacity {capacity} is below the largest measured concurrency {cmax}: every decode "
                             "needs a token per step")
        caps = [capacity]
    workload = Workload(prompt_len=prompt_len, output_len=output_len, prefill_chunk=prefill_chunk)
    drafter = Drafter(num_drafts=num_drafts, kind=drafter_kind)
    if draft_ms is not None:
        if not isinstance(draft_ms, dict):
            raise TypeError(f"draft_ms must be a dict {{requests: ms}} or None, got {type(draft_ms).__name__}")
        # The table's own checks (messages start "draft_ms"), and its curve prices each step exactly as the
        # written profile will (linear between the points, extrapolated past the last).
        measured = CostTable.from_points({1: 1.0}, draft_ms, draft_interpolation="linear")
        dk, fixed_draft = list(draft_ms), [1.0]  # one parameter: the measured curve, weight 1

        def draft_features(R: np.ndarray) -> np.ndarray:
            return np.array([[measured.draft_cost(int(r))] for r in R]).reshape(-1, 1)
    else:
        dk, fixed_draft = ([1] if cmax == 1 else [1, cmax]), None

        def draft_features(R: np.ndarray) -> np.ndarray:
            return _hat(dk, R)
    seed_list = list(range(seed, seed + seeds))
    total, done = (len(caps) * len(fit_points) + len(held)) * seeds, 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    losses: dict[int, float] = {}
    fits: dict[int, tuple] = {}
    for cap in caps:
        vk = verify_knots(cap)
        # The traces need only the capacity from the table: any cost will do for simulating them.
        base = Profile(name=name, description="", acceptance=acceptance, drafter=drafter, workload=workload,
                       cost_table=_table(vk, [1.0] * len(vk), dk, [0.0] * len(dk), 0.0, cap, {}))
        runs = _trace_runs(base, fit_points, vk, draft_features, steps, seed_list, tick)
        theta, err = _solve(runs, fit_points, vk, len(fixed_draft or dk), request_term, fixed_draft, penalty)
        losses[cap] = float(err.sum())
        fits[cap] = (vk, runs, theta)
    # The smallest capacity whose error is within CAPACITY_TIE of the lowest: closer than that, the points
    # cannot tell capacities apart (larger ones only add steps nobody measured).
    lowest = min(losses.values())
    cap = min(c for c, v in losses.items() if v <= lowest * (1 + CAPACITY_TIE) + 1e-12)
    vk, runs, theta = fits[cap]
    nv = len(vk)
    # Rounded as written, and the reported errors computed from the rounded numbers (what sweep will show).
    verify = [round(float(v), 4) for v in theta[:nv]]
    if fixed_draft is None:
        draft = [round(float(v), 4) for v in theta[nv:nv + len(dk)]]
        draft_theta = draft
    else:
        draft, draft_theta = [float(v) for v in draft_ms.values()], fixed_draft
    req = round(float(theta[-1]), 6) if request_term else 0.0
    tput, tpot = _predictor(runs, len(fit_points))(torch.tensor(verify + draft_theta + [req], dtype=torch.float64))
    step_tokens = [float(np.mean(runs.step_tokens[runs.point == i])) for i in range(len(fit_points))]
    rows = _rows(fit_points, tput.numpy(), tpot.numpy(), step_tokens, held_back=False)

    table = _table(vk, verify, dk, draft, req, cap, {"source": f"adaptive-verify fit {source}".strip(),
                                                        **({"tensor_parallel": tensor_parallel} if tensor_parallel else {})},
                   levels=num_drafts if drafter_kind == "chain" else None)
    tp = f" at TP{tensor_parallel}" if tensor_parallel else ""
    profile = Profile(name=name, description=f"fitted to {len(fit_points)} measured points{tp} "
                      f"({source or 'adaptive-verify fit'}), {num_drafts}-token {drafter_kind} drafter",
                      cost_table=table, acceptance=acceptance, drafter=drafter, workload=workload, overhead=overhead)
    if held:
        results = []
        for p in held:
            runs_p = [_simulate(profile, p, num_drafts, steps, s) for s in seed_list]
            for _ in seed_list:
                tick(f"{p.policy} c={p.concurrency}")
            results.append({k: float(np.mean([r[k] for r in runs_p])) for k in ("tokens_per_s", "tpot_ms",
                                                                                 "mean_step_tokens")})
        rows += _rows(held, [r["tokens_per_s"] for r in results], [r["tpot_ms"] for r in results],
                      [r["mean_step_tokens"] for r in results], held_back=True)

    fitted = [f"verify_ms at {', '.join(map(str, vk))} tokens (linear in between)"]
    if fixed_draft is None:
        fitted.append(f"draft_ms at {' and '.join(map(str, dk))} requests (linear in between)")
    if request_term:
        fitted.append("request_ms (per request per step)")
    if capacity is None:
        fitted.append(f"token capacity {cap} (the smallest within {CAPACITY_TIE:.0%} of the lowest error of "
                      f"{', '.join(map(str, caps))})")
    given = list(assumed) + [
        f"prompt length {prompt_len[0]}..{prompt_len[1]}, output length {output_len[0]}..{output_len[1]}, "
        f"prefill chunk {prefill_chunk}", f"{num_drafts}-token {drafter_kind} drafter"]
    if draft_ms is not None:
        given.append(f"drafter cost {draft_ms} ms at those request counts (measured, not fitted; linear in "
                     "between and past the last)")
    if capacity is not None:
        given.append(f"token capacity {cap} per step")
    if tensor_parallel:
        given.append(f"tensor parallel {tensor_parallel} (recorded only: measured costs already include it)")
    notes = {
        "fitted": "; ".join(fitted) + f"; by `adaptive-verify fit` on {source or 'the measured points'}: squared "
                  f"log errors of each point's mean over seeds {seed_list} x {steps} steps, plus a bend penalty "
                  f"{penalty:g} that shapes the curve where no measured step ran",
        "assumed": given,
        "how_close": [[f"{r['policy']} c={r['concurrency']} {r['metric']}" + (" (held back)" if r["held_back"] else ""),
                       round(r["fitted"], 4), r["measured"], round(r["error"], 4)] for r in rows],
        "how_close_columns": ["point", "simulated", "measured", "error"],
    }
    out = dataclasses.replace(profile, notes=notes).to_dict()
    settings = dict(seed=seed, seeds=seeds, steps=steps, capacity=cap, capacity_given=capacity is not None,
                    request_term=request_term, tensor_parallel=tensor_parallel, penalty=penalty)
    return FitResult(profile=out, rows=rows, capacities=losses, seconds=time.perf_counter() - start,
                     settings=settings)


def _table(vk, verify, dk, draft, request_ms, cap, meta, levels=None):
    """The fitted table; a chain drafter's with its levels (uniform: the simulator prices a chain of D drafts as D / K
    of the full draft, which is what the fit measured it by), so the draft depth can price each level."""
    return CostTable.from_points(dict(zip(vk, verify)), dict(zip(dk, draft)), max_tokens=cap, metadata=meta,
                                 draft_interpolation="linear", request_ms=request_ms, draft_levels=levels)
