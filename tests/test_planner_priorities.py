"""Request priorities (weights) and a latency target (max_step_ms) in the planner: the C++ CPU kernel against the
reference bit for bit, brute-force checks of the weighted argmax and of the cap, the verifier's use of both,
and argument checks. The CUDA source under the emulator: test_planner_emu.py."""
import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

FIELDS = [f.name for f in dataclasses.fields(av.VerifyPlan)]


def table(max_tokens=None):
    return av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 128: 6.5, 256: 11.0, 512: 20.0}, draft_ms=0.6,
                                    max_tokens=max_tokens)


def problem(rng, R, K, ties=False):
    conf = rng.uniform(0.2, 1.0, (R, K)).astype(np.float32)
    if ties:
        conf = np.round(conf * 4) / 4
    conf = torch.from_numpy(conf)
    drafts = torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32))
    return av.prefix_survival(conf, drafts), drafts


def weights_of(rng, R, kind):
    if kind == "ones":
        return torch.ones(R)
    if kind == "small":
        return torch.from_numpy(rng.uniform(0.0, 1.0, R).astype(np.float32))
    if kind == "classes":  # high-priority requests at 4, the rest at 1, some at 0
        return torch.tensor(rng.choice([0.0, 1.0, 4.0], R, p=[0.1, 0.7, 0.2]), dtype=torch.float32)
    return torch.from_numpy(rng.uniform(0.0, 3.0, R).astype(np.float32))


def assert_same(got, want, what):
    for f in FIELDS:
        x, y = getattr(got, f), getattr(want, f)
        assert (x is None) == (y is None), (what, f)
        if x is not None:
            assert torch.equal(x, y), f"{what}: {f}\n{x}\n{y}"


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
@pytest.mark.parametrize("kind", ["ones", "small", "classes", "wide"])
def test_weights_kernel_matches_reference(mode, kind):
    rng = np.random.default_rng(len(mode) * 7 + len(kind))
    ct = table()
    for R, K, ties in [(1, 3, False), (9, 4, True), (37, 8, False), (64, 5, True)]:
        survival, drafts = problem(rng, R, K, ties)
        w = weights_of(rng, R, kind)
        kw = dict(mode=mode, weights=w, min_verify=int(rng.integers(0, 2)), extra_emitting=int(rng.integers(0, 3)),
                  extra_tokens=int(rng.integers(0, 9)), verification="onehot")
        if mode == "fixed":
            kw["budget"] = int(rng.integers(0, R * K + 1))
        got = av.plan_verification(survival, drafts, ct, **kw)
        want = ref.plan_verification(survival, drafts, ct, **kw)
        assert_same(got, want, f"R={R} K={K} {mode} {kind}")
        if mode != "fixed":
            b = av.choose_budget(survival, drafts, ct, mode="global" if mode == "fixed" else mode,
                                 **{k: v for k, v in kw.items() if k not in ("verification", "budget", "mode")})
            assert int(b) == int(ref.choose_budget(survival, drafts, ct, mode=mode,
                                                   **{k: v for k, v in kw.items() if k not in ("verification",
                                                                                              "mode")}))


def test_weights_of_one_change_nothing():
    rng = np.random.default_rng(3)
    survival, drafts = problem(rng, 40, 6, ties=True)
    for mode in ("greedy", "global"):
        plain = av.plan_verification(survival, drafts, table(), mode=mode, verification="onehot")
        ones = av.plan_verification(survival, drafts, table(), mode=mode, verification="onehot", weights=torch.ones(40))
        assert_same(ones, plain, mode)


def test_weighted_global_is_the_brute_force_argmax():
    """Theta_w(B) = (sum_r w_r + the first B weighted survivals) / step_cost, in float64 from exact values: the
    kernel's budget is its first argmax (inputs without near-ties, so fixed point cannot reorder them)."""
    rng = np.random.default_rng(11)
    ct = table()
    for trial in range(20):
        R, K = int(rng.integers(2, 30)), int(rng.integers(1, 9))
        survival, drafts = problem(rng, R, K)
        w = weights_of(rng, R, "wide")
        got = av.plan_verification(survival, drafts, ct, mode="global", weights=w, verification="onehot")
        # candidates ranked by w_r * a[r, j]
        vals = sorted(((float(w[r]) * float(survival[r, j]), r, j) for r in range(R) for j in range(int(drafts[r]))),
                      key=lambda x: (-x[0], x[2], x[1]))
        base = float(w.double().sum())
        best, arg, acc = -1.0, 0, 0.0
        for B in range(len(vals) + 1):
            if B:
                acc += vals[B - 1][0]
            t = (base + acc) / (ct.fixed_cost(R) + ct.verify_cost(R + B))
            if t > best * (1 + 1e-9):
                best, arg = t, B
        assert int(got.budget) == arg, trial
        # the verified set is the first B of that order, per request a prefix
        want = np.zeros(R, dtype=np.int64)
        for _, r, _j in vals[:arg]:
            want[r] += 1
        assert got.verify_lens.tolist() == want.tolist()
        # expected tokens stay unweighted: R + the verified drafts' own survivals
        exp = R + sum(float(survival[r, j]) for r in range(R) for j in range(int(want[r])))
        assert math.isclose(float(got.expected_tokens), exp, rel_tol=1e-5)


def test_a_heavier_request_is_verified_first():
    survival = torch.tensor([[0.9, 0.8, 0.7], [0.9, 0.8, 0.7]])
    drafts = torch.tensor([3, 3], dtype=torch.int32)
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=3, weights=torch.tensor([1.0, 2.0]))
    assert plan.verify_lens.tolist() == [0, 3]
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=3, weights=torch.tensor([1.0, 1.0]))
    assert plan.verify_lens.tolist() == [2, 1]


# ------------------------------------------------------------------------------------------------------
# max_step_ms
# ------------------------------------------------------------------------------------------------------


def step_ms(ct, R, n):
    return float(np.float32(ct.fixed_cost(R)) + np.float32(ct.verify_cost(n)))


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_max_step_ms_caps_the_budget(mode):
    rng = np.random.default_rng(21)
    ct = table()
    for trial in range(12):
        R, K = int(rng.integers(4, 60)), int(rng.integers(2, 9))
        survival = torch.ones(R, K)  # everything worth verifying: the cap decides
        drafts = torch.full((R,), K, dtype=torch.int32)
        extra = int(rng.integers(0, 50))
        target = float(rng.uniform(step_ms(ct, R, R + extra), step_ms(ct, R, R + extra + R * K) + 1))
        kw = dict(mode=mode, max_step_ms=target, extra_tokens=extra, verification="onehot")
        if mode == "fixed":
            kw["budget"] = R * K
        plan = av.plan_verification(survival, drafts, ct, **kw)
        B = int(plan.budget)
        assert step_ms(ct, R, R + extra + B) <= target
        if B < R * K and mode in ("fixed", "all"):  # the largest budget under the target
            assert step_ms(ct, R, R + extra + B + 1) > target
        assert_same(plan, ref.plan_verification(survival, drafts, ct, **kw), f"{mode} {trial}")


def test_min_verify_wins_over_the_latency_target():
    ct = table()
    survival, drafts = torch.ones(8, 4), torch.full((8,), 4, dtype=torch.int32)
    plan = av.plan_verification(survival, drafts, ct, mode="all", min_verify=2, max_step_ms=0.001)
    assert int(plan.budget) == 16
    plan = av.plan_verification(survival, drafts, ct, mode="all", max_step_ms=0.001)
    assert int(plan.budget) == 0


def test_max_step_ms_measures_a_shifted_view_on_its_base_curve():
    """With the prompt chunk priced at the margin (cost_table.shifted(extra)), the target still bounds the step's
    real time: the base curve at R + extra + B."""
    ct = table()
    R, K, extra = 10, 4, 200
    survival, drafts = torch.ones(R, K), torch.full((R,), K, dtype=torch.int32)
    target = step_ms(ct, R, R + extra + 20)
    plan = av.plan_verification(survival, drafts, ct.shifted(extra), mode="all", max_step_ms=target)
    assert int(plan.budget) == 20
    assert int(ref.plan_verification(survival, drafts, ct.shifted(extra), mode="all", max_step_ms=target).budget) == 20


def test_verifier_respects_the_target_and_passes_weights():
    ct = table(max_tokens=512)
    R, K = 12, 4
    target = step_ms(ct, R, R + 20)
    for mode in ("lagged", "greedy", "all"):
        v = av.AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, mode=mode, max_step_ms=target,
                                verification="onehot")
        conf = torch.full((R, K), 0.99)
        drafts = np.full(R, K)
        for step in range(2):
            budget, padded = v.plan_budget(R, drafts)
            assert budget <= 20 and step_ms(ct, R, R + budget) <= target
            v.record_confidence(conf)
            plan = v.plan(conf, torch.from_numpy(drafts.astype(np.int32)), budget=budget,
                          weights=torch.linspace(0.5, 2.0, R))
            assert int(plan.budget) <= 20
            v.observe(plan.verify_lens[:R], plan.verify_lens[:R])


# ------------------------------------------------------------------------------------------------------
# argument checks and the prepared path
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad,exc", [
    (torch.tensor([1.0, float("nan"), 1.0]), ValueError), (torch.tensor([1.0, -0.5, 1.0]), ValueError),
    (torch.tensor([1.0, float("inf"), 1.0]), ValueError), (torch.ones(4), ValueError),
    (torch.ones(3, dtype=torch.float64), TypeError), ([1.0, 1.0, 1.0], TypeError),
])
def test_bad_weights_name_the_argument(bad, exc):
    survival, drafts = torch.rand(3, 2), torch.full((3,), 2, dtype=torch.int32)
    with pytest.raises(exc, match="weights"):
        av.plan_verification(survival, drafts, mode="all", weights=bad)


@pytest.mark.parametrize("bad,exc", [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                     (float("inf"), ValueError), ("5", TypeError)])
def test_bad_max_step_ms_names_the_argument(bad, exc):
    survival, drafts = torch.rand(3, 2), torch.full((3,), 2, dtype=torch.int32)
    with pytest.raises(exc, match="max_step_ms"):
        av.plan_verification(survival, drafts, table(), mode="all", max_step_ms=bad)
    with pytest.raises(ValueError, match="max_step_ms"):
        av.plan_verification(survival, drafts, mode="all", max_step_ms=5.0)  # no cost table


def test_prepared_calls_follow_weights_and_targets():
    """A prepared global plan with weights, run every step with new survivals, drafts and weights written in place
    and the latency target changed per run, equals a fresh call each step."""
    rng = np.random.default_rng(5)
    R, K = 20, 5
    ct = table()
    survival = torch.empty(R, K)
    drafts = torch.empty(R, dtype=torch.int32)
    w = torch.empty(R)
    out = av.VerifyPlan.allocate(R, R + R * K)
    handle = av.prepare(av.plan_verification, survival, drafts, ct, mode="global", weights=w, out=out,
                        verification="onehot")
    for step, target in itertools.product(range(3), (None, 6.0, 8.0)):
        s, d = problem(rng, R, K)
        survival.copy_(s)
        drafts.copy_(d)
        w.copy_(weights_of(rng, R, "wide"))
        got = handle.run(max_step_ms=target)
        want = av.plan_verification(survival.clone(), drafts.clone(), ct, mode="global", weights=w.clone(),
                                    max_step_ms=target, verification="onehot")
        assert_same(got, want, f"{step} {target}")
