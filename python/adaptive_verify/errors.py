"""Device error counters.

Values that cannot be checked without a host synchronisation (NaN confidences, ids or drafts out of
range on a CUDA tensor) are given a documented safe behaviour by the kernels and counted in an int32
buffer on their device. Read the counts whenever a sync is acceptable (for example once per N steps)::

    adaptive_verify.error_counts("cuda")   # {'nan_survival': 0, 'drafts_out_of_range': 0, ...}

Create the buffer before capturing a CUDA graph (any op call does it), so the capture does not allocate.
"""
from __future__ import annotations

import torch

from ._ext import _C
from ._validate import device_arg

# Slot names, in the order of csrc/include/adaptive_verify/common.h (ErrorCounter).
COUNTER_NAMES = (
    # prefix_survival: each NaN confidence of a drafted position (it counts as 0);
    # plan_verification / choose_budget: each request whose candidates a NaN survival cuts short.
    "nan_survival",
    "drafts_out_of_range",  # drafts[r] outside [0, K] on CUDA: clamped (the CPU raises ValueError)
    # planner on CUDA: a position beyond the block table (slot written as -1); write_kv on CUDA: a slot outside
    # the cache (skipped); verify_attention on CUDA: a block id outside the cache (position skipped). The CPU
    # raises ValueError for all three.
    "slot_out_of_range",
    "nan_logits",  # NaN logits: ignored by draft_margin, never emitted by rejection_sample / sample
    "nan_confidence",  # NaN confidences: skipped by AcceptanceStats.update (no trial recorded)
    "draft_id_out_of_range",  # rejection_sample: a draft id outside [0, V): rejected, never used as an index
    # rejection_sample: q_len < 0 or rows past T (padding), q_len > K + 1 (clamped); verify_attention on CUDA:
    # a request whose lengths are invalid (q_len > max_query_len, seq_lens < q_len, ...) is made padding.
    "query_len_out_of_range",
    # rejection_sample / sample on CUDA: top_k < 0, top_p outside (0, 1] or min_p outside [0, 1] (or NaN): that
    # filter is off for the request (the CPU raises ValueError).
    "sampling_param_out_of_range",
    # plan_verification / choose_budget on CUDA: a weight that is NaN, negative or infinite weighs 1 (the CPU raises)
    "weight_out_of_range",
    # draft trees on CUDA: parents[r, j] outside [-1, j): the node and its subtree are not candidates (tree_survival:
    # survival 0); the CPU raises ValueError.
    "bad_parent",
    # draft trees on CUDA: a node whose draft id repeats an earlier sibling's: it and its subtree are not candidates
    # (the CPU raises ValueError).
    "duplicate_sibling",
    # commit_tree_kv on CUDA: a request whose accepted path is invalid (offsets not increasing, num_accepted out of
    # range, a slot outside its blocks or the cache): none of its entries is moved (the CPU raises ValueError).
    "accepted_path",
    # planner: a context length outside [0, MAX_CONTEXT_LEN] on CUDA: the request's seq_lens and positions are
    # written 0 and its slots -1 (the CPU raises ValueError).
    "context_len_out_of_range",
    # tree_rejection_sample on CUDA: a token at offset i >= 1 whose token_parent lies outside [0, i) (not a parent
    # before it in its request): it is no child of any token, so the walk never enters it (the CPU raises ValueError).
    "token_parent_out_of_range",
    # AcceptanceStats.update(positions=) on CUDA: a trial whose positions[r] + j lies outside [0, num_positions): it
    # is not counted (the CPU raises ValueError naming positions).
    "stats_position_out_of_range",
    # fp8 KV caches on CUDA (verify_attention, write_kv): a per-head k_scales / v_scales tensor entry that is NaN,
    # infinite or <= 0, counted once per KV head and call; it is used as given (the CPU raises ValueError).
    "kv_scale_out_of_range",
    # verify_attention(sinks=) on CUDA: a sinks entry that is NaN or infinite, counted once per query head and call;
    # it is used as given (the CPU raises ValueError).
    "sink_out_of_range",
)

_buffers: dict[torch.device, torch.Tensor] = {}


def _key(device) -> torch.device:
    # Ops pass their tensors' (valid) device on every call: only other values pay for the full check.
    if not (isinstance(device, torch.device) and device.type in ("cpu", "cuda")):
        device = device_arg("device", device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def error_buffer(device) -> torch.Tensor:
    """The int32 [NUM_ERROR_COUNTERS] counter buffer of ``device`` (created on first use)."""
    key = _key(device)
    buf = _buffers.get(key)
    if buf is None:
        buf = torch.zeros(_C.NUM_ERROR_COUNTERS, dtype=torch.int32, device=key)
        _buffers[key] = buf
    return buf


def error_counts(device="cpu") -> dict[str, int]:
    """Counts of each safely-handled bad value seen on ``device`` since the last reset (syncs)."""
    values = error_buffer(device).tolist()
    return {name: values[i] for i, name in enumerate(COUNTER_NAMES)}


def reset_error_counts(device="cpu") -> None:
    """Zeroes the counters of ``device`` (asynchronously on CUDA)."""
    error_buffer(device).zero_()
