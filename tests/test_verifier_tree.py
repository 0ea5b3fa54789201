"""AdaptiveVerifier over draft trees (verifier_tree.py): plans in every mode are plan_tree_verification's, a chain
given as a tree is planned, budgeted and counted exactly as the chain, the lagged node budget is the global budget
of each slot's last tree priced at the current step, per-depth statistics of a hand tree, CUDA-graph padding."""
import warnings

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import AdaptiveVerifier

N = 12


def table(max_tokens=256):
    return av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 256: 9.0}, draft_ms=0.5,
                                    graph_sizes=[8, 16, 32, 64], max_tokens=max_tokens)


def random_trees(rng, R, n=N):
    """parents [R, n] (topological, random shapes), tree sizes [R], conf [R, n], tokens [R, n] (distinct per
    request, so siblings differ)."""
    parents = np.full((R, n), -1, dtype=np.int32)
    for r in range(R):
        for j in range(1, n):
            parents[r, j] = rng.integers(-1, j)
    sizes = rng.integers(0, n + 1, R).astype(np.int32)
    conf = rng.uniform(0.05, 0.99, (R, n)).astype(np.float32)
    tokens = np.tile(np.arange(1, n + 1, dtype=np.int32), (R, 1))
    return (torch.from_numpy(parents), torch.from_numpy(sizes), torch.from_numpy(conf), torch.from_numpy(tokens))


def metadata(R, ctx_max=40, block_size=16, blocks=8):
    ctx = torch.arange(R, dtype=torch.int32) * 3 % ctx_max
    bt = torch.arange(R * blocks, dtype=torch.int32).view(R, blocks)
    return ctx, bt, torch.full((R,), 7, dtype=torch.int32)


@pytest.mark.parametrize("mode", ["lagged", "greedy", "global", "all", "off"])
def test_every_mode_plans_what_plan_tree_verification_plans_without_warning(mode):
    ct = table()
    rng = np.random.default_rng(1)
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=4, block_size=16, mode=mode, max_nodes=N)
    for step, R in enumerate((5, 7, 3)):
        parents, sizes, conf, tokens = random_trees(rng, R)
        ctx, bt, anchors = metadata(R)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # trees are verified one-hot: "global" must not warn
            budget, padded = v.plan_budget(R, sizes.numpy(), tree=True)
            v.record_confidence(conf, parents=parents, tree_sizes=sizes)
            plan = v.plan(conf, sizes, ctx, bt, anchors, tokens, budget, parents=parents)
        assert isinstance(plan, av.TreeVerifyPlan)
        live = mode in ("greedy", "global")
        want = av.plan_tree_verification(None, parents, sizes, ct, mode=mode if live else "fixed",
                                         budget=None if live else budget, conf=conf, context_lens=ctx, block_table=bt,
                                         block_size=16, anchor_tokens=anchors, draft_tokens=tokens,
                                         num_tokens_padded=padded - 0)
        for name in ("verify_lens", "budget", "query_start_loc", "positions", "slot_mapping", "input_ids",
                     "tree_mask", "token_parent", "token_node", "token_depth", "token_req"):
            assert torch.equal(getattr(plan, name), getattr(want, name)), (mode, step, name)
        if mode == "off":
            assert int(plan.budget) == 0
        if mode == "all":
            assert torch.equal(plan.verify_lens[:R], sizes)
        T = int(plan.num_tokens)
        toks, emitted, offsets = av.tree_rejection_sample(torch.randn(plan.token_req.shape[0], 64),
                                                          plan.query_start_loc, plan.token_parent, plan.input_ids,
                                                          N + 1)
        assert T <= padded
        v.observe(plan.verify_lens, (emitted - 1).clamp(min=0), accepted_offsets=offsets)
    assert v.metrics()["steps"] == 3


def test_a_chain_given_as_a_tree_is_budgeted_planned_and_counted_as_the_chain():
    """parents j - 1: the tree verifier's lagged budgets, plans and per-depth statistics equal the chain verifier's
    (the statistics bit for bit: the tree counts are the stats kernel's binning and fixed point)."""
    K = 6
    ct = table()
    rng = np.random.default_rng(2)
    chain = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16)
    tree = AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=16, max_nodes=K)
    for R in (6, 8, 4, 8, 5, 7):
        conf = torch.from_numpy(rng.uniform(0.0, 1.0, (R, K)).astype(np.float32))
        conf[0, 0] = 1.0  # the bins' edges
        conf[1, 1] = 0.5
        drafts = rng.integers(0, K + 1, R)
        d32 = torch.from_numpy(drafts.astype(np.int32))
        parents = (torch.arange(K, dtype=torch.int32) - 1).repeat(R, 1)
        b_chain, p_chain = chain.plan_budget(R, drafts)
        b_tree, p_tree = tree.plan_budget(R, drafts, tree=True)
        assert (b_chain, p_chain) == (b_tree, p_tree)
        chain.record_confidence(conf)
        # The chain records the confidences of all K positions whatever its drafts; so does the tree here.
        tree.record_confidence(conf, parents=parents, tree_sizes=torch.full((R,), K, dtype=torch.int32))
        pc = chain.plan(conf, d32, budget=b_chain)
        pt = tree.plan(conf, d32, budget=b_tree, parents=parents)
        assert torch.equal(pc.verify_lens, pt.verify_lens)
        vl = pc.verify_lens[:R]
        acc = torch.minimum(torch.from_numpy(rng.integers(0, K + 1, R).astype(np.int32)), vl)
        offsets = torch.full((R, K + 1), -1, dtype=torch.int32)  # a chain's path: offset = depth
        for r in range(R):
            offsets[r, :int(acc[r]) + 1] = torch.arange(int(acc[r]) + 1)
        chain.observe(vl, acc)
        tree.observe(pt.verify_lens, acc, accepted_offsets=offsets)
    for name in ("trials", "survivals", "_conf_fixed", "totals"):
        assert torch.equal(getattr(chain.stats, name), getattr(tree.stats, name)), name
    assert int(tree.stats.trials.sum()) > 20
    mc, mt = chain.metrics(), tree.metrics()
    assert mc == mt


def test_hand_tree_counts_every_sibling_at_its_depth():
    """anchor -> 0, 1; 0 -> 2, 3; 2 -> 4. Accepted path 0, 3 (depth 2). Trials: depth 1 nodes 0 (survives) and
    1; depth 2 nodes 2 and 3 (survives); node 4 is not a trial (its parent 2 was rejected)."""
    v = AdaptiveVerifier(table(), max_reqs=2, max_drafts=3, block_size=16, mode="all", max_nodes=5)
    parents = torch.tensor([[-1, -1, 0, 0, 2]], dtype=torch.int32)
    conf = torch.tensor([[0.81, 0.12, 0.40, 0.55, 0.93]])
    sizes = torch.tensor([5], dtype=torch.int32)
    budget, _ = v.plan_budget(1, [5], tree=True)
    v.record_confidence(conf, parents=parents, tree_sizes=sizes)
    plan = v.plan(conf, sizes, budget=budget, parents=parents)
    assert plan.verify_lens.tolist() == [5]
    offsets = torch.tensor([[0, 1, 4, -1, -1, -1]], dtype=torch.int32)  # nodes 0 and 3 sit at offsets 1 and 4
    v.observe(plan.verify_lens, torch.tensor([2], dtype=torch.int32), accepted_offsets=offsets)
    s = v.stats
    bins = s.num_bins
    want_trials = torch.zeros_like(s.trials)
    want_surv = torch.zeros_like(s.survivals)
    for depth, c, survived in ((1, 0.81, 1), (1, 0.12, 0), (2, 0.40, 0), (2, 0.55, 1)):
        b = min(int(np.float32(c) * np.float32(bins)), bins - 1)
        want_trials[depth - 1, b] += 1
        want_surv[depth - 1, b] += survived
    assert torch.equal(s.trials, want_trials) and torch.equal(s.survivals, want_surv)
    assert torch.allclose(s.conf_sum.sum(1)[:2].float(), torch.tensor([0.93, 0.95]), atol=1e-6)
    assert s.totals.tolist() == [5, 2]
    rep = s.report()
    assert rep["trials"][:3] == [2, 2, 0] and rep["acceptance"][:2] == [0.5, 0.5]


def lagged_reference(ct, stale_rows, sizes, extra=0, capacity=256):
    """The node budget recomputed: each request's stale sorted survivals ranked as a chain of its tree size, the
    global argmax at THIS step's R, prompt tokens and capacity, clamped to [0, B_max]."""
    R, n = stale_rows.shape
    d = torch.from_numpy(np.asarray(sizes, dtype=np.int32))
    parents = (torch.arange(n, dtype=torch.int32) - 1).repeat(R, 1)
    tab = ct.shifted(extra) if extra else ct
    b = int(av.choose_budget(stale_rows.contiguous(), d, tab, mode="global", capacity=capacity - extra,
                             parents=parents))
    return min(b, min(int(np.sum(sizes)), capacity - R - extra))


def test_lagged_node_budget_follows_each_slots_last_tree_at_the_current_step():
    ct = table()
    rng = np.random.default_rng(3)
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=4, block_size=16, max_nodes=N)
    R = 6
    parents, sizes, conf, tokens = random_trees(rng, R)
    slots = np.array([5, 0, 3, 7, 1, 2])
    v.add_request(slots.tolist())
    b0, _ = v.plan_budget(R, sizes.numpy(), tree=True, req_indices=slots)
    assert b0 == lagged_reference(ct, torch.ones(R, N), sizes.numpy())  # no history: survival 1.0 (the prior)
    v.record_confidence(conf, parents=parents, tree_sizes=sizes)
    surv = av.tree_survival(conf, parents, sizes)
    # The same step's trees again: the lagged budget is the live global budget of those trees.
    b1, _ = v.plan_budget(R, sizes.numpy(), tree=True, req_indices=slots)
    live = int(av.choose_budget(None, sizes, ct, mode="global", conf=conf, parents=parents, capacity=256))
    assert b1 == live == lagged_reference(ct, surv.sort(1, descending=True).values, sizes.numpy())
    assert np.array_equal(v._tree.snap_np[0][slots], surv.sort(1, descending=True).values.numpy())
    # Reordered requests, one leaving, one joining slot 4 (the prior), 40 prompt tokens and new tree sizes.
    order = np.array([3, 0, 5, 1])
    new_sizes = rng.integers(0, N + 1, 5)
    v.add_request(4)
    b2, padded = v.plan_budget(5, new_sizes, 40, tree=True, req_indices=np.append(slots[order], 4))
    rows = torch.cat([surv.sort(1, descending=True).values[order], torch.ones(1, N)])
    assert b2 == lagged_reference(ct, rows, new_sizes, extra=40)
    assert padded == v.padded_tokens(5 + 40 + b2)
    # A slot re-used by a new request reads as new even though the old request's survivals were recorded.
    v.add_request(int(slots[0]))
    stale = v._tree.snap_np[1 - v._tree.slot]
    assert not np.allclose(stale[slots[0]], 1.0)
    b3, _ = v.plan_budget(1, [N], tree=True, req_indices=[int(slots[0])])
    assert b3 == lagged_reference(ct, torch.ones(1, N), [N])


def test_tensor_budget_padding_and_persistent_buffers():
    """CUDA-graph style: a 0-d budget tensor with the padded size; the same (R, padded) key reuses its buffers, and
    every padding lane is written."""
    ct = table()
    rng = np.random.default_rng(4)
    v = AdaptiveVerifier(ct, max_reqs=4, max_drafts=4, block_size=16, max_nodes=N)
    R = 4
    seen = None
    for _ in range(3):
        parents, sizes, conf, tokens = random_trees(rng, R)
        ctx, bt, anchors = metadata(R)
        budget, padded = v.plan_budget(R, sizes.numpy(), tree=True)
        v.record_confidence(conf, parents=parents, tree_sizes=sizes)
        plan = v.plan(conf, sizes, ctx, bt, anchors, tokens, torch.tensor(min(budget, 10), dtype=torch.int32),
                      padded_tokens=64, parents=parents)
        assert plan.token_req.shape[0] == 64 and plan.tree_mask.shape[0] == 64
        assert seen is None or plan.tree_mask is seen
        seen = plan.tree_mask
        T = int(plan.num_tokens)
        assert int(plan.budget) <= 10
        assert (plan.token_req[T:] == -1).all() and (plan.tree_mask[T:] == 0).all()
        assert (plan.slot_mapping[T:] == -1).all() and (plan.token_node[T:] == -1).all()


def test_statistics_keep_one_position_per_depth_and_online_calibration_follows():
    v = AdaptiveVerifier(table(), max_reqs=2, max_drafts=4, block_size=16, max_nodes=20, mode="all",
                         online_calibration=True, refresh_every=1)
    assert v.stats.num_positions == 20 and v.temperatures.shape == (20,)
    n = 15  # a chain of 15 nodes: depth 15 > max_drafts
    parents = (torch.arange(n, dtype=torch.int32) - 1)[None]
    conf = torch.full((1, n), 0.9)
    sizes = torch.tensor([n], dtype=torch.int32)
    budget, _ = v.plan_budget(1, [n], tree=True)
    v.record_confidence(conf, parents=parents, tree_sizes=sizes)
    plan = v.plan(conf, sizes, budget=budget, parents=parents)
    offsets = torch.arange(n + 1, dtype=torch.int32)[None]
    v.observe(plan.verify_lens, torch.tensor([n], dtype=torch.int32), accepted_offsets=offsets)
    assert v.stats.trials.sum(1)[:n].tolist() == [1] * n and int(v.stats.trials.sum()) == n
    assert v.sts.steps == 1


def test_errors_name_the_argument():
    ct = table()
    chain_only = AdaptiveVerifier(ct, max_reqs=2, max_drafts=4, block_size=16)
    with pytest.raises(ValueError, match="max_nodes"):
        chain_only.plan_budget(1, [3], tree=True)
    with pytest.raises(ValueError, match="max_nodes"):
        AdaptiveVerifier(ct, max_reqs=2, max_drafts=4, block_size=16, max_nodes=64)
    v = AdaptiveVerifier(ct, max_reqs=2, max_drafts=4, block_size=16, max_nodes=8)
    with pytest.raises(ValueError, match="drafts_host"):
        v.plan_budget(1, [9], tree=True)
    parents = torch.full((1, 9), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="max_nodes"):
        v.record_confidence(torch.rand(1, 9), parents=parents, tree_sizes=torch.tensor([9], dtype=torch.int32))
    parents = torch.full((1, 8), -1, dtype=torch.int32)
    sizes = torch.tensor([8], dtype=torch.int32)
    with pytest.raises(ValueError, match="parents"):
        v.record_confidence(torch.rand(1, 8), parents=parents[:, :4], tree_sizes=sizes)
    conf = torch.rand(1, 8)
    budget, _ = v.plan_budget(1, [8], tree=True)
    v.record_confidence(conf, parents=parents, tree_sizes=sizes)
    plan = v.plan(conf, sizes, budget=budget, parents=parents)
    with pytest.raises(ValueError, match="accepted_offsets"):
        v.observe(plan.verify_lens, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="accepted_offsets"):
        v.observe(plan.verify_lens, torch.zeros(1, dtype=torch.int32), accepted_offsets=torch.zeros(1, 9))


def test_weighted_lagged_node_budget():
    """plan_budget(tree=True, weights=): the weighted argmax over each slot's last recorded sorted node survivals,
    ranked as a chain, at this step's tree sizes; unit weights are the unweighted budget; any host layout."""
    ct = table()
    rng = np.random.default_rng(8)
    v = AdaptiveVerifier(ct, max_reqs=8, max_drafts=4, block_size=16, max_nodes=N)
    R = 6
    parents, sizes, conf, _ = random_trees(rng, R)
    v.plan_budget(R, sizes.numpy(), tree=True)
    v.record_confidence(conf, parents=parents, tree_sizes=sizes)
    rows = av.tree_survival(conf, parents, sizes).sort(1, descending=True).values
    chain = (torch.arange(N, dtype=torch.int32) - 1).repeat(R, 1)
    for trial in range(4):
        w = rng.uniform(0.2, 5.0, R).astype(np.float32)
        new_sizes = rng.integers(0, N + 1, R)
        got, _ = v.plan_budget(R, new_sizes, tree=True, weights=w[::-1].copy()[::-1])  # a negative-stride view
        want = int(av.choose_budget(rows, torch.from_numpy(new_sizes.astype(np.int32)), ct, mode="global",
                                    parents=chain, capacity=256, weights=torch.from_numpy(w)))
        assert got == min(want, int(new_sizes.sum()), 256 - R), trial
        assert v.plan_budget(R, new_sizes, tree=True, weights=np.ones(R))[0] == \
            v.plan_budget(R, new_sizes, tree=True)[0]
    with pytest.raises(ValueError, match="weights"):
        v.plan_budget(R, sizes.numpy(), tree=True, weights=[float("inf")] * R)
