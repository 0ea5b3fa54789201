"""The fuzzed ops: name -> case generator, and how a case is rebuilt from (seed, op, index) in any process.

A case is a pure function of its id: its generator draws everything from ``numpy.random.default_rng([seed,
op number, index])`` (and torch's generator is seeded from the same id), so the parent process only ships ids to
a worker, and a failure is reproduced by its id alone.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch

from .attention_cases import attention_case, write_kv_case
from .metadata_cases import flashinfer_plan_case
from .mla_cases import mla_case, write_mla_case
from .confidence_cases import confidence_case, from_logits_case, margin_case, stats_case
from .core import Case
from .guards import Guards
from .host_cases import calibration_case, cost_table_case, margin_estimator_case, misc_case, verifier_case
from .planner_cases import choose_case, depth_case, plan_case, prepared_case, survival_case
from .sampling_cases import rejection_case, sample_case, tree_case
from .tree_cases import commit_case as tree_commit_case
from .tree_cases import plan_case as tree_plan_case
from .tree_cases import shape_case as tree_shape_case
from .tree_cases import survival_case as tree_survival_case

# Every public op (and the planner's prepared calls, which have their own failure modes). Weights: share of
# the calls each op gets in a campaign (the kernel ops, with the most arguments, get more).
OPS = {
    "prefix_survival": (survival_case, 2),
    "choose_budget": (choose_case, 3),
    "choose_draft_depth": (depth_case, 2),
    "plan_verification": (plan_case, 6),
    "plan_verification (prepared calls)": (prepared_case, 3),
    "confidence": (confidence_case, 3),
    "confidence_from_logits": (from_logits_case, 2),
    "draft_margin": (margin_case, 2),
    "AcceptanceStats": (stats_case, 2),
    "verify_attention": (attention_case, 4),
    "write_kv": (write_kv_case, 2),
    "rejection_sample": (rejection_case, 3),
    "sample": (sample_case, 2),
    "tree_survival": (tree_survival_case, 2),
    "plan_tree_verification / choose_budget(parents)": (tree_plan_case, 4),
    "commit_tree_kv": (tree_commit_case, 2),
    "choose_tree_shape": (tree_shape_case, 2),
    "tree_rejection_sample": (tree_case, 2),
    "CostTable": (cost_table_case, 3),
    "AdaptiveVerifier": (verifier_case, 3),
    "MarginEstimator": (margin_estimator_case, 1),
    "calibration": (calibration_case, 2),
    "VerifyPlan / error_counts / build_info": (misc_case, 1),
    "verify_attention_mla": (mla_case, 3),
    "write_kv_mla": (write_mla_case, 1),
    "flashinfer_plan": (flashinfer_plan_case, 1),
}


def _selftest_guard(rng) -> Case:
    """Writes one element past its tensor: the guard check must see it (tests of the fuzzer itself)."""
    g = Guards()
    t = g.empty("out", (4,), torch.int32)

    def call():  # the buffer behind t is larger than t: write just past its end, as a bad kernel would
        torch.as_strided(t, (5,), (1,))[4] = 7

    return Case("valid", call, guards=g, what="selftest: a write past the end")


def _selftest_crash(rng) -> Case:
    # The signal a kernel's bad access raises (a null read is not reliable: some sandboxes map page 0).
    return Case("valid", lambda: os.kill(os.getpid(), signal.SIGSEGV), what="selftest: SIGSEGV")


def _selftest_hang(rng) -> Case:
    return Case("valid", lambda: time.sleep(3600), what="selftest: never returns")


# Not part of any campaign: tests/test_fuzz.py runs them to check that the fuzzer reports each kind of failure.
SELFTEST_OPS = {"_selftest_guard": (_selftest_guard, 0), "_selftest_crash": (_selftest_crash, 0),
                "_selftest_hang": (_selftest_hang, 0)}
_ALL = {**OPS, **SELFTEST_OPS}
_NUMBERS = {name: i for i, name in enumerate(_ALL)}


def make_case(seed: int, op: str, index: int) -> Case:
    """The case (seed, op, index), built exactly as in any other process."""
    rng = np.random.default_rng([seed, _NUMBERS[op], index])
    torch.manual_seed(int(rng.integers(0, 2**62)))
    return _ALL[op][0](rng)


def known(op: str) -> bool:
    return op in _ALL


__all__ = ["OPS", "SELFTEST_OPS", "known", "make_case"]
