"""Verification planner: which drafts each request verifies this step, and the varlen metadata.

Terms (see ../shared/design.md section 4):

- survival a[r, j]: probability that drafts 0..j of request r all survive, non-increasing in j.
- candidate (r, j): j < drafts[r] and j < max_verify. Forced candidates: j < min_verify.
- canonical order: forced candidates first, then survival descending, position ascending, request
  ascending. The first B candidates in this order are verified; they are prefix-closed per request.
- Theta(B) = (R + extra_emitting + P(B)) / step_cost(R, R + extra_tokens + B), P(B) the survival sum of
  the first B candidates: expected emitted tokens per millisecond.
- budget modes: ``greedy`` (Algorithm 1, lossless), ``global`` (argmax of Theta; NOT lossless when run
  on the live step's survivals, use it on an earlier step's for the lagged mode), ``fixed`` (caller's B,
  lossless when B does not depend on this step's drafts), ``all`` (verify every candidate).

Decisions where the design is silent (also in the docstrings below):

- Survival is sanitised before ranking: clamped to [0, 1], then made non-increasing along each row by
  a running minimum, so the verified set is prefix-closed even for a caller's non-monotone input.
- A NaN survival ends its request's candidates: that draft and every later one of the request are never
  verified, in every mode (forced ones too), and each request so cut is counted once in
  ``error_counts()["nan_survival"]`` (NaNs past max_verify or past drafts[r] are never looked at).
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
"""
from __future__ import annotations

import dataclasses
import struct
import warnings
from typing import Optional, Union

import torch

from . import errors
from ._ext import _C, check_status
from ._validate import check_device, check_tensor, env_kernel, run_op
from .cost import CostTable

MODES = {"greedy": 0, "global": 1, "fixed": 2, "all": 3}
# The planner's scalars travel to the extension as one buffer of 64-bit words (one pybind11 argument
# instead of 43; see csrc/bindings.cpp PLAN_FIELDS): 17 ints, draft_cost as float64, 25 ints.
_PLAN_STRUCT = struct.Struct("<17qd25q")
MAX_DRAFTS = 32
MAX_REQS = (1 << 26) - 2
INT32_MAX = _INT32_MAX = (1 << 31) - 1

# CUDA planner kernel, chosen by the environment variable AV_PLANNER_KERNEL (read at every call, so a test
# or an engine can switch): "v1" (default) the bitonic-sort kernel, "v2" the histogram kernel
# (csrc/include/adaptive_verify/planner/kernel_v2.cuh). Both give the same integers as the CPU kernel,
# which ignores the choice.
PLANNER_KERNELS = {"v1": 0, "v2": 1}


def _planner_kernel() -> int:
    return env_kernel("AV_PLANNER_KERNEL", PLANNER_KERNELS, "v1")


@dataclasses.dataclass
class VerifyPlan:
    """Outputs of :func:`plan_verification` (device tensors; int32 unless noted).

    verify_lens [R_pad]: drafts verified per request (0 for padding rows).
    budget (0-d): total verified drafts, == verify_lens.sum().
    expected_tokens (0-d float32): expected tokens emitted by the R requests, R + P(budget).
    num_tokens (0-d): token_offset + sum of q_len = 1 + verify_lens over the R requests.
    query_start_loc [R_pad + 1]: token_offset + exclusive cumsum of q_len; padding rows repeat the end.
    seq_lens [R_pad]: context_lens + q_len (KV length after this step); 0 for padding. Needs context_lens.
    token_req [T_pad]: request of each decode token, -1 for padding tokens.
    positions [T_pad]: context_lens[r] + offset within the request; 0 for padding. Needs context_lens.
    slot_mapping [T_pad] int64: KV-cache slot of each token via block_table; -1 for padding.
    input_ids [T_pad]: anchor token then the verified drafts; 0 for padding. Needs anchor/draft_tokens.

    Pass a preallocated plan as ``out=`` (see :meth:`allocate`) so CUDA-graph replays keep addresses.
    """

    verify_lens: torch.Tensor
    budget: torch.Tensor
    expected_tokens: torch.Tensor
    num_tokens: torch.Tensor
    query_start_loc: torch.Tensor
    token_req: torch.Tensor
    seq_lens: Optional[torch.Tensor] = None
    positions: Optional[torch.Tensor] = None
    slot_mapping: Optional[torch.Tensor] = None
    input_ids: Optional[torch.Tensor] = None

    @classmethod
    def allocate(
        cls,
        num_reqs_padded: int,
        num_tokens_padded: int,
        device: Union[str, torch.device] = "cpu",
        *,
        positions: bool = False,
        slot_mapping: bool = False,
        input_ids: bool = False,
    ) -> "VerifyPlan":
        """Buffers for ``out=``: R_pad requests and T_pad tokens. ``positions=True`` also allocates
        seq_lens and positions (needed when context_lens is passed), ``slot_mapping=True`` the slots
        (block_table), ``input_ids=True`` the token ids (anchor_tokens, draft_tokens)."""
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            verify_lens=torch.empty(num_reqs_padded, **i32),
            budget=torch.empty((), **i32),
            expected_tokens=torch.empty((), dtype=torch.float32, device=device),
            num_tokens=torch.empty((), **i32),
            query_start_loc=torch.empty(num_reqs_padded + 1, **i32),
            token_req=torch.empty(num_tokens_padded, **i32),
            seq_lens=torch.empty(num_reqs_padded, **i32) if positions else None,
            positions=torch.empty(num_tokens_padded, **i32) if positions else None,
            slot_mapping=torch.empty(num_tokens_padded, dtype=torch.int64, device=device) if slot_mapping else None,
            input_ids=torch.empty(num_tokens_padded, **i32) if input_ids else None,
        )


# ----------------------------------------------------------------------------------------------------
# validation helpers: every message names the argument
# ----------------------------------------------------------------------------------------------------


def _check_tensor(name, t, *, dtype, device, shape=None, ndim=None, inner_contiguous=False):
    """One dtype; whole-tensor contiguity unless inner_contiguous (see _validate.check_tensor)."""
    return check_tensor(name, t, dtypes=(dtype,), device=device, ndim=ndim, shape=shape,
                        inner_contiguous=inner_contiguous)


def _int_tensor(name, t, device, shape):
    """int32 tensor, accepting int64 with a (documented) conversion."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.int64:
        t = t.to(torch.int32)
    return _check_tensor(name, t, dtype=torch.int32, device=device, shape=shape)


def _check_int(name, v, *, lo=None, hi=None):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def _survival_and_drafts(survival, drafts):
    if not isinstance(survival, torch.Tensor):
        raise TypeError(f"survival must be a torch.Tensor, got {type(survival).__name__}")
    if survival.dim() != 2:
        raise ValueError(f"survival must have shape [R, K], got {tuple(survival.shape)}")
    _check_tensor("survival", survival, dtype=torch.float32, device=None, inner_contiguous=True)
    R, K = survival.shape
    if not 1 <= K <= MAX_DRAFTS:
        raise ValueError(f"survival.shape[1] (K, drafts per request) must be in [1, {MAX_DRAFTS}], got {K}")
    if R > MAX_REQS:
        raise ValueError(f"survival.shape[0] (R, requests) must be <= {MAX_REQS}, got {R}")
    device = check_device("survival", survival)
    drafts = _int_tensor("drafts", drafts, device, (R,))
    return R, K, device, drafts


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _ptr(t):
    return 0 if t is None else t.data_ptr()


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
    if isinstance(conf, torch.Tensor) and conf.dim() != 2:
        raise ValueError(f"conf must have shape [R, K], got {tuple(conf.shape)}")
    R, K, device, drafts = _survival_and_drafts(conf, drafts) if isinstance(conf, torch.Tensor) else (None,) * 4
    if R is None:
        raise TypeError(f"conf must be a torch.Tensor, got {type(conf).__name__}")
    if out is None:
        out = torch.empty(R, K, dtype=torch.float32, device=device)
    else:
        _check_tensor("out", out, dtype=torch.float32, device=device, shape=(R, K))
    run_op("prefix_survival_into", _launch_survival, conf, drafts, out, errors.error_buffer(device))
    return out


def _launch_survival(conf, drafts, out, error_counts):
    R, K = conf.shape
    status = _C.prefix_survival(
        conf.is_cuda, _stream(conf.device), conf.data_ptr(), conf.stride(0), drafts.data_ptr(), R, K,
        out.data_ptr(), error_counts.data_ptr(),
    )
    check_status(status, "prefix_survival", conf.device)


# ----------------------------------------------------------------------------------------------------
# argument resolution shared by the kernels and the reference
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PlanArgs:
    """Validated, defaulted planner arguments (host ints and checked tensors)."""

    survival: torch.Tensor  # [R, K] float32
    drafts: torch.Tensor  # [R] int32
    R: int
    K: int
    device: torch.device
    mode: str
    fixed_budget: int
    budget_in: Optional[torch.Tensor]  # 0-d int32
    min_verify: int
    max_verify: int
    extra_tokens: int
    extra_emitting: int
    budget_cap: int  # most drafts that fit: min(R * max_verify, T_pad - R, capacity - R - extra_tokens)
    verify_cost: Optional[torch.Tensor]  # [R + extra_tokens + budget_cap + 1] float32 (greedy/global)
    draft_cost: float  # cost_table.fixed_cost(R): draft_ms(R) + request_ms * R (the kernels' name)
    context_lens: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    block_size: int
    anchor_tokens: Optional[torch.Tensor]
    draft_tokens: Optional[torch.Tensor]
    token_offset: int
    num_reqs_padded: int
    num_tokens_padded: int


def resolve_plan_args(
    survival, drafts, cost_table, *, mode, budget=None, min_verify=0, max_verify=None, extra_tokens=0,
    extra_emitting=0, capacity=None, context_lens=None, block_table=None, block_size=None, anchor_tokens=None,
    draft_tokens=None, token_offset=0, num_reqs_padded=None, num_tokens_padded=None, allowed_modes=tuple(MODES),
) -> PlanArgs:
    """Validates every planner argument (errors name the argument) and fills the defaults."""
    R, K, device, drafts = _survival_and_drafts(survival, drafts)
    if not isinstance(mode, str) or mode not in allowed_modes:
        raise ValueError(f"mode must be one of {list(allowed_modes)}, got {mode!r}")
    _check_int("min_verify", min_verify, lo=0)
    max_verify = K if max_verify is None else _check_int("max_verify", max_verify, lo=0, hi=K)
    if min_verify > max_verify:
        raise ValueError(f"min_verify ({min_verify}) must be <= max_verify ({max_verify})")
    _check_int("extra_tokens", extra_tokens, lo=0)
    _check_int("extra_emitting", extra_emitting, lo=0)
    _check_int("token_offset", token_offset, lo=0)

    fixed_budget, budget_in = 0, None
    if mode == "fixed":
        if budget is None:
            raise ValueError("budget is required with mode='fixed' (a Python int or a 0-d int32 tensor)")
        if isinstance(budget, torch.Tensor):
            if budget.dtype == torch.int64:  # clamp first (no sync) so a huge int64 cannot wrap around
                budget = budget.clamp(0, _INT32_MAX).to(torch.int32)
            budget_in = _check_tensor("budget", budget, dtype=torch.int32, device=device, shape=())
        else:
            # Clamped to [B_min, B_max] later anyway; capping here keeps huge ints packable as int64.
            fixed_budget = min(_check_int("budget", budget, lo=0), 1 << 62)
    elif budget is not None:
        raise ValueError(f"budget is only used with mode='fixed', not mode={mode!r}")

    if cost_table is not None and not isinstance(cost_table, CostTable):
        raise TypeError(f"cost_table must be an adaptive_verify.CostTable, got {type(cost_table).__name__}")
    if cost_table is None and mode in ("greedy", "global"):
        raise ValueError(f"cost_table is required with mode={mode!r}")

    anchors = R + extra_tokens
    limit = None
    if cost_table is not None and cost_table.max_tokens is not None:
        limit = cost_table.max_tokens
    if capacity is not None:
        _check_int("capacity", capacity, lo=0)
        if limit is not None and capacity > limit:
            raise ValueError(f"capacity ({capacity}) exceeds cost_table.max_tokens ({limit})")
        limit = capacity
    if limit is not None and limit < anchors:
        raise ValueError(
            f"capacity ({limit}) is below the R + extra_tokens = {anchors} anchor tokens that every step needs"
        )
    budget_cap = R * max_verify
    if limit is not None:
        budget_cap = min(budget_cap, limit - anchors)

    if num_reqs_padded is None:
        num_reqs_padded = R
    _check_int("num_reqs_padded", num_reqs_padded, lo=R)
    if num_tokens_padded is None:
        num_tokens_padded = R + budget_cap
    _check_int("num_tokens_padded", num_tokens_padded, lo=R)
    budget_cap = min(budget_cap, num_tokens_padded - R)
    if token_offset + num_tokens_padded > _INT32_MAX:
        raise ValueError(f"token_offset + num_tokens_padded must fit int32, got {token_offset + num_tokens_padded}")

    verify_cost, draft_cost = None, 0.0
    if cost_table is not None:
        draft_cost, verify_cost = _costs(cost_table, R, anchors + budget_cap, device, mode in ("greedy", "global"))

    if context_lens is not None:
        context_lens = _int_tensor("context_lens", context_lens, device, (R,))
    if block_table is not None:
        if context_lens is None:
            raise ValueError("block_table needs context_lens (positions decide the slots)")
        if block_size is None:
            raise ValueError("block_size is required with block_table")
        _check_int("block_size", block_size, lo=1)
        if isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int64:
            block_table = block_table.to(torch.int32)
        _check_tensor("block_table", block_table, dtype=torch.int32, device=device, ndim=2, inner_contiguous=True)
        if block_table.shape[0] != R:
            raise ValueError(f"block_table must have R = {R} rows, got shape {tuple(block_table.shape)}")
    elif block_size is not None:
        _check_int("block_size", block_size, lo=1)
    if (anchor_tokens is None) != (draft_tokens is None):
        raise ValueError("anchor_tokens and draft_tokens must be given together (they make input_ids)")
    if anchor_tokens is not None:
        anchor_tokens = _int_tensor("anchor_tokens", anchor_tokens, device, (R,))
        if isinstance(draft_tokens, torch.Tensor) and draft_tokens.dtype == torch.int64:
            draft_tokens = draft_tokens.to(torch.int32)
        _check_tensor("draft_tokens", draft_tokens, dtype=torch.int32, device=device, ndim=2, inner_contiguous=True)
        if draft_tokens.shape[0] != R or draft_tokens.shape[1] < max_verify:
            raise ValueError(
                f"draft_tokens must have shape [R, >= max_verify] = [{R}, >= {max_verify}], "
                f"got {tuple(draft_tokens.shape)}"
            )

    return PlanArgs(
        survival=survival, drafts=drafts, R=R, K=K, device=device, mode=mode, fixed_budget=fixed_budget,
        budget_in=budget_in, min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
        extra_emitting=extra_emitting, budget_cap=budget_cap, verify_cost=verify_cost, draft_cost=draft_cost,
        context_lens=context_lens, block_table=block_table, block_size=block_size or 0,
        anchor_tokens=anchor_tokens, draft_tokens=draft_tokens, token_offset=token_offset,
        num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
    )


# Decode loops call the planner with the same cost table, batch shape and out= buffers step after step.
# The last few lookups and out= validations are remembered; entries hold strong references to the objects
# they describe, so an id in a key can never be reused by a different object while the entry lives.
_COST_MEMO: dict = {}
_OUT_MEMO: dict = {}
_MEMO_SIZE = 8


def _remember(memo: dict, key, value):
    if len(memo) >= _MEMO_SIZE:
        memo.pop(next(iter(memo)))
    memo[key] = value
    return value


def _tsig(t):
    """What of a tensor decides its validation: identity, shape, strides, dtype, device (not its values,
    which the kernel reads at launch)."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return (id(t), t.shape, t.stride(), t.dtype, t.device)
    return (type(t), id(t))  # not a tensor: resolve_plan_args will say so


_ARGS_MEMO: dict = {}


def _resolve_memoized(survival, drafts, cost_table, *, mode, budget=None, min_verify=0, max_verify=None,
                      extra_tokens=0, extra_emitting=0, capacity=None, context_lens=None, block_table=None,
                      block_size=None, anchor_tokens=None, draft_tokens=None, token_offset=0, num_reqs_padded=None,
                      num_tokens_padded=None, allowed_modes=tuple(MODES)) -> PlanArgs:
    """resolve_plan_args, skipped when a decode loop repeats the previous call's arguments (same tensor
    objects with the same shapes, same scalars): validation was about those, not about the values.

    Only results that hold the caller's own tensors are remembered (an int64 input converted to int32
    would be a stale copy), and each entry keeps its tensors and cost table alive (inside PlanArgs), so no
    id in a key can be reused by another object while the entry exists."""
    key = (_tsig(survival), _tsig(drafts), id(cost_table), mode,
           _tsig(budget) if isinstance(budget, torch.Tensor) else budget, min_verify, max_verify, extra_tokens,
           extra_emitting, capacity, _tsig(context_lens), _tsig(block_table), block_size, _tsig(anchor_tokens),
           _tsig(draft_tokens), token_offset, num_reqs_padded, num_tokens_padded, allowed_modes)
    try:
        hit = _ARGS_MEMO.get(key)
    except TypeError:  # an unhashable scalar argument: let the validation name it
        hit = key = None
    if hit is not None and hit[0] is cost_table:
        return hit[1]
    a = resolve_plan_args(
        survival, drafts, cost_table, mode=mode, budget=budget, min_verify=min_verify, max_verify=max_verify,
        extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity, context_lens=context_lens,
        block_table=block_table, block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens,
        token_offset=token_offset, num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
        allowed_modes=allowed_modes,
    )
    own = (a.survival is survival and a.drafts is drafts and a.context_lens is context_lens
           and a.block_table is block_table and a.anchor_tokens is anchor_tokens and a.draft_tokens is draft_tokens
           and (a.budget_in is budget or not isinstance(budget, torch.Tensor)))
    if own and key is not None:
        _remember(_ARGS_MEMO, key, (cost_table, a))
    return a


def _costs(cost_table: CostTable, R: int, max_n: int, device: torch.device, need_verify: bool):
    key = (id(cost_table), R, max_n, device, need_verify)
    hit = _COST_MEMO.get(key)
    if hit is not None and hit[0] is cost_table:
        return hit[1], hit[2]
    draft = float(cost_table.fixed_cost(R))  # Theta's fixed term: drafter + per-request work
    verify = cost_table.verify_array(max_n, device) if need_verify else None
    return _remember(_COST_MEMO, key, (cost_table, draft, verify))[1:]


def _check_out(out: VerifyPlan, a: PlanArgs) -> VerifyPlan:
    fields = (out.verify_lens, out.budget, out.expected_tokens, out.num_tokens, out.query_start_loc, out.token_req,
              out.seq_lens, out.positions, out.slot_mapping, out.input_ids) if isinstance(out, VerifyPlan) else ()
    # Shapes are part of the key: a buffer resized in place must be validated again.
    key = (id(out), *map(id, fields), *(None if f is None else f.shape for f in fields), a.num_reqs_padded,
           a.num_tokens_padded, a.device, a.context_lens is not None, a.block_table is not None,
           a.anchor_tokens is not None)
    hit = _OUT_MEMO.get(key)
    if hit is not None and hit[0] is out and all(x is y for x, y in zip(hit[1], fields)):
        return out
    _check_out_uncached(out, a)
    _remember(_OUT_MEMO, key, (out, fields))
    return out


def _check_out_uncached(out: VerifyPlan, a: PlanArgs) -> VerifyPlan:
    if not isinstance(out, VerifyPlan):
        raise TypeError(f"out must be a VerifyPlan (see VerifyPlan.allocate), got {type(out).__name__}")
    i32, dev = torch.int32, a.device
    Rp, Tp = a.num_reqs_padded, a.num_tokens_padded
    _check_tensor("out.verify_lens", out.verify_lens, dtype=i32, device=dev, shape=(Rp,))
    _check_tensor("out.budget", out.budget, dtype=i32, device=dev, shape=())
    _check_tensor("out.expected_tokens", out.expected_tokens, dtype=torch.float32, device=dev, shape=())
    _check_tensor("out.num_tokens", out.num_tokens, dtype=i32, device=dev, shape=())
    _check_tensor("out.query_start_loc", out.query_start_loc, dtype=i32, device=dev, shape=(Rp + 1,))
    _check_tensor("out.token_req", out.token_req, dtype=i32, device=dev, shape=(Tp,))
    wanted = {
        "seq_lens": (a.context_lens is not None, i32, (Rp,)),
        "positions": (a.context_lens is not None, i32, (Tp,)),
        "slot_mapping": (a.block_table is not None, torch.int64, (Tp,)),
        "input_ids": (a.anchor_tokens is not None, i32, (Tp,)),
    }
    for name, (needed, dtype, shape) in wanted.items():
        t = getattr(out, name)
        if needed and t is None:
            raise ValueError(f"out.{name} is None but this call produces it (allocate it in the VerifyPlan)")
        if needed:
            _check_tensor(f"out.{name}", t, dtype=dtype, device=dev, shape=shape)
    return out


def _launch_plan(a: PlanArgs, outs, budget_out: torch.Tensor, expected: torch.Tensor, error_counts: torch.Tensor):
    """Runs the C++ CPU kernel or the CUDA kernel into preallocated outputs.

    outs: VerifyPlan, a dict of its tensor fields, or None (choose_budget: budget only).
    """
    ws = None
    kernel = _planner_kernel()
    on_cuda = a.device.type == "cuda"  # read once: a torch.device attribute costs ~0.2 us per access
    if on_cuda:
        n = _C.plan_workspace_keys(a.R, a.K)
        if n:
            ws = torch.empty(n, dtype=torch.int64, device=a.device)
    write_plan = outs is not None
    if outs is None:
        outs = {}
    get = outs.get if isinstance(outs, dict) else (lambda name: getattr(outs, name))
    meta = a.context_lens is not None
    vc, bt, dt = a.verify_cost, a.block_table, a.draft_tokens
    status = _C.plan(_PLAN_STRUCT.pack(
        on_cuda, _stream(a.device) if on_cuda else 0, a.survival.data_ptr(), a.survival.stride(0), a.drafts.data_ptr(),
        a.R, a.K, MODES[a.mode], a.fixed_budget, _ptr(a.budget_in), a.min_verify, a.max_verify, a.extra_tokens,
        a.extra_emitting, a.budget_cap, _ptr(vc), 0 if vc is None else vc.numel(), a.draft_cost,
        _ptr(a.context_lens), _ptr(bt), 0 if bt is None else bt.stride(0), 0 if bt is None else bt.shape[1],
        a.block_size, _ptr(a.anchor_tokens), _ptr(dt), 0 if dt is None else dt.stride(0), a.token_offset,
        a.num_reqs_padded, a.num_tokens_padded, _ptr(get("verify_lens")), budget_out.data_ptr(),
        expected.data_ptr(), _ptr(get("num_tokens")), _ptr(get("query_start_loc")),
        _ptr(get("seq_lens") if meta else None), _ptr(get("token_req")),
        _ptr(get("positions") if meta else None),
        _ptr(get("slot_mapping") if bt is not None else None),
        _ptr(get("input_ids") if a.anchor_tokens is not None else None),
        error_counts.data_ptr(), _ptr(ws), write_plan, kernel,
    ))
    check_status(status, "plan_verification" if write_plan else "choose_budget", a.device)


def _run_plan(a: PlanArgs, out: Optional[VerifyPlan], budget_out: torch.Tensor, expected: torch.Tensor):
    """Eager: call the kernel directly. Under torch.compile: through the registered custom op."""
    err = errors.error_buffer(a.device)
    if not torch.compiler.is_compiling():
        _launch_plan(a, out, budget_out, expected, err)
        return
    from .library import pack_plan_args

    tensors, config, draft_cost = pack_plan_args(a)
    o = out if out is not None else VerifyPlan(None, budget_out, expected, None, None, None)
    produce = lambda t, flag: t if flag else None  # noqa: E731
    torch.ops.adaptive_verify.plan_into(
        *tensors, o.verify_lens, budget_out, expected, o.num_tokens, o.query_start_loc, o.token_req,
        produce(o.seq_lens, a.context_lens is not None), produce(o.positions, a.context_lens is not None),
        produce(o.slot_mapping, a.block_table is not None), produce(o.input_ids, a.anchor_tokens is not None),
        err, config, draft_cost,
    )


VERIFICATIONS = (None, "onehot", "probs")
_warned_global: set = set()


def _warn_global_live(verification):
    """Live global looks at a[r, j + 1] when deciding draft j. With one-hot verification (draft_probs=None,
    or greedy) every emitted token is a fresh target sample whatever was drafted, so that is lossless; with
    verification against draft probabilities it is not (design section 4, the paper's Appendix A). Warn once
    per kind: when the caller declared "probs", and when the caller declared nothing (a silent bias is worse
    than one warning; declaring verification="onehot" silences it)."""
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


# ----------------------------------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------------------------------


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
) -> torch.Tensor:
    """Budget B (0-d int32 tensor on survival's device) for ``mode`` in "global", "greedy", "all".

    survival [R, K] float32, drafts [R] int32. Run on an earlier step's survivals, "global" gives the
    lagged mode's budget: pass it to ``plan_verification(mode="fixed", budget=B)``, which clamps it
    to the new step's [B_min, B_max]. Arguments as in :func:`plan_verification`.
    """
    a = _resolve_memoized(
        survival, drafts, cost_table, mode=mode, min_verify=min_verify, max_verify=max_verify,
        extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity,
        allowed_modes=("global", "greedy", "all"),
    )
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
        token_offset: global index of this step's first decode token (query_start_loc starts there).
        num_reqs_padded: R_pad >= R (default R). num_tokens_padded: T_pad >= R (default
            R + min(R * max_verify, capacity - R - extra_tokens): room for every candidate that fits);
            the budget never exceeds T_pad - R.
        out: preallocated :class:`VerifyPlan` whose buffers are fully rewritten.
        verification: how the caller verifies the drafts, which decides whether live "global" is lossless
            (design section 4): "onehot" (``rejection_sample(draft_probs=None)``, greedy, trees: every mode is
            lossless, no warning), "probs" (against draft probabilities: live "global" is not lossless and
            warns once), or None (undeclared: "global" warns once, saying both). Other modes ignore it.
    """
    a = _resolve_memoized(
        survival, drafts, cost_table, mode=mode, budget=budget, min_verify=min_verify, max_verify=max_verify,
        extra_tokens=extra_tokens, extra_emitting=extra_emitting, capacity=capacity, context_lens=context_lens,
        block_table=block_table, block_size=block_size, anchor_tokens=anchor_tokens, draft_tokens=draft_tokens,
        token_offset=token_offset, num_reqs_padded=num_reqs_padded, num_tokens_padded=num_tokens_padded,
    )
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
        _check_out(out, a)
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
