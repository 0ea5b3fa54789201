"""choose_tree_shape: how deep and how wide to draft a step's trees, and how many nodes to verify, decided together
(docs/design.md, "Drafting from the budget").

An EAGLE-2 drafter drafts a tree level by level: level 1 is the anchor's top-k, each later level the top-k children
of the W best nodes (by path confidence) of the level before. Each level is one drafter forward, over R rows at
level 1 and R * W rows after, so the step's shape (W, D) is what drafting costs
(:func:`adaptive_verify.cost.tree_draft_cost`), and the nodes it drafts are the only ones the budget can verify:

    Theta(W, D, B) = (R + extra_emitting + P_{W,D}(B)) / (tree_draft_cost(R, D, W) + request_ms * R
                                                          + verify_cost(R + extra_tokens + B))

over W in [1, max_width], D in [min_depth, max_depth] and B in the shape's [B_min, B_max], P_{W,D}(B) the
survival sum of the B best nodes (the planner's canonical order) among those the shape drafts: depth <= D, and
every ancestor at depth >= 1 among the W best of its depth. Ties: the smallest W, then D, then B.

Per-level widths (``widths=``): the beam may narrow with depth. The caller lists the width profiles to weigh, each
(W_1, W_2, ...) the nodes expanded at levels 1, 2, ... (:func:`tree_width_profiles` lists every non-increasing one);
shape (profile, D) drafts the nodes of depth <= D whose every ancestor at depth l >= 1 ranks among the W_l best of
its depth, costs ``tree_draft_cost(R, D, profile)`` (level l + 1 over R * W_l rows), and the ties go to the earlier
profile in the list, then D, then B. The uniform beams are the profiles (W, W, ...): one kernel serves both.

Run on an earlier step's trees it is the lagged decision (lossless: nothing looks at this step's drafts). The
trees given are the candidates' predicted survivals, typically the last step's tree with the nodes it did not
draft estimated (:func:`predict_tree` in sim/tree_shape.py does this for the simulator). The kernel is
choose_draft_depth's (algorithm.h ``choose_depth``): one launch, no host sync.
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional

import numpy as np
import torch

from .. import _C, errors
from .._checks import check_int
from .._validate import check_tensor
from ..cost import CostTable
from .args import resolve_plan_args
from .depth import fill_depths
from .launch import launch, make_params, workspace_for
from .ops import budget_step
from .step import MetadataInputs, PlanStep

__all__ = ["choose_tree_shape", "tree_shape_costs", "tree_width_profiles", "MAX_TREE_WIDTH"]

#: Widest beam choose_tree_shape considers (EAGLE-2 drafts use top-k <= 10); widths * (max_depth + 1) <= 256.
MAX_TREE_WIDTH = 16


def tree_width_profiles(max_width: int, levels: int) -> list[tuple[int, ...]]:
    """Every non-increasing width profile (W_1 >= W_2 >= ... >= W_levels, each in [1, max_width]) in lexicographic
    order, the narrowest first: choose_tree_shape's ``widths=`` when the beam may narrow with depth (a deeper level's
    nodes survive less, so a wider beam below a narrower one rarely pays). C(max_width + levels - 1, levels)
    profiles; levels = max_depth - 1 (0: the one empty profile)."""
    max_width = check_int("max_width", max_width, lo=1, hi=MAX_TREE_WIDTH)
    levels = check_int("levels", levels, lo=0, hi=_C.PLANNER_MAX_DRAFTS)
    if math.comb(max_width + levels - 1, levels) > _C.PLANNER_MAX_SHAPES:
        raise ValueError(f"max_width = {max_width} over levels = {levels}: {math.comb(max_width + levels - 1, levels)} "
                         f"profiles, more than one choose_tree_shape call weighs ({_C.PLANNER_MAX_SHAPES} shapes)")
    out: list[tuple[int, ...]] = [()]
    for _ in range(levels):  # append a level no wider than the last
        out = [w + (x,) for w in out for x in range(1, (w[-1] if w else max_width) + 1)]
    return sorted(out)


def tree_shape_costs(cost_table: CostTable, R: int, max_width, max_depth: int) -> list[float]:
    """[fixed cost of shape (P, D)] at index (P - 1) * (max_depth + 1) + D: tree_draft_cost(R, D, W) +
    request_ms * R, the values the kernel's float32 fields round once. max_width: an int (profiles W = 1..max_width,
    uniform) or a list of per-level width profiles."""
    levels = cost_table.draft_levels
    if levels is not None and max_depth > levels:
        raise ValueError(f"max_depth ({max_depth}): the cost table's drafter drafts at most draft_levels = {levels} "
                         "levels")
    # tree_draft_cost's arithmetic (the same floats, in the same order), each width's later level priced once rather
    # than once per shape and level: depth <= 1 is draft_cost(R, D); deeper, level 1 plus the later levels (uniform:
    # (D - 1) times one; per-level: added in level order).
    request = cost_table.request_ms * R
    uniform = isinstance(max_width, int)
    profiles = [(w,) for w in range(1, max_width + 1)] if uniform else max_width
    L = cost_table.draft_levels
    later = {}
    if max_depth >= 2:
        for w in {x for profile in profiles for x in profile}:
            later[w] = cost_table.draft_cost(R * w, L) - cost_table.draft_cost(R * w, L - 1)
    head = [cost_table.draft_cost(R, d) for d in range(min(max_depth, 1) + 1)]  # depths 0 and 1
    out = []
    for profile in profiles:
        total = head[-1]
        for d in range(max_depth + 1):
            if d <= 1:
                cost = head[d]
            elif uniform:
                cost = head[1] + (d - 1) * later[profile[0]]
            else:
                total += later[profile[d - 2]]
                cost = total
            out.append(float(cost) + request)
    return out


def _profiles(widths, max_depth, d_cap) -> tuple[list[tuple[int, ...]], int]:
    """widths= checked: the profiles as tuples and max_depth (default: the profiles' levels + 1, at most d_cap)."""
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__len__") or len(widths) == 0:
        raise TypeError("widths must be a non-empty list of per-level width profiles (tuples of ints), "
                        f"got {widths!r:.80}")
    profiles = []
    for i, w in enumerate(widths):
        if isinstance(w, (str, bytes)) or not hasattr(w, "__len__"):
            raise TypeError(f"widths[{i}] must be a tuple of per-level widths, got {type(w).__name__}")
        profiles.append(tuple(check_int(f"widths[{i}][{l}]", x, lo=1, hi=MAX_TREE_WIDTH) for l, x in enumerate(w)))
    levels = {len(w) for w in profiles}
    if len(levels) != 1:
        raise ValueError(f"widths: every profile must list the same number of levels, got lengths {sorted(levels)}")
    n = levels.pop()
    d_hi = min(n + 1, d_cap) if max_depth is None else check_int("max_depth", max_depth, lo=0, hi=d_cap)
    if n < d_hi - 1:
        raise ValueError(f"widths: profiles of {n} levels cannot draft max_depth = {d_hi} levels (need max_depth - 1 "
                         "widths each)")
    return [w[:max(d_hi - 1, 0)] for w in profiles], d_hi


def _out_triple(out, device, width_shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if out is None:
        return tuple(torch.empty(shape, dtype=torch.int32, device=device) for shape in ((), width_shape, ()))
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError(f"out must be a triple (depth, width, budget) of int32 tensors, got {type(out).__name__}")
    for name, t, shape in zip(("out[0] (depth)", "out[1] (width)", "out[2] (budget)"), out, ((), width_shape, ())):
        check_tensor(name, t, dtypes=(torch.int32,), device=device, shape=shape)
    spans = sorted((t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in out if t.numel())  # (bytes: int32)
    if any(end > start for (_, end), (start, _) in zip(spans, spans[1:])):
        raise ValueError("out: depth, width and budget must be three tensors that do not overlap")
    return out[0], out[1], out[2]


def choose_tree_shape(
    survival: Optional[torch.Tensor],
    parents: torch.Tensor,
    tree_sizes: torch.Tensor,
    cost_table: CostTable,
    *,
    max_width: Optional[int] = None,
    widths: Optional[list] = None,
    max_depth: Optional[int] = None,
    min_depth: int = 0,
    max_verify: Optional[int] = None,
    extra_tokens: int = 0,
    extra_emitting: int = 0,
    capacity: Optional[int] = None,
    draft_tokens: Optional[torch.Tensor] = None,
    conf: Optional[torch.Tensor] = None,
    out: Optional[tuple] = None,
    weights: Optional[torch.Tensor] = None,
    max_step_ms: Optional[float] = None,
    step: Optional[PlanStep] = None,
    metadata: Optional[MetadataInputs] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(depth D, width W, budget B) maximising Theta(W, D, B), three int32 tensors on survival's device (module
    docstring): 0-d, except with ``widths=`` the width, [max_depth] int32 whose entry l - 1 is the nodes expanded
    at level l (0 from level D on, where nothing is expanded).

    survival [R, N] float32 (or ``conf=`` [R, N] conditional confidences, survival=None), parents [R, N] int32 and
    tree_sizes [R] int32: each request's candidate tree, as :func:`plan_tree_verification` takes it (N <= 63),
    holding at least every node the widest, deepest shape would draft. cost_table: a level-by-level drafter's
    (``draft_levels``), which prices each shape (:func:`adaptive_verify.cost.tree_draft_cost`).

    max_width: widths W in [1, max_width] (<= 16) are considered (the drafter's top-k: wider beams draft nothing
    new). Or ``widths``: the per-level width profiles to weigh (module docstring), each of max_depth - 1 or more
    widths in [1, 16] (all of one length). Depths: D in [min_depth, max_depth], max_depth default
    min(draft_levels, 32) (with widths=, also at most the profiles' levels + 1); profiles * (max_depth + 1) <= 256.
    Every other keyword is :func:`choose_budget`'s, applied at each shape (capacity, extra_tokens, extra_emitting,
    weights, draft_tokens' negative ids, ``max_step_ms`` priced with the shape's cost). There is no ``min_verify``:
    a forced node would tie the shape to data the host cannot read without a sync. ``out``: a triple (depth, width,
    budget) of int32 tensors to write (width [max_depth] with widths=, else 0-d).

    A node's rank within its depth is by the planner's capped (and weighted) survival, ties to the lower index, so
    a tree drafted in rank order (node index = rank, as EAGLE-2 and the simulator lay it out) ranks as drafted.
    D = 0 means no speculation this step; D <= 1 drafts the same nodes at every W, which the ties settle at W = 1.
    One launch of the planner kernel (CPU or CUDA, no host sync); the integers equal a brute force over (W, D, B)
    (adaptive_verify.reference.choose_tree_shape).
    """
    min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, draft_tokens = budget_step(
        "choose_tree_shape", step, metadata, 0, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms,
        weights, draft_tokens)
    if min_verify:
        raise ValueError("step.min_verify: choose_tree_shape has no forced nodes (see its docstring)")
    if cost_table is None:
        raise ValueError("cost_table is required: it prices every shape")
    if parents is None:
        raise ValueError("parents is required (a [R, N] int32 tensor; choose_draft_depth plans chains)")
    a = resolve_plan_args(survival, tree_sizes, cost_table, mode="global", max_verify=max_verify,
                          extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity,
                          draft_tokens=draft_tokens, allowed_modes=("global",), conf=conf, weights=weights,
                          max_step_ms=max_step_ms, parents=parents)
    levels = cost_table.draft_levels
    if levels is None:
        raise ValueError("cost_table: choose_tree_shape prices a tree's levels, which needs a level-by-level "
                         "drafter's table (draft_levels); a block drafter's cost does not depend on the shape")
    d_cap = min(levels, _C.PLANNER_MAX_DRAFTS)
    if (max_width is None) == (widths is None):
        raise TypeError("choose_tree_shape takes exactly one of max_width (uniform beams) and widths (per-level "
                        "width profiles)")
    if widths is None:
        max_width = check_int("max_width", max_width, lo=1, hi=MAX_TREE_WIDTH)
        d_hi = d_cap if max_depth is None else check_int("max_depth", max_depth, lo=0, hi=d_cap)
        profiles = [(w,) * max(d_hi - 1, 0) for w in range(1, max_width + 1)]
    else:
        profiles, d_hi = _profiles(widths, max_depth, d_cap)
    d_lo = check_int("min_depth", min_depth, lo=0, hi=d_hi)
    if len(profiles) * (d_hi + 1) > _C.PLANNER_MAX_SHAPES:
        what = "max_width" if widths is None else "len(widths)"
        raise ValueError(f"{what} * (max_depth + 1) = {len(profiles) * (d_hi + 1)} exceeds "
                         f"{_C.PLANNER_MAX_SHAPES} shapes; lower {what} or max_depth")
    costs = tree_shape_costs(cost_table, a.R, max_width if widths is None else profiles, d_hi)
    depth_out, width_out, budget_out = _out_triple(out, a.device, () if widths is None else (d_hi,))
    p = make_params(a, None, budget_out, budget_out, errors.error_buffer(a.device))
    p.expected_tokens = None
    fill_depths(p, a, cost_table, costs, d_lo, d_hi, max_step_ms)
    p.num_widths = len(profiles)
    if d_hi > 1:  # shape_width[(P - 1) * (d_hi + 1) + l] = profile P's width at level l (1 <= l < d_hi)
        table = np.zeros((len(profiles), d_hi + 1), dtype=np.uint8)
        table[:, 1:d_hi] = profiles
        ctypes.memmove(ctypes.addressof(p) + type(p).shape_width.offset, table.ctypes.data, table.size)
    p.depth_out = depth_out.data_ptr()
    if widths is None:
        p.width_out = width_out.data_ptr()
    elif d_hi:
        p.level_widths_out = width_out.data_ptr()
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    launch(p, a.device, "choose_tree_shape")
    return depth_out, width_out, budget_out
