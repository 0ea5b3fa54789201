"""Bundled profiles: deployments the simulator runs with no user data (``adaptive-verify profiles``).

Each is the same JSON-shaped dict a user would write (see :mod:`adaptive_verify.sim.model`); the numbers
that were fitted to published measurements say so in ``notes``, with how close each point lands
(``benchmarks/fit_sim_profile.py`` refits and prints that table).
"""
from __future__ import annotations

import copy
from typing import Any

from .model import Profile

__all__ = ["PROFILES", "get_profile", "profile_dict", "list_profiles"]

# vLLM's default CUDA-graph capture sizes up to 512 (1, 2, 4, then multiples of 8).
_VLLM_GRAPH_SIZES = [1, 2, 4] + list(range(8, 513, 8))

DSV4_PRO_8XB300: dict[str, Any] = {
    "name": "dsv4-pro-8xb300",
    "description": "DeepSeek-V4-Pro-class MoE, 8x B300 at TP8, FP8 KV, DSpark 7-token block drafter, "
                   "~256-token prompts and ~512-token outputs (fitted to vLLM's published 0813 sweep)",
    # An effective step-cost table fitted to the published sweep (benchmarks/fit_sim_profile.py), not a
    # roofline: the published points need a cost that stays flat to about 1k tokens and then climbs
    # steeply, which no bandwidth/FLOP roofline of this node gives.
    "cost": {"table": {
        "format_version": 1,
        "verify_ms": [[1, 11.9], [256, 30.0], [640, 36.0], [1024, 60.0], [1536, 130.0], [2048, 220.0], [4096, 600.0]],
        "draft_ms": [[1, 0.9], [256, 2.46]],
        "graph_sizes": [],
        "max_tokens": 2048,
        "metadata": {"source": "fitted: benchmarks/fit_sim_profile.py"},
    }},
    "acceptance": {
        "conditional": [0.9, 0.82, 0.74, 0.68, 0.62, 0.57, 0.52],
        "request_sigma": 0.6,
        "token_sigma": 1.2,
        "head_noise": 0.6,
        "head_temperature": 1.0,
        "head_bias": 0.0,
    },
    "drafter": {"num_drafts": 7, "kind": "block"},
    # Output lengths spread +-25% around the published 512: with fixed lengths the closed loop is periodic
    # (every request lives exactly as many steps) and a window's averages depend on its phase. Prompt
    # lengths are an assumption (~256 tokens): with ~1k-token prompts the prompt work (2 tokens per
    # output token) dominates the step at c=256, and no monotone cost curve we fitted then lets any
    # speculation beat no speculation there, as the published sweep shows adaptive doing by 41%.
    "workload": {"prompt_len": [192, 320], "output_len": [384, 640], "prefill_chunk": 512},
    "notes": {},
}

LLAMA3_70B_8XH200: dict[str, Any] = {
    "name": "llama3-70b-8xh200",
    "description": "Llama-3-70B-class dense model, 8x H200 at TP8, bf16 weights and KV, EAGLE-class 4-token "
                   "chain drafter, ~1k-token prompts and ~512-token outputs (roofline from datasheet figures)",
    "cost": {"roofline": {
        # 8 x 4.8 TB/s HBM3e at an assumed 80% achieved; 8 x 989 dense bf16 TFLOP/s at an assumed 50%.
        "hbm_gbps": 8 * 4800.0 * 0.8,
        "tflops": 8 * 989.0 * 0.5,
        "weight_bytes": 141e9,
        "active_params": 70.6e9,
        # 80 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes
        "kv_bytes_per_token": 80 * 8 * 128 * 2 * 2,
        "context_len": 1280,
        "graph_sizes": _VLLM_GRAPH_SIZES,
        "max_tokens": 8192,
        # One EAGLE head forward per draft: the table's draft cost is for all 4 (chain drafter).
        "draft_ms": {"1": 1.6, "256": 3.2},
        "overhead_ms": 1.0,
    }},
    "acceptance": {
        "conditional": [0.78, 0.7, 0.64, 0.6],
        "request_sigma": 0.5,
        "token_sigma": 1.0,
        "head_noise": 0.8,
        "head_temperature": 1.0,
        "head_bias": 0.0,
    },
    "drafter": {"num_drafts": 4, "kind": "chain"},
    "workload": {"prompt_len": [768, 1280], "output_len": [384, 640], "prefill_chunk": 2048},
    "notes": {
        "status": "not fitted to measurements: datasheet roofline with the assumed efficiencies above and an "
                  "EAGLE-like acceptance (about 2.6 tokens per step at k=4); profile your engine with "
                  "CostTable.profile and pass --cost-table for numbers you can act on",
    },
}

PROFILES: dict[str, dict[str, Any]] = {p["name"]: p for p in (DSV4_PRO_8XB300, LLAMA3_70B_8XH200)}


def profile_dict(name: str) -> dict[str, Any]:
    """A deep copy of a bundled profile's dict (edit it and pass it to Profile.from_dict)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; bundled profiles: {', '.join(sorted(PROFILES))}")
    return copy.deepcopy(PROFILES[name])


def get_profile(name: str) -> Profile:
    """The bundled profile ``name`` (ValueError listing the known names otherwise)."""
    return Profile.from_dict(profile_dict(name), where=f"profile {name!r}")


def list_profiles() -> list[tuple[str, str]]:
    """(name, one-line description) of every bundled profile."""
    return [(name, p["description"]) for name, p in PROFILES.items()]
