"""The remembered calls of the planner ops (python/adaptive_verify/_callcache.py): a call repeating an earlier
call's objects skips validation, so these tests check that such a call is exactly the validating call: same
integers whatever changes step to step, in-place changes of a tensor's layout caught, per-step scalars still
validated, and the one-call confidence path (conf=) equal to prefix_survival followed by the plan."""
import dataclasses

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import errors as av_errors
from adaptive_verify._callcache import CALL_CACHE_SIZE
from adaptive_verify.planner import ops as planner_ops
from adaptive_verify.planner import survival as survival_ops


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def table(max_tokens=None):
    return av.CostTable.from_points({1: 4.0, 64: 4.5, 256: 6.0, 1024: 14.0}, draft_ms=0.7, max_tokens=max_tokens)


def fresh_plan(plan: av.VerifyPlan) -> av.VerifyPlan:
    return dataclasses.replace(plan, **{f.name: (None if getattr(plan, f.name) is None else getattr(plan, f.name).clone())
                                        for f in dataclasses.fields(plan)})


def assert_same_plan(a: av.VerifyPlan, b: av.VerifyPlan):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert torch.equal(x, y), f.name


def engine_inputs(rng, R, K, max_blocks=8):
    conf = torch.from_numpy(rng.uniform(0.0, 1.0, (R, K)).astype(np.float32))
    drafts = torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32))
    ctx = torch.from_numpy(rng.integers(0, 40, R).astype(np.int32))
    bt = torch.from_numpy(rng.permutation(R * max_blocks).astype(np.int32).reshape(R, max_blocks))
    anchors = torch.from_numpy(rng.integers(0, 1000, R).astype(np.int32))
    tokens = torch.from_numpy(rng.integers(0, 1000, (R, K)).astype(np.int32))
    return conf, drafts, ctx, bt, anchors, tokens


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_repeated_calls_equal_validating_calls_as_a_loop_changes_values_and_step_scalars(mode):
    """A decode loop: the same buffers every step with new values copied in, and the budget, prompt chunk,
    prefill emitters and token offset changing. Every step equals a fresh, validated call (no out=, new objects)."""
    rng = np.random.default_rng(3)
    R, K, Tp = 13, 6, 13 + 13 * 6 + 40
    ct = table(max_tokens=400)
    conf, drafts, ctx, bt, anchors, tokens = engine_inputs(rng, R, K)
    survival = torch.empty(R, K)
    out = av.VerifyPlan.allocate(R + 3, Tp, positions=True, slot_mapping=True, input_ids=True)
    for step in range(12):
        new = engine_inputs(rng, R, K)
        for buf, value in zip((conf, drafts, ctx, bt, anchors, tokens), new):
            buf.copy_(value)
        scalars = dict(extra_tokens=int(rng.integers(0, 30)), extra_emitting=int(rng.integers(0, 3)),
                       token_offset=int(rng.integers(0, 50)))
        if mode == "fixed":
            scalars["budget"] = int(rng.integers(0, R * K + 1))
        av.prefix_survival(conf, drafts, out=survival)
        kw = dict(mode=mode, block_size=8, num_reqs_padded=R + 3, num_tokens_padded=Tp, min_verify=1, capacity=390,
                  verification="onehot", **scalars)
        got = av.plan_verification(survival, drafts, ct, context_lens=ctx, block_table=bt, anchor_tokens=anchors,
                                   draft_tokens=tokens, out=out, **kw)
        want = av.plan_verification(survival.clone(), drafts.clone(), ct, context_lens=ctx.clone(),
                                    block_table=bt.clone(), anchor_tokens=anchors.clone(), draft_tokens=tokens.clone(),
                                    **kw)
        assert_same_plan(fresh_plan(got), want)
    assert any(True for _ in planner_ops._CALLS._entries)  # the loop did take the remembered path


def test_a_loop_takes_the_remembered_path(monkeypatch):
    """After the first call, repeated calls never validate again (resolve_plan_args is not called)."""
    R, K = 9, 4
    survival = torch.rand(R, K)
    drafts = torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    av.plan_verification(survival, drafts, table(), mode="greedy", out=out)
    calls = []
    real = planner_ops.resolve_plan_args
    monkeypatch.setattr(planner_ops, "resolve_plan_args", lambda *a, **k: calls.append(1) or real(*a, **k))
    for b in (3, 5, 7):  # a new table object is a per-step argument (a shifted view per prompt chunk): re-derived
        av.plan_verification(survival, drafts, table(), mode="greedy", out=out)
    assert len(calls) == 0
    ct = table()
    av.plan_verification(survival, drafts, ct, mode="fixed", budget=1, out=out)  # another mode: validates
    for b in (3, 5, 7):
        plan = av.plan_verification(survival, drafts, ct, mode="fixed", budget=b, out=out)
        assert int(plan.budget) == b
    assert len(calls) == 1


@pytest.mark.parametrize("change", ["resize", "transpose", "set", "as_strided"])
def test_a_tensor_changed_in_place_is_validated_again(change):
    R, K = 6, 6
    survival = torch.rand(R, K)
    drafts = torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    av.plan_verification(survival, drafts, mode="all", out=out)
    if change == "resize":
        survival.resize_(R, K + 40)  # K past 32: only validation can say so
        with pytest.raises(ValueError, match="K"):
            av.plan_verification(survival, drafts, mode="all", out=out)
    elif change == "transpose":
        survival.transpose_(0, 1)  # same pointer and shape, strides (1, 6): the last dim is no longer contiguous
        with pytest.raises(ValueError, match="survival"):
            av.plan_verification(survival, drafts, mode="all", out=out)
    elif change == "set":
        out.token_req.set_(torch.empty(3, dtype=torch.int32))  # another (smaller) storage
        with pytest.raises(ValueError, match="out.token_req"):
            av.plan_verification(survival, drafts, mode="all", out=out)
    else:
        drafts.as_strided_((R - 1,), (1,))
        with pytest.raises(ValueError, match="drafts"):
            av.plan_verification(survival, drafts, mode="all", out=out)


def test_step_scalars_are_still_validated_on_the_remembered_path():
    R, K = 4, 4
    survival, drafts = torch.rand(R, K), torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    ct = table(max_tokens=40)
    av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, out=out)
    with pytest.raises(ValueError, match="budget"):
        av.plan_verification(survival, drafts, ct, mode="fixed", budget=-1, out=out)
    with pytest.raises(TypeError, match="extra_tokens"):
        av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, extra_tokens=1.5, out=out)
    with pytest.raises(ValueError, match="capacity"):  # 4 requests + 37 prompt tokens > max_tokens 40
        av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, extra_tokens=37, out=out)
    # A prompt chunk that changes the default T_pad is checked against out again.
    with pytest.raises(ValueError, match="out.token_req"):
        av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, extra_tokens=30, out=out)
    plan = av.plan_verification(survival, drafts, ct, mode="fixed", budget=3, out=out)  # and it recovers
    assert int(plan.budget) == 3


def test_remembered_calls_are_bounded_and_hold_their_arguments():
    out = av.VerifyPlan.allocate(3, 3 + 3 * 2)
    drafts = torch.full((3,), 2, dtype=torch.int32)
    planner_ops._CALLS.clear()
    for _ in range(CALL_CACHE_SIZE + 5):
        av.plan_verification(torch.rand(3, 2), drafts, mode="all", out=out)
    assert len(planner_ops._CALLS) == CALL_CACHE_SIZE


@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_confidences_in_one_call_equal_prefix_survival_then_plan(mode):
    """plan_verification(conf=...) computes the survival in the kernel: the same survival bits, the same plan
    and the same error counts as prefix_survival + plan_verification (NaNs and drafts < K included)."""
    rng = np.random.default_rng(11)
    R, K = 37, 7
    ct = table()
    for trial in range(6):
        conf, drafts, ctx, bt, anchors, tokens = engine_inputs(rng, R, K)
        conf[rng.random((R, K)) < 0.05] = float("nan")
        conf[0, 0] = 1.5  # clamped
        kw = dict(mode=mode, min_verify=trial % 2, context_lens=ctx, block_table=bt, block_size=8,
                  anchor_tokens=anchors, draft_tokens=tokens, verification="onehot")
        if mode == "fixed":
            kw["budget"] = int(rng.integers(0, R * K))
        av_errors.reset_error_counts()
        want_survival = av.prefix_survival(conf, drafts)
        want = av.plan_verification(want_survival, drafts, ct, **kw)
        want_counts = av_errors.error_counts()
        av_errors.reset_error_counts()
        survival = torch.full((R, K), -7.0)
        got = av.plan_verification(None, drafts, ct, conf=conf, survival_out=survival, **kw)
        assert av_errors.error_counts() == want_counts
        assert torch.equal(survival, want_survival)
        assert_same_plan(got, want)
        got2 = av.plan_verification(None, drafts, ct, conf=conf, **kw)  # a scratch survival
        assert_same_plan(got2, want)
        budget = av.choose_budget(None, drafts, ct, conf=conf, mode="global" if mode != "greedy" else "greedy")
        want_budget = av.choose_budget(want_survival, drafts, ct, mode="global" if mode != "greedy" else "greedy")
        assert int(budget) == int(want_budget)
    av_errors.reset_error_counts()


def test_confidence_path_arguments_are_checked():
    conf, drafts = torch.rand(3, 4), torch.full((3,), 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="either survival or conf"):
        av.plan_verification(torch.rand(3, 4), drafts, mode="all", conf=conf)
    with pytest.raises(ValueError, match="survival is required"):
        av.plan_verification(None, drafts, mode="all")
    with pytest.raises(ValueError, match="survival_out"):
        av.plan_verification(torch.rand(3, 4), drafts, mode="all", survival_out=torch.empty(3, 4))
    with pytest.raises(ValueError, match="survival_out"):
        av.plan_verification(None, drafts, mode="all", conf=conf, survival_out=torch.empty(3, 5))
    with pytest.raises(TypeError, match="conf"):
        av.plan_verification(None, drafts, mode="all", conf=conf.double())
    with pytest.raises(ValueError, match="drafts"):
        av.plan_verification(None, i32([0, 5, 1]), mode="all", conf=conf)  # CPU: out of [0, K] raises


def test_choose_budget_out_and_repeated_calls():
    rng = np.random.default_rng(5)
    R, K = 20, 5
    ct = table()
    conf = torch.empty(R, K)
    drafts = torch.empty(R, dtype=torch.int32)
    out = torch.empty((), dtype=torch.int32)
    for step in range(6):
        conf.copy_(torch.from_numpy(rng.uniform(0, 1, (R, K)).astype(np.float32)))
        drafts.copy_(torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32)))
        extra = int(rng.integers(0, 20))
        got = av.choose_budget(None, drafts, ct, conf=conf, extra_tokens=extra, out=out)
        assert got is out
        again = av.choose_budget(None, drafts, ct, conf=conf, extra_tokens=extra)  # a fresh result tensor
        assert again is not out and int(again) == int(out)
        want = av.choose_budget(av.prefix_survival(conf.clone(), drafts.clone()), drafts.clone(), ct,
                                extra_tokens=extra)
        assert int(got) == int(want)
    with pytest.raises(TypeError, match="out"):
        av.choose_budget(None, drafts, ct, conf=conf, out=torch.empty((), dtype=torch.int64))


def test_prefix_survival_remembered_call_sees_new_values_and_layouts():
    conf, drafts, out = torch.rand(5, 3), torch.full((5,), 3, dtype=torch.int32), torch.empty(5, 3)
    survival_ops._CALLS.clear()
    av.prefix_survival(conf, drafts, out=out)
    assert len(survival_ops._CALLS) == 1
    conf.fill_(0.5)
    drafts.fill_(2)
    av.prefix_survival(conf, drafts, out=out)
    assert out.tolist() == [[0.5, 0.25, 0.0]] * 5
    drafts[1] = 9
    with pytest.raises(ValueError, match="drafts"):  # values are read at launch: the CPU kernel still checks
        av.prefix_survival(conf, drafts, out=out)
    drafts[1] = 2
    out.resize_(4, 3)
    with pytest.raises(ValueError, match="out"):
        av.prefix_survival(conf, drafts, out=out)


def test_an_out_field_restrided_in_place_with_its_shape_is_validated_again():
    """Issue 16, finding 3: out= buffers were re-validated only when their pointer or shape changed. A 1-D field
    restrided in place (as_strided_ on a view of a larger buffer: same pointer, same shape) made the remembered
    call write its contiguous layout over elements outside the view."""
    R, K = 4, 4
    Tp = R + R * K
    survival, drafts = torch.rand(R, K), torch.full((R,), K, dtype=torch.int32)
    big = torch.zeros(2 * Tp + 8, dtype=torch.int32)
    out = dataclasses.replace(av.VerifyPlan.allocate(R, Tp), token_req=big[:Tp])
    av.plan_verification(survival, drafts, mode="all", out=out)  # remembered from here on
    out.token_req.as_strided_((Tp,), (2,))
    big.fill_(-7)
    with pytest.raises(ValueError, match=r"^out\.token_req must be contiguous"):
        av.plan_verification(survival, drafts, mode="all", out=out)
    assert (big == -7).all()  # nothing written, inside the view or between its elements
    conf, d, s = torch.rand(R, K), torch.zeros(2 * R, dtype=torch.int32), torch.empty(R, K)
    d_view = d[:R]
    av.prefix_survival(conf, d_view, out=s)
    d_view.as_strided_((R,), (2,))  # an input read with the wrong stride would read another row's value
    with pytest.raises(ValueError, match=r"^drafts must be contiguous"):
        av.prefix_survival(conf, d_view, out=s)


@pytest.mark.parametrize("first,second", [
    (dict(min_verify=1), dict(min_verify=True)),
    (dict(min_verify=0), dict(min_verify=False)),
    (dict(budget=2), dict(budget=2.0)),
    (dict(budget=1), dict(budget=True)),
    (dict(extra_tokens=0), dict(extra_tokens=0.0)),
    (dict(token_offset=1), dict(token_offset=True)),
    (dict(max_verify=3), dict(max_verify=3.0)),
    (dict(num_reqs_padded=4), dict(num_reqs_padded=4.0)),
    (dict(capacity=30), dict(capacity=30.0)),
])
def test_a_scalar_of_another_type_is_validated_on_the_remembered_path(first, second):
    """Issue 16, finding 7: the remembered call's key compared scalars by ==, so True (== 1) or 2.0 (== 2) after an
    int call skipped the check that rejects them. Keys now hold the scalars' types."""
    R, K = 4, 4
    survival, drafts = torch.rand(R, K), torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    kw = dict(mode="fixed", budget=2, min_verify=0, token_offset=0, num_tokens_padded=R + R * K)
    av.plan_verification(survival, drafts, table(), out=out, **{**kw, **first})
    (name,) = second
    with pytest.raises(TypeError, match=rf"^{name} must be an int"):
        av.plan_verification(survival, drafts, table(), out=out, **{**kw, **second})
    if name in ("min_verify", "extra_tokens", "capacity"):
        ct = table()
        av.choose_budget(survival, drafts, ct, **{k: v for k, v in first.items()})
        with pytest.raises(TypeError, match=rf"^{name} must be an int"):
            av.choose_budget(survival, drafts, ct, **second)
