"""The lagged budget, written once (docs/design.md, "When is which mode lossless").

The budget of a step is decided on the host before the step's drafts exist: the planner's "global" argmax of Theta
on each request's survivals of an EARLIER step (its stale confidences), priced entirely at THIS step (its requests,
their drafts, its prompt tokens, capacity and latency target). It does not look at the current drafts, so
verification stays lossless; the step's live survivals then decide who verifies (plan_verification(mode="fixed")).

Every caller decides it here: AdaptiveVerifier.plan_budget (its persistent slot table gathers the stale rows; its
prepared call (prepare_lagged_budget) runs this very call; a tree step's node count is ``lagged_tree_budget``,
priced the same way),
the simulator's adaptive policies (through AdaptiveVerifier) and the vLLM adapter (vLLM keeps the stale table).
Two ways of pricing the step's prompt tokens X exist, and a caller names one:

- ``"marginal"`` (AdaptiveVerifier's): drafts are priced on the cost curve seen from the step's operating point,
  ``cost_table.shifted(X)``, within the capacity X leaves; the prompt's own time is not a cost the drafts share.
- ``"fixed"`` (vLLM's manager: its differential tests hold the adapter to it): X are the planner's
  ``extra_tokens``, a fixed part of the step that Theta amortises.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._checks import INT32_MAX, check_int
from ..cost import CostTable
from ..prepared import prepare
from .ops import _choose_budget, choose_budget
from .prepared import PreparedPlan

__all__ = ["PROMPT_PRICING", "lagged_budget"]

PROMPT_PRICING = ("marginal", "fixed")


def _priced(cost_table, prompt_tokens: int, prompt_pricing: str, capacity: Optional[int]) -> tuple:
    """(table, extra_tokens, capacity) for the planner: the step's prompt tokens priced as ``prompt_pricing`` says."""
    if not isinstance(cost_table, CostTable):
        raise TypeError(f"cost_table must be a CostTable, got {type(cost_table).__name__}")
    if not isinstance(prompt_pricing, str) or prompt_pricing not in PROMPT_PRICING:
        raise ValueError(f"prompt_pricing must be one of {PROMPT_PRICING}, got {prompt_pricing!r}")
    prompt_tokens = check_int("prompt_tokens", prompt_tokens, lo=0, hi=INT32_MAX)
    if capacity is None:
        capacity = cost_table.max_tokens
    if prompt_pricing == "fixed":
        return cost_table, prompt_tokens, capacity
    if capacity is not None:
        capacity = check_int("capacity", capacity, lo=0, hi=INT32_MAX) - prompt_tokens
        if capacity < 0:
            raise ValueError(f"prompt_tokens {prompt_tokens} exceed the capacity {capacity + prompt_tokens}")
    return (cost_table.shifted(prompt_tokens) if prompt_tokens else cost_table), 0, capacity


def _lagged_kwargs(stale_conf, drafts, cost_table, prompt_tokens, prompt_pricing, capacity, min_verify, max_step_ms,
                   weights, out) -> tuple:
    """choose_budget's (positional, keyword) arguments of lagged_budget."""
    table, extra, capacity = _priced(cost_table, prompt_tokens, prompt_pricing, capacity)
    return (None, drafts, table), dict(mode="global", min_verify=min_verify, extra_tokens=extra, capacity=capacity,
                                       conf=stale_conf, out=out, weights=weights, max_step_ms=max_step_ms)


def prepare_lagged_budget(stale_conf: torch.Tensor, drafts: torch.Tensor, cost_table, *, prompt_tokens: int,
                          prompt_pricing: str, capacity: Optional[int], min_verify, max_step_ms, weights,
                          out) -> PreparedPlan:
    """lagged_budget prepared (adaptive_verify.prepare of its choose_budget call), for AdaptiveVerifier, which runs
    it on its persistent inputs step after step (PreparedPlan.run / run_shifted)."""
    args, kw = _lagged_kwargs(stale_conf, drafts, cost_table, prompt_tokens, prompt_pricing, capacity, min_verify,
                              max_step_ms, weights, out)
    return prepare(choose_budget, *args, **kw)


def lagged_tree_budget(stale_survival: torch.Tensor, sizes: torch.Tensor, parents: torch.Tensor, cost_table, *,
                       prompt_tokens: int, capacity: Optional[int], min_verify, max_step_ms, weights, out) -> int:
    """The lagged budget of a tree step (a node count), priced as the chains' ("marginal"): the "global" argmax over
    [R, N] stale node survivals, as given (AdaptiveVerifier ranks each slot's sorted survivals as a chain: parents
    [R, N] j - 1), THIS step's tree sizes [R]; written into ``out`` (0-d int32) and returned as an int."""
    table, extra, capacity = _priced(cost_table, prompt_tokens, "marginal", capacity)
    budget = _choose_budget(stale_survival, sizes, table, mode="global", min_verify=min_verify, max_verify=None,
                               extra_tokens=extra, extra_emitting=0, capacity=capacity, draft_tokens=None, conf=None,
                               out=out, weights=weights, max_step_ms=max_step_ms, parents=parents)
    return int(budget)


def lagged_budget(stale_conf: torch.Tensor, drafts: torch.Tensor, cost_table, *, prompt_tokens: int = 0,
                  prompt_pricing: str = "marginal", capacity: Optional[int] = None, min_verify: int = 0,
                  max_step_ms: Optional[float] = None, weights: Optional[torch.Tensor] = None) -> int:
    """This step's lagged budget B (a host int) from each request's stale confidences (module docstring).

    stale_conf [R, K] float32: each request's confidences of its last recorded step (the caller's prior, e.g. 1.0,
    for a request with none); drafts [R] int32: THIS step's drafts per request; cost_table: this step's
    :class:`~adaptive_verify.CostTable`. prompt_tokens: the step's prompt (chunked-prefill) tokens, priced as
    ``prompt_pricing`` says. capacity: tokens per step (default the table's max_tokens). min_verify, max_step_ms,
    weights ([R] float32 priorities): as in :func:`adaptive_verify.plan_verification`. Pass B to
    ``plan_verification(mode="fixed", budget=B)`` with the step's live survivals."""
    args, kw = _lagged_kwargs(stale_conf, drafts, cost_table, prompt_tokens, prompt_pricing, capacity, min_verify,
                              max_step_ms, weights, None)
    return int(choose_budget(*args, **kw))
