"""The planner's per-step inputs in two objects, so an engine passes them as two arguments instead of sixteen keywords.

``PlanStep`` (``step=``): what bounds and ranks this step's verification: the budget, the per-request limits, the
step's token room and prompt chunk, the latency target, the request priorities and the padded sizes.
``MetadataInputs`` (``metadata=``): what the varlen metadata is written from: the KV cache's layout (context_lens,
block_table, block_size), the step's tokens (anchor_tokens, draft_tokens) and where its tokens start (token_offset).

``plan_verification``, ``plan_tree_verification`` and ``choose_budget`` take them keyword-only and still take each
field as its own keyword (same name): a field is given when it is not its default (0 or None, the keyword's default
too), and a field given both ways raises ValueError naming both. The ops unpack the objects before anything else,
so a call is the same call (prepared alike, adaptive_verify.prepare), whichever form it came in.

Construction checks each field's type (TypeError naming the field); values (ranges, shapes, dtypes, devices) are
checked by the ops on every call, in args.py, by the field's name, which is also its keyword's name.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch

from .._checks import is_int, is_real

__all__ = ["MetadataInputs", "PlanStep"]


def _check_type(cls: str, name: str, value, kind: str) -> None:
    """TypeError naming ``cls.name`` unless ``value`` is of ``kind``: "int", "int?" (or None), "real?",
    "tensor?", "budget" (an int, a tensor or None)."""
    if value is None and kind != "int":
        return
    if kind in ("int", "int?", "budget") and is_int(value):
        return
    if kind in ("tensor?", "budget") and isinstance(value, torch.Tensor):
        return
    if kind == "real?" and is_real(value):
        return
    wanted = {"int": "an int", "int?": "an int or None", "real?": "a real number or None",
              "tensor?": "a torch.Tensor or None", "budget": "an int, a 0-d integer torch.Tensor or None"}[kind]
    raise TypeError(f"{cls}.{name} must be {wanted}, got {type(value).__name__} {value!r}")


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class PlanStep:
    """One step's limits and budget for the planner ops (``step=``); every field is also the op's keyword.

    Fields (their meaning is the ops', :func:`plan_verification`'s docstring):
        budget: ``mode="fixed"`` only: an int, or a 0-d int32 (int64) tensor, e.g. choose_budget's ``out``;
            clamped to this step's [B_min, B_max].
        min_verify: forced drafts (tree nodes) per request. max_verify: cap per request (None: K, or N).
        capacity: most tokens in the step (None: cost_table.max_tokens, else unbounded).
        extra_tokens: the step's non-draft tokens (prompt chunks); extra_emitting: prefill requests that sample.
        max_step_ms: a latency target on the step's modelled cost (needs the cost table).
        weights: [R] float32 request priorities (None: all 1).
        num_reqs_padded: R_pad (None: R). num_tokens_padded: T_pad (None: room for every candidate that fits).

    ``choose_budget`` reads all but ``budget`` (it chooses one) and ``num_tokens_padded`` (the plan clamps the
    budget to its T_pad), which must be None there; it ignores ``num_reqs_padded`` (padding rows verify nothing).

    Holds the objects given (tensors are not copied): built once around an engine's persistent ``weights`` and
    budget tensor, it prepares (adaptive_verify.prepare) like the keywords it holds. Frozen: ``dataclasses.replace(step,
    extra_tokens=n)`` makes the next step's. A host int field that changes every step (a budget, a prompt chunk)
    may instead be passed as its keyword next to a step that leaves it at its default.
    """

    budget: Union[int, torch.Tensor, None] = None
    min_verify: int = 0
    max_verify: Optional[int] = None
    capacity: Optional[int] = None
    extra_tokens: int = 0
    extra_emitting: int = 0
    max_step_ms: Optional[float] = None
    weights: Optional[torch.Tensor] = None
    num_reqs_padded: Optional[int] = None
    num_tokens_padded: Optional[int] = None

    def __post_init__(self):
        for name, kind in _STEP_KINDS:
            _check_type("PlanStep", name, getattr(self, name), kind)


_STEP_KINDS = (("budget", "budget"), ("min_verify", "int"), ("max_verify", "int?"), ("capacity", "int?"),
               ("extra_tokens", "int"), ("extra_emitting", "int"), ("max_step_ms", "real?"), ("weights", "tensor?"),
               ("num_reqs_padded", "int?"), ("num_tokens_padded", "int?"))


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class MetadataInputs:
    """What a plan's varlen metadata is written from (``metadata=``); every field is also the op's keyword.

    Fields (their meaning is the ops', :func:`plan_verification`'s docstring):
        context_lens: [R] int32 KV length before this step; enables seq_lens and positions.
        block_table: [R, max_blocks] int32 with block_size; enables slot_mapping (needs context_lens).
        anchor_tokens: [R] int32 last emitted token; with draft_tokens enables input_ids.
        draft_tokens: [R, >= max_verify] int32 drafted ids; a negative id ends its request's candidates (and in a
            tree, siblings must differ).
        token_offset: global index of this step's first decode token (query_start_loc starts there).

    ``choose_budget`` reads only ``draft_tokens`` (the rest lays out tokens and KV slots, which no budget depends
    on), so one object can serve a step's budget and its plan.

    Holds the tensors given, not copies: built once around an engine's persistent buffers (updated in place), it
    prepares like the keywords it holds. Frozen: ``dataclasses.replace(metadata, token_offset=t)``.
    """

    context_lens: Optional[torch.Tensor] = None
    block_table: Optional[torch.Tensor] = None
    block_size: Optional[int] = None
    anchor_tokens: Optional[torch.Tensor] = None
    draft_tokens: Optional[torch.Tensor] = None
    token_offset: int = 0

    def __post_init__(self):
        for name, kind in _METADATA_KINDS:
            _check_type("MetadataInputs", name, getattr(self, name), kind)


_METADATA_KINDS = (("context_lens", "tensor?"), ("block_table", "tensor?"), ("block_size", "int?"),
                   ("anchor_tokens", "tensor?"), ("draft_tokens", "tensor?"), ("token_offset", "int"))


def _given(value, zero: bool) -> bool:
    """Whether a keyword or a field is given: not None and, for a field whose default is 0 (``zero``), not the int 0
    (False or 0.0 are given: a wrong type next to an object is then reported, not dropped). A budget, capacity or
    max_verify of 0 is given: their default is None."""
    return value is not None and not (zero and type(value) is int and value == 0)


def _merge(obj_name: str, obj, fields: tuple, keywords: tuple) -> tuple:
    """Each field from whichever of ``obj`` and ``keywords`` gives it; ValueError naming every field given both
    ways. ``fields``: (name, default is 0) per keyword."""
    merged, both = [], []
    for (name, zero), kw in zip(fields, keywords):
        value = getattr(obj, name)
        if not _given(kw, zero):
            merged.append(value if _given(value, zero) else kw)
        elif not _given(value, zero):
            merged.append(kw)
        else:
            both.append(name)
    if both:
        raise ValueError(" and ".join(f"{name}= and {obj_name}.{name}" for name in both)
                         + " are both given: pass each argument once")
    return tuple(merged)


_STEP_FIELDS = (("budget", False), ("min_verify", True), ("max_verify", False), ("capacity", False),
                ("extra_tokens", True), ("extra_emitting", True), ("max_step_ms", False), ("weights", False),
                ("num_reqs_padded", False), ("num_tokens_padded", False))
_METADATA_FIELDS = (("context_lens", False), ("block_table", False), ("block_size", False),
                    ("anchor_tokens", False), ("draft_tokens", False), ("token_offset", True))


def merge_step(step, budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting, max_step_ms, weights,
               num_reqs_padded, num_tokens_padded) -> tuple:
    """The step's fields of a call given ``step`` (not None) and the keywords, in this order: each from whichever
    gives it (the objects themselves, so a prepared call holds the same ones as with keywords)."""
    if not isinstance(step, PlanStep):
        raise TypeError(f"step must be an adaptive_verify.PlanStep, got {type(step).__name__}")
    # The usual call passes the object alone, every keyword at its default: a few attribute reads.
    if (budget is None and max_verify is None and capacity is None and max_step_ms is None and weights is None
            and num_reqs_padded is None and num_tokens_padded is None and type(min_verify) is int
            and type(extra_tokens) is int and type(extra_emitting) is int
            and min_verify == extra_tokens == extra_emitting == 0):
        return (step.budget, step.min_verify, step.max_verify, step.capacity, step.extra_tokens, step.extra_emitting,
                step.max_step_ms, step.weights, step.num_reqs_padded, step.num_tokens_padded)
    return _merge("step", step, _STEP_FIELDS, (budget, min_verify, max_verify, capacity, extra_tokens, extra_emitting,
                                               max_step_ms, weights, num_reqs_padded, num_tokens_padded))


def merge_metadata(metadata, context_lens, block_table, block_size, anchor_tokens, draft_tokens,
                   token_offset) -> tuple:
    """merge_step for ``metadata``: (context_lens, block_table, block_size, anchor_tokens, draft_tokens,
    token_offset)."""
    if not isinstance(metadata, MetadataInputs):
        raise TypeError(f"metadata must be an adaptive_verify.MetadataInputs, got {type(metadata).__name__}")
    if (context_lens is None and block_table is None and block_size is None and anchor_tokens is None
            and draft_tokens is None and type(token_offset) is int and token_offset == 0):
        return (metadata.context_lens, metadata.block_table, metadata.block_size, metadata.anchor_tokens,
                metadata.draft_tokens, metadata.token_offset)
    return _merge("metadata", metadata, _METADATA_FIELDS,
                  (context_lens, block_table, block_size, anchor_tokens, draft_tokens, token_offset))
