"""The drafter's cost per level: a level-by-level drafter (EAGLE, multi-step MTP: one forward per level) pays for
the levels it drafts, a block drafter for its one forward whatever it drafts (CostTable.draft_cost's ``levels``).

A leaf of the package beside checks.py and curve.py: CostTable validates its draft_levels / draft_level_ms here and
prices a depth with :func:`level_cost`.
"""
from __future__ import annotations

from collections.abc import Mapping

from .._checks import check_int, is_real
from .checks import check_ms, check_points
from .curve import DraftCurve

__all__ = ["MAX_DRAFT_LEVELS", "check_levels", "level_cost", "tree_draft_cost"]

#: Most levels a drafter drafts (the planner's K limit); a block drafter's draft_cost takes levels up to it.
MAX_DRAFT_LEVELS = 32


def check_levels(draft_levels, draft_level_ms, draft, mode: str):
    """(draft_levels, draft_level as stored) of from_points, checked: the levels an int in [1, MAX_DRAFT_LEVELS] or
    None; the level cost only with them, a float or points like draft_ms, and (L - 1) levels never above the full
    draft at a request count where either curve bends (both are piecewise linear or steps between those)."""
    if draft_levels is None:
        if draft_level_ms is not None:
            raise ValueError("draft_level_ms needs draft_levels (the levels of the full draft)")
        return None, None
    L = check_int("draft_levels", draft_levels, lo=1, hi=MAX_DRAFT_LEVELS)
    if draft_level_ms is None:
        return L, None
    if isinstance(draft_level_ms, Mapping):
        level = check_points("draft_level_ms", draft_level_ms, positive=False)
    elif is_real(draft_level_ms):
        level = check_ms("draft_level_ms", draft_level_ms, what="constant", positive=False)
    else:
        raise TypeError(f"draft_level_ms must be a dict {{r: ms}}, a float or None, got {type(draft_level_ms).__name__}")
    full, one = DraftCurve(draft, mode), DraftCurve(level, mode)
    for r in sorted({1, *full.xs, *one.xs}):
        if (L - 1) * one.cost(r) > full.cost(r) * (1 + 1e-9):
            raise ValueError(f"draft_level_ms: {L - 1} levels after the first cost {(L - 1) * one.cost(r):.6g} ms at "
                             f"r={r}, more than the full draft's {full.cost(r):.6g} ms (draft_ms)")
    return L, level


def level_cost(full: float, level_curve, r: int, L, levels: int) -> float:
    """Milliseconds of drafting ``levels`` levels at r requests (checked), ``full`` the full draft's: 0 at 0 levels
    (a drafter with draft_catch_up is asked for 1: its first forward runs anyway); a block drafter (L None) or the full
    L levels ``full``; else ``max(0, full - (L - levels) * level(r))``, level(r) being draft_level_ms (the first
    level carries the rest: an EAGLE drafter's first forward reads the step's accepted tokens), or with uniform
    levels (level_curve None) ``full * levels / L``."""
    if levels == 0 or L is None or levels == L:
        return 0.0 if levels == 0 else full
    if level_curve is None:
        return full * levels / L
    return max(0.0, full - (L - levels) * level_curve.cost(r))


def tree_draft_cost(cost_table, r: int, depth: int, width) -> float:
    """Milliseconds for a level-by-level drafter (a table with ``draft_levels``) to draft r requests' trees ``depth``
    levels deep, expanding the ``width`` best nodes of each level, as EAGLE-2 drafts: level 1 is one forward over the
    r anchors (``draft_cost(r, 1)``, which carries the first level's extra work), each later level one forward over
    the r * width expanded nodes (one later level at n rows: ``draft_cost(n, L) - draft_cost(n, L - 1)``). Width 1
    is the chain's ``draft_cost(r, depth)``; depth 0 is ``draft_cost(r, 0)``. depth in [0, draft_levels], width >= 1,
    or per-level widths: a sequence whose entry l - 1 is level l's (levels 1 .. depth - 1 are read; the later levels'
    costs are summed in level order). A block drafter drafts its chain in one forward and has no per-level cost:
    ValueError."""
    L = cost_table.draft_levels
    if L is None:
        raise ValueError("cost_table: pricing a tree's levels needs a level-by-level drafter's table (draft_levels); "
                         "a block drafter's cost does not depend on what it drafts")
    depth = check_int("depth", depth, lo=0, hi=L)
    if isinstance(width, (list, tuple)):
        if len(width) < depth - 1:
            raise ValueError(f"width: {len(width)} per-level widths for a tree {depth} levels deep (needs depth - 1)")
        widths = [check_int(f"width[{i}]", w, lo=1) for i, w in enumerate(width[:max(depth - 1, 0)])]
        if depth <= 1:
            return cost_table.draft_cost(r, depth)
        total = cost_table.draft_cost(r, 1)
        for w in widths:
            total += cost_table.draft_cost(r * w, L) - cost_table.draft_cost(r * w, L - 1)
        return total
    width = check_int("width", width, lo=1)
    if depth <= 1:
        return cost_table.draft_cost(r, depth)
    n = r * width
    later = cost_table.draft_cost(n, L) - cost_table.draft_cost(n, L - 1)
    return cost_table.draft_cost(r, 1) + (depth - 1) * later
