"""choose_draft_depth: how many levels to draft and how many drafts to verify, decided together (docs/design.md,
"Drafting from the budget").

A level-by-level drafter (EAGLE, multi-step MTP) pays one forward per level, so the step's decision is (D, B):

    Theta(D, B) = (R + extra_emitting + P_D(B)) / (fixed_cost(R, D) + verify_cost(R + extra_tokens + B))

over D in [min_depth, max_depth] and B in that depth's [B_min, B_max], P_D(B) the survival sum of the B best
candidates among positions < D (the planner's canonical order, so prefix-closed). The kernel is the planner's
(algorithm.h ``choose_depth``): one walk, then per depth the buckets counted again and the budget search of mode
"global". Ties: the smallest D, then the smallest B, so a block drafter (whose cost does not depend on D >= 1)
gets the smallest depth that holds its best budget, and no speculation (D = 0) whenever no draft pays for the
drafter's forward.

Run on an earlier step's survivals it is the lagged decision (lossless: neither D nor B looks at this step's
drafts); AdaptiveVerifier.plan_draft runs it so, filling the positions a request did not draft last step from the
per-depth acceptance statistics.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import errors
from .._checks import check_int
from .._validate import check_tensor
from ..cost import CostTable
from .args import NO_STEP_CAP, PlanArgs, resolve_plan_args, step_cap_of
from .launch import launch, make_params, workspace_for
from .ops import budget_step
from .step import MetadataInputs, PlanStep

__all__ = ["choose_draft_depth", "depth_costs"]


def depth_costs(cost_table: CostTable, R: int, max_depth: int) -> list[float]:
    """[fixed_cost(R, D) for D in 0..max_depth]: the step's fixed term at each depth (the drafter's levels plus
    request_ms * R), the values the kernel's float32 fields round once."""
    levels = cost_table.draft_levels
    if levels is not None and max_depth > levels:
        raise ValueError(f"max_verify ({max_depth}): the cost table's drafter drafts at most draft_levels = {levels} "
                         "levels; pass max_verify <= draft_levels or a table whose draft_levels covers K")
    return [float(cost_table.fixed_cost(R, d)) for d in range(max_depth + 1)]


def _out_pair(out, device) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None:
        return (torch.empty((), dtype=torch.int32, device=device), torch.empty((), dtype=torch.int32, device=device))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a pair (depth, budget) of 0-d int32 tensors, got {type(out).__name__}")
    for name, t in zip(("out[0] (depth)", "out[1] (budget)"), out):
        check_tensor(name, t, dtypes=(torch.int32,), device=device, shape=())
    if out[0].data_ptr() == out[1].data_ptr():
        raise ValueError("out: depth and budget must be two tensors, not one")
    return out[0], out[1]


def choose_draft_depth(
    survival: Optional[torch.Tensor],
    drafts: torch.Tensor,
    cost_table: CostTable,
    *,
    min_depth: int = 0,
    min_verify: int = 0,
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth D, budget B) maximising Theta(D, B), two 0-d int32 tensors on survival's device (module docstring).

    survival [R, K] float32 (or ``conf=`` [R, K] confidences, survival=None), drafts [R] int32: the positions each
    request could draft, K the drafter's levels; for the lagged decision, an earlier step's survivals with the
    positions it did not draft estimated (AdaptiveVerifier.plan_draft does this). cost_table: required; its
    ``fixed_cost(R, D)`` prices each depth (:meth:`CostTable.draft_cost`: a table with ``draft_levels`` charges
    per level, any other charges the full drafter for every D >= 1 and nothing at D = 0).

    Depths: D in [max(min_depth, min(min_verify, max_verify)), max_verify] (max_verify defaults to K): drafting
    past max_verify would pay for levels nobody may verify, and min_verify's forced drafts need their levels.
    Every other keyword is :func:`choose_budget`'s, applied at each depth: capacity and extra_tokens bound B,
    extra_emitting and weights enter Theta, draft_tokens' negative ids end candidates, and ``max_step_ms`` caps B
    at each depth by that depth's modelled step time (``fixed_cost(R, D) + verify_cost(...)``; a depth whose
    forced drafts alone exceed it keeps B_min). ``out``: a pair (depth, budget) of 0-d int32 tensors to write.

    One launch of the planner kernel (CPU kernel on CPU tensors, CUDA kernel on CUDA tensors; no host sync);
    the integers equal a brute force over (D, B) (adaptive_verify.reference.choose_draft_depth). Chains; a draft
    tree's depth and beam width: :func:`choose_tree_shape`.
    """
    min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, draft_tokens = budget_step(
        "choose_draft_depth", step, metadata, min_verify, max_verify, capacity, extra_tokens, extra_emitting,
        max_step_ms, weights, draft_tokens)
    if cost_table is None:
        raise ValueError("cost_table is required: it prices every depth")
    a = resolve_plan_args(survival, drafts, cost_table, mode="global", min_verify=min_verify, max_verify=max_verify,
                          extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity,
                          draft_tokens=draft_tokens, allowed_modes=("global",), conf=conf, weights=weights,
                          max_step_ms=max_step_ms)
    d_hi = a.max_verify
    min_depth = check_int("min_depth", min_depth, lo=0, hi=d_hi)
    d_lo = max(min_depth, min(a.min_verify, d_hi))
    costs = depth_costs(cost_table, a.R, d_hi)
    depth_out, budget_out = _out_pair(out, a.device)
    p = make_params(a, None, budget_out, budget_out, errors.error_buffer(a.device))
    p.expected_tokens = None  # (not an output here: the kernel skips it, and a graph holds no scratch of ours)
    fill_depths(p, a, cost_table, costs, d_lo, d_hi, max_step_ms)
    p.depth_out = depth_out.data_ptr()
    ws = workspace_for(a)
    p.workspace = 0 if ws is None else ws.data_ptr()
    launch(p, a.device, "choose_draft_depth")
    return depth_out, budget_out


def fill_depths(p, a: PlanArgs, cost_table: CostTable, costs: list[float], d_lo: int, d_hi: int,
                max_step_ms: Optional[float]) -> None:
    """The struct's depth fields: the range, each shape's fixed cost and latency cap (planner/params.h). costs: one
    per depth 0..d_hi (chains), or per (width, depth) at (W - 1) * (d_hi + 1) + D (choose_tree_shape)."""
    p.choose_depth, p.min_depth, p.max_depth = 1, d_lo, d_hi
    anchors = a.R + a.extra_tokens
    caps: dict = {}  # latency cap per float32 cost (tree shapes share costs: every profile at D <= 1, ...)
    for s, cost in enumerate(costs):
        p.depth_cost[s] = cost
        c32 = float(p.depth_cost[s])
        if max_step_ms is None:
            p.depth_step_cap[s] = NO_STEP_CAP
            continue
        if c32 not in caps:
            caps[c32] = step_cap_of(cost_table, a.R, anchors, a.budget_cap, c32, max_step_ms)
        p.depth_step_cap[s] = caps[c32]
