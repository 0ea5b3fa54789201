"""Random cost tables for the fuzz cases: valid ones the reference can price quickly (small token counts), and the
raw arguments of adversarial ones."""
from __future__ import annotations

import numpy as np

from ..cost import CostTable
from .values import maybe, pick


def random_points(rng: np.random.Generator, n_max: int, *, lo_ms: float = 0.05, hi_ms: float = 30.0) -> dict:
    """{count: ms}: 1 to 6 increasing counts in [1, n_max], values in [lo_ms, hi_ms], not monotone (the envelope's
    job), sometimes with ties or a tiny first value."""
    n = int(rng.integers(1, 7))
    xs = sorted(set(int(x) for x in rng.integers(1, n_max + 1, size=n)))
    ys = rng.uniform(lo_ms, hi_ms, size=len(xs))
    if maybe(rng, 0.2):
        ys[0] = pick(rng, [1e-300, 1e-9, ys[0]])
    if maybe(rng, 0.2) and len(ys) > 1:
        ys[1] = ys[0]
    return {x: float(y) for x, y in zip(xs, ys)}


def random_table(rng: np.random.Generator, *, max_n: int = 2048, levels: int | None = None) -> CostTable:
    """A valid table over counts up to max_n: graph sizes, a capacity, a drafter curve and a per-request term, each
    sometimes; and sometimes a shifted view of it. levels: a level-by-level drafter of that many levels (uniform
    levels, or a constant drafter's cost per level), else a block drafter."""
    verify = random_points(rng, max_n)
    sizes = ()
    if maybe(rng, 0.5):
        sizes = tuple(sorted(set(int(x) for x in rng.integers(1, max(2, max_n // 2), size=int(rng.integers(1, 8))))))
    max_tokens = None
    if maybe(rng, 0.6):
        lo = sizes[-1] if sizes else 1
        max_tokens = int(rng.integers(lo, max(lo, max_n) + 1))
    if maybe(rng, 0.5):
        draft = random_points(rng, 64, lo_ms=0.0, hi_ms=5.0)
    else:
        draft = float(pick(rng, [0.0, 0.3, 2.5]))
    table = CostTable.from_points(verify, draft, sizes, max_tokens,
                                  draft_interpolation=pick(rng, ["staircase", "linear"]),
                                  request_ms=float(pick(rng, [0.0, 0.0, 0.01, 0.2])), draft_levels=levels,
                                  draft_level_ms=None if levels is None or levels == 1 or not isinstance(draft, float)
                                  or maybe(rng, 0.5) else draft * float(rng.random()) / (levels - 1))
    if maybe(rng, 0.25):
        top = table.token_limit if max_tokens is not None else max_n
        if top > 1:
            table = table.shifted(int(rng.integers(1, max(2, min(top, 200)))))
    return table
