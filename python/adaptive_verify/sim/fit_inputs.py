"""What `adaptive-verify fit` reads: a serving benchmark's measured points, and the drafter's acceptance.

Measured points, a CSV file (a serving benchmark's output, one row per run)::

    policy,concurrency,tokens_per_s,tpot_ms
    none,256,6267,33.8
    k7,1,264,3.7
    k7,256,2945,

- ``policy``: ``none`` (no speculation) or ``k<N>`` (fixed N drafts verified per step, N <= --drafts).
  Adaptive runs (``greedy``, ``lagged``, ``global``) are held back: never fitted (predicting them is what
  the profile is for), but simulated on the fitted profile and reported next to their measurement.
- ``concurrency``: an int >= 1; ``tokens_per_s``: output tokens per second, > 0; ``tpot_ms`` (optional
  column, a cell may be empty): mean time per output token in ms, > 0.
- Other columns are ignored; lines starting with ``#`` are comments; each (policy, concurrency) once.

Acceptance, a JSON file, either of:

- ``{"per_position": [a_0, ..., a_{K-1}]}``: measured per-position acceptance as engines report it (vLLM's
  spec-decode metrics): the fraction of drafted blocks whose draft j was accepted, i.e. the mean prefix
  survival, non-increasing in j. Converted to the simulator's model (:class:`Acceptance`) by choosing each
  position's median conditional acceptance so that the model's mean survival matches, with the spread
  and head parameters of :data:`SPREAD` (assumed: the default profile's).
- ``{"acceptance": {...}}``: the simulator's model itself, as ``sweep --acceptance`` files hold it (their
  ``drafter`` must then agree with --drafts; their ``workload`` is not used: the command line gives it).

Without a file the default profile's acceptance model is assumed (DeepSeek-V4's DSpark decay, continued
past 7 positions) and the fit says so.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .engine import ADAPTIVE
from .model import Acceptance

__all__ = ["MeasuredPoint", "read_points_csv", "read_acceptance", "acceptance_from_per_position",
           "default_acceptance", "SPREAD"]

#: Spread and head parameters a per-position measurement does not determine (the default profile's).
SPREAD = {"request_sigma": 0.6, "token_sigma": 1.2, "head_noise": 0.6, "head_temperature": 1.0, "head_bias": 0.0}
# The default profile's conditional medians (per-position survival 0.84 ... 0.07 in the model).
_DEFAULT_CONDITIONAL = (0.9, 0.82, 0.74, 0.68, 0.62, 0.57, 0.52)
# Monte Carlo draws for the per-position conversion (requests x steps, fixed seed), and how often the
# per-block weights are refreshed; together about a second, and the matched rates land within ~0.005.
_MC_REQUESTS, _MC_STEPS, _WEIGHT_ROUNDS = 1000, 64, 4


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured run: policy "none" or "k<N>", concurrency, output tokens/s and TPOT (ms, or None)."""

    policy: str
    concurrency: int
    tokens_per_s: float
    tpot_ms: Optional[float] = None
    row: int = 0  # line number in the CSV file (1 = header), for messages


def _positive(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be a finite number > 0, got {text!r}")
    return v


def read_points_csv(path: str | os.PathLike, num_drafts: int) -> list[MeasuredPoint]:
    """The measured points of ``path`` (see the module docstring). Errors (ValueError) name the file, the
    line and the column."""
    path = os.fspath(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) CSV file") from None
    # Comments are dropped but line numbers kept, so a message points at the line the user sees.
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise ValueError(f"{path}: no header line (expected columns policy,concurrency,tokens_per_s[,tpot_ms])")
    rows = list(csv.reader(io.StringIO("\n".join(line for _, line in numbered))))
    header = [h.strip() for h in rows[0]]
    for col in ("policy", "concurrency", "tokens_per_s"):
        if col not in header:
            raise ValueError(f"{path}: line {numbered[0][0]}: missing column {col!r} (columns: {', '.join(header)})")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: line {numbered[0][0]}: a column name appears twice ({', '.join(header)})")
    col = {h: i for i, h in enumerate(header)}
    points: list[MeasuredPoint] = []
    seen: dict[tuple[str, int], int] = {}
    for (line_no, _), cells in zip(numbered[1:], rows[1:]):
        where = f"{path}: line {line_no}"
        if len(cells) != len(header):
            raise ValueError(f"{where}: {len(cells)} cells for {len(header)} columns")
        cell = {h: cells[i].strip() for h, i in col.items()}
        policy = cell["policy"]
        m = re.fullmatch(r"k([0-9]+)", policy)
        if policy not in ("none",) + ADAPTIVE and not m:
            raise ValueError(f"{where}: column 'policy': expected none, k<N> or (held back, not fitted) "
                             f"{', '.join(ADAPTIVE)}, got {policy!r}")
        if m and not 1 <= int(m.group(1)) <= num_drafts:
            raise ValueError(f"{where}: column 'policy': {policy!r} verifies more drafts than --drafts {num_drafts} "
                             "(or none)")
        try:
            c = int(cell["concurrency"])
        except ValueError:
            raise ValueError(f"{where}: column 'concurrency': expected an int, got {cell['concurrency']!r}") from None
        if c < 1:
            raise ValueError(f"{where}: column 'concurrency': must be >= 1, got {c}")
        tput = _positive(cell["tokens_per_s"], f"{where}: column 'tokens_per_s'")
        tpot = None
        if "tpot_ms" in cell and cell["tpot_ms"] != "":
            tpot = _positive(cell["tpot_ms"], f"{where}: column 'tpot_ms'")
        key = (policy, c)
        if key in seen:
            raise ValueError(f"{where}: {policy} at concurrency {c} is already on line {seen[key]}")
        seen[key] = line_no
        points.append(MeasuredPoint(policy, c, tput, tpot, line_no))
    if not points:
        raise ValueError(f"{path}: no data rows after the header")
    return points


def default_acceptance(num_drafts: int) -> Acceptance:
    """The default profile's acceptance model for K positions: its 7 medians, continued 0.05 lower per
    position (floor 0.3) past them."""
    cond = list(_DEFAULT_CONDITIONAL[:num_drafts])
    while len(cond) < num_drafts:
        cond.append(max(round(cond[-1] - 0.05, 2), 0.3))
    return Acceptance(conditional=tuple(cond), **SPREAD)


def acceptance_from_per_position(per_position, num_drafts: int, where: str = "per_position") -> Acceptance:
    """The model whose per-position acceptance, counted per drafted block as engines count it, equals
    ``per_position`` (its first num_drafts entries).

    Engines average over blocks, not requests, and a request that accepts less lives more steps, so the
    requests are weighted by 1 / (1 + its expected accepted drafts) (verifying all K; end-of-output effects
    are ignored). Each position's median conditional acceptance is found by bisection on its logit over
    fixed draws (deterministic), and the weights are refreshed from the medians a few times.
    """
    if not isinstance(per_position, list) or len(per_position) < num_drafts:
        raise ValueError(f"{where} must be a list of at least --drafts = {num_drafts} acceptance rates, "
                         f"got {per_position!r}")
    targets = []
    for j, a in enumerate(per_position[:num_drafts]):
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < a < 1.0:
            raise ValueError(f"{where}[{j}] must be a number in (0, 1), got {a!r}")
        if targets and a > targets[-1]:
            raise ValueError(f"{where}[{j}] = {a} exceeds [{j - 1}] = {targets[-1]}: survival to position {j} "
                             f"cannot be more likely than to position {j - 1}")
        targets.append(float(a))
    rng = np.random.default_rng(0)
    d = rng.normal(0.0, SPREAD["request_sigma"], (_MC_REQUESTS, 1))  # [requests, 1] difficulty
    e = rng.normal(0.0, SPREAD["token_sigma"], (_MC_REQUESTS, _MC_STEPS, num_drafts))  # [requests, steps, K]
    weight = np.full(_MC_REQUESTS, 1.0 / _MC_REQUESTS)
    mus = [0.0] * num_drafts
    for _ in range(_WEIGHT_ROUNDS):
        prefix = np.ones((_MC_REQUESTS, _MC_STEPS))
        per_request = np.zeros((_MC_REQUESTS, num_drafts))  # expected survival of each request
        for j, target in enumerate(targets):
            def survival(mu: float) -> np.ndarray:
                return prefix / (1.0 + np.exp(-(mu + d + e[:, :, j])))

            lo, hi = -12.0, 12.0
            for _ in range(40):  # bisection: the survival is increasing in the median's logit
                mid = 0.5 * (lo + hi)
                if float(weight @ survival(mid).mean(axis=1)) < target:
                    lo = mid
                else:
                    hi = mid
            mus[j] = 0.5 * (lo + hi)
            prefix = survival(mus[j])
            per_request[:, j] = prefix.mean(axis=1)
        weight = 1.0 / (1.0 + per_request.sum(axis=1))
        weight /= weight.sum()
    # The model's medians must lie strictly inside (0, 1); an unreachable rate ends at the bracket.
    medians = [min(max(1.0 / (1.0 + math.exp(-mu)), 1e-4), 1.0 - 1e-4) for mu in mus]
    return Acceptance(conditional=tuple(round(m, 4) for m in medians), **SPREAD)


def read_acceptance(path: str | os.PathLike, num_drafts: int) -> tuple[Acceptance, str]:
    """(model, how it was obtained) from an acceptance JSON file (see the module docstring)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data: Any = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and "per_position" in data:
        acc = acceptance_from_per_position(data["per_position"], num_drafts, f"{path}: per_position")
        rates = ", ".join(f"{a:g}" for a in data["per_position"][:num_drafts])
        return acc, (f"measured per-position acceptance {rates} ({path}), matched by the model's conditional "
                     f"medians with the default profile's spread {SPREAD}")
    if isinstance(data, dict) and "acceptance" in data:
        drafter = data.get("drafter")
        if isinstance(drafter, dict) and drafter.get("num_drafts", num_drafts) != num_drafts:
            raise ValueError(f"{path}: drafter.num_drafts = {drafter.get('num_drafts')!r} disagrees with "
                             f"--drafts {num_drafts}")
        acc = Acceptance.from_dict(data["acceptance"], f"{path}: acceptance")
        if len(acc.conditional) < num_drafts:
            raise ValueError(f"{path}: acceptance.conditional has {len(acc.conditional)} positions, fewer than "
                             f"--drafts {num_drafts}")
        return acc, f"the simulator's acceptance model as given in {path}"
    raise ValueError(f"{path}: expected a JSON object with 'per_position' (measured acceptance per position) or "
                     "'acceptance' (the simulator's model)")
