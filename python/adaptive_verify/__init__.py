"""adaptive_verify: adaptive verification for speculative decoding.

Each decode step verifies only the drafts most likely to survive, with a budget sized so that expected
emitted tokens per millisecond of step time is highest. Ops take and return torch tensors; CUDA tensors
run the CUDA kernels, CPU tensors the C++ CPU kernels. ``adaptive_verify.reference`` holds the readable
torch oracle of every op.
"""
from ._ext import build_info, cuda_available
from .attention import commit_tree_kv, verify_attention, write_kv
from .attention_mla import commit_tree_kv_mla, verify_attention_mla, write_kv_mla
from .attention_metadata import flash_attn_plan, flashinfer_plan
from .attention_fa4 import attention_backend, fa4_import_error
from .calibration import OnlineSTS, calibration_report, fit_sts, load_temperatures, save_temperatures
from .confidence import confidence, confidence_from_logits, draft_margin
from .cost import CostTable
from .errors import error_counts, reset_error_counts
from .margin import MarginEstimator
from .planner import (MetadataInputs, PlanStep, TreeVerifyPlan, VerifyPlan, choose_budget, choose_draft_depth,
                      choose_tree_shape, lagged_budget, plan_tree_verification, plan_verification, prefix_survival,
                      tree_survival, tree_width_profiles)
from .prepared import Prepared, PreparedMismatch, prepare
from .sampling import SamplingParams, rejection_sample, sample, tree_rejection_sample
from .stats import AcceptanceStats
from .verifier import AdaptiveVerifier

__version__ = "0.1.0"

__all__ = [
    "AcceptanceStats",
    "AdaptiveVerifier",
    "CostTable",
    "MarginEstimator",
    "MetadataInputs",
    "OnlineSTS",
    "PlanStep",
    "Prepared",
    "PreparedMismatch",
    "SamplingParams",
    "TreeVerifyPlan",
    "VerifyPlan",
    "attention_backend",
    "build_info",
    "calibration_report",
    "choose_budget",
    "choose_draft_depth",
    "choose_tree_shape",
    "tree_width_profiles",
    "commit_tree_kv",
    "commit_tree_kv_mla",
    "confidence",
    "confidence_from_logits",
    "cuda_available",
    "draft_margin",
    "error_counts",
    "fa4_import_error",
    "fit_sts",
    "flash_attn_plan",
    "flashinfer_plan",
    "lagged_budget",
    "load_temperatures",
    "plan_tree_verification",
    "plan_verification",
    "prepare",
    "prefix_survival",
    "rejection_sample",
    "reset_error_counts",
    "sample",
    "tree_rejection_sample",
    "tree_survival",
    "verify_attention",
    "verify_attention_mla",
    "write_kv",
    "write_kv_mla",
    "save_temperatures",
]
