"""What the simulator models: acceptance, the drafter, the workload, and a profile that ties them to a cost.

A profile is plain data (a JSON object) so engineers can write their own:

    {
      "name": "...", "description": "...",
      "cost": {"roofline": {...CostTable.roofline arguments, hbm_gbps and tflops per GPU, plus
                            "tensor_parallel": N...}}  or  {"table": {...CostTable.to_dict()...}},
      "acceptance": {"conditional": [...], "request_sigma": ..., "token_sigma": ..., "head_noise": ...,
                     "head_temperature": ..., "head_bias": ...},
      "drafter": {"num_drafts": K, "kind": "block" | "chain"},
      "workload": {"prompt_len": [lo, hi], "output_len": [lo, hi],
                   "priority": {"fraction": f, "weight": w}},
      "adaptive_overhead": "device" | "host" | "none" | {"fixed_ms": ..., "per_request_ms": ...},
      "notes": {...free-form: what was fitted, how close it lands...}
    }

"adaptive_overhead" is optional (default "device"; :mod:`adaptive_verify.sim.overhead` has the presets);
so is "workload"."priority" (default: one class, every request weighs 1; see :class:`Priority`).

Every missing or malformed key raises ValueError naming it (``profile.acceptance.conditional``).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from ..cost import CostTable
from ..planner import MAX_DRAFTS
from .overhead import DEFAULT_OVERHEAD, Overhead, overhead_preset

__all__ = ["Acceptance", "Drafter", "Priority", "Workload", "Profile", "load_profile_file"]


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
    if key not in data:
        raise ValueError(f"{where}: missing key {key!r}")
    return data[key]


def _real(value: Any, name: str, *, lo: float | None = None, lo_open: bool = False, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    v = float(value)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def _int_range(value: Any, name: str, *, minimum: int) -> tuple[int, int]:
    """An int n (meaning [n, n]) or a pair [lo, hi] of ints, lo <= hi, both >= minimum."""
    pair = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in pair)):
        raise ValueError(f"{name} must be an int or a pair [lo, hi] of ints, got {value!r}")
    lo, hi = int(pair[0]), int(pair[1])
    if lo < minimum or hi < lo:
        raise ValueError(f"{name} must satisfy {minimum} <= lo <= hi, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class Acceptance:
    """Acceptance of drafts and what the drafter's confidence head sees of it.

    For request r (difficulty d_r ~ N(0, request_sigma), drawn once) at a decode step, draft j's true
    conditional acceptance probability is ``p = sigmoid(logit(conditional[j]) + d_r + e)`` with
    ``e ~ N(0, token_sigma)`` fresh per (step, position): ``conditional[j]`` is the median, and it decays
    with j. The head reports ``conf = sigmoid((logit(p) + n) / head_temperature + head_bias)`` with
    ``n ~ N(0, head_noise)``: head_noise lowers its AUC, head_temperature != 1 and head_bias != 0 make it
    miscalibrated. The planner ranks these confidences; acceptance itself is drawn from p (a rejection
    draw per verified draft, stopping at the first rejection).
    """

    conditional: tuple[float, ...]
    request_sigma: float = 0.5
    token_sigma: float = 1.0
    head_noise: float = 0.5
    head_temperature: float = 1.0
    head_bias: float = 0.0

    def __post_init__(self):
        cond = self.conditional
        if not isinstance(cond, (list, tuple)) or not cond:
            raise ValueError(f"acceptance.conditional must be a non-empty list of probabilities, got {cond!r}")
        object.__setattr__(self, "conditional", tuple(
            _real(c, f"acceptance.conditional[{j}]", lo=0.0, lo_open=True, hi=1.0 - 1e-9) for j, c in enumerate(cond)))
        for name in ("request_sigma", "token_sigma", "head_noise"):
            object.__setattr__(self, name, _real(getattr(self, name), f"acceptance.{name}", lo=0.0))
        object.__setattr__(self, "head_temperature",
                           _real(self.head_temperature, "acceptance.head_temperature", lo=0.0, lo_open=True))
        object.__setattr__(self, "head_bias", _real(self.head_bias, "acceptance.head_bias"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "acceptance") -> "Acceptance":
        cond = _get(data, "conditional", where)
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        return cls(conditional=tuple(cond) if isinstance(cond, list) else cond,
                   **{k: v for k, v in data.items() if k != "conditional"})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["conditional"] = list(self.conditional)
        return d


@dataclass(frozen=True)
class Drafter:
    """num_drafts: K, the drafts per request per step. kind: "block" (one drafter forward yields all K
    drafts, as DSpark or MTP-style block drafters) or "chain" (one forward per draft, as EAGLE): the
    drafter's cost per step is cost_table.draft_cost(R) (the cost of drafting K) times 1 (block) or
    the most drafts any request makes this step / K (chain)."""

    num_drafts: int
    kind: str = "block"

    def __post_init__(self):
        k = self.num_drafts
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFTS:  # the planner's limit
            raise ValueError(f"drafter.num_drafts must be an int in [1, {MAX_DRAFTS}], got {k!r}")
        if self.kind not in ("block", "chain"):
            raise ValueError(f"drafter.kind must be 'block' or 'chain', got {self.kind!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "drafter") -> "Drafter":
        return cls(num_drafts=_get(data, "num_drafts", where), kind=data.get("kind", "block"))


@dataclass(frozen=True)
class Priority:
    """Two request classes: each admitted request is "high" with probability ``fraction`` (drawn from its
    own seeded stream, so every policy serves the same classes) and then weighs ``weight`` in the planner
    (``plan_verification(weights=...)``); the others ("low") weigh 1. A weight below 1 makes the drawn
    class the less important one; the names stay."""

    fraction: float
    weight: float

    def __post_init__(self):
        object.__setattr__(self, "fraction", _real(self.fraction, "priority.fraction", lo=0.0, lo_open=True))
        if self.fraction >= 1.0:  # both classes must exist for per-class numbers to mean anything
            raise ValueError(f"priority.fraction must be < 1, got {self.fraction}")
        object.__setattr__(self, "weight", _real(self.weight, "priority.weight", lo=0.0, lo_open=True))

    @classmethod
    def parse(cls, text: str, name: str = "priority") -> "Priority":
        """"FRACTION:WEIGHT", e.g. "0.2:4" (ValueError naming ``name`` otherwise)."""
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str FRACTION:WEIGHT, got {type(text).__name__}")
        try:
            fraction, weight = (float(x) for x in text.split(":"))  # not two parts, or not numbers: ValueError
        except ValueError:
            raise ValueError(f"{name} must be FRACTION:WEIGHT (e.g. 0.2:4), got {text!r}") from None
        try:
            return cls(fraction, weight)
        except ValueError as e:
            raise ValueError(f"{name} {text!r}: {e}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "workload.priority") -> "Priority":
        unknown = sorted(set(data) - {"fraction", "weight"}) if isinstance(data, Mapping) else []
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: ['fraction', 'weight'])")
        try:
            return cls(_get(data, "fraction", where), _get(data, "weight", where))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, float]:
        return {"fraction": self.fraction, "weight": self.weight}


@dataclass(frozen=True)
class Workload:
    """Prompt and output lengths of each request, uniform on [lo, hi] (ints; lo == hi for a fixed length).
    prefill_chunk: most prompt tokens one request may prefill in one step (chunked prefill).
    priority: two request classes (:class:`Priority`), or None for one class of weight 1."""

    prompt_len: tuple[int, int] = (1024, 1024)
    output_len: tuple[int, int] = (512, 512)
    prefill_chunk: int = 2048
    priority: Optional[Priority] = None

    def __post_init__(self):
        object.__setattr__(self, "prompt_len", _int_range(self.prompt_len, "workload.prompt_len", minimum=1))
        object.__setattr__(self, "output_len", _int_range(self.output_len, "workload.output_len", minimum=2))
        c = self.prefill_chunk
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"workload.prefill_chunk must be an int >= 1, got {c!r}")
        if self.priority is not None and not isinstance(self.priority, Priority):
            raise TypeError(f"workload.priority must be a Priority or None, got {type(self.priority).__name__}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "workload") -> "Workload":
        priority = data.get("priority") if isinstance(data, Mapping) else None
        return cls(prompt_len=_get(data, "prompt_len", where), output_len=_get(data, "output_len", where),
                   prefill_chunk=data.get("prefill_chunk", 2048),
                   priority=None if priority is None else Priority.from_dict(priority, f"{where}.priority"))

    def to_dict(self) -> dict[str, Any]:
        d = {"prompt_len": list(self.prompt_len), "output_len": list(self.output_len),
             "prefill_chunk": self.prefill_chunk}
        if self.priority is not None:  # absent otherwise: profiles without classes read and write as before
            d["priority"] = self.priority.to_dict()
        return d


@dataclass(frozen=True)
class Profile:
    """A deployment to simulate: its step cost, acceptance model, drafter and workload.

    The cost table's ``max_tokens`` is the engine's token capacity per forward (vLLM's
    max_num_batched_tokens): steps never exceed it, and the planner never plans past it. ``overhead`` is
    what the adaptive path adds to each of its steps (:class:`~adaptive_verify.sim.overhead.Overhead`).
    """

    name: str
    description: str
    cost_table: CostTable
    acceptance: Acceptance
    drafter: Drafter
    workload: Workload = field(default_factory=Workload)
    notes: Mapping[str, Any] = field(default_factory=dict)
    cost_spec: Mapping[str, Any] = field(default_factory=dict)
    overhead: Overhead = field(default_factory=lambda: overhead_preset(DEFAULT_OVERHEAD))

    def __post_init__(self):
        if len(self.acceptance.conditional) < self.drafter.num_drafts:
            raise ValueError(f"acceptance.conditional has {len(self.acceptance.conditional)} positions, fewer than "
                             f"drafter.num_drafts = {self.drafter.num_drafts}")
        if self.cost_table.max_tokens is None:
            raise ValueError("cost: the cost table needs max_tokens (the engine's token capacity per step)")

    @property
    def capacity(self) -> int:
        return int(self.cost_table.max_tokens)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> "Profile":
        cost = _get(data, "cost", where)
        if not isinstance(cost, Mapping) or len(cost) != 1 or next(iter(cost)) not in ("roofline", "table"):
            raise ValueError(f"{where}.cost must be {{'roofline': {{...}}}} or {{'table': {{...}}}}, got {cost!r}")
        if "roofline" in cost:
            args = dict(_get(cost, "roofline", f"{where}.cost"))
            for key in ("hbm_gbps", "tflops", "weight_bytes", "active_params", "kv_bytes_per_token", "context_len",
                        "max_tokens"):
                _get(args, key, f"{where}.cost.roofline")
            if isinstance(args.get("draft_ms"), Mapping):  # JSON object keys are strings
                args["draft_ms"] = {int(k): v for k, v in args["draft_ms"].items()}
            tp = args.pop("tensor_parallel", 1)
            if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
                raise ValueError(f"{where}.cost.roofline.tensor_parallel must be an int >= 1, got {tp!r}")
            # With tensor parallelism the step reads the weights and KV once across tp GPUs: hbm_gbps and
            # tflops are per GPU and scale by tp (an ideal split; all-reduce time goes in overhead_ms).
            args["hbm_gbps"] = _real(args["hbm_gbps"], f"{where}.cost.roofline.hbm_gbps", lo=0.0, lo_open=True) * tp
            args["tflops"] = _real(args["tflops"], f"{where}.cost.roofline.tflops", lo=0.0, lo_open=True) * tp
            args["metadata"] = {**dict(args.get("metadata") or {}), "tensor_parallel": tp}
            table = CostTable.roofline(**args)
        else:
            table = CostTable.from_dict(_get(cost, "table", f"{where}.cost"))
        return cls(
            name=str(_get(data, "name", where)), description=str(data.get("description", "")), cost_table=table,
            acceptance=Acceptance.from_dict(_get(data, "acceptance", where), f"{where}.acceptance"),
            drafter=Drafter.from_dict(_get(data, "drafter", where), f"{where}.drafter"),
            workload=Workload.from_dict(data.get("workload", {"prompt_len": 1024, "output_len": 512}),
                                        f"{where}.workload"),
            notes=dict(data.get("notes", {})), cost_spec=dict(cost),
            overhead=Overhead.from_dict(data.get("adaptive_overhead", DEFAULT_OVERHEAD),
                                        f"{where}.adaptive_overhead"),
        )

    def to_dict(self) -> dict[str, Any]:
        cost = dict(self.cost_spec) if self.cost_spec else {"table": self.cost_table.to_dict()}
        return {"name": self.name, "description": self.description, "cost": cost,
                "acceptance": self.acceptance.to_dict(), "drafter": asdict(self.drafter),
                "workload": self.workload.to_dict(), "adaptive_overhead": self.overhead.to_dict(),
                "notes": dict(self.notes)}


def load_profile_file(path: str | os.PathLike) -> Profile:
    """A profile from a JSON file (see the module docstring); errors name the file and the key."""
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return Profile.from_dict(data, where=os.fspath(path))
