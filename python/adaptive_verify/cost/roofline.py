"""A roofline step cost for planning without a profile (docs/design.md, "Step cost"): weights and KV bytes over
bandwidth, matmul FLOPs over the FLOP rate, whichever is slower, plus a fixed overhead."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .._checks import check_int, check_real
from .checks import now_iso


def roofline_points(*, hbm_gbps: float, tflops: float, weight_bytes: float, active_params: float,
                    kv_bytes_per_token: float, context_len: int, graph_sizes: Sequence[int],
                    max_tokens: Optional[int], overhead_ms: float,
                    token_counts: Optional[Sequence[int]]) -> tuple[dict[int, float], dict[str, Any]]:
    """({n: ms}, recorded metadata) of ``overhead_ms + max(memory_ms, compute_ms)``:

    - memory_ms = (weight_bytes + n * context_len * kv_bytes_per_token) / (hbm_gbps * 1e9) * 1e3.
      Simplification: every one of the n tokens is charged a full context's KV read, as if each
      token were its own request. Tokens of one request share their KV reads in a real kernel, so
      this overestimates KV traffic when requests verify many drafts; it is the conservative side.
    - compute_ms = 2 * active_params * n / (tflops * 1e12) * 1e3 (matmul FLOPs only; attention
      FLOPs and launch overhead are left to overhead_ms).

    Default token counts: the graph sizes, the powers of two up to the limit, the largest graph size + 1
    (so the eager region starts from its true cost instead of the next power of two's), and the limit
    itself, where the limit is max_tokens, or max(8192, largest graph size) when unbounded.

    Validation: hbm_gbps, tflops, weight_bytes, active_params > 0; kv_bytes_per_token, overhead_ms
    >= 0; context_len an int in [0, 2^31 - 1] (a context length the kernels can hold: larger Python ints would
    not even convert to a float).
    """
    hbm_gbps = check_real("hbm_gbps", hbm_gbps, lo=0.0, lo_open=True)
    tflops = check_real("tflops", tflops, lo=0.0, lo_open=True)
    weight_bytes = check_real("weight_bytes", weight_bytes, lo=0.0, lo_open=True)
    active_params = check_real("active_params", active_params, lo=0.0, lo_open=True)
    kv_bytes_per_token = check_real("kv_bytes_per_token", kv_bytes_per_token, lo=0.0)
    overhead_ms = check_real("overhead_ms", overhead_ms, lo=0.0)
    context_len = check_int("context_len", context_len, lo=0, hi=2**31 - 1)
    if token_counts is None:
        limit = max_tokens if max_tokens is not None else max(8192, graph_sizes[-1] if graph_sizes else 0)
        default = set(graph_sizes)
        default.update(1 << i for i in range(limit.bit_length()) if (1 << i) <= limit)
        default.add(limit)
        if graph_sizes and graph_sizes[-1] < limit:
            default.add(graph_sizes[-1] + 1)
        token_counts = tuple(sorted(default))

    bytes_per_ms = hbm_gbps * 1e9 / 1e3
    flops_per_ms = tflops * 1e12 / 1e3
    verify = {}
    for n in token_counts:
        memory_ms = (weight_bytes + n * context_len * kv_bytes_per_token) / bytes_per_ms
        compute_ms = 2.0 * active_params * n / flops_per_ms
        verify[n] = overhead_ms + max(memory_ms, compute_ms)
    recorded: dict[str, Any] = {
        "source": "roofline",
        "date": now_iso(),
        "roofline": {
            "hbm_gbps": hbm_gbps, "tflops": tflops, "weight_bytes": weight_bytes, "active_params": active_params,
            "kv_bytes_per_token": kv_bytes_per_token, "context_len": context_len, "overhead_ms": overhead_ms,
        },
    }
    return verify, recorded
