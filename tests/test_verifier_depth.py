"""AdaptiveVerifier.plan_draft: the draft depth and the budget on the host before drafting (docs/design.md, "Drafting
from the budget"), the loop an engine with a level-by-level drafter runs."""
import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import AdaptiveVerifier
from adaptive_verify import reference as ref
from adaptive_verify.verifier_chain import DEPTH_CONF_WEIGHT, DEPTH_DECAY, DEPTH_PRIOR_TRIALS

K = 6


def table(level_ms=0.6):
    return av.CostTable.from_points({1: 5.0, 64: 5.2, 256: 6.0, 1024: 9.0}, {1: 0.6 + (K - 1) * level_ms},
                                    graph_sizes=(8, 16, 32, 64, 128, 256), max_tokens=1024, draft_levels=K,
                                    draft_level_ms=level_ms)


def step(v, rng, R, accept_p, *, idx=None):
    """One engine step: plan_draft, draft `depth` levels (conf [R, depth]), record, plan, accept each verified draft
    with probability accept_p[j] in order, observe. Returns (depth, budget, verify_lens)."""
    depth, budget, padded = v.plan_draft(R, np.full(R, K), req_indices=idx)
    if depth == 0:
        return depth, budget, np.zeros(R, dtype=np.int64)
    conf = torch.from_numpy(np.tile(accept_p[:depth], (R, 1)).astype(np.float32))
    drafts = torch.full((R,), depth, dtype=torch.int32)
    v.record_confidence(conf, req_indices=idx)
    plan = v.plan(conf, drafts, budget=budget)
    lens = plan.verify_lens[:R].numpy().astype(np.int64)
    ok = rng.random((R, depth)) < accept_p[None, :depth]
    ok &= np.arange(depth)[None, :] < lens[:, None]
    accepted = np.where(ok.all(1), depth, np.argmin(ok, 1))
    v.observe(plan.verify_lens, torch.from_numpy(np.minimum(accepted, lens).astype(np.int32)))
    verified = int(plan.verify_lens.sum())  # the live modes choose on the device, within the host's B_max
    assert (verified <= budget if v.mode in ("greedy", "global") else verified == budget) and budget <= R * depth
    assert padded >= R + budget
    return depth, budget, lens


def test_the_decision_is_choose_draft_depth_on_the_predicted_confidences():
    """plan_draft equals choose_draft_depth on (last recorded confidence x DEPTH_CONF_WEIGHT + the statistics'
    acceptance x the rest), the statistics' alone past the recorded width, priced on the shifted table; the statistics'
    acceptance from the counts each call saw, decayed by DEPTH_DECAY per call and shrunk by DEPTH_PRIOR_TRIALS."""
    ct = table()
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16)
    rng = np.random.default_rng(0)
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    counts_seen, last = [], (np.zeros(K), np.zeros(K))
    for _ in range(5):
        now = (v.stats.trials.sum(1).numpy()[:K].astype(np.float64), v.stats.survivals.sum(1).numpy()[:K] * 1.0)
        counts_seen.append((now[0] - last[0], now[1] - last[1]))
        last = now
        step(v, rng, 8, p)
    now = (v.stats.trials.sum(1).numpy()[:K].astype(np.float64), v.stats.survivals.sum(1).numpy()[:K] * 1.0)
    counts_seen.append((now[0] - last[0], now[1] - last[1]))
    last = v._chain.last_width
    stale = v.stale_confidence(np.arange(8)).astype(np.float64)
    trials, surv = np.zeros(K), np.zeros(K)  # the counts each plan_draft saw, decayed per call
    for t, s in counts_seen:
        trials, surv = trials * DEPTH_DECAY + t, surv * DEPTH_DECAY + s
    rates, mean = [], 1.0
    for j in range(K):
        mean = (surv[j] + DEPTH_PRIOR_TRIALS * mean) / (trials[j] + DEPTH_PRIOR_TRIALS)
        rates.append(mean)
    rates = np.array(rates)
    pred = DEPTH_CONF_WEIGHT * stale + (1 - DEPTH_CONF_WEIGHT) * rates
    pred[:, last:] = rates[last:]
    pred = torch.from_numpy(pred.astype(np.float32))
    depth, budget, _ = v.plan_draft(8, np.full(8, K), extra_tokens=40)
    d_ref, b_ref, _ = ref.choose_draft_depth(None, torch.full((8,), K, dtype=torch.int32), ct.shifted(40),
                                             conf=pred, capacity=1024 - 40)
    assert (depth, budget) == (int(d_ref), int(b_ref))


def test_depth_shrinks_when_acceptance_falls_and_grows_again_when_it_rises():
    v = AdaptiveVerifier(table(0.3), max_reqs=32, max_drafts=K, block_size=16)
    rng = np.random.default_rng(1)
    high, low = np.full(K, 0.9), np.full(K, 0.15)
    depths = [step(v, rng, 32, high)[0] for _ in range(30)]
    assert np.mean(depths[-10:]) >= 4, depths
    depths = [step(v, rng, 32, low)[0] for _ in range(100)]
    assert np.mean(depths[-10:]) <= 2.5, depths  # (the decayed counts still remember some of the good steps)
    depths = [step(v, rng, 32, high)[0] for _ in range(80)]
    assert np.mean(depths[-10:]) >= 4, depths  # the statistics' acceptance pulls the unmeasured levels back


def test_modes_and_metrics():
    rng = np.random.default_rng(2)
    p = np.full(K, 0.8)
    for mode in ("lagged", "greedy", "global", "all", "off"):
        v = AdaptiveVerifier(table(), max_reqs=16, max_drafts=K, block_size=16, mode=mode, verification="onehot")
        for _ in range(4):
            depth, budget, lens = step(v, rng, 16, p)
        if mode == "off":
            assert (depth, budget) == (0, 0)
        if mode == "all":
            assert depth == K and budget == 16 * K
        if mode in ("greedy", "global"):  # the live budget is planned on the device: the host gives B_max at depth
            assert budget >= int(lens.sum())
        assert v.metrics()["depth_mean"] == pytest.approx(v._depth_sum / v._depth_count)


def test_request_identity_and_errors():
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16)
    rng = np.random.default_rng(3)
    step(v, rng, 4, np.full(K, 0.7), idx=np.array([5, 2, 7, 0]))
    with pytest.raises(ValueError, match="num_reqs"):
        v.plan_draft(9)
    with pytest.raises(ValueError, match="drafts_host"):
        v.plan_draft(2, [K + 1, 0])
    with pytest.raises(ValueError, match="req_indices"):
        v.plan_draft(2, req_indices=[1, 1])
    with pytest.raises(ValueError, match="weights"):
        v.plan_draft(2, weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="capacity"):
        v.plan_draft(2, extra_tokens=1023)
    assert v.plan_draft(0) == (0, 0, 0)


def test_drafting_the_planned_depth_is_lossless():
    """The loop of an engine with a level-by-level drafter, verified against draft probabilities (the strict case:
    docs/design.md, "When is which mode lossless"): each step plan_draft decides the depth and the budget from earlier
    steps, the drafter samples that many levels from Q, the planner allocates the budget on the live confidences
    (each a function of the tokens before its draft only), rejection_sample verifies against P. The emitted tokens
    must be a Markov chain with P's transitions: a chi-square test per context, with the depth really varying."""
    from scipy.stats import chisquare
    V, R, steps = 4, 8, 500
    P = np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.05, 0.05, 0.1, 0.8]])
    Q = np.array([[0.6, 0.2, 0.1, 0.1], [0.2, 0.4, 0.3, 0.1], [0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.1, 0.7]])
    C = np.array([0.7, 0.5, 0.25, 0.8], dtype=np.float32)  # the head: a confidence per context token
    rng = np.random.default_rng(4)
    torch.manual_seed(4)
    v = AdaptiveVerifier(table(0.8), max_reqs=R, max_drafts=K, block_size=16, verification="probs")
    last = rng.integers(0, V, R)
    counts = np.zeros((V, V), dtype=np.int64)
    depths = []
    logP, temperature = torch.from_numpy(np.log(P).astype(np.float32)), torch.ones(R)
    for _ in range(steps):
        depth, budget, _ = v.plan_draft(R)
        depths.append(depth)
        D = max(depth, 1)  # (depth 0: no drafts; the step still emits one target sample per request)
        tokens = np.zeros((R, D), dtype=np.int64)
        ctx = np.zeros((R, D + 1), dtype=np.int64)  # ctx[:, j]: the token draft j (or the bonus at j) follows
        ctx[:, 0] = last
        for j in range(D):
            tokens[:, j] = [rng.choice(V, p=Q[c]) for c in ctx[:, j]]
            ctx[:, j + 1] = tokens[:, j]
        if depth:
            conf = torch.from_numpy(C[ctx[:, :depth]])
            v.record_confidence(conf)
            plan = v.plan(conf, torch.full((R,), depth, dtype=torch.int32), budget=budget)
            lens = plan.verify_lens[:R].long()
        else:
            lens = torch.zeros(R, dtype=torch.long)
        qsl = torch.zeros(R + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(lens + 1, 0)
        rows = torch.cat([torch.from_numpy(ctx[r, :int(lens[r]) + 1]) for r in range(R)])
        probs = torch.from_numpy(Q[ctx[:, :D]].astype(np.float32))  # [R, D, V]
        out, emitted = av.rejection_sample(logP[rows], qsl, torch.from_numpy(tokens).int(), draft_probs=probs,
                                           temperature=temperature)[:2]
        for r in range(R):
            for t in out[r, :int(emitted[r])].tolist():
                counts[last[r], t] += 1
                last[r] = t
        if depth:
            v.observe(plan.verify_lens, emitted - 1)
    assert len(set(depths)) >= 2 and max(depths) >= 2, sorted(set(depths))
    for c in range(V):
        n = counts[c].sum()
        assert n > 300, (c, n)
        assert chisquare(counts[c], n * P[c]).pvalue > 1e-4, (c, counts[c], n * P[c])


def test_a_step_that_drafts_nothing_records_no_columns():
    """Depth 0: the engine records conf [R, 0] and observes as every step; the next decision takes every position
    from the statistics (nothing of the last step to blend)."""
    v = AdaptiveVerifier(table(), max_reqs=4, max_drafts=K, block_size=16, mode="off")
    assert v.plan_draft(4)[:2] == (0, 0)
    conf = torch.rand(4, K)
    v.record_confidence(conf[:, :0])
    plan = v.plan(conf, torch.zeros(4, dtype=torch.int32), budget=0)
    v.observe(plan.verify_lens, torch.zeros(4, dtype=torch.int32))
    assert v._chain.last_width == 0 and v.metrics()["steps"] == 1
    v.mode = "lagged"
    depth, budget, _ = v.plan_draft(4)
    assert depth == K and budget == 4 * K  # the prior (1.0) everywhere: every level pays
