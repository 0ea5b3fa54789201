"""The simulator: what adaptive verification buys on a given GPU, model and drafter, before touching an engine.

    result = adaptive_verify.sim.sweep("dsv4-pro-8xb300")      # or a Profile
    print(result.table()); result.write("sweep_out")

    fitted = adaptive_verify.sim.fit_profile(points, num_drafts=7, ...)   # `adaptive-verify fit`
    trees = adaptive_verify.sim.sweep(..., policies=["lagged", "tree", "eagle2-16"], tree=TreeModel(top_k=4))

It runs the library's real planner (the C++ CPU kernel behind :func:`adaptive_verify.plan_verification`)
inside a closed-loop serving model; see :mod:`adaptive_verify.sim.engine` for what is modelled.
"""
from .engine import Policy, parse_policy, simulate
from .fit import FitResult, fit_profile
from .fit_inputs import MeasuredPoint, read_acceptance, read_points_csv
from .model import Acceptance, Drafter, Priority, Profile, Workload, load_profile_file
from .overhead import OVERHEAD_PRESETS, Overhead
from .profiles import PROFILES, get_profile, list_profiles, profile_dict
from .sweep import DEFAULT_CONCURRENCY, SweepResult, default_policies, pareto_frontier, sweep
from .tree import TreeModel

__all__ = [
    "Acceptance", "Drafter", "Priority", "Profile", "Workload", "load_profile_file", "Policy", "parse_policy",
    "simulate", "PROFILES", "get_profile", "list_profiles", "profile_dict", "DEFAULT_CONCURRENCY", "SweepResult",
    "default_policies", "pareto_frontier", "sweep", "Overhead", "OVERHEAD_PRESETS", "FitResult", "fit_profile",
    "MeasuredPoint", "read_points_csv", "read_acceptance", "TreeModel",
]
