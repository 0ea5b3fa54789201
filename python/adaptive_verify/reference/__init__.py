"""Readable torch references of every op: the oracle the kernels are tested against.

They follow docs/design.md literally and use the same exact arithmetic as the kernels
(float32 products left to right, 32.32 fixed-point survival sums, float64 Theta), so the kernels
must match them integer for integer. Slow by design; never used on a hot path. They resolve their own
arguments (:func:`resolve_args`: defaults, the budget cap, the cost curve read through CostTable's public
methods) and return their own plain types (:class:`Plan`, :class:`TreePlan`: VerifyPlan's and TreeVerifyPlan's
field names). They share no code with the ops they check: nothing here imports from adaptive_verify outside this
package, so the oracle runs without the compiled extension (tests/test_layout.py checks both). They assume valid
inputs (the ops' validation is tested separately).

Where things are: ``planner.py`` prefix survival, candidate orders (chains and trees), Theta, the budget and the
chain plan; ``trees.py`` tree survival, the tree plan and the KV commit; ``confidence.py`` confidence heads,
margins and acceptance statistics; ``sampling.py`` the sampler's bit-exact oracles; ``attention.py`` verification
attention and KV writes.
"""
from .attention import quantize_fp8, verify_attention, verify_attention_mla, write_kv
from .metadata import flashinfer_plan
from .confidence import confidence, confidence_from_logits, draft_margin, stats_totals, stats_update
from .planner import (FIXED_ONE, Plan, ResolvedArgs, candidate_order, choose, choose_budget, choose_draft_depth,
                      plan_verification, prefix_survival, request_weights, resolve_args, theta, tree_candidate_order)
from .sampling import (av_exp, av_log, canonical_sum, kept_tokens, philox, rejection_sample, sample, to_uniform,
                       token_logprob, tree_rejection_sample, uniforms)
from .sampling import _fadd, _fdiv, _fmul, _fsub  # noqa: F401 - single-rounding float32 steps the tests reuse
from .trees import TreePlan, choose_tree_shape, commit_tree_kv, plan_tree_verification, tree_survival

__all__ = ["FIXED_ONE", "Plan", "ResolvedArgs", "TreePlan", "av_exp", "av_log", "candidate_order", "canonical_sum",
           "choose", "choose_budget", "choose_draft_depth", "choose_tree_shape", "commit_tree_kv", "confidence",
           "confidence_from_logits", "draft_margin", "flashinfer_plan",
           "kept_tokens", "philox", "plan_tree_verification", "plan_verification", "prefix_survival",
           "quantize_fp8", "rejection_sample", "request_weights", "resolve_args", "sample", "stats_totals", "stats_update", "theta",
           "to_uniform", "token_logprob", "tree_candidate_order", "tree_rejection_sample", "tree_survival",
           "uniforms", "verify_attention", "verify_attention_mla", "write_kv"]
