"""The adaptive path's own cost per step, which fixed k and no speculation do not pay.

An adaptive step runs work a fixed-k step does not: the drafter's confidence head, the planner (budget,
allocation, varlen metadata), the budget's copy to the host (the engine picks a CUDA graph with it) and the
host work around them. The simulator charges ``fixed_ms + per_request_ms * R`` to every adaptive step with
R > 0 decoding requests (a step without decodes plans nothing), on top of the cost table's step cost. The
planner is not told about it: an engine's cost table times its forward and drafter, not the planner, and a
term that does not depend on the budget only scales Theta's fixed part (52 us against steps of 3.6 ms and
more on the bundled profiles).

Presets (``adaptive-verify sweep --overhead NAME``; a profile's ``"adaptive_overhead"`` key takes a preset
name or ``{"fixed_ms": ..., "per_request_ms": ...}``; a profile without the key gets ``device``):

- ``device``: this library's kernels on the GPU, no host synchronisation, measured on an H200
  (benchmarks/results/2026-11-29-h200.md): the planner takes 6.0 us at R = 1 and 42 us at R = 256 (K = 8),
  the confidence head 9.0 us at R = 256 (bandwidth-bound, so it grows with R), and the budget's pinned copy
  is counted as one more launch at the measured launch floor (0.97 us, rounded to 1). Fixed: 6.0 + 1.0 =
  7 us; per request: (42 + 9 + 1 - 7) / 256 = 0.176 us, so R = 256 costs the measured 42 + 9 + 1 = 52 us.
- ``host``: a host-side planner, as in engines that compute the budget on the CPU: the step waits for the
  confidences' copy to the host, the budget search and the copy back, about 0.2 ms per step (the CPU budget
  step issue 21 reports for such ports; for scale, the engine-style torch op chain that computes a budget
  takes 158 us at R = 256, K = 8 on the 2-core CI machine, benchmarks/results/2026-11-29-cpu.md), added to
  the device kernels that still run (confidence head, allocation). The difference to ``device`` is what
  sync-free planning is worth.
- ``none``: free (the simulator before the overhead was modelled).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Overhead", "OVERHEAD_PRESETS", "DEFAULT_OVERHEAD", "overhead_preset"]

_DEVICE_FIXED_MS = (6.0 + 1.0) / 1000.0  # planner at R = 1, plus the budget copy's launch
_DEVICE_PER_REQUEST_MS = (42.0 + 9.0 + 1.0 - 7.0) / 256 / 1000.0  # the rest of the measured total at R = 256
_HOST_BUDGET_STEP_MS = 0.2


@dataclass(frozen=True)
class Overhead:
    """``fixed_ms + per_request_ms * R`` milliseconds per adaptive step with R >= 1 decoding requests.
    preset: the preset's name when the numbers are one of OVERHEAD_PRESETS (what to_dict writes), else None."""

    fixed_ms: float
    per_request_ms: float
    preset: Optional[str] = None

    def __post_init__(self):
        for name in ("fixed_ms", "per_request_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"adaptive_overhead.{name} must be a finite number of milliseconds >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))

    def cost(self, requests: int) -> float:
        """Milliseconds the adaptive path adds to a step with ``requests`` decoding requests (0 for none)."""
        return self.fixed_ms + self.per_request_ms * requests if requests > 0 else 0.0

    def to_dict(self) -> Any:
        if self.preset is not None:
            return self.preset
        return {"fixed_ms": self.fixed_ms, "per_request_ms": self.per_request_ms}

    @classmethod
    def from_dict(cls, value: Any, where: str = "adaptive_overhead") -> "Overhead":
        """A preset name or ``{"fixed_ms": ..., "per_request_ms": ...}`` (both required)."""
        if isinstance(value, str):
            try:
                return overhead_preset(value)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a preset name ({', '.join(OVERHEAD_PRESETS)}) or an object "
                             f"{{'fixed_ms': ..., 'per_request_ms': ...}}, got {value!r}")
        unknown = sorted(set(value) - {"fixed_ms", "per_request_ms"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: ['fixed_ms', 'per_request_ms'])")
        for key in ("fixed_ms", "per_request_ms"):
            if key not in value:
                raise ValueError(f"{where}: missing key {key!r}")
        try:
            return cls(value["fixed_ms"], value["per_request_ms"])
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


OVERHEAD_PRESETS: dict[str, Overhead] = {
    "device": Overhead(_DEVICE_FIXED_MS, _DEVICE_PER_REQUEST_MS, "device"),
    "host": Overhead(_DEVICE_FIXED_MS + _HOST_BUDGET_STEP_MS, _DEVICE_PER_REQUEST_MS, "host"),
    "none": Overhead(0.0, 0.0, "none"),
}
DEFAULT_OVERHEAD = "device"


def overhead_preset(name: str) -> Overhead:
    """The preset ``name`` (ValueError naming the presets otherwise)."""
    if name not in OVERHEAD_PRESETS:
        raise ValueError(f"unknown overhead preset {name!r}; presets: {', '.join(OVERHEAD_PRESETS)}")
    return OVERHEAD_PRESETS[name]
