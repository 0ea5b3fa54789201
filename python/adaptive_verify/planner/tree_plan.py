"""TreeVerifyPlan: the tree planner's outputs (docs/design.md, "Draft trees")."""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch

from .._ext import _C
from .verify_plan import VerifyPlan

#: Most nodes per request, 63: the anchor and every node fit a 64-bit attention mask (planner/math.h kMaxTreeNodes).
MAX_TREE_NODES: int = _C.PLANNER_MAX_TREE_NODES
#: Most requests of a tree plan, 2^21 - 1: the tree candidate key holds 21 request bits (planner/math.h kMaxTreeReqs).
MAX_TREE_REQS: int = _C.PLANNER_MAX_TREE_REQS


def tree_status_messages(_C) -> dict:
    """check_status's wording for the tree ops, where the kernels' drafts are the tree sizes."""
    return {_C.STATUS_DRAFTS_OUT_OF_RANGE: "tree_sizes: every value must lie in [0, N] where N = survival.shape[1]"}


@dataclasses.dataclass(frozen=True)
class TreeVerifyPlan(VerifyPlan):
    """Outputs of :func:`adaptive_verify.plan_tree_verification`: :class:`VerifyPlan`'s fields, where
    verify_lens counts the verified nodes of each request and a request's tokens are its anchor then its verified
    nodes in increasing node index, plus four per-token tensors ([T_pad], padding lanes as noted):

    tree_mask int64: bit i set iff the token attends to its request's query token at offset i (itself, its
        ancestors and the anchor, bit 0); 0 for padding. A chain's mask is lower-triangular.
    token_parent int32: offset of the token's parent within its request, -1 for the anchor and for padding.
    token_node int32: node index of the token, -1 for the anchor and for padding.
    token_depth int32: depth of the token (the anchor 0, a child of the anchor 1); 0 for padding.

    positions are context_lens + depth (the RoPE position); slot_mapping is the slot of KV index context_lens +
    offset, so siblings never share a slot (commit_tree_kv moves the accepted path to context_lens + depth).
    """

    tree_mask: Optional[torch.Tensor] = None
    token_parent: Optional[torch.Tensor] = None
    token_node: Optional[torch.Tensor] = None
    token_depth: Optional[torch.Tensor] = None

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
    ) -> "TreeVerifyPlan":
        """Buffers for ``out=``, as :meth:`VerifyPlan.allocate`, plus the four tree buffers (always written)."""
        base = VerifyPlan.allocate(num_reqs_padded, num_tokens_padded, device, positions=positions,
                                   slot_mapping=slot_mapping, input_ids=input_ids)
        T = base.token_req.shape[0]
        i32 = dict(dtype=torch.int32, device=device)
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(VerifyPlan)},
                   tree_mask=torch.empty(T, dtype=torch.int64, device=device), token_parent=torch.empty(T, **i32),
                   token_node=torch.empty(T, **i32), token_depth=torch.empty(T, **i32))
