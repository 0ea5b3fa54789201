"""Prepared calls (adaptive_verify.prepare, python/adaptive_verify/prepared.py): a call validated once and run every
step must be exactly the free function's call with the same arguments, whatever a decode loop changes between runs
(values in place, per-step scalars, inputs rebound with the same layout), and must refuse by name what it cannot
repeat (another layout, a buffer resized in place, a per-call copy, a setting that is not a run argument). The free
functions remember nothing: each call reads its arguments as they are."""
import dataclasses

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def table(max_tokens=None):
    return av.CostTable.from_points({1: 4.0, 64: 4.5, 256: 6.0, 1024: 14.0}, draft_ms=0.7, max_tokens=max_tokens)


def fresh_plan(plan):
    return dataclasses.replace(plan, **{f.name: (None if getattr(plan, f.name) is None else getattr(plan, f.name).clone())
                                        for f in dataclasses.fields(plan)})


def assert_same_plan(a, b):
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
@pytest.mark.parametrize("rebind", [False, True])
def test_prepared_plan_equals_free_calls_as_a_loop_changes_values_scalars_and_inputs(mode, rebind):
    """A decode loop: values copied into the prepared buffers (or new tensors of their layout rebound each run),
    and the cost table (a shifted view per prompt chunk), budget, prompt tokens, prefill emitters, token offset and
    latency target changing. Every run equals a free call with the same arguments on fresh objects."""
    rng = np.random.default_rng(3)
    R, K, Tp = 13, 6, 13 + 13 * 6 + 40
    ct = table(max_tokens=400)
    conf, drafts, ctx, bt, anchors, tokens = engine_inputs(rng, R, K)
    out = av.VerifyPlan.allocate(R + 3, Tp, positions=True, slot_mapping=True, input_ids=True)
    static = dict(mode=mode, block_size=8, num_reqs_padded=R + 3, min_verify=1, verification="onehot")
    handle = av.prepare(av.plan_verification, None, drafts, ct, conf=conf, context_lens=ctx, block_table=bt,
                        anchor_tokens=anchors, draft_tokens=tokens, out=out, survival_out=torch.empty(R, K),
                        num_tokens_padded=Tp, capacity=390, budget=0 if mode == "fixed" else None, **static)
    for step in range(12):
        new = engine_inputs(rng, R, K)
        scalars = dict(extra_tokens=int(rng.integers(0, 30)), extra_emitting=int(rng.integers(0, 3)),
                       token_offset=int(rng.integers(0, 50)), capacity=int(rng.integers(300, 391)),
                       max_step_ms=[None, 9.0, 20.0][step % 3])
        chunk = int(rng.integers(0, 20)) if step % 2 else 0
        scalars["cost_table"] = ct.shifted(chunk) if chunk else ct
        scalars["capacity"] -= chunk
        if mode == "fixed":
            scalars["budget"] = int(rng.integers(0, R * K + 1))
        if rebind:
            inputs = dict(zip(("conf", "drafts", "context_lens", "block_table", "anchor_tokens", "draft_tokens"), new))
            got = handle.run(**inputs, **scalars)
        else:
            for buf, value in zip((conf, drafts, ctx, bt, anchors, tokens), new):
                buf.copy_(value)
            got = handle.run(**scalars)
        c, d, x, b, a, t = (v.clone() for v in new)
        kw = dict(static, **scalars)
        table_ = kw.pop("cost_table")
        want = av.plan_verification(None, d, table_, conf=c, context_lens=x, block_table=b, anchor_tokens=a,
                                    draft_tokens=t, num_tokens_padded=Tp, **kw)
        assert_same_plan(fresh_plan(got), want)
        assert got.verify_lens is out.verify_lens  # the prepared buffers, every run


def test_prepare_launches_nothing_and_run_keeps_what_it_was_not_told():
    """prepare validates and builds the call but writes nothing; a run without arguments repeats the last run's
    scalars, and None for an input keeps the prepared tensor."""
    rng = np.random.default_rng(1)
    R, K = 9, 5
    conf, drafts, *_ = engine_inputs(rng, R, K)
    out = av.VerifyPlan.allocate(R, R * (K + 1))
    out.verify_lens.fill_(-7)
    ct = table()
    handle = av.prepare(av.plan_verification, av.prefix_survival(conf, drafts), drafts, ct, mode="fixed", budget=3,
                        out=out)
    assert (out.verify_lens == -7).all()
    handle.run(budget=11, token_offset=4)
    again = fresh_plan(handle.run(survival=None))
    want = av.plan_verification(av.prefix_survival(conf, drafts), drafts.clone(), ct, mode="fixed", budget=11,
                                token_offset=4)
    assert int(again.budget) == 11
    assert_same_plan(again, want)


def test_the_free_functions_remember_nothing():
    """A free call after earlier calls with the same objects reads each argument as it is now: a tensor given new
    storage in place (set_) or a new layout (transpose_) is read or refused as in a first call."""
    rng = np.random.default_rng(2)
    R, K = 6, 4
    conf, drafts, *_ = engine_inputs(rng, R, K)
    survival = av.prefix_survival(conf, drafts)
    out = av.VerifyPlan.allocate(R, R * (K + 1))
    for _ in range(3):
        av.plan_verification(survival, drafts, table(), out=out)
    other = torch.from_numpy(rng.uniform(0.0, 1.0, (R, K)).astype(np.float32))
    survival.set_(other.untyped_storage(), 0, (R, K), (K, 1))
    assert_same_plan(fresh_plan(av.plan_verification(survival, drafts, table(), out=out)),
                     av.plan_verification(other.clone(), drafts.clone(), table()))
    survival.transpose_(0, 1)
    with pytest.raises(ValueError, match="survival"):
        av.plan_verification(survival, drafts, table(), out=out)
    s_out = torch.empty(R, K)
    av.prefix_survival(conf, drafts, out=s_out)
    conf.mul_(0.5)
    assert torch.equal(av.prefix_survival(conf, drafts, out=s_out), ref.prefix_survival(conf, drafts))


@pytest.mark.parametrize("change", ["resize", "as_strided", "set", "transpose"])
def test_a_tensor_changed_in_place_is_refused_by_name(change):
    """Every tensor a prepared call holds (inputs and outputs) is checked for its data pointer, shape and strides on
    every run: an in-place change raises PreparedMismatch (a ValueError) naming it, before any kernel runs."""
    rng = np.random.default_rng(4)
    R, K = 7, 5
    conf, drafts, *_ = engine_inputs(rng, R, K)
    survival = av.prefix_survival(conf, drafts)
    out = av.VerifyPlan.allocate(R, R * (K + 1))
    handle = av.prepare(av.plan_verification, survival, drafts, table(), out=out)
    handle.run()
    if change == "resize":
        survival.resize_(R, K + 40)
        name = "survival"
    elif change == "as_strided":
        out.token_req.as_strided_(out.token_req.shape, (0,))  # same pointer and shape: only the stride says it
        name = "out.token_req"
    elif change == "set":
        out.query_start_loc.set_(torch.zeros(R + 1, dtype=torch.int32).untyped_storage(), 0, (R + 1,), (1,))
        name = "out.query_start_loc"
    else:
        drafts.unsqueeze_(1)
        name = "drafts"
    with pytest.raises(av.PreparedMismatch, match=f"^plan_verification: {name} changed"):
        handle.run()


def test_rebinding_checks_layout_and_names():
    """A rebound input must have the prepared one's dtype, device, shape and strides (PreparedMismatch naming it and
    saying what was prepared); a name that is not an input (or was None at prepare) is a TypeError naming it."""
    rng = np.random.default_rng(5)
    R, K = 6, 4
    conf, drafts, ctx, *_ = engine_inputs(rng, R, K)
    handle = av.prepare(av.plan_verification, None, drafts, table(), conf=conf, context_lens=ctx,
                        out=av.VerifyPlan.allocate(R, R * (K + 1), positions=True))
    assert set(handle.inputs) == {"conf", "drafts", "context_lens"}
    bad = [("conf", torch.rand(R, K + 1)), ("conf", torch.rand(K, R).t()), ("conf", conf.double()),
           ("drafts", drafts.long()), ("context_lens", ctx[:R - 1]), ("drafts", [1] * R)]
    for name, value in bad:
        with pytest.raises(av.PreparedMismatch, match=f"^plan_verification: {name} must"):
            handle.run(**{name: value})
    for name in ("weights", "block_table", "min_verify"):
        with pytest.raises(TypeError, match=f"cannot rebind \\['{name}'\\]"):
            handle.run(**{name: torch.ones(R)})
    # the failed runs left the prepared tensors bound: a run now reads them
    want = av.plan_verification(None, drafts.clone(), table(), conf=conf.clone(), context_lens=ctx.clone())
    assert_same_plan(fresh_plan(handle.run()), want)


def test_step_scalars_are_validated_on_every_change():
    """A run's per-step scalars go through the op's own checks: wrong types (a bool for an int, a float budget) and
    values out of range raise the op's error naming the argument; the next valid run is still exact."""
    rng = np.random.default_rng(6)
    R, K = 5, 4
    conf, drafts, *_ = engine_inputs(rng, R, K)
    survival = av.prefix_survival(conf, drafts)
    ct = table(max_tokens=200)
    handle = av.prepare(av.plan_verification, survival, drafts, ct, mode="fixed", budget=2,
                        out=av.VerifyPlan.allocate(R, R * (K + 1)))
    for kw, err, name in [(dict(budget=True), TypeError, "budget"), (dict(budget=2.0), TypeError, "budget"),
                          (dict(budget=-1), ValueError, "budget"), (dict(capacity=R - 1), ValueError, "capacity"),
                          (dict(extra_tokens=1.5), TypeError, "extra_tokens"),
                          (dict(token_offset=-3), ValueError, "token_offset"),
                          (dict(cost_table="fast"), TypeError, "cost_table"),
                          (dict(max_step_ms=float("nan")), ValueError, "max_step_ms"),
                          (dict(num_tokens_padded=R * (K + 1) + 1), ValueError, "num_tokens_padded")]:
        with pytest.raises(err, match=name):
            handle.run(**kw)
    got = fresh_plan(handle.run(budget=3, capacity=200, extra_tokens=0, token_offset=0, cost_table=ct,
                                max_step_ms=None, num_tokens_padded=None))
    assert_same_plan(got, av.plan_verification(survival.clone(), drafts.clone(), ct, mode="fixed", budget=3))
    budget_handle = av.prepare(av.choose_budget, survival, drafts, ct)
    with pytest.raises(TypeError, match="choose_budget's prepared call takes no budget"):
        budget_handle.run(budget=3)


def test_prepare_refuses_copies_unknown_ops_and_compiled_regions():
    rng = np.random.default_rng(7)
    R, K = 4, 3
    conf, drafts, *_ = engine_inputs(rng, R, K)
    with pytest.raises(TypeError, match="drafts would be converted"):
        av.prepare(av.plan_verification, av.prefix_survival(conf, drafts), drafts.long(), table())
    with pytest.raises(TypeError, match="drafts would be converted"):
        av.prepare(av.prefix_survival, conf, drafts.long())
    with pytest.raises(TypeError, match="top_k would be converted"):
        av.prepare(av.sample, torch.randn(R, 9), torch.ones(R), top_k=torch.full((R,), 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="weight would be converted"):
        av.prepare(av.confidence, torch.randn(R, K, 8), torch.randn(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="prepare: op must be one of"):
        av.prepare(av.draft_margin, torch.randn(R, K, 9))
    with pytest.raises(TypeError, match="prepare: op must be one of"):
        av.prepare(lambda: None)
    # the op's own validation, with the op's errors
    with pytest.raises(ValueError, match="conf"):
        av.prepare(av.prefix_survival, torch.rand(R, 40), drafts)


def test_prepared_survival_confidence_and_stats_follow_new_inputs():
    """prefix_survival, tree_survival, confidence and AcceptanceStats.update prepared once and run with new inputs
    of the same layout (and in-place new values) give the free functions' results."""
    rng = np.random.default_rng(8)
    R, K, H, Q = 7, 5, 16, 3
    conf, drafts, *_ = engine_inputs(rng, R, K)
    surv = av.prepare(av.prefix_survival, conf, drafts)
    parents = torch.from_numpy(np.array([[j - 1 if j % 2 else max(j - 2, -1) for j in range(K)]] * R, np.int32))
    tree = av.prepare(av.tree_survival, conf, parents, drafts, out=torch.empty(R, K))
    hidden, markov = torch.randn(R, K, H, dtype=torch.bfloat16), torch.randn(R, K, Q, dtype=torch.bfloat16)
    weight, temp = torch.randn(H + Q), torch.rand(K) + 0.5
    conf_h = av.prepare(av.confidence, hidden, weight, markov=markov, bias=0.3, temperature=temp, survival=True,
                        out=torch.empty(R, K))
    stats, free_stats = av.AcceptanceStats(K), av.AcceptanceStats(K)
    v, a = torch.zeros(R, dtype=torch.int32), torch.zeros(R, dtype=torch.int32)
    upd = av.prepare(stats.update, conf, v, a)
    for step in range(4):
        c2, d2, *_ = engine_inputs(rng, R, K)
        assert torch.equal(surv.run(conf=c2, drafts=d2), av.prefix_survival(c2, d2))
        assert torch.equal(tree.run(conf=c2, tree_sizes=d2), av.tree_survival(c2, parents, d2))
        h2 = torch.randn(R, K, H, dtype=torch.bfloat16)
        markov.normal_()
        assert torch.equal(conf_h.run(hidden=h2), av.confidence(h2, weight, markov=markov, bias=0.3, temperature=temp,
                                                                survival=True))
        v2 = torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32))
        a2 = torch.minimum(v2, torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32)))
        upd.run(conf=c2, verify_lens=v2, num_accepted=a2)
        free_stats.update(c2, v2, a2)
        for name in ("trials", "survivals", "totals", "conf_sum"):
            assert torch.equal(getattr(stats, name), getattr(free_stats, name)), (step, name)


def _sampler_batch(rng, R, K, V):
    """(target_logits [T, V], query_start_loc, draft_tokens) of a varlen step: q_len in [0, K + 1]."""
    q_len = rng.integers(0, K + 2, R)
    qsl = torch.from_numpy(np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32))
    logits = torch.from_numpy(rng.normal(0, 2, (int(qsl[-1]), V)).astype(np.float32))
    drafts = torch.from_numpy(rng.integers(0, V, (R, K)).astype(np.int32))
    return logits, qsl, drafts


@pytest.mark.parametrize("seeded", [True, False])
def test_prepared_samplers_equal_free_calls_with_new_logits_and_offsets(seeded):
    """rejection_sample and sample prepared once, run with each step's new logits (same layout) and host offset,
    with sampling parameters and logprobs: every run equals the free call; unseeded requests draw fresh seeds each
    run (runs differ), as free calls do."""
    rng = np.random.default_rng(9)
    R, K, V = 6, 3, 50
    logits, qsl, drafts = _sampler_batch(rng, R, K, V)
    temperature = torch.from_numpy(rng.uniform(0.5, 1.5, R).astype(np.float32))
    seeds = torch.from_numpy(rng.integers(0, 2**62, R)) if seeded else None
    params = av.SamplingParams(temperature=temperature, seeds=seeds, top_k=torch.full((R,), 20, dtype=torch.int32),
                               top_p=torch.full((R,), 0.9))
    out = (torch.empty(R, K + 1, dtype=torch.int32), torch.empty(R, dtype=torch.int32), torch.empty(R, K + 1))
    rej = av.prepare(av.rejection_sample, logits, qsl, drafts, params=params, logprobs=True, out=out)
    rows = torch.from_numpy(rng.normal(0, 2, (R, V)).astype(np.float32))
    smp = av.prepare(av.sample, rows, params=params, offset=0)
    seen = set()
    for offset in range(5):
        new_logits = torch.from_numpy(rng.normal(0, 2, tuple(logits.shape)).astype(np.float32))
        got = rej.run(offset=offset, target_logits=new_logits)
        assert got[0] is out[0]
        new_rows = torch.from_numpy(rng.normal(0, 2, (R, V)).astype(np.float32))
        tokens = smp.run(offset=offset, logits=new_rows)
        if seeded:
            want = av.rejection_sample(new_logits, qsl, drafts, params=params, logprobs=True, offset=offset)
            assert all(torch.equal(x, y) for x, y in zip(got, want)), offset
            assert torch.equal(tokens, av.sample(new_rows, params=params, offset=offset))
        else:
            same_logits = rej.run(offset=offset, target_logits=new_logits)
            seen.add(tuple(same_logits[0].flatten().tolist()))
    if not seeded:
        assert len(seen) > 1
    with pytest.raises(TypeError, match="cannot rebind \\['draft_probs'\\]"):
        rej.run(draft_probs=torch.rand(R, K, V))


def test_a_tensor_offset_is_read_at_every_run_and_a_host_one_is_refused():
    """A call prepared with a 0-d offset tensor (for CUDA graphs) reads it, advanced in place, at every run; a host
    offset then is a TypeError (the struct reads the tensor), another tensor of its layout is rebound."""
    rng = np.random.default_rng(10)
    R, K, V = 5, 2, 30
    logits, qsl, drafts = _sampler_batch(rng, R, K, V)
    kw = dict(temperature=torch.ones(R), seeds=torch.arange(R, dtype=torch.int64))
    offset = torch.zeros((), dtype=torch.int64)
    handle = av.prepare(av.rejection_sample, logits, qsl, drafts, offset=offset, **kw)
    for step in range(3):
        offset.fill_(step * 11)
        got = handle.run()
        want = av.rejection_sample(logits, qsl, drafts, offset=step * 11, **kw)
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    with pytest.raises(TypeError, match="offset was prepared as a 0-d tensor"):
        handle.run(offset=3)
    got = handle.run(offset=torch.tensor(7))
    assert all(torch.equal(x, y) for x, y in zip(got, av.rejection_sample(logits, qsl, drafts, offset=7, **kw)))
