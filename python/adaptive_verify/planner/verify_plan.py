"""VerifyPlan: the planner's outputs (docs/design.md, "Planner", outputs)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch

from .._checks import check_bool, check_int
from .._ext import _C
from .._validate import device_arg

#: Most requests per step, 2^26 - 2: the candidate key holds 26 request bits (planner/math.h kMaxReqs).
MAX_REQS: int = _C.PLANNER_MAX_REQS
#: Most tokens a plan's padded buffers may hold (its int32 offsets, and a bound on host allocation). A limit of the
#: Python layer's allocation, not of a kernel: the kernels take T_pad as int64.
MAX_TOKENS = 1 << 30
#: Largest context length, 2^31 - 65 (planner/math.h kMaxContextLen): context_lens + q_len (<= 64) must fit int32.
MAX_CONTEXT_LEN: int = _C.PLANNER_MAX_CONTEXT_LEN


#: The per-token ([T_pad]) fields of a VerifyPlan and of a TreeVerifyPlan.
TOKEN_FIELDS = ("token_req", "positions", "slot_mapping", "input_ids", "tree_mask", "token_parent", "token_node",
                "token_depth")


@dataclasses.dataclass(frozen=True)
class VerifyPlan:
    """Outputs of :func:`adaptive_verify.plan_verification` (device tensors; int32 unless noted).

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

    Pass a preallocated plan as ``out=`` (see :meth:`allocate`) so CUDA-graph replays keep addresses. Frozen:
    a plan's buffers are fixed when it is made (``dataclasses.replace`` makes another plan), which is what lets
    a prepared planner call (adaptive_verify.prepare) hold a validated ``out=``.
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

    def first_tokens(self, n: int) -> "VerifyPlan":
        """This plan with its per-token buffers ([T_pad]: token_req, positions, slot_mapping, input_ids and a tree
        plan's four) cut to their first ``n`` entries (views; the same plan when they already have n). For a plan
        written into persistent buffers longer than the step's T_pad."""
        fields = self.__dict__
        names = [name for name in TOKEN_FIELDS if fields.get(name) is not None]
        if all(fields[name].shape[0] == n for name in names):
            return self
        # A copy with the token fields cut (what dataclasses.replace makes, without its per-field __init__: an eager
        # step of AdaptiveVerifier asks for a new n almost every step). Frozen: the fields are set once, here.
        plan = object.__new__(type(self))
        plan.__dict__.update(fields)
        plan.__dict__.update({name: fields[name][:n] for name in names})
        return plan

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
        """Buffers for ``out=``: R_pad requests (<= MAX_REQS) and T_pad tokens (<= MAX_TOKENS).
        ``positions=True`` also allocates seq_lens and positions (needed when context_lens is passed),
        ``slot_mapping=True`` the slots (block_table), ``input_ids=True`` the token ids (anchor_tokens,
        draft_tokens)."""
        num_reqs_padded = check_int("num_reqs_padded", num_reqs_padded, lo=0, hi=MAX_REQS)
        num_tokens_padded = check_int("num_tokens_padded", num_tokens_padded, lo=0, hi=MAX_TOKENS)
        positions, slot_mapping = check_bool("positions", positions), check_bool("slot_mapping", slot_mapping)
        input_ids = check_bool("input_ids", input_ids)
        i32 = dict(dtype=torch.int32, device=device_arg("device", device))
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
