"""vLLM v1 adapter: our plan and sampler outputs in vLLM's structures, and vLLM's drafts in ours.

Where each call goes in vLLM's loop, and which vLLM metadata each output replaces: docs/integrations/vllm.md.
Nothing here imports vLLM (tests/integration checks it against vLLM 0.33.0). Functions return dicts keyed by
vLLM's field names (``SpecDecodeMetadata``, ``CommonAttentionMetadata``), so ``cls(**d)`` builds the real object
where vLLM is installed; :func:`build` drops the keys a given class does not take (field sets differ between vLLM
versions). :func:`patch_manager` drives vLLM's own ``AdaptiveVerificationManager`` with this library's planner.

Scope: the decode requests of one step, the rows of one :class:`~adaptive_verify.VerifyPlan`, every
scheduled token's logits computed (each verified token yields one logit row, as in our layout). A step that
also carries prefill chunks needs the engine to put those requests' rows next to ours (see the docs).

Host synchronisation: only :func:`spec_decode_metadata` needs the per-request draft counts on the host
(vLLM's ``num_draft_tokens`` is a ``list[int]`` and its sampler reads ``max_spec_len`` on the host); pass
``verify_lens_host`` if you already copied them, else one small device-to-host copy is made.
:func:`attention_metadata` syncs only if ``max_seq_len`` is not given, :func:`sampled_token_ids` is a
host conversion by nature (vLLM's own ``parse_output`` copies the same tensor).
"""
from __future__ import annotations

import dataclasses
import inspect
import types
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

if TYPE_CHECKING:  # imported where used: the adapters load no more than they need
    from ..cost import CostTable

# Our K limit, the extension's (vLLM 0.33.0's MAX_SPEC_LEN is 128, older versions' 32).
from ..planner import MAX_DRAFTS
from . import _check_int, _check_tensor, _host_verify_lens, _num_reqs, _plan_field, _relative_starts

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "PAD_SLOT_ID",
    "SPEC_DECODE_FIELDS",
    "ATTENTION_FIELDS",
    "drafts_from_vllm",
    "drafts_to_vllm",
    "spec_decode_metadata",
    "attention_metadata",
    "sampler_query_start_loc",
    "output_token_ids",
    "sampled_token_ids",
    "build",
    "TESTED_VLLM_VERSION",
    "cost_table_from_vllm",
    "budget_kwargs",
    "patch_manager",
    "schedule_draft_depth",
]

#: The vLLM release the manager patch and the differential tests were checked against
#: (tests/integration/peers.txt). :func:`patch_manager` checks the manager's attributes, not this version.
TESTED_VLLM_VERSION = "0.33.0"

PLACEHOLDER_TOKEN_ID = -1  # vLLM's padding in the rejection sampler's output, and ours
PAD_SLOT_ID = -1  # vLLM's slot of a padding token, and ours (the planner writes -1)

SPEC_DECODE_FIELDS = ("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens", "cu_num_sampled_tokens",
                      "target_logits_indices", "bonus_logits_indices", "logits_indices")
ATTENTION_FIELDS = ("query_start_loc", "seq_lens", "num_reqs", "num_actual_tokens", "max_query_len",
                    "max_seq_len", "block_table_tensor", "slot_mapping", "causal")


def drafts_from_vllm(draft_token_ids, max_drafts: int, *, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-request drafts to ours.

    draft_token_ids: ``list[list[int]]`` (vLLM's ``DraftTokenIds.draft_token_ids`` or the values of
        ``scheduled_spec_decode_tokens`` in input-batch order), or a 2-D integer tensor [R, k] such as a
        proposer's output, where a negative id ends the request's drafts.
    max_drafts: K, our drafts per request (the verifier's ``max_drafts``), in [1, 32].
    Returns (draft_tokens [R, K] int32 padded with 0, drafts [R] int32) on ``device`` (default: the tensor's
    device, or CPU for lists).
    """
    K = _check_int("max_drafts", max_drafts, lo=1, hi=MAX_DRAFTS)
    if isinstance(draft_token_ids, torch.Tensor):
        t = _check_tensor("draft_token_ids", draft_token_ids, ndim=2)
        R, k = t.shape
        if k > K:
            raise ValueError(f"draft_token_ids has {k} columns, more than max_drafts = {K}")
        dev = t.device if device is None else torch.device(device)
        valid = (t >= 0).to(torch.int32).cumprod(dim=1)  # 1 until the first negative id
        drafts = valid.sum(dim=1, dtype=torch.int32)
        out = torch.zeros(R, K, dtype=torch.int32, device=t.device)
        out[:, :k] = torch.where(valid.bool(), t, torch.zeros_like(t)).to(torch.int32)
        return out.to(dev), drafts.to(dev)
    if isinstance(draft_token_ids, (str, bytes)) or not isinstance(draft_token_ids, Sequence):
        raise ValueError(f"draft_token_ids must be a list of lists of ints or a 2-D tensor, "
                         f"got {type(draft_token_ids).__name__}")
    R = len(draft_token_ids)
    rows = []
    for i, ids in enumerate(draft_token_ids):
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise ValueError(f"draft_token_ids[{i}] must be a list of ints, got {type(ids).__name__}")
        if len(ids) > K:
            raise ValueError(f"draft_token_ids[{i}] has {len(ids)} drafts, more than max_drafts = {K}")
        row = []
        for x in ids:
            if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x > 0x7FFFFFFF:
                raise ValueError(f"draft_token_ids[{i}] must hold token ids in [0, 2^31), got {x!r}")
            row.append(x)
        rows.append(row)
    out = torch.zeros(R, K, dtype=torch.int32)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    drafts = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    dev = torch.device("cpu") if device is None else torch.device(device)
    return out.to(dev), drafts.to(dev)


def drafts_to_vllm(draft_tokens: torch.Tensor, drafts) -> list:
    """The inverse of :func:`drafts_from_vllm`: ``list[list[int]]``, the first ``drafts[r]`` ids of row r
    (one device-to-host copy)."""
    _check_tensor("draft_tokens", draft_tokens, ndim=2)
    R, K = draft_tokens.shape
    d = drafts.tolist() if isinstance(drafts, torch.Tensor) else list(drafts)
    if len(d) != R:
        raise ValueError(f"drafts must have R = {R} entries (draft_tokens.shape[0]), got {len(d)}")
    if any(not 0 <= int(x) <= K for x in d):
        raise ValueError(f"drafts must be in [0, K = {K}], got {d}")
    rows = draft_tokens.tolist()
    return [rows[i][: int(d[i])] for i in range(R)]


def spec_decode_metadata(plan, draft_tokens: torch.Tensor, num_reqs: Optional[int] = None, *,
                         verify_lens_host=None) -> dict:
    """vLLM's ``SpecDecodeMetadata`` fields computed from our plan (decode-only step, every token's logits).

    plan: the step's :class:`~adaptive_verify.VerifyPlan` (verify_lens, query_start_loc).
    draft_tokens: [>= R, K] integer tensor on the plan's device, the drafts the plan was made from.
    num_reqs: R, the real requests (default: every plan row); later rows are padding.
    verify_lens_host: optional host copy of ``plan.verify_lens[:R]``; without it one small
        device-to-host copy is made (the only host sync: vLLM needs ``num_draft_tokens`` as a list).

    Returns a dict: ``draft_token_ids`` [B] int32 (the verified drafts, flattened), ``num_draft_tokens``
    (list[int], = verify_lens), ``cu_num_draft_tokens`` [R] int32 (inclusive cumsum),
    ``cu_num_sampled_tokens`` [R] int32 (inclusive cumsum of 1 + verify_lens; newer vLLM versions only),
    ``target_logits_indices`` [B] and ``bonus_logits_indices`` [R] int32 (rows of the computed logits,
    i.e. of ``logits[logits_indices]``), ``logits_indices`` [R + B] int32 (token indices whose hidden
    states give logits: every decode token, starting at the plan's token_offset). Everything but
    ``num_draft_tokens`` stays on the plan's device and is computed without a sync.
    """
    R = _num_reqs(plan, num_reqs)
    vl_dev = plan.verify_lens[:R].to(torch.int64)
    device = vl_dev.device
    _check_tensor("draft_tokens", draft_tokens, ndim=2)
    if draft_tokens.shape[0] < R:
        raise ValueError(f"draft_tokens must have at least num_reqs = {R} rows, got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.device != device:
        raise ValueError(f"draft_tokens must be on the plan's device {device}, got {draft_tokens.device}")
    vl = _host_verify_lens(plan, R, verify_lens_host)
    K = draft_tokens.shape[1]
    if any(x > K for x in vl):
        raise ValueError(f"draft_tokens has K = {K} columns but a request verifies {max(vl)} drafts")
    B = sum(vl)
    qsl = _plan_field(plan, "query_start_loc")
    reqs = torch.arange(R, dtype=torch.int64, device=device)
    cu = torch.cumsum(vl_dev, 0)  # inclusive
    draft_req = torch.repeat_interleave(reqs, vl_dev, output_size=B)  # request of each verified draft
    k = torch.arange(B, dtype=torch.int64, device=device)
    j = k - (cu - vl_dev)[draft_req]  # draft position within its request
    return {
        "draft_token_ids": draft_tokens[draft_req, j].to(torch.int32),
        "num_draft_tokens": vl,
        "cu_num_draft_tokens": cu.to(torch.int32),
        "cu_num_sampled_tokens": (cu + reqs + 1).to(torch.int32),
        # Each earlier request adds one bonus row, so draft k of request r sits at row k + r.
        "target_logits_indices": (k + draft_req).to(torch.int32),
        "bonus_logits_indices": (cu + reqs).to(torch.int32),
        "logits_indices": (qsl[:1].to(torch.int64) + torch.arange(R + B, dtype=torch.int64, device=device))
        .to(torch.int32),
    }


def attention_metadata(plan, block_table: torch.Tensor, max_query_len: int, num_reqs: Optional[int] = None, *,
                       max_seq_len: Optional[int] = None, num_actual_tokens: Optional[int] = None,
                       host_copies: bool = False) -> dict:
    """vLLM ``CommonAttentionMetadata``-style fields from our plan (the decode requests of the step).

    plan: made with context_lens and block_table (seq_lens, slot_mapping).
    block_table: [>= R, max_blocks] the table the plan's slots came from (passed through as
        ``block_table_tensor``).
    max_query_len: host upper bound of 1 + verify_lens (e.g. 1 + max_drafts; vLLM picks kernels with it).
    max_seq_len: host upper bound of seq_lens; when None it is read from the plan (a device sync).
    num_actual_tokens: tokens in the batch as vLLM counts them (default: the plan's padded token count,
        ``plan.token_req.numel()``, which is what vLLM passes for a padded CUDA-graph batch).
    host_copies: also return ``query_start_loc_cpu`` and ``seq_lens_cpu`` (a device-to-host copy). Their
        per-request boundaries exist only after the device plan ran: vLLM code that reads them for the
        split must read the device tensors instead (see docs).
    """
    R = _num_reqs(plan, num_reqs)
    mql = _check_int("max_query_len", max_query_len, lo=1)
    seq_lens = _plan_field(plan, "seq_lens", needs="context_lens")
    slots = _plan_field(plan, "slot_mapping", needs="block_table and block_size")
    qsl = _plan_field(plan, "query_start_loc")
    _check_tensor("block_table", block_table, ndim=2)
    if block_table.shape[0] < R:
        raise ValueError(f"block_table must have at least num_reqs = {R} rows, got shape {tuple(block_table.shape)}")
    tokens = plan.token_req.numel() if num_actual_tokens is None else _check_int("num_actual_tokens",
                                                                                  num_actual_tokens, lo=0)
    if max_seq_len is None:
        msl = int(seq_lens[:R].max()) if R else 0
    else:
        msl = _check_int("max_seq_len", max_seq_len, lo=0)
    d = {
        "query_start_loc": qsl[: R + 1],
        "seq_lens": seq_lens[:R],
        "num_reqs": R,
        "num_actual_tokens": tokens,
        "max_query_len": mql,
        "max_seq_len": msl,
        "block_table_tensor": block_table[:R],
        "slot_mapping": slots,
        "causal": True,
    }
    if host_copies:
        d["query_start_loc_cpu"] = d["query_start_loc"].cpu()
        d["seq_lens_cpu"] = d["seq_lens"].cpu()
    return d


def sampler_query_start_loc(plan, num_reqs: Optional[int] = None) -> torch.Tensor:
    """query_start_loc [R + 1] int32 relative to the computed logits (``logits[logits_indices]``): what
    :func:`adaptive_verify.rejection_sample` takes when it replaces vLLM's rejection sampler."""
    R = _num_reqs(plan, num_reqs)
    return _relative_starts(plan, R).to(torch.int32)


def output_token_ids(output_tokens: torch.Tensor, max_spec_len: int) -> torch.Tensor:
    """Our output_tokens [R, K + 1] as vLLM's rejection-sampler tensor [R, max_spec_len + 1] (a view; -1 is
    vLLM's PLACEHOLDER_TOKEN_ID too). max_spec_len = max(num_draft_tokens): no request emits more than
    max_spec_len + 1 tokens, so nothing is cut."""
    _check_tensor("output_tokens", output_tokens, ndim=2)
    m = _check_int("max_spec_len", max_spec_len, lo=0, hi=output_tokens.shape[1] - 1)
    return output_tokens[:, : m + 1]


def sampled_token_ids(output_tokens: torch.Tensor, num_emitted: torch.Tensor, num_reqs: Optional[int] = None, *,
                      vocab_size: Optional[int] = None) -> list:
    """vLLM's per-request output lists (``ModelRunnerOutput.sampled_token_ids``) from
    :func:`adaptive_verify.rejection_sample`: row r's first ``num_emitted[r]`` tokens (accepted drafts,
    then the recovered or bonus token). vocab_size: also drop ids >= vocab_size, as vLLM's parse_output
    does. One device-to-host copy of each tensor."""
    _check_tensor("output_tokens", output_tokens, ndim=2)
    _check_tensor("num_emitted", num_emitted, ndim=1)
    if num_emitted.shape[0] != output_tokens.shape[0]:
        raise ValueError(f"num_emitted must have output_tokens.shape[0] = {output_tokens.shape[0]} entries, "
                         f"got {num_emitted.shape[0]}")
    R = output_tokens.shape[0] if num_reqs is None else _check_int("num_reqs", num_reqs, lo=0,
                                                                    hi=output_tokens.shape[0])
    if vocab_size is not None:
        _check_int("vocab_size", vocab_size, lo=1)
    rows = output_tokens[:R].tolist()
    counts = num_emitted[:R].tolist()
    width = output_tokens.shape[1]
    out = []
    for r in range(R):
        n = int(counts[r])
        if not 0 <= n <= width:
            raise ValueError(f"num_emitted[{r}] = {n} is outside [0, {width}]")
        toks = rows[r][:n]
        if vocab_size is not None:
            toks = [t for t in toks if 0 <= t < vocab_size]
        out.append(toks)
    return out


def build(cls, fields: dict):
    """``cls(**fields)`` with only the keys ``cls`` takes (a dataclass or any class with named init
    parameters): field sets differ between vLLM versions (``SpecDecodeMetadata.cu_num_sampled_tokens`` appeared
    in later versions; ``CommonAttentionMetadata`` gains and loses fields). A field ``cls`` requires that
    ``fields`` lacks is a ValueError naming it (vLLM 0.33's ``CommonAttentionMetadata`` requires
    ``query_start_loc_cpu``: pass ``host_copies=True`` to :func:`attention_metadata`, or add the runner's own
    host copy)."""
    if not isinstance(fields, dict):
        raise ValueError(f"fields must be a dict, got {type(fields).__name__}")
    if dataclasses.is_dataclass(cls) and isinstance(cls, type):
        params = [(f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                  for f in dataclasses.fields(cls) if f.init]
    else:
        try:
            sig = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            raise ValueError(f"cls must be a dataclass or a class with an inspectable __init__, got {cls!r}") from None
        if any(p.kind == p.VAR_KEYWORD for p in sig.values()):
            return cls(**fields)
        params = [(n, p.default is p.empty) for n, p in sig.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    lacking = [n for n, required in params if required and n not in fields]
    if lacking:
        raise ValueError(f"fields lacks {', '.join(lacking)}, required by {getattr(cls, '__name__', cls)}")
    names = {n for n, _ in params}
    return cls(**{k: v for k, v in fields.items() if k in names})


# --------------------------------------------------------------------------------------------------------------
# vLLM's own adaptive verification (vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, model runner v2):
# its AdaptiveVerificationManager, driven by this library's planner.
# --------------------------------------------------------------------------------------------------------------


def cost_table_from_vllm(cost_tables) -> "CostTable":
    """Our :class:`~adaptive_verify.CostTable` with exactly the costs of vLLM's dense tables.

    cost_tables: ``AdaptiveVerificationManager.cost_tables``, i.e. ``(draft_table, verify_table)`` as
        ``build_cost_tables_from_curves`` returns them: float64 arrays indexed by request count (0..max_num_reqs)
        and by token count (0..max_num_batched_tokens).

    Every count >= 1 becomes a measured point (no graph sizes: vLLM's staircase and eager tail are already in
    the values), so ``verify_cost(n) == verify_table[n]`` and ``draft_cost(r) == draft_table[r]`` for every
    n, r >= 1; ``max_tokens = len(verify_table) - 1`` (vLLM's ``max_num_batched_tokens``). The planner's
    kernels read the verify costs as float32 (vLLM compares float64): see docs/integrations/vllm.md for what
    that rounding changes.
    """
    from ..cost import CostTable

    if not isinstance(cost_tables, (tuple, list)) or len(cost_tables) != 2:
        raise ValueError(f"cost_tables must be vLLM's (draft_table, verify_table) pair, got {type(cost_tables).__name__}")
    draft, verify = (np.asarray(t, dtype=np.float64).reshape(-1) for t in cost_tables)
    if draft.shape[0] < 2 or verify.shape[0] < 2:
        raise ValueError(f"cost_tables must cover at least 1 request and 1 token, got lengths "
                         f"{draft.shape[0]} and {verify.shape[0]}")
    if not (np.isfinite(draft).all() and np.isfinite(verify).all()) or (draft < 0).any() or (verify[1:] <= 0).any():
        raise ValueError("cost_tables must hold finite costs, draft >= 0 and verify > 0 (vLLM clamps them so)")
    return CostTable.from_points(
        {n: float(verify[n]) for n in range(1, verify.shape[0])},
        {r: float(draft[r]) for r in range(1, draft.shape[0])},
        max_tokens=verify.shape[0] - 1,
        metadata={"source": "vllm AdaptiveVerificationManager.cost_tables"},
    )


def budget_kwargs(num_reqs: int, num_non_draft_tokens: int, max_total_logits: int, num_bonus_tokens: int = 1,
                  max_tokens: Optional[int] = None) -> dict:
    """:func:`adaptive_verify.choose_budget` keyword arguments for one vLLM step (model runner v2).

    The planner's rows are every scheduled request, in any order (a prefill chunk is a row with 0 drafts), so
    the drafter is priced at all of them, as vLLM does. num_non_draft_tokens: the step's scheduled tokens minus
    its drafts (one anchor per decode request plus the prompt chunks): the rows' own token is counted by the
    planner, the rest is ``extra_tokens``. vLLM caps the draft budget by logit rows,
    ``max_total_logits - num_reqs * num_bonus_tokens``; that becomes the planner's token ``capacity`` (bounded by
    ``max_tokens``, the cost table's).

    Not expressible: vLLM's numerator counts only the requests that sample this step, the planner counts every
    row (``extra_emitting`` adds, it cannot subtract), so a prompt chunk that does not finish its prompt counts
    as one emitted token here (docs/integrations/vllm.md, "Differential results").
    """
    R = _check_int("num_reqs", num_reqs, lo=0)
    nd = _check_int("num_non_draft_tokens", num_non_draft_tokens, lo=R)
    logits = _check_int("max_total_logits", max_total_logits, lo=0)
    bonus = _check_int("num_bonus_tokens", num_bonus_tokens, lo=1)
    capacity = nd + max(0, logits - R * bonus)
    if max_tokens is not None:
        capacity = min(capacity, _check_int("max_tokens", max_tokens, lo=nd))
    return {"extra_tokens": nd - R, "capacity": capacity}


_MANAGER_ATTRS = ("cost_tables", "req_states", "num_speculative_steps", "num_bonus_tokens", "_max_total_logits",
                  "_stale_confidences", "_stale_idx", "_confidence_probs", "_batch_draft_capacity",
                  "_num_non_draft_tokens", "_cu_num_logits", "query_start_loc", "_batch_budget",
                  "_copy_admitted_drafts_to_host", "get_num_tokens", "reallocate_drafts")


class _HostCounts:
    """Admitted draft counts already on the host (a CPU manager): vLLM's ``AdmittedDraftCounts`` interface."""

    def __init__(self, counts: torch.Tensor):
        self._counts = counts

    def wait(self) -> np.ndarray:
        return self._counts.numpy()


class _Patch:
    """What :func:`patch_manager` keeps on the manager: the original methods and our cost table, rebuilt
    whenever vLLM replaces ``cost_tables`` (``set_cost_curves``)."""

    def __init__(self, get_num_tokens, reallocate_drafts):
        self.original = (get_num_tokens, reallocate_drafts)
        self._key = None
        self._table = None

    def table(self, cost_tables):
        if self._key is not cost_tables:
            self._table, self._key = cost_table_from_vllm(cost_tables), cost_tables
        return self._table


def _patched_get_num_tokens(self, num_tokens_per_req: dict, draft_tokens: dict) -> int:
    """vLLM's ``get_num_tokens`` contract (token count of the step once the draft budget is chosen; the budget
    stashed in ``_batch_budget`` for ``compact_batch`` / ``reallocate_drafts``), with the budget chosen by
    :func:`adaptive_verify.planner.lagged_budget` (the lagged mode, as AdaptiveVerifier decides it) with
    ``prompt_pricing="fixed"``, vLLM's."""
    from ..planner import lagged_budget

    if self.cost_tables is None:
        raise RuntimeError("manager.cost_tables is None: vLLM sets it by profiling (set_cost_curves) first")
    table = self._adaptive_verify_patch.table(self.cost_tables)
    req_ids = list(num_tokens_per_req)
    R = len(req_ids)
    scheduled = np.fromiter(num_tokens_per_req.values(), dtype=np.int64, count=R)
    drafts = np.fromiter((len(draft_tokens.get(r, ())) for r in req_ids), dtype=np.int32, count=R)
    non_draft = scheduled - drafts
    slots = np.fromiter(map(self.req_states.req_id_to_index.__getitem__, req_ids), dtype=np.int64, count=R)
    budget = 0
    if R and drafts.any():
        # [R, K] host float32: the confidences vLLM's budget ranks (new requests hold its prior, 1.0).
        stale = np.ascontiguousarray(self._stale_confidences[self._stale_idx].np[slots], dtype=np.float32)
        d = torch.from_numpy(drafts)
        kw = budget_kwargs(R, int(non_draft.sum()), self._max_total_logits, self.num_bonus_tokens, table.max_tokens)
        # The library's one lagged budget, with vLLM's pricing of the non-draft tokens (a fixed part of the step).
        budget = lagged_budget(torch.from_numpy(stale), d, table, prompt_tokens=kw["extra_tokens"],
                               prompt_pricing="fixed", capacity=kw["capacity"])
    self._batch_budget = (
        {r: int(n) for r, n in zip(req_ids, drafts)},
        {r: int(n) for r, n in zip(req_ids, non_draft)},
        budget,
    )
    return int(non_draft.sum()) + budget


def _patched_reallocate_drafts(self, req_ids: list, idx_mapping: torch.Tensor):
    """vLLM's ``reallocate_drafts`` contract: the step's budget given to the drafts with the highest live
    survival, in canonical order (:func:`adaptive_verify.plan_verification`, mode "fixed"), written to the
    manager's persistent buffers (admitted counts, ``cu_num_logits``, ``query_start_loc``)."""
    from ..planner import plan_verification, prefix_survival

    batch_budget, self._batch_budget = self._batch_budget, None
    if batch_budget is None:
        raise RuntimeError("reallocate_drafts needs get_num_tokens first (it chooses the step's budget)")
    drafts_per_req, non_draft_per_req, budget = batch_budget
    R = idx_mapping.shape[0]
    drafts = np.fromiter((drafts_per_req[r] for r in req_ids), dtype=np.int32, count=R)
    non_draft = np.fromiter((non_draft_per_req[r] for r in req_ids), dtype=np.int32, count=R)
    num_tokens = int(non_draft.sum()) + budget
    device = idx_mapping.device
    caps = self._batch_draft_capacity[:R]
    if budget == 0:
        caps.zero_()
    else:
        d = torch.from_numpy(drafts).to(device, non_blocking=True)
        # [R, K] live confidences of this step's requests (vLLM's persistent per-slot table).
        conf = self._confidence_probs[idx_mapping.long()].contiguous()
        plan = plan_verification(prefix_survival(conf, d), d, mode="fixed", budget=budget,
                                 num_tokens_padded=R + budget)
        caps.copy_(plan.verify_lens)
    non_draft_dev = self._num_non_draft_tokens[:R]
    non_draft_dev.copy_(torch.from_numpy(non_draft).to(device, non_blocking=True))
    # Logit rows per request: its admitted drafts plus its bonus rows; query tokens: admitted drafts plus its
    # non-draft tokens. (For a decode-only step this query_start_loc is the plan's own.)
    self._cu_num_logits[:1].zero_()
    torch.cumsum(caps + self.num_bonus_tokens, dim=0, out=self._cu_num_logits[1: R + 1])
    self.query_start_loc[:1].zero_()
    torch.cumsum(caps + non_draft_dev, dim=0, out=self.query_start_loc[1: R + 1])
    self.query_start_loc[R + 1:].fill_(num_tokens)
    admitted = None
    if self._copy_admitted_drafts_to_host and 0 < budget < int(drafts.sum()):
        if device.type == "cuda":
            # GPU-only (not run by the CPU tests): the same pinned copy and event vLLM's method records.
            module = __import__(type(self).__module__, fromlist=["AdmittedDraftCounts"])
            host = self._admitted_drafts_cpu[:R]
            current = torch.cuda.current_stream(device)
            self._copy_stream.wait_stream(current)
            with torch.cuda.stream(self._copy_stream):
                host.copy_(caps, non_blocking=True)
                self._admitted_drafts_event.record()
            admitted = module.AdmittedDraftCounts(host, self._admitted_drafts_event)
        else:
            admitted = _HostCounts(caps.clone())
    return self._cu_num_logits[: R + 1], self.query_start_loc, budget, admitted


def patch_manager(manager):
    """Make an installed vLLM's ``AdaptiveVerificationManager`` use this library's planner. Returns it.

    Replaces, on this instance only, the two methods where vLLM decides:

    - ``get_num_tokens`` (host, scheduling): the draft budget is :func:`adaptive_verify.choose_budget`
      (mode "global") on vLLM's stale confidences, with vLLM's cost tables (:func:`cost_table_from_vllm`) and
      its logit-row capacity (:func:`budget_kwargs`). vLLM ranks the same survivals; what can differ is listed
      in docs/integrations/vllm.md.
    - ``reallocate_drafts`` (device): the budget is allocated by :func:`adaptive_verify.plan_verification`
      (mode "fixed") on the live confidences, in the canonical order (survival desc, position asc, request
      asc: the same integers on every TP rank), instead of a ``torch.topk`` whose order among equal survivals
      is unspecified; then vLLM's ``cu_num_logits`` and ``query_start_loc`` buffers are written from it.

    Everything else (profiling, ``set_cost_curves``, ``record_confidences``, ``add_request`` and its prior of
    1.0, ``compact_batch``) stays vLLM's. Drafts are counted as vLLM counts them (the length of each request's
    scheduled list); their ids are not read, since under async scheduling those lists hold ``-1`` placeholders,
    which the planner would take for invalidated drafts. Idempotent. Checked against vLLM 0.33.0 (TESTED_VLLM_VERSION): a
    manager lacking an attribute the patch uses raises ValueError naming it. The CUDA-event paths (vLLM's
    ``record_confidences``, the admitted-count copy to the host) run only on a GPU; the tests exercise the rest
    on the CPU (tests/integration/test_peer_vllm_manager.py).
    """
    lacking = [a for a in _MANAGER_ATTRS if not hasattr(manager, a)]
    if lacking:
        raise ValueError(f"manager lacks {', '.join(lacking)}: not a vLLM {TESTED_VLLM_VERSION}-style "
                         f"AdaptiveVerificationManager ({type(manager).__name__})")
    if isinstance(getattr(manager, "_adaptive_verify_patch", None), _Patch):
        return manager
    manager._adaptive_verify_patch = _Patch(manager.get_num_tokens, manager.reallocate_drafts)
    manager.get_num_tokens = types.MethodType(_patched_get_num_tokens, manager)
    manager.reallocate_drafts = types.MethodType(_patched_reallocate_drafts, manager)
    return manager


def schedule_draft_depth(scheduler_output, depth: int) -> None:
    """Hands this step's draft depth (``AdaptiveVerifier.plan_draft``) to vLLM: its ``SchedulerOutput`` carries
    ``num_spec_tokens_to_schedule``, the K of dynamic speculative decoding, which the model runner passes to the
    proposer's ``propose(num_speculative_tokens, ...)``, and an EAGLE proposer drafts that many levels (its first
    forward runs at 0 too, to keep the drafter's KV cache in step: price it with ``CostTable(...,
    draft_catch_up=True)``). Call it in a scheduler fork where vLLM sets the field from its batch-size lookup, after
    ``plan_draft`` (host, no sync). TypeError for an object without the field (a vLLM before dynamic speculation);
    ValueError for a depth that is not an int >= 0."""
    if not hasattr(scheduler_output, "num_spec_tokens_to_schedule"):
        raise TypeError(f"scheduler_output must be a vLLM SchedulerOutput with num_spec_tokens_to_schedule (vLLM >= "
                        f"0.33), got {type(scheduler_output).__name__}")
    scheduler_output.num_spec_tokens_to_schedule = _check_int("depth", depth, lo=0, hi=MAX_DRAFTS)
