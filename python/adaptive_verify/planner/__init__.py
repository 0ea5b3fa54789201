"""Verification planner: which drafts each request verifies this step, and the varlen metadata.

Terms (docs/design.md, "Planner"):

- survival a[r, j]: probability that drafts 0..j of request r all survive, non-increasing in j.
- candidate (r, j): j < drafts[r] and j < max_verify. Forced candidates: j < min_verify.
- canonical order: forced candidates first, then survival descending, position ascending, request
  ascending. The first B candidates in this order are verified; they are prefix-closed per request.
- Theta(B) = (R + extra_emitting + P(B)) / step_cost(R, R + extra_tokens + B), P(B) the survival sum of
  the first B candidates: expected emitted tokens per millisecond.
- budget modes: ``greedy`` (Algorithm 1, lossless), ``global`` (argmax of Theta: on an earlier step's
  survivals the lagged mode's budget; on the live step's lossless with one-hot verification only),
  ``fixed`` (caller's B, lossless when B does not depend on this step's drafts), ``all`` (every candidate).

Decisions where the design is silent (also in the docstrings below):

- Survival is sanitised before ranking: clamped to [0, 1], then made non-increasing along each row by
  a running minimum, so the verified set is prefix-closed even for a caller's non-monotone input.
- A NaN survival ends its request's candidates: that draft and every later one of the request are never
  verified, in every mode (forced ones too), and each request so cut is counted once in
  ``error_counts()["nan_survival"]`` (NaNs past max_verify or past drafts[r] are never looked at).
- A negative draft token (when draft_tokens is given: an engine's invalidated draft) ends its request's
  candidates the same way (not counted: it is the engine's normal signal).
- Survival sums use 32.32 fixed point and Theta is compared in float64, so the CPU kernel, the CUDA
  kernel and the torch reference choose the same budget bit for bit (and so do tensor-parallel ranks).
- A ``fixed`` budget is clamped to [B_min, B_max] (an earlier step's budget may exceed this step's
  candidates); the output ``budget`` is the clamped value, so ``verify_lens.sum() == budget`` always.
- Capacity: B_max also respects ``num_tokens_padded - R`` (the token buffers must hold every token),
  ``capacity - R - extra_tokens`` and ``cost_table.max_tokens - R - extra_tokens``. Capacity wins over
  ``min_verify``: B_min = min(forced candidates, B_max), the forced candidates kept in canonical order.
- Token-level outputs (token_req, positions, slot_mapping, input_ids) hold this step's decode tokens
  starting at index 0; their global token index is ``token_offset + index``, which is what
  query_start_loc holds. ``num_tokens`` is ``token_offset + sum(q_len)`` (the end of the decode tokens).

Draft trees (docs/design.md, "Draft trees"): the same planner with ``parents`` given. Candidates are nodes,
ordered by survival descending, depth, request, node index (forced nodes first); every prefix is ancestor-closed.
``tree_survival`` computes node survival, ``choose_budget(..., parents=)`` the budget, ``plan_tree_verification``
the plan and the tree layout (TreeVerifyPlan). A chain given as a tree gives the chain planner's integers.

Where things are: ``verify_plan.py`` the VerifyPlan outputs, ``tree_plan.py`` TreeVerifyPlan, ``args.py`` validation
and defaults (and their bounds), ``survival.py`` prefix_survival and tree_survival, ``ops.py`` choose_budget and
plan_verification, ``depth.py`` choose_draft_depth (the draft depth and the budget together), ``tree_shape.py``
choose_tree_shape (a tree's depth, width and budget), ``prepared.py`` their prepared calls
(adaptive_verify.prepare), ``tree_ops.py`` plan_tree_verification, ``step.py`` PlanStep and MetadataInputs (the per-step inputs as two objects), ``launch.py``
the kernel struct and the custom op torch.compile traces. The algorithm itself is written once, in csrc/include/adaptive_verify/planner/algorithm.h; the C++ CPU kernel
and the CUDA kernel instantiate it.
"""
from .args import MODES, PlanArgs, resolve_plan_args
from .ops import VERIFICATIONS, choose_budget, plan_verification
from .depth import choose_draft_depth
from .tree_shape import choose_tree_shape, tree_width_profiles
from .lagged import PROMPT_PRICING, lagged_budget
from .step import MetadataInputs, PlanStep
from .survival import prefix_survival, tree_survival
from .tree_ops import plan_tree_verification
from .tree_plan import MAX_TREE_NODES, MAX_TREE_REQS, TreeVerifyPlan
from .verify_plan import MAX_CONTEXT_LEN, MAX_REQS, MAX_TOKENS, VerifyPlan
from .._validate import MAX_DRAFTS
from .._checks import INT32_MAX

__all__ = ["INT32_MAX", "MAX_CONTEXT_LEN", "MAX_DRAFTS", "MAX_REQS", "MAX_TOKENS", "MAX_TREE_NODES", "MAX_TREE_REQS",
           "MODES", "MetadataInputs", "PROMPT_PRICING", "PlanArgs", "PlanStep", "TreeVerifyPlan", "VERIFICATIONS",
           "VerifyPlan", "choose_budget", "choose_draft_depth", "choose_tree_shape", "tree_width_profiles", "lagged_budget", "plan_tree_verification", "plan_verification",
           "prefix_survival", "resolve_plan_args", "tree_survival"]
