"""AdaptiveVerifier: cold start, lagged budgets across steps, requests joining and leaving, padded graph
sizes, modes, and metrics() against a slow recomputation."""
import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import AdaptiveVerifier

K = 5


def table(max_tokens=256):
    return av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 256: 9.0}, draft_ms=0.5,
                                    graph_sizes=[8, 16, 32, 64], max_tokens=max_tokens)


def step_inputs(rng, R):
    conf = torch.from_numpy(rng.uniform(0.05, 0.99, (R, K)).astype(np.float32))
    drafts = rng.integers(0, K + 1, R)
    return conf, drafts


def lagged_reference(ct, stale_conf, drafts, extra=0, capacity=256, min_verify=0):
    """The budget plan_budget must return, recomputed the slow way: the stale confidences of THIS step's
    requests (one row per request, the prior for new ones), priced at this step's R, drafts, prompt tokens
    and capacity."""
    d = torch.from_numpy(drafts.astype(np.int32))
    s = av.prefix_survival(stale_conf, d)
    tab = ct.shifted(extra) if extra else ct
    b = int(av.choose_budget(s, d, tab, mode="global", min_verify=min_verify, capacity=capacity - extra))
    b_min = int(np.minimum(drafts, min_verify).sum())
    b_max = max(b_min, min(int(drafts.sum()), capacity - len(drafts) - extra))
    return min(max(b, b_min), b_max)


def run_step(v, rng, R, extra=0):
    conf, drafts = step_inputs(rng, R)
    budget, padded = v.plan_budget(R, drafts, extra)
    v.record_confidence(conf)
    plan = v.plan(conf, torch.from_numpy(drafts.astype(np.int32)), budget=budget, extra_tokens=extra)
    vl = plan.verify_lens[:R]
    acc = torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32))
    acc = torch.minimum(acc, vl)
    v.observe(vl, acc)
    return conf, drafts, budget, padded, plan, acc


def test_cold_start_uses_the_prior_then_lagged_budgets_follow_each_requests_last_confidences():
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
    rng = np.random.default_rng(0)
    conf, drafts, budget, padded, plan, _ = run_step(v, rng, 6)
    assert budget == lagged_reference(ct, torch.ones(6, K), drafts)  # no history: prior 1.0 everywhere
    assert int(plan.budget) == budget
    assert padded == v.padded_tokens(6 + budget)
    table_rows = torch.ones(16, K)  # what each persistent slot (= row here) last recorded
    table_rows[:6] = conf
    budgets = []
    for R in (6, 9, 3, 12, 12, 1):  # requests join and leave (rows are slots: no req_indices)
        c2, d2 = step_inputs(rng, R)
        b, p = v.plan_budget(R, d2)
        assert b == lagged_reference(ct, table_rows[:R], d2), R
        assert p == v.padded_tokens(R + b)
        budgets.append(b)
        v.record_confidence(c2)
        table_rows[:R] = c2
        plan = v.plan(c2, torch.from_numpy(d2.astype(np.int32)), budget=b)
        assert int(plan.budget) == b and int(plan.verify_lens[:R].sum()) == b
        v.observe(plan.verify_lens[:R], torch.zeros(R, dtype=torch.int32))
    assert len(set(budgets)) > 1  # the budget really changes between steps


def test_lagged_budget_is_priced_at_the_current_step_when_a_request_joins():
    """The issue's example: 256 requests x 8 drafts, cost flat up to the 512-token graph and twice as much
    eager above. Steady state B = 256 (R + B = 512); when one request joins, pricing at the previous step's
    R gave B = 256 again (513 tokens: an eager step at 2x the cost); priced at this step's R it is 255."""
    ct = av.CostTable.from_points({1: 10.0, 512: 10.0, 513: 20.0, 1024: 60.0}, draft_ms=1.0,
                                  graph_sizes=[64, 128, 256, 512], max_tokens=4096)
    v = AdaptiveVerifier(ct, max_reqs=300, max_drafts=8, block_size=16)
    conf = torch.full((257, 8), 0.9)
    drafts = np.full(257, 8)
    for _ in range(3):
        b, padded = v.plan_budget(256, drafts[:256])
        v.record_confidence(conf[:256])
    assert (b, padded) == (256, 512)
    b, padded = v.plan_budget(257, drafts)  # request 257 joins with no history (prior 1.0)
    assert (b, padded) == (255, 512)
    v.record_confidence(conf)
    b, padded = v.plan_budget(255, drafts[:255])  # two leave: room for more drafts in the same graph
    assert (b, padded) == (257, 512)


def test_request_identity_permuting_the_batch_permutes_the_plan_and_nothing_else():
    """Engines reorder requests between steps: with req_indices the lagged budget and every plan are the same
    up to the permutation; a slot re-used by a new request (add_request) gets the prior."""
    ct = table()
    a = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
    b = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
    rng = np.random.default_rng(11)
    slots = np.array([3, 7, 0, 12, 5, 9, 14])
    for step in range(6):
        R = len(slots)
        conf, drafts = step_inputs(rng, R)
        perm = rng.permutation(R)
        ba, pa = a.plan_budget(R, drafts, req_indices=slots)
        bb, pb = b.plan_budget(R, drafts[perm], req_indices=slots[perm])
        assert (ba, pa) == (bb, pb), step
        a.record_confidence(conf)
        b.record_confidence(conf[torch.from_numpy(perm)])
        plan_a = a.plan(conf, torch.from_numpy(drafts.astype(np.int32)), budget=ba)
        plan_b = b.plan(conf[torch.from_numpy(perm)], torch.from_numpy(drafts[perm].astype(np.int32)), budget=bb)
        assert torch.equal(plan_a.verify_lens[:R][torch.from_numpy(perm)], plan_b.verify_lens[:R]), step
        for v, plan in ((a, plan_a), (b, plan_b)):
            v.observe(plan.verify_lens[:R], torch.zeros(R, dtype=torch.int32))
        if step == 2:  # one request leaves, a new one takes slot 7, another joins in slot 1
            for v in (a, b):
                v.add_request([7, 1])
            slots = np.array([3, 7, 0, 12, 5, 9, 1])
            stale = a.stale_confidence(slots)
            assert np.all(stale[[1, 6]] == 1.0) and not np.any(stale[[0, 2, 3, 4, 5]] == 1.0)
    assert a.metrics()["budget_mean"] == b.metrics()["budget_mean"]


def test_rows_without_req_indices_and_a_custom_prior():
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, prior=0.25)
    np.testing.assert_array_equal(v.stale_confidence([0, 5]), np.full((2, K), 0.25, dtype=np.float32))
    conf = torch.full((3, K), 0.5)
    v.plan_budget(3, [K] * 3)
    v.record_confidence(conf)
    stale = v.stale_confidence([0, 1, 2, 3])
    assert np.all(stale[:3] == 0.5) and np.all(stale[3] == 0.25)
    v.add_request(1)
    assert np.all(v.stale_confidence([1]) == 0.25)


def test_host_state_stays_bounded():
    """Per-step histories do not grow: plan buffers live in a bounded LRU, metrics keep running sums."""
    from adaptive_verify import verifier as verifier_mod

    ct = av.CostTable.from_points({1: 4.0, 4096: 40.0}, draft_ms=0.5, max_tokens=4096)  # eager only
    v = AdaptiveVerifier(ct, max_reqs=64, max_drafts=K, block_size=16)
    rng = np.random.default_rng(12)
    for step in range(200):
        R = int(rng.integers(1, 65))
        run_step(v, rng, R, extra=int(rng.integers(0, 500)))
    assert len(v._plans) <= verifier_mod.PLAN_CACHE_SIZE
    assert not hasattr(v, "_budgets")
    assert v.metrics()["steps"] == 200


def test_lagged_budget_with_prompt_tokens_uses_the_shifted_table():
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
    rng = np.random.default_rng(1)
    conf, drafts, *_ = run_step(v, rng, 8)
    d2 = rng.integers(0, K + 1, 8)
    b, padded = v.plan_budget(8, d2, extra_tokens=100)
    assert b == lagged_reference(ct, conf, d2, extra=100)
    assert padded == v.padded_tokens(8 + 100 + b)


def test_padded_tokens():
    v = AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=16, graph_sizes=[4, 8, 32])
    assert [v.padded_tokens(n) for n in (1, 4, 5, 8, 9, 32, 33, 100)] == [4, 4, 8, 8, 32, 32, 33, 100]
    assert AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=16).graph_sizes == (8, 16, 32, 64)


@pytest.mark.parametrize("mode", ["off", "all", "greedy", "global"])
def test_modes(mode):
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16, mode=mode, verification="onehot")
    rng = np.random.default_rng(2)
    for _ in range(3):
        conf, drafts, budget, _, plan, _ = run_step(v, rng, 7)
        d = torch.from_numpy(drafts.astype(np.int32))
        if mode == "off":
            assert budget == 0 and int(plan.verify_lens.sum()) == 0
        elif mode == "all":
            assert budget == drafts.sum() and torch.equal(plan.verify_lens[:7], d)
        else:
            ref = av.plan_verification(av.prefix_survival(conf, d), d, ct, mode=mode, verification="onehot")
            assert torch.equal(plan.verify_lens, ref.verify_lens) and budget == drafts.sum()


@pytest.mark.parametrize("mode", ["greedy", "global", "lagged"])
def test_prompt_tokens_are_priced_through_the_shifted_curve(mode):
    """A prompt chunk in the step prices drafts at their marginal time, cost_table.shifted(extra), not by
    putting the prompt's time into Theta (extra_tokens=extra), in the live modes and in the lagged budget. The
    curve makes the two differ, so the test can tell them apart."""
    ct = av.CostTable.from_points({1: 2.0, 128: 4.0, 256: 40.0}, draft_ms=0.5, max_tokens=256)
    rng = np.random.default_rng(9)
    R, extra = 12, 70
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, mode=mode, verification="onehot")
    conf, drafts = step_inputs(rng, R)
    drafts[:] = K
    budget, _ = v.plan_budget(R, drafts, extra)
    v.record_confidence(conf)
    d = torch.from_numpy(drafts.astype(np.int32))
    plan = v.plan(conf, d, budget=budget, extra_tokens=extra)
    s = av.prefix_survival(conf, d)
    shifted = av.plan_verification(s, d, ct.shifted(extra), mode="global" if mode == "lagged" else mode,
                                   capacity=256 - extra, verification="onehot")
    diluted = av.plan_verification(s, d, ct, mode="global" if mode == "lagged" else mode, extra_tokens=extra,
                                   capacity=256, verification="onehot")
    assert int(shifted.budget) != int(diluted.budget)
    if mode != "lagged":
        assert torch.equal(plan.verify_lens[:R], shifted.verify_lens)
    else:  # the first step's lagged budget ranks the prior (survival 1): every candidate that fits
        assert budget == lagged_reference(ct, torch.ones(R, K), drafts, extra=extra)
        conf2, _ = step_inputs(rng, R)
        b2, _ = v.plan_budget(R, drafts, extra)
        assert b2 == lagged_reference(ct, conf, drafts, extra=extra)


def test_metrics_against_a_slow_recomputation():
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
    rng = np.random.default_rng(3)
    verified = accepted = predicted = 0.0
    budgets, pads = [], []
    Rs = [5, 9, 9, 2, 14, 7, 7, 11, 3, 16]
    for R in Rs:
        conf, drafts, budget, padded, plan, acc = run_step(v, rng, R)
        vl = plan.verify_lens[:R].numpy()
        verified += vl.sum()
        accepted += np.minimum(acc.numpy(), vl).sum()
        # P(B): survival of the verified candidates, which are each request's first vl[r] drafts
        s = av.prefix_survival(conf, torch.from_numpy(drafts.astype(np.int32))).numpy()
        predicted += sum(s[r, :vl[r]].sum() for r in range(R))
        budgets.append(budget)
        pads.append(padded)
    m = v.metrics()
    n = len(Rs)
    assert m["steps"] == n and m["budget_last"] == budgets[-1]
    assert m["budget_mean"] == pytest.approx(np.mean(budgets))
    assert m["verified_per_step"] == pytest.approx(verified / n)
    assert m["accepted_per_step"] == pytest.approx(accepted / n)
    assert m["predicted_accepted_per_step"] == pytest.approx(predicted / n, rel=1e-5)
    assert m["acceptance_rate"] == pytest.approx(accepted / verified)
    assert m["graph_use"] == {p: pads.count(p) for p in sorted(set(pads))}
    assert m["ece"] == v.stats.report()["ece_overall"]


def test_metadata_and_persistent_buffers():
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=4)
    rng = np.random.default_rng(4)
    R = 3
    ctx = torch.tensor([5, 9, 2], dtype=torch.int32)
    bt = torch.arange(R * 8, dtype=torch.int32).reshape(R, 8)
    anchors = torch.tensor([7, 8, 9], dtype=torch.int32)
    dt = torch.from_numpy(rng.integers(0, 100, (R, K)).astype(np.int32))
    plans = []
    for _ in range(2):
        conf, drafts = step_inputs(rng, R)
        d = torch.from_numpy(drafts.astype(np.int32))
        b, padded = v.plan_budget(R, drafts)
        v.record_confidence(conf)
        plan = v.plan(conf, d, ctx, bt, anchors, dt, b, padded_tokens=16)
        ref = av.plan_verification(av.prefix_survival(conf, d), d, ct, mode="fixed", budget=b, context_lens=ctx,
                                   block_table=bt, block_size=4, anchor_tokens=anchors, draft_tokens=dt,
                                   num_tokens_padded=16, capacity=ct.max_tokens)
        for f in ("verify_lens", "query_start_loc", "seq_lens", "positions", "slot_mapping", "input_ids", "token_req"):
            assert torch.equal(getattr(plan, f), getattr(ref, f)), f
        plans.append(plan)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))
    assert plans[0].slot_mapping.data_ptr() == plans[1].slot_mapping.data_ptr()  # same buffers, graph-safe


def test_online_calibration_refreshes_temperatures():
    v = AdaptiveVerifier(table(), max_reqs=32, max_drafts=K, block_size=16, online_calibration=True,
                         refresh_every=5)
    assert torch.equal(v.temperatures, torch.ones(K))
    rng = np.random.default_rng(5)
    for _ in range(10):
        R = 32
        conf = torch.full((R, K), 0.95)  # overconfident: half of the drafts survive
        drafts = np.full(R, K)
        b, _ = v.plan_budget(R, drafts)
        v.record_confidence(conf)
        plan = v.plan(conf, torch.from_numpy(drafts.astype(np.int32)), budget=b)
        acc = torch.from_numpy((rng.random((R, K)) < 0.5).cumprod(1).sum(1).astype(np.int32))
        v.observe(plan.verify_lens, torch.minimum(acc, plan.verify_lens))
    assert v.sts.refreshes == 2 and float(v.temperatures[0]) > 1.5


def test_errors():
    ct = table()
    with pytest.raises(ValueError, match="mode"):
        AdaptiveVerifier(ct, max_reqs=4, max_drafts=K, block_size=16, mode="fast")
    with pytest.raises(TypeError, match="cost_table"):
        AdaptiveVerifier({1: 2.0}, max_reqs=4, max_drafts=K, block_size=16)
    with pytest.raises(ValueError, match="max_reqs"):
        AdaptiveVerifier(ct, max_reqs=0, max_drafts=K, block_size=16)
    with pytest.raises(ValueError, match="graph_sizes"):
        AdaptiveVerifier(ct, max_reqs=4, max_drafts=K, block_size=16, graph_sizes=[8, 4])
    with pytest.raises(ValueError, match="^max_drafts must be <= 32"):  # the planner's K limit, at construction
        AdaptiveVerifier(ct, max_reqs=4, max_drafts=64, block_size=16)
    with pytest.raises(ValueError, match="^prior"):
        AdaptiveVerifier(ct, max_reqs=4, max_drafts=K, block_size=16, prior=1.5)
    with pytest.raises(ValueError, match="^verification"):
        AdaptiveVerifier(ct, max_reqs=4, max_drafts=K, block_size=16, verification="q")
    v = AdaptiveVerifier(ct, max_reqs=4, max_drafts=K, block_size=16)
    with pytest.raises(ValueError, match="num_reqs 5 exceeds max_reqs"):
        v.plan_budget(5, [1] * 5)
    with pytest.raises(ValueError, match="drafts_host must have num_reqs = 3"):
        v.plan_budget(3, [1, 2])
    with pytest.raises(ValueError, match="drafts_host values"):
        v.plan_budget(2, [1, K + 1])
    with pytest.raises(ValueError, match="exceeds the capacity"):
        v.plan_budget(2, [1, 1], extra_tokens=255)
    with pytest.raises(RuntimeError, match="observe"):
        v.observe(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="budget is required"):
        v.plan(torch.rand(2, K), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="conf"):
        v.record_confidence(torch.rand(2, K, dtype=torch.float64))
    with pytest.raises(ValueError, match="^req_indices must lie"):
        v.plan_budget(2, [1, 1], req_indices=[0, 4])
    with pytest.raises(ValueError, match="^req_indices must be distinct"):
        v.plan_budget(2, [1, 1], req_indices=[2, 2])
    with pytest.raises(ValueError, match="^req_indices must have num_reqs = 2"):
        v.plan_budget(2, [1, 1], req_indices=[2])
    with pytest.raises(TypeError, match="^req_indices must hold integers"):
        v.plan_budget(2, [1, 1], req_indices=[0.0, 1.0])
    with pytest.raises(ValueError, match="^req_indices must lie"):
        v.add_request(9)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    ct = table()
    vs = [AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, device=d) for d in ("cpu", "cuda")]
    rng = np.random.default_rng(6)
    for R in (5, 9, 16, 2):
        conf, drafts = step_inputs(rng, R)
        out = []
        for v in vs:
            b, p = v.plan_budget(R, drafts)
            c = conf.to(v.device)
            v.record_confidence(c)
            plan = v.plan(c, torch.from_numpy(drafts.astype(np.int32)).to(v.device), budget=b)
            v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32, device=v.device))
            out.append((b, p, plan.verify_lens.cpu()))
        assert out[0][:2] == out[1][:2] and torch.equal(out[0][2], out[1][2])


def test_tensor_budget_for_cuda_graphs():
    """A 0-d tensor budget (what a captured graph reads at replay) plans exactly like the int."""
    ct = table()
    rng = np.random.default_rng(8)
    conf, drafts = step_inputs(rng, 6)
    d = torch.from_numpy(drafts.astype(np.int32))
    a = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16)
    b = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16)
    budget = int(drafts.sum()) // 2
    p1 = a.plan(conf, d, budget=budget, padded_tokens=32)
    p2 = b.plan(conf, d, budget=torch.tensor(budget, dtype=torch.int32), padded_tokens=32)
    assert torch.equal(p1.verify_lens, p2.verify_lens) and int(p2.budget) == budget
    with pytest.raises(ValueError, match="padded_tokens is required"):
        b.plan(conf, d, budget=torch.tensor(budget, dtype=torch.int32))
    with pytest.raises(ValueError, match="0-d"):
        b.plan(conf, d, budget=torch.tensor([budget]), padded_tokens=32)


def test_review_edge_cases():
    """Forced drafts past the capacity, fewer confidence columns than max_drafts, metadata appearing
    on a reused key, and an empty step."""
    ct = av.CostTable.from_points({1: 4.0, 16: 5.0}, draft_ms=0.5, graph_sizes=[8, 16], max_tokens=16)
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16, mode="all", min_verify=2)
    drafts = np.full(8, K)
    b, padded = v.plan_budget(8, drafts)
    assert b == 8 and padded == 16  # room for 8 drafts only, even though 16 are forced
    conf = torch.rand(8, K)
    v.record_confidence(conf)
    plan = v.plan(conf, torch.from_numpy(drafts.astype(np.int32)), budget=b)
    assert int(plan.budget) == b
    v2 = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=4)
    conf3 = torch.rand(3, 3)  # K' = 3 < max_drafts
    d3 = torch.tensor([3, 1, 2], dtype=torch.int32)
    b3, p3 = v2.plan_budget(3, d3.numpy())
    v2.record_confidence(conf3)
    plain = v2.plan(conf3, d3, budget=b3, padded_tokens=16)
    with_meta = v2.plan(conf3, d3, torch.tensor([4, 4, 4], dtype=torch.int32),
                        torch.arange(12, dtype=torch.int32).reshape(3, 4), budget=b3, padded_tokens=16)
    assert plain.positions is None and with_meta.positions is not None and with_meta.slot_mapping is not None
    assert v2.plan_budget(0, []) == (0, 0)


def test_a_loop_under_inference_mode():
    """Engines run under torch.inference_mode (tensors without version counters, no autograd): a whole loop of
    verifier steps works there and matches the same loop outside it."""
    def loop():
        v = AdaptiveVerifier(table(), max_reqs=16, max_drafts=K, block_size=16, online_calibration=True)
        rng = np.random.default_rng(4)
        return [run_step(v, rng, 9, extra=step % 3)[4].verify_lens.clone() for step in range(4)]

    plain = loop()
    with torch.inference_mode():
        inside = loop()
    for a, b in zip(plain, inside):
        assert torch.equal(a, b)


def test_bad_arguments_are_value_or_type_errors_naming_them():
    """Issue 16, finding 7: conf=None or a 0-d tensor raised AttributeError / IndexError, a negative padded size
    torch's RuntimeError, observe() with lists AttributeError, a meta device NotImplementedError, drafts of 2**70
    OverflowError. Each is now a ValueError or TypeError whose message starts with the argument's name."""
    ct = table()
    kw = dict(max_reqs=4, max_drafts=K, block_size=16)
    for device, exc in (("meta", ValueError), ("foo", ValueError), ("cuda:7", ValueError), (1.5, TypeError)):
        with pytest.raises(exc, match="^device"):
            AdaptiveVerifier(ct, **kw, device=device)
    for name, value, exc in (("graph_sizes", 8, TypeError), ("graph_sizes", range(1, 10**9), ValueError),
                             ("refresh_every", 0, ValueError), ("online_calibration", "yes", TypeError),
                             ("mode", np.array(["all"]), ValueError), ("verification", ["onehot"], ValueError)):
        with pytest.raises(exc, match=f"^{name}"):
            AdaptiveVerifier(ct, **kw, **{name: value})
    v = AdaptiveVerifier(ct, **kw)
    drafts = torch.ones(2, dtype=torch.int32)
    v.plan_budget(2, [1, 1])
    for conf, exc in ((None, TypeError), ("conf", TypeError), (torch.tensor(1.0), ValueError)):
        with pytest.raises(exc, match="^conf"):
            v.plan(conf, drafts, budget=0)
        with pytest.raises(exc, match="^conf"):
            v.record_confidence(conf)
    for padded in (-5, 1):
        with pytest.raises(ValueError, match="^padded_tokens must be >= 2"):
            v.plan(torch.rand(2, K), drafts, budget=0, padded_tokens=padded)
    with pytest.raises(ValueError, match="^padded_tokens must be <= 256"):  # at most the capacity: bounded buffers
        v.plan(torch.rand(2, K), drafts, budget=0, padded_tokens=2**31 - 1)
    with pytest.raises(TypeError, match="^drafts_host must hold integers"):
        v.plan_budget(2, [2**70, 1])
    conf = torch.rand(2, K)
    v.record_confidence(conf)
    plan = v.plan(conf, drafts, budget=1)
    for bad, exc, name in (([1, 1], TypeError, "verify_lens"), (torch.tensor(1, dtype=torch.int32), ValueError,
                                                                 "verify_lens"),
                           (plan.verify_lens.float(), TypeError, "verify_lens"),
                           (plan.verify_lens[:1], ValueError, "verify_lens")):
        with pytest.raises(exc, match=f"^{name}"):
            v.observe(bad, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="^num_accepted"):
        v.observe(plan.verify_lens, [0, 0])


def test_a_step_of_prompt_tokens_only_may_fill_the_capacity():
    """Found by fuzzing: with no decode row (R = 0), plan_budget accepts extra_tokens up to the capacity, and
    plan() then asked for a shifted view with no room left (ValueError naming `tokens`, not an argument)."""
    v = AdaptiveVerifier(table(max_tokens=64), max_reqs=4, max_drafts=K, block_size=16, mode="greedy")
    budget, padded = v.plan_budget(0, [], extra_tokens=64)
    conf, drafts = torch.zeros(0, K), torch.zeros(0, dtype=torch.int32)
    v.record_confidence(conf)
    plan = v.plan(conf, drafts, budget=budget, extra_tokens=64)
    assert int(plan.budget) == 0 and int(plan.num_tokens) == 0


def test_eager_steps_share_one_buffer_set_and_one_prepared_planner_call(monkeypatch):
    """Above the largest graph size the padded size follows the budget; every such step of R requests writes one
    buffer set (views of its first R + B entries come back), so the planner never revalidates for a new size, and
    each plan equals a fresh planner call."""
    import adaptive_verify.verifier_chain as chain_mod

    prepared = []
    monkeypatch.setattr(chain_mod, "prepare", lambda *a, **k: prepared.append(a[0]) or av.prepare(*a, **k))

    ct = av.CostTable.from_points({1: 4.0, 64: 5.0, 1024: 30.0}, draft_ms=0.5, graph_sizes=[8, 16], max_tokens=1024)
    R = 24
    v = AdaptiveVerifier(ct, max_reqs=R, max_drafts=K, block_size=4)
    rng = np.random.default_rng(21)
    ctx = torch.from_numpy(rng.integers(0, 50, R).astype(np.int32))
    bt = torch.arange(R * 16, dtype=torch.int32).reshape(R, 16)
    anchors = torch.from_numpy(rng.integers(0, 100, R).astype(np.int32))
    dt = torch.from_numpy(rng.integers(0, 100, (R, K)).astype(np.int32))
    pointers, sizes = set(), set()
    conf_buf, d = torch.empty(R, K), torch.empty(R, dtype=torch.int32)  # an engine's persistent inputs
    for step in range(12):
        conf, drafts = step_inputs(rng, R)
        conf_buf.copy_(conf)
        d.copy_(torch.from_numpy(drafts))
        conf = conf_buf
        extra = int(rng.integers(0, 200))
        b, padded = v.plan_budget(R, drafts, extra)
        v.record_confidence(conf)
        b = max(0, b - step % 3)  # a budget the caller changed: a new size each step
        plan = v.plan(conf, d, ctx, bt, anchors, dt, b, extra_tokens=extra)
        ref = av.plan_verification(av.prefix_survival(conf, d), d, ct.shifted(extra) if extra else ct, mode="fixed",
                                   budget=b, context_lens=ctx, block_table=bt, block_size=4, anchor_tokens=anchors,
                                   draft_tokens=dt, num_tokens_padded=R + b, capacity=ct.max_tokens - extra)
        for f in ("verify_lens", "budget", "num_tokens", "query_start_loc", "seq_lens", "positions", "slot_mapping",
                  "input_ids", "token_req"):
            assert torch.equal(getattr(plan, f), getattr(ref, f)), f
        assert plan.token_req.shape == (R + b,)
        pointers.add(plan.token_req.data_ptr())
        sizes.add(R + b)
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32))
    assert len(sizes) > 3 and len(pointers) == 1  # many sizes, one buffer
    assert prepared[0] is av.plan_verification and prepared[1] == v.stats.update and len(prepared) == 2  # once each


def test_a_new_slot_after_the_snapshot_reads_as_the_prior():
    """add_request between record_confidence and the next plan_budget: the slot's snapshot row belongs to its
    previous request, so the lagged budget must rank the prior for it (and keep every other slot's row)."""
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, prior=0.5)
    conf = torch.full((4, K), 0.9)
    v.plan_budget(4, [K] * 4)
    v.record_confidence(conf)
    assert np.allclose(v.stale_confidence([0, 1, 2, 3]), 0.9)
    v.add_request(2)
    stale = v.stale_confidence([0, 1, 2, 3])
    assert np.allclose(stale[[0, 1, 3]], 0.9) and np.allclose(stale[2], 0.5)
    v.plan_budget(4, [K] * 4)
    v.record_confidence(conf)  # the slot's first confidences arrive
    assert np.allclose(v.stale_confidence([0, 1, 2, 3]), 0.9)


def test_weighted_lagged_budget_is_the_weighted_argmax_on_the_stale_confidences():
    """plan_budget(weights=) (host priorities): the budget is choose_budget's weighted argmax on each slot's last
    confidences, priced at this step; weights that favour the confident requests buy a budget no smaller than
    weights that favour the doubtful ones, and unit weights are the unweighted budget."""
    ct = table()
    rng = np.random.default_rng(11)
    for trial in range(6):
        v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
        R, extra = 7, int(rng.integers(0, 40))
        conf, drafts = step_inputs(rng, R)
        v.plan_budget(R, drafts)
        v.record_confidence(conf)  # the next step ranks these
        w = rng.uniform(0.2, 5.0, R).astype(np.float32)
        for weights in (w, w.tolist(), torch.from_numpy(w)):  # any host form
            got, _ = v.plan_budget(R, drafts, extra, weights=weights)
            d = torch.from_numpy(drafts.astype(np.int32))
            tab = ct.shifted(extra) if extra else ct
            want = int(av.choose_budget(av.prefix_survival(conf, d), d, tab, mode="global", capacity=256 - extra,
                                        weights=torch.from_numpy(w)))
            assert got == min(want, int(drafts.sum()), 256 - R - extra), trial
        ones, _ = v.plan_budget(R, drafts, extra, weights=np.ones(R))
        assert ones == v.plan_budget(R, drafts, extra)[0]
    with pytest.raises(ValueError, match="weights"):
        v.plan_budget(R, drafts, weights=np.ones(R + 1))
    with pytest.raises(TypeError, match="weights"):
        v.plan_budget(R, drafts, weights=["a"] * R)
    with pytest.raises(ValueError, match="weights"):  # an unusable weight is refused, naming it
        v.plan_budget(R, drafts, weights=[float("nan")] + [1.0] * (R - 1))
    live = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, mode="greedy")
    with pytest.raises(ValueError, match="weights"):  # in every mode, though only "lagged" weighs on the host
        live.plan_budget(R, drafts, weights=[-1.0] * R)
    strided = np.ones(2 * R, dtype=np.float32)[::-2]  # any host layout
    assert v.plan_budget(R, drafts, weights=strided) == v.plan_budget(R, drafts)


def test_max_step_ms_may_change_between_steps():
    """verifier.max_step_ms is the step-time target the next plan_budget and plan read (an SLO that moves): a
    tighter target never raises the budget, removing it restores the untargeted budget, and a bad value is
    refused naming it."""
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, mode="all")
    drafts = np.full(12, K)
    free, _ = v.plan_budget(12, drafts)
    budgets = []
    for ms in (9.0, 6.0, 5.0, 4.6):
        v.max_step_ms = ms
        b, _ = v.plan_budget(12, drafts)
        assert ct.fixed_cost(12) + ct.verify_cost(12 + b) <= ms + 1e-9 or b == 0
        budgets.append(b)
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]
    v.max_step_ms = None
    assert v.plan_budget(12, drafts)[0] == free
    for bad in (0.0, -1.0, float("nan"), "5"):
        with pytest.raises((ValueError, TypeError), match="max_step_ms"):
            v.max_step_ms = bad


def test_lagged_budget_is_the_one_decision_plan_budget_makes():
    """av.lagged_budget (what the vLLM adapter calls) is plan_budget's lagged decision: on the same stale
    confidences, drafts, prompt tokens and weights they agree; "fixed" prompt pricing is choose_budget with the
    prompt as extra_tokens, "marginal" the shifted table within the capacity the prompt leaves."""
    ct = table()
    rng = np.random.default_rng(5)
    for trial in range(8):
        R, extra = int(rng.integers(1, 13)), int(rng.integers(0, 60))
        v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)
        conf, drafts = step_inputs(rng, R)
        v.plan_budget(R, drafts)
        v.record_confidence(conf)
        conf2, drafts2 = step_inputs(rng, R)  # this step's drafts; the budget ranks last step's confidences
        w = rng.uniform(0.5, 3.0, R).astype(np.float32) if trial % 2 else None
        got, _ = v.plan_budget(R, drafts2, extra, weights=w)
        d = torch.from_numpy(drafts2.astype(np.int32))
        wt = None if w is None else torch.from_numpy(w)
        assert got == av.lagged_budget(conf, d, ct, prompt_tokens=extra, weights=wt), trial
        fixed = av.lagged_budget(conf, d, ct, prompt_tokens=extra, prompt_pricing="fixed", weights=wt)
        assert fixed == int(av.choose_budget(av.prefix_survival(conf, d), d, ct, mode="global", extra_tokens=extra,
                                             weights=wt)), trial
    with pytest.raises(ValueError, match="prompt_pricing"):
        av.lagged_budget(conf, d, ct, prompt_pricing="extra")
    with pytest.raises(ValueError, match="prompt_tokens"):
        av.lagged_budget(conf, d, ct, prompt_tokens=-1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        av.lagged_budget(conf, d, ct, prompt_tokens=300)  # past the table's max_tokens (256)
    with pytest.raises(TypeError, match="cost_table"):
        av.lagged_budget(conf, d, None, prompt_tokens=3)


def test_a_latency_target_set_between_steps_with_prompt_chunks_binds_the_lagged_budget():
    """Steps that all carry prompt chunks keep the lagged budget on its remembered call; a target set (or changed,
    or removed) between them must reach that call: each step's budget equals that of a verifier built with the
    target. (Confident drafts and a cost cliff past 16 tokens: without a target the budget verifies all 40.)"""
    ct = av.CostTable.from_points({1: 4.0, 16: 4.2, 17: 12.0, 256: 12.4}, draft_ms=0.5, max_tokens=256)
    R = 8
    conf = torch.full((R, K), 0.97)
    drafts = np.full(R, K)
    extras = (2, 3, 3, 2, 3, 4, 2)
    targets = (None, None, 12.53, 12.53, 12.6, None, None)

    def budgets(verifier_for_step):
        out = []
        for i, extra in enumerate(extras):
            v = verifier_for_step(i)
            out.append(v.plan_budget(R, drafts, extra)[0])
            v.record_confidence(conf)
        return out

    late = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16)

    def set_late(i):
        late.max_step_ms = targets[i]
        return late

    built = {}

    def built_with(i):  # a verifier constructed with the target, fed the same history
        t = targets[i]
        if t not in built:
            built[t] = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, max_step_ms=t)
            built[t].plan_budget(R, drafts, 1)
            built[t].record_confidence(conf)
        return built[t]

    got, want = budgets(set_late), budgets(built_with)
    assert got == want, (got, want)
    assert got[1] == R * K and got[2] < R * K and got[5] == R * K  # the target binds, and lets go when removed
