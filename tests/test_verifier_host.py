"""AdaptiveVerifier's per-step host paths (issue 13's host-time work): the one-pass slot checks and stale gather
(_C.slot_inputs), the planner calls the verifier drives itself (verifier._Driven), shifted cost arrays written in
place (_C.shifted_costs), and the plan buffers prompt chunks share. Each test states what it would catch."""
import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import AdaptiveVerifier
from adaptive_verify._ext import _C

K = 5


def table():
    return av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 256: 9.0, 1024: 30.0}, draft_ms=0.5,
                                    graph_sizes=[8, 16, 32, 64], max_tokens=1024)


def stale_reference(v, snapshot_conf, idx, new_slots=()):
    """[R, K]: each slot's row of the last recorded conf, or the prior for a slot added since."""
    out = snapshot_conf[idx].copy()
    for r, i in enumerate(idx):
        if i in new_slots:
            out[r] = v.prior
    return out


def test_slot_checks_and_gather_match_a_numpy_recomputation_under_churn():
    """Random steps with joins, permutations and strided host arrays: the gathered stale confidences are each slot's
    last recorded row (prior for slots added since) and the budget is choose_budget's on them, priced at this step."""
    ct = table()
    M = 32
    v = AdaptiveVerifier(ct, max_reqs=M, max_drafts=K, block_size=16, prior=0.7)
    rng = np.random.default_rng(5)
    recorded = np.full((M, K), 0.7, dtype=np.float32)
    for step in range(40):
        R = int(rng.integers(1, M + 1))
        idx = rng.permutation(M)[:R]
        added = set(int(i) for i in rng.choice(idx, size=int(rng.integers(0, 3)), replace=False)) if step % 4 == 0 \
            else set()
        for i in added:
            v.add_request(i)
            recorded[i] = 0.7
        drafts = rng.integers(0, K + 1, R)
        # strided views (not contiguous): converted once, never read raw
        idx_arg = np.repeat(idx, 2)[::2] if step % 2 else idx
        drafts_arg = np.repeat(drafts, 2)[::2] if step % 3 == 0 else drafts
        assert step % 2 == 0 or R == 1 or not idx_arg.flags.c_contiguous
        extra = int(rng.integers(0, 300)) if step % 5 else 0
        b, _ = v.plan_budget(R, drafts_arg, extra, req_indices=idx_arg)
        stale = recorded[idx]
        d = torch.from_numpy(drafts.astype(np.int32))
        tab = ct.shifted(extra) if extra else ct
        ref = int(av.choose_budget(None, d, tab, conf=torch.from_numpy(stale.copy()), mode="global",
                                   capacity=ct.max_tokens - extra))
        b_max = min(int(drafts.sum()), ct.max_tokens - R - extra)
        assert b == min(max(ref, 0), b_max), step
        assert np.array_equal(v.stale_confidence(idx), stale)
        conf = rng.uniform(0.05, 0.99, (R, K)).astype(np.float32)
        v.record_confidence(torch.from_numpy(conf), req_indices=idx)
        recorded[idx] = conf


def test_fewer_recorded_columns_leave_zeros_past_them():
    v = AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=16)
    v.plan_budget(2, [3, 3], req_indices=[3, 1])
    v.record_confidence(torch.full((2, 3), 0.8), req_indices=[3, 1])
    assert np.allclose(v.stale_confidence([1, 3]), [[0.8] * 3 + [0.0] * 2] * 2)


def test_duplicate_slots_are_found_across_the_stamp_wrap_and_after_an_error():
    """Distinct slots are checked with per-call stamps: a stale stamp must never make a slot look seen (wrap, or the
    marks a failed call left behind), and a real duplicate must always be caught."""
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16)
    with pytest.raises(ValueError, match="^req_indices must be distinct"):
        v.plan_budget(3, [1, 1, 1], req_indices=[4, 5, 4])
    v.plan_budget(3, [1, 1, 1], req_indices=[4, 5, 6])  # slots 4 and 5 carry the failed call's stamp: not seen now
    v.slots._stamp = 0xFFFFFFFF - 1
    v.plan_budget(2, [1, 1], req_indices=[0, 1])  # the last stamp
    v.plan_budget(2, [1, 1], req_indices=[0, 1])  # wraps to 1: marks cleared, so 0 and 1 are not seen
    assert v.slots._stamp == 1
    with pytest.raises(ValueError, match="^req_indices must be distinct"):
        v.plan_budget(2, [1, 1], req_indices=[7, 7])
    with pytest.raises(ValueError, match="^req_indices must lie"):
        v.plan_budget(2, [1, 1], req_indices=[-1, 2])
    with pytest.raises(ValueError, match=r"^drafts_host values must be in \[0, max_drafts = 5\]"):
        v.plan_budget(2, [-1, 2])
    v.plan_budget(2, [K, 0], req_indices=[7, 6])


def test_slot_inputs_refuses_arrays_it_cannot_read_raw():
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16)
    v.slots._params.num_reqs = 2
    for drafts in (np.zeros(2, dtype=np.int32), np.zeros(4, dtype=np.int64)[::2], np.zeros(3, dtype=np.int64)):
        with pytest.raises(ValueError, match="drafts must be a contiguous 1-D int64 array"):
            _C.slot_inputs(v.slots._addr, drafts, None)


def test_shifted_costs_equal_the_float64_formula_rounded_once():
    """_C.shifted_costs (ShiftedCurve.dense32) is the view's float64 n -> base(n + t) - base(t) + base(0), rounded to
    float32 once: bit for bit what the numpy formula gives."""
    ct = av.CostTable.from_points({1: 1e-3, 7: 2.5, 100: 3.25, 4096: 77.7}, draft_ms=0.1, graph_sizes=[2, 8, 64])
    base = ct.verify_curve
    for t in (1, 2, 7, 63, 64, 65, 1000, 4000):
        view = ct.shifted(t)
        n = 3000
        expect = (base.dense(t + n)[t:] - base.cost(t) + base.cost(0)).astype(np.float32)
        got = view.verify_curve.dense32(n)
        assert np.array_equal(got.view(np.uint32), expect.view(np.uint32)), t
        assert np.array_equal(view.verify_array(n - 1).numpy().view(np.uint32), expect.view(np.uint32)), t
    out = np.empty(4, dtype=np.float32)
    with pytest.raises(ValueError, match="shifted_costs"):
        _C.shifted_costs(np.zeros(4, dtype=np.float32), 0, 0.0, 0.0, out)
    with pytest.raises(ValueError, match="shifted_costs"):
        _C.shifted_costs(np.zeros(5), 2, 0.0, 0.0, out)  # base too short for shift + len(out)


def test_a_prepared_budget_run_on_shifted_tables_prices_like_fresh_calls():
    """choose_budget prepared on persistent inputs, run with a new shifted table per step (on the CPU its shifted
    costs go into the call's own array, rewritten in place): every budget equals a fresh call's on that view."""
    ct = table()
    R = 16
    rng = np.random.default_rng(3)
    conf = torch.from_numpy(rng.uniform(0.3, 0.99, (R, K)).astype(np.float32))
    drafts = torch.full((R,), K, dtype=torch.int32)
    out = torch.empty((), dtype=torch.int32)
    call = av.prepare(av.choose_budget, None, drafts, ct, conf=conf, mode="global", capacity=1024, out=out)
    for step in range(30):
        extra = int(rng.integers(1, 900))
        view = ct.shifted(extra)
        assert call.run(cost_table=view, capacity=1024 - extra) is out
        fresh = int(av.choose_budget(None, drafts.clone(), view, conf=conf.clone(), mode="global",
                                     capacity=1024 - extra))
        assert int(out) == fresh, step


def _plan_inputs(rng, R):
    ctx = torch.from_numpy(rng.integers(0, 50, R).astype(np.int32))
    bt = torch.arange(R * 16, dtype=torch.int32).reshape(R, 16)
    anchors = torch.from_numpy(rng.integers(0, 100, R).astype(np.int32))
    dt = torch.from_numpy(rng.integers(0, 100, (R, K)).astype(np.int32))
    return ctx, bt, anchors, dt


def _full_drafts_setup(R, seed):
    """(table, a verifier for R requests, the plan's metadata inputs, conf [R, K], drafts [R] all K)."""
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4)
    rng = np.random.default_rng(seed)
    inputs = _plan_inputs(rng, R)
    conf = torch.from_numpy(rng.uniform(0.5, 0.99, (R, K)).astype(np.float32))
    return ct, v, inputs, conf, torch.full((R,), K, dtype=torch.int32)


def _reference_plan(ct, conf, d, b, extra, ctx, bt, anchors, dt, padded, min_verify=0):
    """A fresh planner call with the step's exact capacity and T_pad."""
    return av.plan_verification(av.prefix_survival(conf, d), d, ct, mode="fixed", budget=b, context_lens=ctx,
                                block_table=bt, block_size=4, anchor_tokens=anchors, draft_tokens=dt,
                                num_tokens_padded=padded, capacity=ct.max_tokens - extra, min_verify=min_verify)


def _new_step(rng, conf, d):
    """Writes a step's confidences and drafts into the engine's persistent conf [R, K] and d [R]; returns the drafts
    as host ints."""
    R = d.shape[0]
    conf.copy_(torch.from_numpy(rng.uniform(0.05, 0.99, (R, K)).astype(np.float32)))
    drafts = rng.integers(0, K + 1, R)
    d.copy_(torch.from_numpy(drafts.astype(np.int32)))
    return drafts


FIELDS = ("verify_lens", "budget", "num_tokens", "query_start_loc", "seq_lens", "positions", "slot_mapping",
          "input_ids", "token_req")


def count_prepares(monkeypatch) -> list:
    """The ops the verifier prepares (adaptive_verify.prepare: its documented fast path), in order."""
    from adaptive_verify import verifier_chain
    from adaptive_verify.planner import lagged as lagged_mod

    prepared = []
    for module in (verifier_chain, lagged_mod):
        monkeypatch.setattr(module, "prepare", lambda op, *a, **k: prepared.append(op) or av.prepare(op, *a, **k))
    return prepared


def test_steps_prepare_once_and_equal_fresh_planner_calls(monkeypatch):
    """Steps repeating the engine's objects (constant and changing prompt chunks, changing budgets) prepare the
    planner a handful of times in all, not per step, and every plan equals a fresh planner call. Chunks below the
    largest graph share the eager buffers, so chunk sizes do not multiply buffer sets."""
    prepared = count_prepares(monkeypatch)
    storages = set()
    ct = table()
    R = 12
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4)
    rng = np.random.default_rng(9)
    ctx, bt, anchors, dt = _plan_inputs(rng, R)
    conf, d = torch.empty(R, K), torch.empty(R, dtype=torch.int32)
    for step in range(40):
        drafts = _new_step(rng, conf, d)
        extra = 0 if step < 10 else 30 if step < 20 else int(rng.integers(1, 60 if step < 30 else 600))
        b, padded = v.plan_budget(R, drafts, extra)
        v.record_confidence(conf)
        plan = v.plan(conf, d, ctx, bt, anchors, dt, b, extra_tokens=extra)
        ref = _reference_plan(ct, conf, d, b, extra, ctx, bt, anchors, dt, padded - extra)  # padded counts the chunk
        for f in FIELDS:
            assert torch.equal(getattr(plan, f), getattr(ref, f)), (step, f)
        storages.add(plan.token_req.untyped_storage().data_ptr())
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))
    # graph-sized steps without a chunk: a few padded sizes, one plan call each, plus the shared eager buffers' and
    # the lagged budget's and the statistics' calls; never one per step or per chunk size
    plans = [op for op in prepared if op is av.plan_verification]
    assert len(plans) <= 4 and len(prepared) - len(plans) <= 3, prepared
    assert len(storages) <= 4, len(storages)  # buffer sets: one per chunk size would make 15


def test_a_caller_tensor_replaced_in_place_is_read_anew():
    """The driven call holds the caller tensors' pointers: one given new storage (set_) between steps must be read
    from its new storage, not the old (its new pointer is a new key, so that step goes through validation)."""
    R = 6
    ct, v, (ctx, bt, anchors, dt), conf, d = _full_drafts_setup(R, 2)
    for step in range(3):
        b, padded = v.plan_budget(R, [K] * R)
        v.record_confidence(conf)
        plan = v.plan(conf, d, ctx, bt, anchors, dt, b)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))
    anchors.set_(torch.arange(1000, 1000 + R, dtype=torch.int32))  # new storage, same object
    ctx.set_(torch.full((R,), 7, dtype=torch.int32))
    b, padded = v.plan_budget(R, [K] * R)
    v.record_confidence(conf)
    plan = v.plan(conf, d, ctx, bt, anchors, dt, b)
    ref = _reference_plan(ct, conf, d, b, 0, ctx, bt, anchors, dt, padded)
    for f in FIELDS:
        assert torch.equal(getattr(plan, f), getattr(ref, f)), f
    first = plan.query_start_loc[:R].long()
    assert torch.equal(plan.input_ids[first], anchors) and torch.equal(plan.positions[first], ctx)


def test_first_tokens_is_dataclasses_replace_with_cut_token_fields():
    import dataclasses

    plan = av.VerifyPlan.allocate(4, 20, positions=True, slot_mapping=True, input_ids=True)
    cut = plan.first_tokens(7)
    expect = dataclasses.replace(plan, **{f: getattr(plan, f)[:7] for f in ("token_req", "positions", "slot_mapping",
                                                                           "input_ids")})
    assert type(cut) is av.VerifyPlan and cut is not plan
    for f in dataclasses.fields(plan):
        a, b = getattr(cut, f.name), getattr(expect, f.name)
        assert (a is None and b is None) or (a.shape == b.shape and a.data_ptr() == b.data_ptr()), f.name
    assert plan.first_tokens(20) is plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        cut.budget = None


def test_bench_verifier_reports_every_regime():
    """`adaptive-verify bench verifier` runs its four prompt-chunk regimes and the churn regret, and reports them."""
    import argparse

    from adaptive_verify.bench import verifier as bench

    args = argparse.Namespace(R=[16], K=4, steps=25, clock="thread", repeat=1, regret_steps=15)
    res = bench.run(args)
    assert [r["prefill"] for r in res["host"]] == list(bench.PREFILLS)
    assert all(r["target_total"] > 0 for r in res["host"])
    text = bench.report(res)
    assert "varying / constant prompt chunk" in text and "varying, wide" in text
    assert res["regret"]["current R"]["mean_regret"] <= res["regret"]["previous R"]["mean_regret"]


@pytest.mark.parametrize("min_verify", [0, 2])
def test_caller_budgets_out_of_range_plan_like_the_planner_on_shared_eager_buffers(min_verify):
    """Budgets the caller changed (below the forced drafts, above the step's room) on steps sharing the eager
    buffers, with prompt chunks: the verifier caps a host budget itself and, without forced drafts, tells the kernel
    the constant capacity and buffer size; every plan must still equal the planner's with the step's exact capacity
    and T_pad."""
    ct = table()
    R = 10
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4, min_verify=min_verify)
    rng = np.random.default_rng(31 + min_verify)
    ctx, bt, anchors, dt = _plan_inputs(rng, R)
    conf, d = torch.empty(R, K), torch.empty(R, dtype=torch.int32)
    for step in range(24):
        drafts = _new_step(rng, conf, d)
        extra = int(rng.integers(0, 980))
        b, _ = v.plan_budget(R, drafts, extra)
        v.record_confidence(conf)
        b = [0, 1, b, b + 7, 10 ** 6][step % 5]
        padded = min(v.padded_tokens(R + extra + b) - extra, ct.max_tokens - extra)
        if step % 3 == 0:  # a step the caller sized below its budget: the planner caps B to T_pad - R
            padded = R + min(b, padded - R) // 2
        plan = v.plan(conf, d, ctx, bt, anchors, dt, b, extra_tokens=extra, padded_tokens=padded)
        ref = _reference_plan(ct, conf, d, b, extra, ctx, bt, anchors, dt, padded, min_verify)
        for f in FIELDS:
            assert torch.equal(getattr(plan, f), getattr(ref, f)), (step, f)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))


@pytest.mark.cuda
def test_buffers_reused_by_a_capture_are_pinned():
    """Eager steps made a graph-sized step's buffers; a CUDA graph then captures plan() at that size: the buffers
    must leave the LRU (a graph replays their addresses), so many later keys cannot evict them."""
    from adaptive_verify import verifier as verifier_mod

    ct = table()
    R = 4
    v = AdaptiveVerifier(ct, max_reqs=80, max_drafts=K, block_size=16, device="cuda")
    conf = torch.full((R, K), 0.9, device="cuda")
    d = torch.full((R,), K, dtype=torch.int32, device="cuda")
    budget = torch.tensor(8, dtype=torch.int32, device="cuda")
    v.plan(conf, d, budget=budget, padded_tokens=16)  # eager: the LRU entry
    key = next(k for k in v._plans if k[1] == R and k[2] == 16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        v.plan(conf, d, budget=budget, padded_tokens=16)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = v.plan(conf, d, budget=budget, padded_tokens=16)
    assert key in v._plans_pinned and key not in v._plans
    for r in range(1, verifier_mod.PLAN_CACHE_SIZE + 2):  # more keys than the LRU holds
        v.plan(torch.full((r, K), 0.9, device="cuda"), torch.full((r,), K, dtype=torch.int32, device="cuda"),
               budget=0, padded_tokens=r)
    budget.fill_(5)
    graph.replay()
    torch.cuda.synchronize()
    assert int(plan.budget) == 5 and v._plans_pinned[key].out.token_req.data_ptr() == plan.token_req.data_ptr()


def test_record_confidence_checks_req_indices_even_without_rows():
    v = AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=16)
    with pytest.raises(ValueError, match="^req_indices must have num_reqs = 0"):
        v.record_confidence(torch.zeros(0, K), req_indices=[1, 2])
    with pytest.raises(ValueError, match="^req_indices must be distinct"):
        v.record_confidence(torch.zeros(2, K), req_indices=[1, 1])


def test_slices_of_persistent_buffers_run_the_prepared_calls(monkeypatch):
    """Engines pass new slices of their persistent buffers every step (``buf[:R]``): new objects of the same layout,
    rebound into the verifier's prepared plan and stats calls, so such steps prepare once; a view of the same memory
    as another dtype is refused by name."""
    prepared = count_prepares(monkeypatch)
    ct = table()
    R, M = 12, 16
    v = AdaptiveVerifier(ct, max_reqs=M, max_drafts=K, block_size=4)
    rng = np.random.default_rng(4)
    ctx_buf, bt_buf, anchors_buf, dt_buf = _plan_inputs(rng, M)
    conf_buf, d_buf, acc_buf = torch.empty(M, K), torch.empty(M, dtype=torch.int32), torch.zeros(M, dtype=torch.int32)
    for step in range(12):
        conf, d = conf_buf[:R], d_buf[:R]  # new objects every step
        drafts = _new_step(rng, conf, d)
        b, padded = v.plan_budget(R, drafts, 300)
        v.record_confidence(conf)
        plan = v.plan(conf, d, ctx_buf[:R], bt_buf[:R], anchors_buf[:R], dt_buf[:R], b, extra_tokens=300)
        ref = _reference_plan(ct, conf, d, b, 300, ctx_buf[:R], bt_buf[:R], anchors_buf[:R], dt_buf[:R],
                              padded - 300)
        for f in FIELDS:
            assert torch.equal(getattr(plan, f), getattr(ref, f)), (step, f)
        v.observe(plan.verify_lens, acc_buf[:R])
    assert prepared == [av.choose_budget, av.plan_verification, v.stats.update], prepared  # once each
    # the same memory as float32: not the prepared layout, so it is validated again (and refused)
    with pytest.raises((TypeError, ValueError), match="verify_lens"):
        v.observe(plan.verify_lens.view(torch.float32), acc_buf[:R])


def test_record_confidence_takes_host_indices_in_every_form():
    """A list, a numpy array and a CPU tensor of slots record the same rows (the CPU table's numpy scatter)."""
    conf = torch.from_numpy(np.random.default_rng(6).uniform(0.1, 0.9, (3, K)).astype(np.float32))
    got = []
    for idx in ([4, 0, 2], np.array([4, 0, 2]), torch.tensor([4, 0, 2], dtype=torch.int32)):
        v = AdaptiveVerifier(table(), max_reqs=6, max_drafts=K, block_size=16)
        v.plan_budget(3, [K] * 3, req_indices=[4, 0, 2])
        v.record_confidence(conf, req_indices=idx)
        got.append(v.stale_confidence([0, 2, 4]))
    assert all(np.array_equal(g, conf.numpy()[[1, 2, 0]]) for g in got)


def test_eager_step_views_follow_each_size(monkeypatch):
    """An eager step's plan is views of its first padded tokens, kept per size (VIEW_CACHE_SIZE, here 5, first in,
    first out): sizes that come back after eviction and sizes kept alike equal the planner's plan of that size.
    Catches a view kept for another size or another step's plan."""
    from adaptive_verify import verifier_buffers

    monkeypatch.setattr(verifier_buffers, "VIEW_CACHE_SIZE", 5)
    R = 10
    ct, v, (ctx, bt, anchors, dt), conf, d = _full_drafts_setup(R, 4)
    for step, budget in enumerate([3, 9, 3, 20, 9, 1, 2, 4, 6, 3]):
        extra = 70  # R + extra exceeds the largest graph (64): every step is eager, its size R + budget
        v.plan_budget(R, [K] * R, extra)
        v.record_confidence(conf)
        plan = v.plan(conf, d, ctx, bt, anchors, dt, budget, extra_tokens=extra)
        assert plan.token_req.shape[0] == R + budget
        ref = _reference_plan(ct, conf, d, budget, extra, ctx, bt, anchors, dt, R + budget)
        for f in FIELDS:
            assert torch.equal(getattr(plan, f), getattr(ref, f)), (step, f)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))


def test_record_confidence_reads_any_strided_conf_on_cpu():
    """record_confidence's CPU scatter (_C.record_rows) reads conf through its strides: a transposed view (column
    stride != 1), a column slice (row stride != K') and an expanded row (row stride 0) record exactly their values
    into the slots named, zeros past K' columns, and leave other slots alone. Catches a scatter that assumes a
    contiguous conf or writes whole K-wide rows from it."""
    R, max_reqs = 4, 9
    v = AdaptiveVerifier(table(), max_reqs=max_reqs, max_drafts=K, block_size=4)
    rng = np.random.default_rng(5)
    idx = np.array([7, 2, 5, 0])
    cases = [
        torch.from_numpy(rng.uniform(0.1, 0.9, (K, R)).astype(np.float32)).t(),  # [R, K], strides (1, R)
        torch.from_numpy(rng.uniform(0.1, 0.9, (R, K + 3)).astype(np.float32))[:, 1:4],  # [R, 3], strides (K + 3, 1)
        torch.from_numpy(rng.uniform(0.1, 0.9, (1, 2)).astype(np.float32)).expand(R, 2),  # strides (0, 1)
    ]
    for conf in cases:
        v.plan_budget(R, [K] * R, req_indices=idx)
        v.record_confidence(conf)  # slots: plan_budget's req_indices
        want = np.zeros((R, K), dtype=np.float32)
        want[:, :conf.shape[1]] = conf.numpy()
        assert np.array_equal(v.stale_confidence(idx), want), conf.stride()
        untouched = [i for i in range(max_reqs) if i not in idx]
        assert np.array_equal(v.stale_confidence(untouched), np.full((len(untouched), K), v.prior, dtype=np.float32))


def _lag_like_call(ct, R, capacity, conf, drafts, out, max_step_ms=None):
    """A prepared choose_budget call as AdaptiveVerifier's lagged budget makes it (global, conf=, out=)."""
    return av.prepare(av.choose_budget, None, drafts, ct, mode="global", capacity=capacity, conf=conf, out=out,
                      max_step_ms=max_step_ms)


@pytest.mark.parametrize("max_tokens", [1024, None])
def test_run_shifted_sets_what_a_run_on_the_view_sets(max_tokens):
    """PreparedPlan.run_shifted (the lagged budget's move to a new prompt chunk without a CostTable view or
    resolve_step) leaves the call exactly as run(cost_table=ct.shifted(s)) does: the same scalar struct fields (the
    pointers differ: each call has its own), the same cost values bit for bit, the same planner arguments, and a
    budget equal to a fresh public call's. It declines (False, launching nothing) where a run must decide: a call
    reading the base table's costs, a cap past the curve, a latency target. Catches a run_shifted that forgets a field
    or accepts a step it cannot price."""
    import ctypes

    pts = {1: 4.0, 16: 4.2, 64: 5.0, 256: 9.0, 1024: 30.0}
    ct = av.CostTable.from_points(pts, draft_ms=0.5, graph_sizes=[8, 16, 32, 64], max_tokens=max_tokens)
    cap = ct.token_limit if max_tokens is None else 1024
    R = 24
    rng = np.random.default_rng(8)
    conf = torch.from_numpy(rng.uniform(0.3, 0.99, (R, K)).astype(np.float32))
    drafts = torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32))
    outs = [torch.empty((), dtype=torch.int32) for _ in range(2)]
    a, b = (_lag_like_call(ct, R, cap, conf, drafts, o) for o in outs)
    assert not a.run_shifted(ct, 40, cap - 40)  # still on the base table's costs
    for call in (a, b):
        call.run(cost_table=ct.shifted(7), capacity=cap - 7)
    for s in [40, 41, 300, 299, 5, 900, 901, 1, 2]:
        view = ct.shifted(s)
        same_length = R + min(R * K, cap - s - R) + 1 == a.call.a.verify_cost.shape[0]  # i.e. the same B_max cap
        outs[0].fill_(-1)
        assert a.run_shifted(ct, s, cap - s) == same_length, s  # another cap: a run on the view
        if not same_length:  # what the verifier does then
            assert int(outs[0]) == -1, s  # (declined: nothing launched)
            a.run(cost_table=view, capacity=cap - s)
        b.run(cost_table=view, capacity=cap - s)
        for name, ctype in type(a.params)._fields_:  # every scalar field (pointers differ: each call has its own)
            if ctype is not ctypes.c_void_p and not name.startswith("_"):
                va, vb = getattr(a.params, name), getattr(b.params, name)
                if isinstance(va, ctypes.Array):  # (the depth fields: arrays compare by identity)
                    va, vb = list(va), list(vb)
                assert va == vb, (s, name)
        assert torch.equal(a.call.a.verify_cost, b.call.a.verify_cost), s
        for f in ("budget_cap", "num_tokens_padded", "draft_cost", "step_cap", "fixed_budget", "extra_tokens"):
            assert getattr(a.call.a, f) == getattr(b.call.a, f), (s, f)
        fresh = int(av.choose_budget(None, drafts.clone(), view, conf=conf.clone(), mode="global", capacity=cap - s))
        assert int(outs[0]) == int(outs[1]) == fresh, s
        assert int(a.run()) == fresh  # a plain run after run_shifted stays on that step's table
    if max_tokens is not None:
        assert not a.run_shifted(ct, 1010, 1024 - 1010)  # capacity below R: the run raises it
    capped = _lag_like_call(ct, R, cap, conf, drafts, torch.empty((), dtype=torch.int32), max_step_ms=50.0)
    capped.run(cost_table=ct.shifted(7), capacity=cap - 7)
    assert not capped.run_shifted(ct, 40, cap - 40)


def test_lagged_budgets_under_changing_prompt_chunks_equal_fresh_calls():
    """The verifier's lagged budget, moved from chunk to chunk in place (run_shifted), back to no chunk and back again,
    equals a fresh choose_budget on each step's stale confidences at that step's shifted table and capacity,
    clamped to the step's bounds. Catches a run_shifted left active after the call returned to the base table."""
    ct = table()
    R = 12
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4)
    rng = np.random.default_rng(11)
    idx = np.arange(R)
    for step in range(40):
        extra = [0, 30, 30, 31, 0, 0, 200, 7, 7, 0][step % 10] if step < 20 else int(rng.integers(0, 600))
        drafts = rng.integers(0, K + 1, R)
        stale = v.stale_confidence(idx)
        b, _ = v.plan_budget(R, drafts, extra, req_indices=idx)
        view = ct.shifted(extra) if extra else ct
        fresh = int(av.choose_budget(None, torch.from_numpy(drafts.astype(np.int32)), view,
                                     conf=torch.from_numpy(stale), mode="global", capacity=1024 - extra))
        room = min(int(drafts.sum()), 1024 - R - extra)
        assert b == min(fresh, room), (step, extra)
        v.record_confidence(torch.from_numpy(rng.uniform(0.05, 0.99, (R, K)).astype(np.float32)))


def test_views_of_evicted_buffer_sets_are_dropped(monkeypatch):
    """The views of an eager step (and the prepared planner calls) hold its buffer set's memory: when the buffer set leaves the LRU (here
    under churn of R, each R its own set), its views go too, so the views never keep more buffer sets alive than the
    LRU does. Catches a view cache that pins evicted buffers (CUDA memory in an engine)."""
    import gc
    import weakref

    from adaptive_verify import verifier as verifier_mod

    monkeypatch.setattr(verifier_mod, "PLAN_CACHE_SIZE", 3)
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=4)
    rng = np.random.default_rng(6)
    dead = []
    for R in range(4, 16):
        ctx, bt, anchors, dt = _plan_inputs(rng, R)
        conf = torch.from_numpy(rng.uniform(0.5, 0.99, (R, K)).astype(np.float32))
        d = torch.full((R,), K, dtype=torch.int32)
        for budget in (1, 2, 3):
            v.plan_budget(R, [K] * R, 70)
            v.record_confidence(conf)
            plan = v.plan(conf, d, ctx, bt, anchors, dt, budget, extra_tokens=70)
        dead.append(weakref.ref(plan.token_req.untyped_storage()))
        del plan
    gc.collect()
    alive = sum(ref() is not None for ref in dead)
    assert alive <= 3, alive  # the LRU's buffer sets, no more (their prepared calls and views go with them)


def test_record_confidence_refuses_a_sparse_conf_naming_it():
    """The CPU scatter reads conf through its strides: a sparse conf is a TypeError naming conf, not torch's
    NotImplementedError from index_put."""
    v = AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=4)
    v.plan_budget(2, [K, K])
    with pytest.raises(TypeError, match="conf must be a dense"):
        v.record_confidence(torch.ones(2, K).to_sparse())


def test_caller_tensors_of_another_layout_prepare_the_step_again(monkeypatch):
    """The verifier's prepared plan is bound to the layout of the caller's tensors: a step whose conf is a strided
    view, whose block table is wider, or whose drafts come as int64, prepares the call again and still equals a fresh
    planner call; switching back runs a prepared call again; a wrong type is refused by name, not run."""
    prepared = count_prepares(monkeypatch)
    ct = table()
    R = 9
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4)
    rng = np.random.default_rng(12)
    ctx, bt, anchors, dt = _plan_inputs(rng, R)
    wide_bt = torch.cat([bt, bt], dim=1)
    conf, d = torch.empty(R, K), torch.empty(R, dtype=torch.int32)
    wide_conf = torch.empty(R, 2 * K)
    for step, kind in enumerate(["plain", "plain", "strided", "wide table", "int64 drafts", "plain", "strided"]):
        drafts = _new_step(rng, conf, d)
        c, b_table, dd = conf, bt, d
        if kind == "strided":
            wide_conf[:, K:] = conf
            c = wide_conf[:, K:]  # [R, K] with strides (2K, 1)
        elif kind == "wide table":
            b_table = wide_bt
        elif kind == "int64 drafts":
            dd = d.long()
        b, padded = v.plan_budget(R, drafts)
        v.record_confidence(conf)
        plan = v.plan(c, dd, ctx, b_table, anchors, dt, b)
        ref = _reference_plan(ct, conf, d, b, 0, ctx, bt, anchors, dt, padded)
        for f in FIELDS:
            assert torch.equal(getattr(plan, f), getattr(ref, f)), (step, kind, f)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))
    plans = [op for op in prepared if op is av.plan_verification]
    assert 3 <= len(plans) <= 6, len(plans)  # plain, strided, wide table, int64 (copied: each time), not per step
    with pytest.raises(TypeError, match="drafts"):
        v.plan(conf, [K] * R, ctx, bt, anchors, dt, b)
