"""torch.library registration of the public ops (design section 8).

Each op is registered as a mutating custom op (``adaptive_verify::<name>_into``) that writes into
caller-allocated outputs and returns nothing, with a fake (meta) implementation, so engines can call
the public functions under torch.compile and inside captured CUDA graphs. The public functions call the
kernels directly in eager mode (no dispatcher overhead on the hot path) and go through these ops only
while torch.compile traces.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from . import planner as _planner

_PLAN_MUTATES = (
    "verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
    "positions", "slot_mapping", "input_ids", "error_counts",
)


@torch.library.custom_op("adaptive_verify::prefix_survival_into", mutates_args=("survival", "error_counts"))
def prefix_survival_into(conf: Tensor, drafts: Tensor, survival: Tensor, error_counts: Tensor) -> None:
    _planner._launch_survival(conf, drafts, survival, error_counts)


@prefix_survival_into.register_fake
def _(conf, drafts, survival, error_counts):
    return None


@torch.library.custom_op("adaptive_verify::plan_into", mutates_args=_PLAN_MUTATES)
def plan_into(
    survival: Tensor,
    drafts: Tensor,
    budget_in: Optional[Tensor],
    verify_cost: Optional[Tensor],
    context_lens: Optional[Tensor],
    block_table: Optional[Tensor],
    anchor_tokens: Optional[Tensor],
    draft_tokens: Optional[Tensor],
    verify_lens: Optional[Tensor],
    budget: Tensor,
    expected_tokens: Tensor,
    num_tokens: Optional[Tensor],
    query_start_loc: Optional[Tensor],
    token_req: Optional[Tensor],
    seq_lens: Optional[Tensor],
    positions: Optional[Tensor],
    slot_mapping: Optional[Tensor],
    input_ids: Optional[Tensor],
    error_counts: Tensor,
    config: List[int],
    draft_cost: float,
) -> None:
    """config = [mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap,
    block_size, token_offset, num_reqs_padded, num_tokens_padded]; see planner.PlanArgs."""
    a = unpack_plan_args(survival, drafts, budget_in, verify_cost, context_lens, block_table, anchor_tokens,
                         draft_tokens, config, draft_cost)
    outs = dict(verify_lens=verify_lens, num_tokens=num_tokens, query_start_loc=query_start_loc,
                token_req=token_req, seq_lens=seq_lens, positions=positions, slot_mapping=slot_mapping,
                input_ids=input_ids)
    _planner._launch_plan(a, outs if verify_lens is not None else None, budget, expected_tokens, error_counts)


@plan_into.register_fake
def _(*args, **kwargs):
    return None


_MODE_NAMES = {v: k for k, v in _planner.MODES.items()}


def pack_plan_args(a: "_planner.PlanArgs"):
    """PlanArgs -> (tensors..., config, draft_cost) in plan_into's argument order."""
    config = [_planner.MODES[a.mode], a.fixed_budget, a.min_verify, a.max_verify, a.extra_tokens,
              a.extra_emitting, a.budget_cap, a.block_size, a.token_offset, a.num_reqs_padded,
              a.num_tokens_padded]
    return (a.survival, a.drafts, a.budget_in, a.verify_cost, a.context_lens, a.block_table, a.anchor_tokens,
            a.draft_tokens), config, a.draft_cost


def unpack_plan_args(survival, drafts, budget_in, verify_cost, context_lens, block_table, anchor_tokens,
                     draft_tokens, config, draft_cost) -> "_planner.PlanArgs":
    (mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap, block_size,
     token_offset, num_reqs_padded, num_tokens_padded) = config
    R, K = survival.shape
    return _planner.PlanArgs(
        survival=survival, drafts=drafts, R=R, K=K, device=survival.device, mode=_MODE_NAMES[mode],
        fixed_budget=fixed_budget, budget_in=budget_in, min_verify=min_verify, max_verify=max_verify,
        extra_tokens=extra_tokens, extra_emitting=extra_emitting, budget_cap=budget_cap, verify_cost=verify_cost,
        draft_cost=draft_cost, context_lens=context_lens, block_table=block_table, block_size=block_size,
        anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
        num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
    )


# ---- confidence area ----
# Import the launchers by name: the package attribute `confidence` is the public function, not the module.
from .confidence import _launch_confidence, _launch_from_logits, _launch_margin  # noqa: E402
from .stats import _launch_update  # noqa: E402


@torch.library.custom_op("adaptive_verify::confidence_into", mutates_args=("out",))
def confidence_into(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], markov: Optional[Tensor],
                    temperature: Optional[Tensor], out: Tensor, bias_value: float, survival: bool) -> None:
    _launch_confidence(hidden, weight, bias, markov, temperature, out, bias_value, survival)


@confidence_into.register_fake
def _(*args, **kwargs):
    return None


@torch.library.custom_op("adaptive_verify::confidence_from_logits_into", mutates_args=("out",))
def confidence_from_logits_into(logits: Tensor, temperature: Optional[Tensor], out: Tensor, survival: bool) -> None:
    _launch_from_logits(logits, temperature, out, survival)


@confidence_from_logits_into.register_fake
def _(*args, **kwargs):
    return None


@torch.library.custom_op("adaptive_verify::draft_margin_into", mutates_args=("out", "error_counts"))
def draft_margin_into(draft_logits: Tensor, out: Tensor, error_counts: Tensor) -> None:
    _launch_margin(draft_logits, out, error_counts)


@draft_margin_into.register_fake
def _(*args, **kwargs):
    return None


@torch.library.custom_op("adaptive_verify::stats_update_",
                         mutates_args=("trials", "survivals", "conf_fixed", "error_counts"))
def stats_update_(conf: Tensor, verify_lens: Tensor, num_accepted: Tensor, trials: Tensor, survivals: Tensor,
                  conf_fixed: Tensor, error_counts: Tensor) -> None:
    _launch_update(conf, verify_lens, num_accepted, trials, survivals, conf_fixed, error_counts)


@stats_update_.register_fake
def _(*args, **kwargs):
    return None


# ---- sampling area ----
from .sampling import _launch_rejection, _launch_sample  # noqa: E402


@torch.library.custom_op("adaptive_verify::rejection_sample_into",
                         mutates_args=("output_tokens", "num_emitted", "error_counts"))
def rejection_sample_into(target_logits: Tensor, query_start_loc: Tensor, draft_tokens: Tensor,
                          draft_probs: Optional[Tensor], temperature: Optional[Tensor], seeds: Optional[Tensor],
                          offset: Optional[Tensor], output_tokens: Tensor, num_emitted: Tensor, error_counts: Tensor,
                          host_offset: int) -> None:
    _launch_rejection(target_logits, query_start_loc, draft_tokens, draft_probs, temperature, seeds, offset,
                      output_tokens, num_emitted, error_counts, host_offset)


@rejection_sample_into.register_fake
def _(*args, **kwargs):
    return None


@torch.library.custom_op("adaptive_verify::sample_into", mutates_args=("out", "error_counts"))
def sample_into(logits: Tensor, temperature: Optional[Tensor], seeds: Optional[Tensor], offset: Optional[Tensor],
                out: Tensor, error_counts: Tensor, host_offset: int) -> None:
    _launch_sample(logits, temperature, seeds, offset, out, error_counts, host_offset)


@sample_into.register_fake
def _(*args, **kwargs):
    return None
