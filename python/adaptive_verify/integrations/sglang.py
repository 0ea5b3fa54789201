"""SGLang adapter, EAGLE verify path: chain drafts (``speculative_eagle_topk == 1``) here, draft trees
(``topk > 1``) in :mod:`.sglang_tree`, re-exported here (tree_from_sglang, tree_verify_input, ...).

Where each call goes in SGLang's loop and what changes there: docs/integrations/sglang.md. Nothing here
imports SGLang; functions return dicts keyed by the names SGLang uses for the same quantities
(``EagleVerifyInput``, ``EagleVerifyOutput``, the attention backends' ``qo_indptr``).

What differs from SGLang's own layout: SGLang verifies ``draft_token_num`` tokens for every request (a
uniform ``[bs, draft_token_num]`` layout, ``qo_indptr = arange(bs + 1) * draft_token_num``); with adaptive
verification request r verifies ``1 + verify_lens[r]`` tokens (anchor first, then its verified drafts), so
every quantity below is varlen, indexed through the plan's ``query_start_loc``. For trees the planner allocates
over nodes (plan_tree_verification); see sglang_tree.

Conventions kept from SGLang: ``seq_lens`` is the KV length *before* the step (SGLang's ``batch.seq_lens``,
our ``context_lens``); indices into the verify forward's logits / hidden-state rows are relative to the
first decode token (0-based); ``accept_length`` counts accepted drafts, not the bonus token.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..planner import MAX_DRAFTS  # the planner's K limit (the extension's)
from . import _check_int, _check_tensor, _num_reqs, _relative_starts
from .sglang_tree import (SGLangTree, mask_bits_from_sglang, tree_from_eagle_draft, tree_from_sglang,
                          tree_from_sglang_mask, tree_mask_to_sglang, tree_to_sglang, tree_verify_input,
                          tree_verify_output, varlen_verify_fields)

__all__ = ["verify_input", "verify_output", "chain_from_sglang", "ragged_layout_fields", "TESTED_SGLANG_VERSION",
           "SGLangTree", "tree_from_sglang", "tree_from_eagle_draft", "tree_from_sglang_mask", "mask_bits_from_sglang",
           "tree_to_sglang", "tree_mask_to_sglang", "tree_verify_input", "tree_verify_output", "DraftDepthPolicy"]

#: The SGLang release the adapter is tested against (tests/integration/peers.txt).
TESTED_SGLANG_VERSION = "0.5.23"



def chain_from_sglang(draft_token: torch.Tensor, num_reqs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's chain verify tokens to our inputs.

    draft_token: [bs * draft_token_num] flattened, each request's verified id (our anchor) first, then its
        ``draft_token_num - 1`` drafts (what SGLang's tree builder produces for topk = 1).
    Returns (anchor_tokens [R] int32, draft_tokens [R, draft_token_num - 1] int32, drafts [R] int32).
    """
    R = _check_int("num_reqs", num_reqs, lo=0)
    _check_tensor("draft_token", draft_token, ndim=1)
    n = draft_token.shape[0]
    if R == 0:
        if n:
            raise ValueError(f"draft_token must be empty when num_reqs is 0, got {n} tokens")
        z = torch.zeros(0, dtype=torch.int32, device=draft_token.device)
        return z, z.reshape(0, 0), z
    if n % R or n // R < 2 or n // R > MAX_DRAFTS + 1:
        raise ValueError(f"draft_token must hold num_reqs * draft_token_num tokens with draft_token_num in "
                         f"[2, {MAX_DRAFTS + 1}], got {n} tokens for {R} requests")
    t = draft_token.reshape(R, n // R).to(torch.int32)
    drafts = torch.full((R,), n // R - 1, dtype=torch.int32, device=draft_token.device)
    return t[:, 0].contiguous(), t[:, 1:].contiguous(), drafts


def verify_input(plan, max_drafts: int, num_reqs: Optional[int] = None, *, num_tokens: Optional[int] = None) -> dict:
    """What SGLang's verify step needs, from our plan (made with context_lens, anchor_tokens and
    draft_tokens), for the chain case. All on the plan's device, no host sync.

    max_drafts: K (the width of the retrieve tables is K + 1, SGLang's ``spec_steps + 1``).
    num_tokens: how many token-level entries to return (host int, e.g. R + budget from plan_budget, the
        slots SGLang allocates); default the plan's padded size. Entries past R + budget are padding.

    Returns:
        ``draft_token`` [num_tokens] int64: each request's anchor then its verified drafts (the verify
            forward's input_ids; SGLang's layout for topk = 1, but varlen);
        ``positions`` [num_tokens] int64;
        ``seq_lens`` [R] int32: KV length before the step (SGLang's ``batch.seq_lens``);
        ``end_offset`` [R] int32: KV length after the step's tokens are written (= our ``seq_lens``; what
            SGLang passes to ``assign_req_to_token_pool`` as ``seq_lens + draft_token_num``);
        ``qo_indptr`` [R + 1] int32: query offsets of each request, 0-based (replaces
            ``arange(bs + 1) * draft_token_num``);
        ``kv_indptr`` [R + 1] int32: exclusive cumsum of ``end_offset`` (SGLang's ``cum_kv_seq_len``);
        ``verify_lens`` [R] int32: drafts verified per request (SGLang has no counterpart: uniform there);
        ``retrieve_index`` [R, K + 1] int64: row of token j of request r (qo_indptr[r] + j), -1 past its end;
        ``retrieve_next_token`` [R, K + 1] int64: j + 1 while inside the chain, -1 at its last token;
        ``retrieve_next_sibling`` [R, K + 1] int64: all -1 (a chain has no siblings);
        ``topk``: 1.
    """
    K = _check_int("max_drafts", max_drafts, lo=1, hi=MAX_DRAFTS)
    R = _num_reqs(plan, num_reqs)
    fields, starts, q_len = varlen_verify_fields(plan, R, num_tokens)
    device = starts.device
    j = torch.arange(K + 1, dtype=torch.int64, device=device)
    inside = j[None, :] < q_len[:, None]
    retrieve_index = torch.where(inside, starts[:-1, None] + j[None, :], torch.full_like(inside, -1, dtype=torch.int64))
    has_next = j[None, :] + 1 < q_len[:, None]
    retrieve_next = torch.where(has_next, (j + 1)[None, :].expand(R, K + 1), torch.full_like(has_next, -1,
                                                                                         dtype=torch.int64))
    return {
        **fields,
        "retrieve_index": retrieve_index,
        "retrieve_next_token": retrieve_next,
        "retrieve_next_sibling": torch.full((R, K + 1), -1, dtype=torch.int64, device=device),
        "topk": 1,
    }


def verify_output(plan, output_tokens: torch.Tensor, num_emitted: torch.Tensor, num_reqs: Optional[int] = None, *,
                  host: bool = True) -> dict:
    """SGLang's verify results from :func:`adaptive_verify.rejection_sample`'s outputs.

    Returns, on the device without a sync:
        ``accept_length`` [R] int32: accepted drafts per request (num_emitted - 1);
        ``accept_index`` [R, K + 1] int32: verify-forward rows of the emitted tokens (row of token j is
            qo_indptr[r] + j, for j < num_emitted[r]; -1 after), SGLang's ``accept_index`` /
            ``accepted_indices`` before flattening (use it to gather the hidden states for the draft model);
    and with ``host=True`` (one sync, as SGLang's own verify does):
        ``verified_id`` [sum num_emitted] int32: every request's emitted tokens (accepted drafts then the
            recovered/bonus token), concatenated in request order;
        ``accepted_rows`` [sum num_emitted] int64: the non-padding entries of accept_index, flattened;
        ``accept_length_per_req_cpu``: list[int], accept_length on the host.
    """
    R = _num_reqs(plan, num_reqs)
    _check_tensor("output_tokens", output_tokens, ndim=2)
    _check_tensor("num_emitted", num_emitted, ndim=1)
    if output_tokens.shape[0] < R or num_emitted.shape[0] < R:
        raise ValueError(f"output_tokens and num_emitted must have at least num_reqs = {R} rows, got "
                         f"{tuple(output_tokens.shape)} and {tuple(num_emitted.shape)}")
    if num_emitted.shape[0] != output_tokens.shape[0]:
        raise ValueError(f"num_emitted must have output_tokens.shape[0] = {output_tokens.shape[0]} entries, "
                         f"got {num_emitted.shape[0]}")
    starts = _relative_starts(plan, R)
    width = output_tokens.shape[1]
    emitted = num_emitted[:R].to(torch.int64)
    j = torch.arange(width, dtype=torch.int64, device=starts.device)
    inside = j[None, :] < emitted[:, None]
    accept_index = torch.where(inside, starts[:-1, None] + j[None, :], torch.full_like(inside, -1,
                                                                                        dtype=torch.int64))
    out = {
        "accept_length": (emitted - 1).to(torch.int32),
        "accept_index": accept_index.to(torch.int32),
    }
    if host:
        out["verified_id"] = output_tokens[:R][inside].to(torch.int32)
        out["accepted_rows"] = accept_index[inside]
        out["accept_length_per_req_cpu"] = [int(x) for x in out["accept_length"].tolist()]
    return out


def ragged_layout_fields(plan, graph_num_tokens: int, num_reqs: Optional[int] = None, *,
                         verify_lens_host=None) -> dict:
    """The fields of SGLang's ``RaggedVerifyLayout`` (``sglang/srt/speculative/ragged_verify.py``, its DSpark
    varlen verify path) from our plan: ``RaggedVerifyLayout(**d)`` builds it and runs its own checks.

    SGLang's ``verify_lens`` count the anchor (every row verifies at least 1 token): ours plus one.
    graph_num_tokens: the padded token count of the step's target-verify graph (host int, e.g. the ``padded``
        of ``AdaptiveVerifier.plan_budget``), >= the step's R + budget tokens.
    verify_lens_host: optional host copy of ``plan.verify_lens[:R]``; with it the layout also carries
        ``verify_lens_cpu`` and ``total_verify_tokens`` (SGLang checks them against graph_num_tokens), without
        it the layout is device-only (SGLang's ``from_verify_lens_device``), and nothing syncs.

    Returns ``verify_lens`` [R] int32, ``graph_num_tokens``, ``extend_start_loc`` [R] int32 (each row's first
    token, 0-based), ``qo_indptr_device`` [R + 1] int32, and with verify_lens_host ``verify_lens_cpu`` (list)
    and ``total_verify_tokens``.
    """
    R = _num_reqs(plan, num_reqs)
    g = _check_int("graph_num_tokens", graph_num_tokens, lo=0)
    starts = _relative_starts(plan, R).to(torch.int32)
    d = {
        "verify_lens": (plan.verify_lens[:R] + 1).to(torch.int32),
        "graph_num_tokens": g,
        "extend_start_loc": starts[:-1].clone(),
        "qo_indptr_device": starts,
    }
    if verify_lens_host is not None:
        if isinstance(verify_lens_host, torch.Tensor):
            verify_lens_host = verify_lens_host.tolist()
        try:
            host = [int(x) + 1 for x in verify_lens_host]
        except (TypeError, ValueError):
            raise ValueError("verify_lens_host must be a sequence of ints") from None
        if len(host) != R:
            raise ValueError(f"verify_lens_host must have num_reqs = {R} entries, got {len(host)}")
        d["verify_lens_cpu"] = host
        d["total_verify_tokens"] = sum(host)
    return d


class DraftDepthPolicy:
    """SGLang's adaptive speculation policy (``AdaptiveSpecPolicy``: ``candidate_steps``, ``get_steps_for_batch``,
    ``on_verify_complete``, ...) driven by ``AdaptiveVerifier.plan_draft``, for SGLang's ``AdaptiveController``:
    each step the fork calls :meth:`decide` with the step's requests (before ``activate_step_by_batch``), and the
    controller switches the worker to the runtime state of ``speculative_num_steps`` = the decided depth.

    SGLang captures a runtime state (its CUDA graphs) per candidate step count, so a depth is served by the smallest
    candidate >= it (the plan then verifies only what its budget allows; the largest candidate when none is
    larger), and a depth of 0 by the smallest candidate (SGLang's adaptive worker has no state without drafting).
    ``on_verify_complete`` returns None: the outcomes reach the verifier through ``observe``."""

    def __init__(self, verifier, candidate_steps):
        steps = sorted({_check_int("candidate_steps[i]", k, lo=1, hi=MAX_DRAFTS) for k in candidate_steps})
        if not steps:
            raise ValueError("candidate_steps must hold at least one step count")
        self.verifier, self._steps, self._graph_bs = verifier, steps, None
        self.depth = self.budget = self.padded = 0
        self.width = 1
        self._serve = steps[-1]

    @property
    def candidate_steps(self) -> list:
        return list(self._steps)

    def decide(self, num_reqs: int, drafts_host=None, extra_tokens: int = 0, *, req_indices=None,
               weights=None) -> tuple:
        """plan_draft's (depth, budget, padded_tokens) for this step (arguments as there); the step count
        get_steps_for_batch then serves."""
        self.depth, self.budget, self.padded = self.verifier.plan_draft(num_reqs, drafts_host, extra_tokens,
                                                                        req_indices=req_indices, weights=weights)
        self._serve = next((k for k in self._steps if k >= self.depth), self._steps[-1])
        return self.depth, self.budget, self.padded

    def decide_tree(self, num_reqs: int, drafts_host=None, extra_tokens: int = 0, *, req_indices=None,
                    weights=None) -> tuple:
        """An EAGLE tree step (``speculative_eagle_topk`` > 1; the verifier built with max_nodes and tree_top_k =
        that topk): plan_tree_draft's (depth, width, budget, padded_tokens), the depth served as decide() serves it.
        SGLang's topk is both the children per node and the beam, fixed per server (its CUDA graphs), so the width
        is advisory: the worker expands topk nodes per level, and the budget verifies the best of them."""
        self.depth, self.width, self.budget, self.padded = self.verifier.plan_tree_draft(
            num_reqs, drafts_host, extra_tokens, req_indices=req_indices, weights=weights)
        self._serve = next((k for k in self._steps if k >= self.depth), self._steps[-1])
        return self.depth, self.width, self.budget, self.padded

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self._serve

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size: int):
        return None

    def set_cuda_graph_bs(self, cuda_graph_bs) -> None:
        self._graph_bs = None if cuda_graph_bs is None else list(cuda_graph_bs)

    def cuda_graph_bs_for_step(self, step: int):
        return self._graph_bs
