"""The remembered calls of the planner ops (python/adaptive_verify/_callcache.py): a call repeating an earlier
call's objects skips validation, so these tests check that such a call is exactly the validating call: same
integers whatever changes step to step, in-place changes of a tensor's layout caught, per-step scalars still
validated, and the one-call confidence path (conf=) equal to prefix_survival followed by the plan."""
import dataclasses
import importlib

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
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
    """After the first call, repeated calls never validate again (resolve_plan_args is not called), also when the
    cost table object changes (a shifted view per prompt chunk is a per-step argument) or the budget does."""
    R, K = 9, 4
    survival = torch.rand(R, K)
    drafts = torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    base = table()
    # (capacity given from the start: a per-step scalar of another type, None then int, is another call)
    av.plan_verification(survival, drafts, base, mode="greedy", capacity=R + R * K, out=out)
    calls = []
    real = planner_ops.resolve_plan_args
    monkeypatch.setattr(planner_ops, "resolve_plan_args", lambda *a, **k: calls.append(1) or real(*a, **k))
    for extra in (3, 5, 7):
        shifted = base.shifted(extra)
        got = av.plan_verification(survival, drafts, shifted, mode="greedy", capacity=R + R * K, out=out)
        want = av.plan_verification(survival.clone(), drafts.clone(), shifted, mode="greedy", capacity=R + R * K)
        assert int(got.budget) == int(want.budget)
    assert len(calls) == 3  # the three fresh calls (new objects) only
    for b in (3, 5, 7):
        plan = av.plan_verification(survival, drafts, base, mode="fixed", budget=b, out=out)
        assert int(plan.budget) == b
    assert len(calls) == 4  # mode is in the key: one validation, then re-stepped budgets


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
    # A prompt chunk that shrinks the default T_pad (4 + min(16, 40 - 34) = 10) is served by the longer buffers: the
    # plan is views of their first 10 entries.
    plan = av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, extra_tokens=30, out=out)
    assert plan.token_req.shape == (10,) and plan.token_req.data_ptr() == out.token_req.data_ptr()
    assert torch.equal(plan.token_req, ref.plan_verification(survival, drafts, ct, mode="fixed", budget=2,
                                                             extra_tokens=30).token_req)
    plan = av.plan_verification(survival, drafts, ct, mode="fixed", budget=3, out=out)  # and back to T_pad = 20
    assert int(plan.budget) == 3 and plan.token_req.shape == (20,)
    # One that grows T_pad past out's buffers is checked against out again.
    short = av.VerifyPlan.allocate(R, 10)
    av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, extra_tokens=30, out=short)
    with pytest.raises(ValueError, match="out.token_req"):
        av.plan_verification(survival, drafts, ct, mode="fixed", budget=2, out=short)


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


# ------------------------------------------------------------------------------------------------------
# the sampler's remembered calls
# ------------------------------------------------------------------------------------------------------


def test_rejection_sample_loop_equals_validating_calls():
    """A decode loop: same buffers with new values, the offset advancing, sampling parameters present; every
    step equals a fresh call, and the remembered path is taken (sampling module's cache holds the call)."""
    from adaptive_verify import sampling as sampling_module

    g = torch.Generator().manual_seed(1)
    R, K, V = 6, 3, 40
    logits = torch.empty(R * (K + 1), V)
    qsl = torch.arange(0, R * (K + 1) + 1, K + 1, dtype=torch.int32)
    drafts = torch.empty(R, K, dtype=torch.int32)
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0, 0.7])
    seeds = torch.arange(R, dtype=torch.int64)
    top_k = torch.tensor([0, 3, 0, 5, 1, 0], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 1.0, 0.8])
    out = (torch.empty(R, K + 1, dtype=torch.int32), torch.empty(R, dtype=torch.int32), torch.empty(R, K + 1))
    sampling_module._REJECTION_CALLS.clear()
    for step in range(5):
        logits.copy_(torch.randn(R * (K + 1), V, generator=g) * 2)
        drafts.copy_(torch.randint(0, V, (R, K), generator=g, dtype=torch.int32))
        kw = dict(temperature=temperature, seeds=seeds, offset=100 + step, top_k=top_k, top_p=top_p, logprobs=True)
        got = av.rejection_sample(logits, qsl, drafts, out=out, **kw)
        want = av.rejection_sample(logits.clone(), qsl.clone(), drafts.clone(), **kw)
        for a, b in zip(got, want):
            assert torch.equal(a, b), step
    assert len(sampling_module._REJECTION_CALLS) == 1
    qsl[2] = 100  # values are read at launch: the CPU kernel still refuses bad ones
    with pytest.raises(ValueError, match="query_start_loc"):
        av.rejection_sample(logits, qsl, drafts, out=out, **kw)
    qsl[2] = 2 * (K + 1)
    temperature[1] = -1.0
    with pytest.raises(ValueError, match="temperature"):
        av.rejection_sample(logits, qsl, drafts, out=out, **kw)
    temperature[1] = 0.5
    out[0].resize_(R - 1, K + 1)  # an output resized in place is validated again
    with pytest.raises(ValueError, match=r"out\[0\]"):
        av.rejection_sample(logits, qsl, drafts, out=out, **kw)


def test_unseeded_remembered_calls_draw_fresh_seeds_every_call():
    R, V = 64, 50
    logits = torch.zeros(R, V)  # uniform: tokens depend on the seeds only
    out = torch.empty(R, dtype=torch.int32)
    T = torch.ones(R)
    first = av.sample(logits, T, out=out).clone()
    second = av.sample(logits, T, out=out).clone()
    assert not torch.equal(first, second)
    torch.manual_seed(3)
    a = av.sample(logits, T, out=out).clone()
    torch.manual_seed(3)
    b = av.sample(logits, T, out=out).clone()
    assert torch.equal(a, b)  # torch's generator decides them: reproducible under torch.manual_seed


def test_sampler_scalar_types_are_part_of_the_key():
    logits = torch.randn(4, 9)
    out = torch.empty(4, dtype=torch.int32)
    av.sample(logits, torch.ones(4), torch.arange(4), 0, out=out)
    with pytest.raises(TypeError, match="logprobs"):
        av.sample(logits, torch.ones(4), torch.arange(4), 0, out=out, logprobs=1)
    with pytest.raises(TypeError, match="offset"):
        av.sample(logits, torch.ones(4), torch.arange(4), 1.5, out=out)


def test_confidence_and_stats_remembered_calls():
    confidence_module = importlib.import_module("adaptive_verify.confidence")  # (av.confidence is the op)
    g = torch.Generator().manual_seed(2)
    R, K, H = 5, 4, 16
    hidden, weight = torch.empty(R, K, H), torch.randn(H, generator=g)
    temperature, out = torch.full((K,), 1.5), torch.empty(R, K)
    confidence_module._CALLS.clear()
    stats, fresh = av.AcceptanceStats(K), av.AcceptanceStats(K)
    vl, na = torch.empty(R, dtype=torch.int32), torch.empty(R, dtype=torch.int32)
    for step in range(4):
        hidden.copy_(torch.randn(R, K, H, generator=g))
        got = av.confidence(hidden, weight, bias=0.25, temperature=temperature, survival=True, out=out)
        assert torch.equal(got, av.confidence(hidden.clone(), weight, bias=0.25, temperature=temperature.clone(),
                                              survival=True))
        vl.copy_(torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32))
        na.copy_(torch.minimum(vl, torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)))
        stats.update(out, vl, na)
        fresh.update(out.clone(), vl.clone(), na.clone())
    assert len(confidence_module._CALLS) == 1 and len(stats._calls) == 1
    assert torch.equal(stats.trials, fresh.trials) and torch.equal(stats.survivals, fresh.survivals)
    temperature[0] = 0.0  # changed in place: checked again, so the remembered call cannot skip it
    with pytest.raises(ValueError, match="temperature"):
        av.confidence(hidden, weight, bias=0.25, temperature=temperature, survival=True, out=out)
    with pytest.raises(TypeError, match="bias"):  # the scalar's type is part of the key
        av.confidence(hidden, weight, bias=True, temperature=torch.ones(K), survival=True, out=out)


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


def test_a_tensor_budget_with_a_new_cost_table_on_the_remembered_path():
    """A remembered call with a 0-d tensor budget re-derives its per-step fields for a new (e.g. shifted) table: the
    budget stays the tensor's (regression: the re-derivation read the host budget, None, and raised)."""
    R, K = 5, 4
    survival = torch.sort(torch.rand(R, K), dim=1, descending=True).values
    drafts = torch.full((R,), K, dtype=torch.int32)
    out = av.VerifyPlan.allocate(R, R + R * K)
    budget = torch.tensor(7, dtype=torch.int32)
    ct = table(max_tokens=200)
    for extra in (0, 3, 11):
        tab = ct.shifted(extra) if extra else ct
        budget.fill_(7 + extra % 4)
        plan = av.plan_verification(survival, drafts, tab, mode="fixed", budget=budget, capacity=200 - extra,
                                    num_tokens_padded=R + R * K, out=out)
        want = ref.plan_verification(survival, drafts, tab, mode="fixed", budget=int(budget), capacity=200 - extra,
                                     num_tokens_padded=R + R * K)
        assert int(plan.budget) == int(want.budget) == 7 + extra % 4
        assert torch.equal(plan.verify_lens, want.verify_lens)
