"""The planner kernel's launch: its parameter struct filled from PlanArgs, and the torch.library custom op that
torch.compile traces (eager calls launch directly)."""
from __future__ import annotations

import ctypes
from typing import List, Optional

import torch
from torch import Tensor

from .. import errors
from .._binding import PlannerParams
from .._ext import _C, check_status
from .._validate import ptr, stream_of
from .args import MODES, PlanArgs
from .tree_plan import tree_status_messages
from .verify_plan import VerifyPlan

_MODE_NAMES = {v: k for k, v in MODES.items()}
TREE_STATUS = tree_status_messages(_C)


def fill_step(p: PlannerParams, a: PlanArgs) -> None:
    """The struct fields resolve_step decides (what a decode loop changes step to step)."""
    p.fixed_budget, p.extra_tokens, p.extra_emitting, p.token_offset = a.fixed_budget, a.extra_tokens, \
        a.extra_emitting, a.token_offset
    p.budget_cap, p.draft_cost, p.num_tokens_padded, p.step_cap = a.budget_cap, a.draft_cost, a.num_tokens_padded, \
        a.step_cap
    if a.verify_cost is not None:
        p.verify_cost, p.verify_cost_len = a.verify_cost.data_ptr(), a.verify_cost.numel()
    else:
        p.verify_cost, p.verify_cost_len = None, 0


def fill_outputs(p: PlannerParams, a: PlanArgs, outs, budget_out: Tensor, expected: Tensor) -> None:
    """Output pointers. outs: VerifyPlan, a dict of its tensor fields, or None (choose_budget: budget only)."""
    p.budget_out, p.expected_tokens = budget_out.data_ptr(), expected.data_ptr()
    p.write_plan = 0 if outs is None else 1
    if outs is None:
        return
    get = outs.get if isinstance(outs, dict) else (lambda name: getattr(outs, name))
    meta = a.context_lens is not None
    p.verify_lens, p.num_tokens = ptr(get("verify_lens")), ptr(get("num_tokens"))
    p.query_start_loc, p.token_req = ptr(get("query_start_loc")), ptr(get("token_req"))
    p.seq_lens, p.positions = ptr(get("seq_lens") if meta else None), ptr(get("positions") if meta else None)
    p.slot_mapping = ptr(get("slot_mapping") if a.block_table is not None else None)
    p.input_ids = ptr(get("input_ids") if a.anchor_tokens is not None else None)
    if a.parents is not None:
        p.tree_mask, p.token_parent = ptr(get("tree_mask")), ptr(get("token_parent"))
        p.token_node, p.token_depth = ptr(get("token_node")), ptr(get("token_depth"))


def make_params(a: PlanArgs, outs, budget_out: Tensor, expected: Tensor, err: Tensor) -> PlannerParams:
    """The kernel's parameter struct, filled by field name (planner/params.h says what each one is)."""
    p = PlannerParams()
    p.survival, p.survival_stride, p.drafts = a.survival.data_ptr(), a.survival.stride(0), a.drafts.data_ptr()
    if a.conf is not None:  # the kernel writes survival (a.survival, contiguous) from the confidences first
        p.conf, p.conf_stride, p.survival_out = a.conf.data_ptr(), a.conf.stride(0), a.survival.data_ptr()
    if a.parents is not None:
        p.parents, p.parents_stride = a.parents.data_ptr(), a.parents.stride(0)
    p.num_reqs, p.max_drafts, p.mode = a.R, a.K, MODES[a.mode]
    p.weights = ptr(a.weights)
    p.budget_in = ptr(a.budget_in)
    p.min_verify, p.max_verify = a.min_verify, a.max_verify
    p.context_lens = ptr(a.context_lens)
    if a.block_table is not None:
        p.block_table, p.block_table_stride = a.block_table.data_ptr(), a.block_table.stride(0)
        p.max_blocks = a.block_table.shape[1]
    p.block_size = a.block_size
    p.anchor_tokens = ptr(a.anchor_tokens)
    if a.draft_tokens is not None:
        p.draft_tokens, p.draft_tokens_stride = a.draft_tokens.data_ptr(), a.draft_tokens.stride(0)
    p.num_reqs_padded = a.num_reqs_padded
    p.error_counts = err.data_ptr()
    fill_step(p, a)
    fill_outputs(p, a, outs, budget_out, expected)
    return p


def workspace_for(a: PlanArgs) -> Optional[Tensor]:
    """The CUDA kernel's global workspace when its scratch does not fit shared memory (None otherwise)."""
    if a.device.type != "cuda":
        return None
    n = _C.plan_workspace_bytes(a.R, a.K, a.min_verify > 0, a.parents is not None)
    return torch.empty(n, dtype=torch.uint8, device=a.device) if n else None


def launch(p: PlannerParams, device: torch.device, op: str) -> None:
    """Runs the C++ CPU kernel or the CUDA kernel on a filled struct."""
    on_cuda = device.type == "cuda"
    launch_at(ctypes.addressof(p), on_cuda, device, op, bool(p.parents))


def launch_at(address: int, on_cuda: bool, device: torch.device, op: str, tree: bool = False) -> None:
    """launch() on a struct's address (prepared calls keep it). Every planner launch passes here. tree: a
    draft-tree plan (its errors name tree_sizes)."""
    status = _C.plan(address, on_cuda, stream_of(device) if on_cuda else 0)
    if status:
        check_status(status, op, device, TREE_STATUS if tree else None)


def launch_plan(a: PlanArgs, outs, budget_out: Tensor, expected: Tensor, err: Tensor) -> PlannerParams:
    """Builds the struct and runs it once (a fresh workspace on CUDA); returns the struct."""
    p = make_params(a, outs, budget_out, expected, err)
    ws = workspace_for(a)
    p.workspace = ptr(ws)
    op = "choose_budget" if outs is None else ("plan_tree_verification" if a.parents is not None else "plan_verification")
    launch(p, a.device, op)
    return p


_PLAN_MUTATES = ("survival_out", "verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc",
                 "token_req", "seq_lens", "positions", "slot_mapping", "input_ids", "tree_mask", "token_parent",
                 "token_node", "token_depth", "error_counts")
_TREE_OUTPUTS = ("tree_mask", "token_parent", "token_node", "token_depth")


@torch.library.custom_op("adaptive_verify::plan_into", mutates_args=_PLAN_MUTATES)
def _plan_into(survival: Tensor, drafts: Tensor, budget_in: Optional[Tensor], verify_cost: Optional[Tensor],
               context_lens: Optional[Tensor], block_table: Optional[Tensor], anchor_tokens: Optional[Tensor],
               draft_tokens: Optional[Tensor], survival_out: Optional[Tensor], weights: Optional[Tensor],
               parents: Optional[Tensor], verify_lens: Optional[Tensor],
               budget: Tensor, expected_tokens: Tensor, num_tokens: Optional[Tensor],
               query_start_loc: Optional[Tensor], token_req: Optional[Tensor], seq_lens: Optional[Tensor],
               positions: Optional[Tensor], slot_mapping: Optional[Tensor], input_ids: Optional[Tensor],
               tree_mask: Optional[Tensor], token_parent: Optional[Tensor], token_node: Optional[Tensor],
               token_depth: Optional[Tensor], error_counts: Tensor, config: List[int], draft_cost: float) -> None:
    """config = [mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap, block_size,
    token_offset, num_reqs_padded, num_tokens_padded, step_cap] (PlanArgs). With survival_out, ``survival`` holds
    the confidences and the kernel writes the survival into survival_out. With parents, a draft-tree plan (the tree
    outputs are then given)."""
    (mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap, block_size, token_offset,
     num_reqs_padded, num_tokens_padded, step_cap) = config
    R, K = survival.shape
    conf = None
    if survival_out is not None:
        conf, survival = survival, survival_out
    a = PlanArgs(survival=survival, drafts=drafts, R=R, K=K, device=survival.device, mode=_MODE_NAMES[mode],
                 fixed_budget=fixed_budget, budget_in=budget_in, min_verify=min_verify, max_verify=max_verify,
                 extra_tokens=extra_tokens, extra_emitting=extra_emitting, budget_cap=budget_cap,
                 verify_cost=verify_cost, draft_cost=draft_cost, context_lens=context_lens, block_table=block_table,
                 block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens,
                 token_offset=token_offset, num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
                 conf=conf, weights=weights, step_cap=step_cap, parents=parents)
    outs = dict(verify_lens=verify_lens, num_tokens=num_tokens, query_start_loc=query_start_loc, token_req=token_req,
                seq_lens=seq_lens, positions=positions, slot_mapping=slot_mapping, input_ids=input_ids,
                tree_mask=tree_mask, token_parent=token_parent, token_node=token_node, token_depth=token_depth)
    launch_plan(a, outs if verify_lens is not None else None, budget, expected_tokens, error_counts)


@_plan_into.register_fake
def _(*args, **kwargs):
    return None


def pack_plan_args(a: PlanArgs):
    """PlanArgs -> (input tensors, config, draft_cost) in plan_into's argument order (inputs up to parents)."""
    config = [MODES[a.mode], a.fixed_budget, a.min_verify, a.max_verify, a.extra_tokens, a.extra_emitting, a.budget_cap,
              a.block_size, a.token_offset, a.num_reqs_padded, a.num_tokens_padded, a.step_cap]
    first, survival_out = (a.survival, None) if a.conf is None else (a.conf, a.survival)
    return (first, a.drafts, a.budget_in, a.verify_cost, a.context_lens, a.block_table, a.anchor_tokens,
            a.draft_tokens, survival_out, a.weights, a.parents), config, a.draft_cost


def run_traced(a: PlanArgs, out: Optional[VerifyPlan], budget_out: Tensor, expected: Tensor) -> None:
    """Under torch.compile: the same launch through the registered custom op."""
    tensors, config, draft_cost = pack_plan_args(a)
    o = out if out is not None else VerifyPlan(None, budget_out, expected, None, None, None)
    produce = lambda t, flag: t if flag else None  # noqa: E731
    meta = a.context_lens is not None
    tree = tuple(getattr(o, name, None) if out is not None and a.parents is not None else None
                 for name in _TREE_OUTPUTS)
    _plan_into(*tensors, o.verify_lens, budget_out, expected, o.num_tokens, o.query_start_loc, o.token_req,
               produce(o.seq_lens, meta), produce(o.positions, meta), produce(o.slot_mapping, a.block_table is not None),
               produce(o.input_ids, a.anchor_tokens is not None), *tree, errors.error_buffer(a.device), config,
               draft_cost)
