"""plan_tree_verification: the planner for draft trees (docs/design.md, "Draft trees"), on plan_verification's call
path (ops.run_plan: one kernel launch; adaptive_verify.prepare makes it a prepared call) with Params::parents set."""
from __future__ import annotations

from typing import Optional, Union

import torch

from ..cost import CostTable
from ..prepared import register
from .ops import run_plan
from .step import MetadataInputs, PlanStep, merge_metadata, merge_step
from .tree_plan import TreeVerifyPlan


@register
def plan_tree_verification(
    survival: Optional[torch.Tensor],
    parents: torch.Tensor,
    tree_sizes: torch.Tensor,
    cost_table: Optional[CostTable] = None,
    *,
    mode: str = "global",
    budget: Union[int, torch.Tensor, None] = None,
    min_verify: int = 0,
    max_verify: Optional[int] = None,
    extra_tokens: int = 0,
    extra_emitting: int = 0,
    capacity: Optional[int] = None,
    context_lens: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    anchor_tokens: Optional[torch.Tensor] = None,
    draft_tokens: Optional[torch.Tensor] = None,
    token_offset: int = 0,
    num_reqs_padded: Optional[int] = None,
    num_tokens_padded: Optional[int] = None,
    out: Optional[TreeVerifyPlan] = None,
    conf: Optional[torch.Tensor] = None,
    survival_out: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    max_step_ms: Optional[float] = None,
    step: Optional[PlanStep] = None,
    metadata: Optional[MetadataInputs] = None,
) -> TreeVerifyPlan:
    """Chooses the budget over every request's draft-tree nodes, gives it to the best nodes, and writes the tree's
    varlen metadata: :func:`plan_verification` for trees, in one CUDA launch (no host sync; graph-capturable with
    ``out=``) or the C++ CPU kernel, both giving the torch reference's integers exactly.

    Candidates are nodes. Canonical order: survival descending, then depth, request, node index (forced nodes,
    node index < min_verify, first); every prefix is ancestor-closed, so the verified nodes of each request form
    a subtree hanging from its anchor. The budget modes and Theta are plan_verification's ("global" by default:
    trees are verified one-hot, so every mode is lossless). A chain given as a tree (parents[r, j] = j - 1) plans
    exactly what plan_verification plans for it.

    Args:
        survival: [R, N] float32 survival of each node (see :func:`tree_survival`), N <= 63, last dim contiguous.
            Clamped to [0, 1] and capped by the parent's survival (the tree form of the chain's running minimum, a
            no-op on tree_survival's output). A NaN removes the node and its subtree and is counted once per request
            in ``error_counts()["nan_survival"]``.
        parents: [R, N] int32 (int64 converted): node j's parent, -1 for the anchor, parents[r, j] < j. Read for
            nodes j < min(tree_sizes[r], max_verify); a bad value raises ValueError on CPU, and on CUDA removes the
            node and its subtree (counted in "bad_parent").
        tree_sizes: [R] int32 nodes drafted per request, in [0, N] (CPU: ValueError; CUDA: clamped, counted in
            "drafts_out_of_range").
        min_verify: nodes j < min_verify are forced (ranked first). max_verify: nodes j >= max_verify are never
            candidates (default N).
        draft_tokens: [R, >= max_verify] int32, each node's token. A negative id (an invalidated draft) removes the
            node and its subtree. Siblings must carry distinct ids: a repeat of an earlier sibling's id raises
            ValueError on CPU, and on CUDA removes the later node and its subtree (counted in "duplicate_sibling").
        conf: [R, N] confidences instead of survival (pass survival=None): the same call computes the survival
            exactly as :func:`tree_survival` does, optionally into survival_out ([R, N] float32 contiguous).
        weights: [R] request priorities: nodes rank by w_r * survival (capped by the parent's, so still
            ancestor-closed) and Theta is weighted, as in :func:`plan_verification`; expected_tokens stays unweighted.
        step: a :class:`PlanStep` (budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting,
            max_step_ms, weights, num_reqs_padded, num_tokens_padded) and metadata: a :class:`MetadataInputs`
            (context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset) in place of those
            keywords, as in :func:`plan_verification` (a field given both ways raises ValueError naming both).
        Everything else as in :func:`plan_verification` (modes "greedy", "global", "fixed", "all"; max_step_ms).

    Returns a :class:`TreeVerifyPlan`: request r's block is its anchor then its verified nodes in increasing node
    index (q_len = 1 + verify_lens[r]); positions are context_lens + depth, slot_mapping the slot of KV index
    context_lens + offset, plus tree_mask, token_parent, token_node and token_depth. Every element of every padded
    buffer is written each call.
    """
    if step is not None:
        (budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights, num_reqs_padded,
         num_tokens_padded) = merge_step(step, budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting,
                                         max_step_ms, weights, num_reqs_padded, num_tokens_padded)
    if metadata is not None:
        context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset = merge_metadata(
            metadata, context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset)
    kw = dict(mode=mode, budget=budget, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, context_lens=context_lens, block_table=block_table,
              block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
              num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded, conf=conf,
              survival_out=survival_out, weights=weights, max_step_ms=max_step_ms, parents=parents)
    if parents is None:
        raise ValueError("parents is required (a [R, N] int32 tensor; a chain is parents[r, j] = j - 1)")
    return run_plan("plan_tree_verification", TreeVerifyPlan, survival, tree_sizes, cost_table, kw, out)
