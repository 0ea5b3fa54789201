"""The planner's public ops: prefix_survival, choose_budget, plan_verification (thin wrappers over _C)."""
from __future__ import annotations

import ctypes
import dataclasses
import warnings
from typing import List, Optional, Union

import torch
from torch import Tensor

from .. import errors
from .._binding import PlannerParams, SurvivalParams
from .._ext import _C, check_status
from .._validate import check_tensor, ptr, run_op, stream_of
from ..cost import CostTable
from .args import MODES, PlanArgs, check_out, resolve_plan_args, survival_and_drafts
from .verify_plan import VerifyPlan

VERIFICATIONS = (None, "onehot", "probs")


# ----------------------------------------------------------------------------------------------------
# prefix_survival
# ----------------------------------------------------------------------------------------------------


def prefix_survival(conf: torch.Tensor, drafts: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a[r, j] = prod_{i <= j} clamp(conf[r, i], 0, 1) for j < drafts[r], else 0.

    conf: [R, K] float32 (last dim contiguous); drafts: [R] int32 (int64 is converted) in [0, K].
    Returns survival [R, K] float32 (into ``out`` when given). The product is a left-to-right float32
    loop, identical on CPU and GPU. NaN confidences count as 0 and are counted in
    ``error_counts()["nan_survival"]``; drafts outside [0, K] raise ValueError on CPU and are clamped
    and counted on CUDA.
    """
    R, K, device, drafts = survival_and_drafts(conf, drafts, name="conf")
    if out is None:
        out = torch.empty(R, K, dtype=torch.float32, device=device)
    else:
        check_tensor("out", out, dtypes=(torch.float32,), device=device, shape=(R, K), inner_contiguous=False)
    run_op(_prefix_survival_into, _launch_survival, conf, drafts, out, errors.error_buffer(device))
    return out


def _launch_survival(conf, drafts, out, error_counts):
    p = SurvivalParams()
    p.num_reqs, p.max_drafts = conf.shape
    p.conf, p.conf_stride, p.drafts = conf.data_ptr(), conf.stride(0), drafts.data_ptr()
    p.survival, p.error_counts = out.data_ptr(), error_counts.data_ptr()
    check_status(_C.prefix_survival(ctypes.addressof(p), conf.is_cuda, stream_of(conf.device)), "prefix_survival",
                 conf.device)


@torch.library.custom_op("adaptive_verify::prefix_survival_into", mutates_args=("survival", "error_counts"))
def _prefix_survival_into(conf: Tensor, drafts: Tensor, survival: Tensor, error_counts: Tensor) -> None:
    _launch_survival(conf, drafts, survival, error_counts)


@_prefix_survival_into.register_fake
def _(*args, **kwargs):
    return None


# ----------------------------------------------------------------------------------------------------
# memoised validation: decode loops repeat the same buffers, shapes and scalars step after step
# ----------------------------------------------------------------------------------------------------

# Entries hold strong references to the objects they describe, so nothing in a key can be reused by a
# different object while the entry lives.
_ARGS_MEMO: dict = {}
_COST_MEMO: dict = {}
_OUT_MEMO: dict = {}
_MEMO_SIZE = 8


def _remember(memo: dict, key, value):
    if len(memo) >= _MEMO_SIZE:
        memo.pop(next(iter(memo)))
    memo[key] = value
    return value


def _tsig(t):
    """What of a tensor decides its validation: its storage address, shape, strides, dtype and device (not its
    values, which the kernel reads at launch). A tensor resized, re-strided or re-pointed in place
    (resize_, as_strided_, set_) therefore misses and is validated again."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return (id(t), t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)
    return (type(t), id(t))  # not a tensor: resolve_plan_args will say so


def _costs(cost_table: CostTable, R: int, max_n: int, device: torch.device, need_verify: bool):
    if torch.compiler.is_compiling():  # traced once: nothing to remember (and no id() in a graph)
        return float(cost_table.draft_cost(R)), cost_table.verify_array(max_n, device) if need_verify else None
    key = (id(cost_table), R, max_n, device, need_verify)
    hit = _COST_MEMO.get(key)
    if hit is not None and hit[0] is cost_table:
        return hit[1], hit[2]
    draft = float(cost_table.fixed_cost(R))  # Theta's fixed term: drafter + per-request work
    verify = cost_table.verify_array(max_n, device) if need_verify else None
    return _remember(_COST_MEMO, key, (cost_table, draft, verify))[1:]


def _resolve(survival, drafts, cost_table, kwargs: dict) -> PlanArgs:
    """resolve_plan_args, skipped when a decode loop repeats an earlier call's arguments (same tensors with the
    same storage, shapes and strides, same scalars). Only results that hold the caller's own tensors are
    remembered (an int64 input converted to int32 would be a stale copy)."""
    if torch.compiler.is_compiling():  # traced once: validate, remember nothing
        return resolve_plan_args(survival, drafts, cost_table, costs=_costs, **kwargs)
    key = (_tsig(survival), _tsig(drafts), id(cost_table),
           *(_tsig(v) if isinstance(v, torch.Tensor) else (type(v), v) for v in kwargs.values()))
    try:
        hit = _ARGS_MEMO.get(key)
    except TypeError:  # an unhashable scalar argument: let the validation name it
        hit = key = None
    if hit is not None and hit[0] is cost_table:
        return hit[1]
    a = resolve_plan_args(survival, drafts, cost_table, costs=_costs, **kwargs)
    budget = kwargs.get("budget")
    own = (a.survival is survival and a.drafts is drafts and a.context_lens is kwargs.get("context_lens")
           and a.block_table is kwargs.get("block_table") and a.anchor_tokens is kwargs.get("anchor_tokens")
           and a.draft_tokens is kwargs.get("draft_tokens")
           and (a.budget_in is budget or not isinstance(budget, torch.Tensor)))
    if own and key is not None:
        _remember(_ARGS_MEMO, key, (cost_table, a))
    return a


_OUT_FIELDS = ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
               "positions", "slot_mapping", "input_ids")


def _check_out_memo(out: VerifyPlan, a: PlanArgs) -> VerifyPlan:
    if torch.compiler.is_compiling():
        return check_out(out, a)
    fields = tuple(getattr(out, f) for f in _OUT_FIELDS) if isinstance(out, VerifyPlan) else ()
    key = (id(out), *map(_tsig, fields), a.num_reqs_padded, a.num_tokens_padded, a.device,
           a.context_lens is not None, a.block_table is not None, a.anchor_tokens is not None)
    hit = _OUT_MEMO.get(key)
    if hit is not None and hit[0] is out and all(x is y for x, y in zip(hit[1], fields)):
        return out
    check_out(out, a)
    _remember(_OUT_MEMO, key, (out, fields))
    return out


# ----------------------------------------------------------------------------------------------------
# launch
# ----------------------------------------------------------------------------------------------------


def _params(a: PlanArgs, outs, budget_out: Tensor, expected: Tensor, err: Tensor) -> PlannerParams:
    """The kernel's parameter struct, filled by field name (planner/params.h says what each one is)."""
    p = PlannerParams()
    p.survival, p.survival_stride, p.drafts = a.survival.data_ptr(), a.survival.stride(0), a.drafts.data_ptr()
    p.num_reqs, p.max_drafts, p.mode = a.R, a.K, MODES[a.mode]
    p.fixed_budget, p.budget_in = a.fixed_budget, ptr(a.budget_in)
    p.min_verify, p.max_verify, p.extra_tokens, p.extra_emitting = a.min_verify, a.max_verify, a.extra_tokens, \
        a.extra_emitting
    p.budget_cap, p.draft_cost = a.budget_cap, a.draft_cost
    if a.verify_cost is not None:
        p.verify_cost, p.verify_cost_len = a.verify_cost.data_ptr(), a.verify_cost.numel()
    p.context_lens = ptr(a.context_lens)
    if a.block_table is not None:
        p.block_table, p.block_table_stride = a.block_table.data_ptr(), a.block_table.stride(0)
        p.max_blocks = a.block_table.shape[1]
    p.block_size = a.block_size
    p.anchor_tokens = ptr(a.anchor_tokens)
    if a.draft_tokens is not None:
        p.draft_tokens, p.draft_tokens_stride = a.draft_tokens.data_ptr(), a.draft_tokens.stride(0)
    p.token_offset, p.num_reqs_padded, p.num_tokens_padded = a.token_offset, a.num_reqs_padded, a.num_tokens_padded
    p.budget_out, p.expected_tokens, p.error_counts = budget_out.data_ptr(), expected.data_ptr(), err.data_ptr()
    if outs is not None:
        get = outs.get if isinstance(outs, dict) else (lambda name: getattr(outs, name))
        meta = a.context_lens is not None
        p.write_plan = 1
        p.verify_lens, p.num_tokens = ptr(get("verify_lens")), ptr(get("num_tokens"))
        p.query_start_loc, p.token_req = ptr(get("query_start_loc")), ptr(get("token_req"))
        p.seq_lens, p.positions = ptr(get("seq_lens") if meta else None), ptr(get("positions") if meta else None)
        p.slot_mapping = ptr(get("slot_mapping") if a.block_table is not None else None)
        p.input_ids = ptr(get("input_ids") if a.anchor_tokens is not None else None)
    return p


def _launch_plan(a: PlanArgs, outs, budget_out: torch.Tensor, expected: torch.Tensor, err: torch.Tensor):
    """Runs the C++ CPU kernel or the CUDA kernel into preallocated outputs.

    outs: VerifyPlan, a dict of its tensor fields, or None (choose_budget: budget only).
    """
    p = _params(a, outs, budget_out, expected, err)
    on_cuda = a.device.type == "cuda"
    ws = None
    if on_cuda:
        n = _C.plan_workspace_bytes(a.R, a.K, a.min_verify > 0)
        if n:
            ws = torch.empty(n, dtype=torch.uint8, device=a.device)  # the kernel's workspace, past shared memory
            p.workspace = ws.data_ptr()
    status = _C.plan(ctypes.addressof(p), on_cuda, stream_of(a.device) if on_cuda else 0)
    check_status(status, "plan_verification" if outs is not None else "choose_budget", a.device)


_PLAN_MUTATES = ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req", "seq_lens",
                 "positions", "slot_mapping", "input_ids", "error_counts")
_MODE_NAMES = {v: k for k, v in MODES.items()}


@torch.library.custom_op("adaptive_verify::plan_into", mutates_args=_PLAN_MUTATES)
def _plan_into(survival: Tensor, drafts: Tensor, budget_in: Optional[Tensor], verify_cost: Optional[Tensor],
               context_lens: Optional[Tensor], block_table: Optional[Tensor], anchor_tokens: Optional[Tensor],
               draft_tokens: Optional[Tensor], verify_lens: Optional[Tensor], budget: Tensor, expected_tokens: Tensor,
               num_tokens: Optional[Tensor], query_start_loc: Optional[Tensor], token_req: Optional[Tensor],
               seq_lens: Optional[Tensor], positions: Optional[Tensor], slot_mapping: Optional[Tensor],
               input_ids: Optional[Tensor], error_counts: Tensor, config: List[int], draft_cost: float) -> None:
    """config = [mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap, block_size,
    token_offset, num_reqs_padded, num_tokens_padded] (PlanArgs)."""
    (mode, fixed_budget, min_verify, max_verify, extra_tokens, extra_emitting, budget_cap, block_size, token_offset,
     num_reqs_padded, num_tokens_padded) = config
    R, K = survival.shape
    a = PlanArgs(survival=survival, drafts=drafts, R=R, K=K, device=survival.device, mode=_MODE_NAMES[mode],
                 fixed_budget=fixed_budget, budget_in=budget_in, min_verify=min_verify, max_verify=max_verify,
                 extra_tokens=extra_tokens, extra_emitting=extra_emitting, budget_cap=budget_cap,
                 verify_cost=verify_cost, draft_cost=draft_cost, context_lens=context_lens, block_table=block_table,
                 block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens,
                 token_offset=token_offset, num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded)
    outs = dict(verify_lens=verify_lens, num_tokens=num_tokens, query_start_loc=query_start_loc, token_req=token_req,
                seq_lens=seq_lens, positions=positions, slot_mapping=slot_mapping, input_ids=input_ids)
    _launch_plan(a, outs if verify_lens is not None else None, budget, expected_tokens, error_counts)


@_plan_into.register_fake
def _(*args, **kwargs):
    return None


def pack_plan_args(a: PlanArgs):
    """PlanArgs -> (input tensors, config, draft_cost) in plan_into's argument order."""
    config = [MODES[a.mode], a.fixed_budget, a.min_verify, a.max_verify, a.extra_tokens, a.extra_emitting, a.budget_cap,
              a.block_size, a.token_offset, a.num_reqs_padded, a.num_tokens_padded]
    return (a.survival, a.drafts, a.budget_in, a.verify_cost, a.context_lens, a.block_table, a.anchor_tokens,
            a.draft_tokens), config, a.draft_cost


def _run_plan(a: PlanArgs, out: Optional[VerifyPlan], budget_out: torch.Tensor, expected: torch.Tensor):
    """Eager: call the kernel directly. Under torch.compile: through the registered custom op."""
    err = errors.error_buffer(a.device)
    if not torch.compiler.is_compiling():
        _launch_plan(a, out, budget_out, expected, err)
        return
    tensors, config, draft_cost = pack_plan_args(a)
    o = out if out is not None else VerifyPlan(None, budget_out, expected, None, None, None)
    produce = lambda t, flag: t if flag else None  # noqa: E731
    meta = a.context_lens is not None
    _plan_into(*tensors, o.verify_lens, budget_out, expected, o.num_tokens, o.query_start_loc, o.token_req,
               produce(o.seq_lens, meta), produce(o.positions, meta), produce(o.slot_mapping, a.block_table is not None),
               produce(o.input_ids, a.anchor_tokens is not None), err, config, draft_cost)


# ----------------------------------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------------------------------

_warned_global: set = set()


def _warn_global_live(verification):
    """Live global looks at a[r, j + 1] when deciding draft j. With one-hot verification (draft_probs=None,
    or greedy) every emitted token is a fresh target sample whatever was drafted, so that is lossless; with
    verification against draft probabilities it is not (docs/design.md, "When is which mode lossless"). Warn
    once per kind: when the caller declared "probs", and when the caller declared nothing (a silent bias is
    worse than one warning; declaring verification="onehot" silences it)."""
    if verification == "onehot" or verification in _warned_global:
        return
    _warned_global.add(verification)
    if verification == "probs":
        msg = ("plan_verification(mode='global', verification='probs') picks the budget from the live step's "
               "survivals while drafts are verified against draft probabilities: whether draft j is verified then "
               "depends on draft j itself, so sampling is NOT lossless. Use mode='greedy', or choose_budget() on an "
               "earlier step + mode='fixed' (lagged), or verify one-hot (draft_probs=None).")
    else:
        msg = ("plan_verification(mode='global') picks the budget from the live step's survivals: lossless with "
               "one-hot verification (rejection_sample(draft_probs=None), greedy, trees), NOT lossless when drafts "
               "are verified against draft probabilities. Pass verification='onehot' or 'probs' to say which "
               "(this warning is for undeclared callers).")
    warnings.warn(msg, stacklevel=3)


def choose_budget(
    survival: torch.Tensor,
    drafts: torch.Tensor,
    cost_table: CostTable,
    *,
    mode: str = "global",
    min_verify: int = 0,
    max_verify: Optional[int] = None,
    extra_tokens: int = 0,
    extra_emitting: int = 0,
    capacity: Optional[int] = None,
    draft_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Budget B (0-d int32 tensor on survival's device) for ``mode`` in "global", "greedy", "all".

    survival [R, K] float32, drafts [R] int32. Run on an earlier step's survivals, "global" gives the
    lagged mode's budget: pass it to ``plan_verification(mode="fixed", budget=B)``, which clamps it
    to the new step's [B_min, B_max]. Arguments as in :func:`plan_verification` (``draft_tokens``: only a
    negative id, an invalidated draft, matters here: it ends its request's candidates).
    """
    kw = dict(mode=mode, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, draft_tokens=draft_tokens,
              allowed_modes=("global", "greedy", "all"))
    a = _resolve(survival, drafts, cost_table, kw)
    budget = torch.empty((), dtype=torch.int32, device=a.device)
    expected = torch.empty((), dtype=torch.float32, device=a.device)
    _run_plan(a, None, budget, expected)
    return budget


def plan_verification(
    survival: torch.Tensor,
    drafts: torch.Tensor,
    cost_table: Optional[CostTable] = None,
    *,
    mode: str = "greedy",
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
    out: Optional[VerifyPlan] = None,
    verification: Optional[str] = None,
) -> VerifyPlan:
    """Chooses the budget, allocates it to the highest-survival drafts, and writes varlen metadata.

    One CUDA launch on CUDA tensors (no host sync; graph-capturable with ``out=``), the C++ CPU kernel
    on CPU tensors; both give the torch reference's integers exactly.

    Args:
        survival: [R, K] float32 prefix survival (see :func:`prefix_survival`), last dim contiguous.
            Sanitised: clamped to [0, 1] and made non-increasing per row; a NaN ends the row's
            candidates (never verified) and is counted in ``error_counts()``.
        drafts: [R] int32 drafted tokens per request, in [0, K] (CPU: ValueError; CUDA: clamped, counted).
        cost_table: step costs; required for "greedy" and "global".
        mode: "greedy" (default, lossless), "global" (argmax of Theta on these survivals: lossless with one-hot
            verification, NOT with verification against draft probabilities; see ``verification``),
            "fixed", "all".
        budget: "fixed" only: a Python int or a 0-d int32 (or int64) device tensor, clamped to
            [B_min, B_max].
        min_verify: forced drafts per request (ranked first). max_verify: cap per request (default K).
        extra_tokens: non-draft tokens in the step (prefill chunks); extra_emitting: prefill requests
            that sample this step (they add tokens to Theta's numerator).
        capacity: most tokens in the step (default cost_table.max_tokens, else unbounded); must be
            >= R + extra_tokens.
        context_lens: [R] int32 KV length before this step; enables seq_lens and positions.
        block_table: [R, max_blocks] int32 with block_size; enables slot_mapping. On CPU a block table
            too short for the positions raises ValueError; on CUDA the slot is -1 and it is counted.
        anchor_tokens: [R] int32 last emitted token; draft_tokens: [R, >= max_verify] int32; enable input_ids.
            A negative draft token (an engine's invalidated draft, e.g. by a grammar: vLLM marks them -1)
            ends its request's candidates, so it is never verified (draft_tokens may be given alone for that).
        token_offset: global index of this step's first decode token (query_start_loc starts there).
        num_reqs_padded: R_pad >= R (default R). num_tokens_padded: T_pad >= R (default
            R + min(R * max_verify, capacity - R - extra_tokens): room for every candidate that fits);
            the budget never exceeds T_pad - R.
        out: preallocated :class:`VerifyPlan` whose buffers are fully rewritten.
        verification: how the caller verifies the drafts, which decides whether live "global" is lossless
            (docs/design.md): "onehot" (``rejection_sample(draft_probs=None)``, greedy, trees: every mode is
            lossless, no warning), "probs" (against draft probabilities: live "global" is not lossless and
            warns once), or None (undeclared: "global" warns once, saying both). Other modes ignore it.
    """
    kw = dict(mode=mode, budget=budget, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
              extra_emitting=extra_emitting, capacity=capacity, context_lens=context_lens, block_table=block_table,
              block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
              num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded)
    a = _resolve(survival, drafts, cost_table, kw)
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")
    if mode == "global":
        _warn_global_live(verification)
    if out is None:
        out = VerifyPlan.allocate(
            a.num_reqs_padded, a.num_tokens_padded, a.device, positions=a.context_lens is not None,
            slot_mapping=a.block_table is not None, input_ids=a.anchor_tokens is not None,
        )
    else:
        _check_out_memo(out, a)
    _run_plan(a, out, out.budget, out.expected_tokens)
    return _present(out, a)


def _present(out: VerifyPlan, a: PlanArgs) -> VerifyPlan:
    """The fields this call did not produce are None."""
    if a.context_lens is None and a.block_table is None and a.anchor_tokens is None:
        if out.seq_lens is None and out.positions is None and out.slot_mapping is None and out.input_ids is None:
            return out
    return dataclasses.replace(
        out,
        seq_lens=out.seq_lens if a.context_lens is not None else None,
        positions=out.positions if a.context_lens is not None else None,
        slot_mapping=out.slot_mapping if a.block_table is not None else None,
        input_ids=out.input_ids if a.anchor_tokens is not None else None,
    )
