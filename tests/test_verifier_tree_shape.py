"""AdaptiveVerifier.plan_tree_draft: a tree step's depth, beam width and budget on the host before drafting
(docs/design.md, "Drafting from the budget"), the loop an engine with an EAGLE-2 drafter runs; the prediction's beam
layout (verifier_tree_shape.py)."""
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import adaptive_verify as av
from adaptive_verify import AdaptiveVerifier
from adaptive_verify.verifier_tree_shape import TreeShapes

K, TOP_K, N = 4, 3, 40  # levels, children per expanded node, pool (3 + 3 * 9 = 30 nodes fit)


def table(level_ms=0.3, first_ms=1.0):
    return av.CostTable.from_points({1: 5.0, 64: 5.2, 256: 6.0, 1024: 9.0}, {1: first_ms + (K - 1) * level_ms},
                                    graph_sizes=(8, 16, 32, 64, 128, 256), max_tokens=2048, draft_levels=K,
                                    draft_level_ms=level_ms)


def beam_tree(layout: np.ndarray, k: int, depth: int, width):
    """The tree an EAGLE-2 drafter of beam ``width`` (an int, or per-level widths: entry l - 1 for level l) drafts
    when the conditional confidences at the beam-layout positions are ``layout`` [R, k + (D - 1) k^2] (siblings
    decreasing): (conf, parents, sizes, position) with nodes numbered level by level, position [R, n] each node's
    layout index."""
    R = layout.shape[0]
    widths = width if isinstance(width, tuple) else (width,) * max(depth - 1, 0)
    conf, parents, pos, surv = [layout[:, :k]], [np.full((R, k), -1)], [np.tile(np.arange(k), (R, 1))], \
        [layout[:, :k].astype(np.float32)]
    at, last_lo = k, 0
    for j in range(1, depth):
        prev, width = surv[-1], widths[j - 1]
        beam = np.argsort(-prev, axis=1, kind="stable")[:, :width]  # [R, width]
        lo = k + (j - 1) * k * k
        slot = np.arange(width)[:, None] * k + np.arange(k)[None, :]  # [width, k]
        idx = lo + slot.reshape(-1)
        conf.append(layout[:, idx])
        parents.append(np.repeat(last_lo + beam, k, axis=1))
        pos.append(np.tile(idx, (R, 1)))
        surv.append((prev[np.arange(R)[:, None], beam][:, :, None]
                     * layout[:, idx].reshape(R, width, k).astype(np.float32)).reshape(R, -1))
        last_lo = at
        at += width * k
    return (np.concatenate(conf, 1).astype(np.float32), np.concatenate(parents, 1).astype(np.int32),
            np.full(R, at, dtype=np.int32), np.concatenate(pos, 1))


def random_layout(rng, R, k, depth, lo=0.2, hi=0.95):
    """[R, k + (D - 1) k^2] conditional confidences, each sibling group strictly decreasing, summing to < 1."""
    groups = 1 + (depth - 1) * k
    top = rng.uniform(lo, hi, (R, groups, 1))
    share = -np.sort(-rng.uniform(0.05, 1.0, (R, groups, k)), axis=2)
    return (top * share / share.sum(axis=2, keepdims=True)).reshape(R, -1)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_positions_put_each_node_at_its_beam_layout_position(width):
    rng = np.random.default_rng(width)
    layout = random_layout(rng, 6, TOP_K, K)
    conf, parents, sizes, pos = beam_tree(layout, TOP_K, K, width)
    perm = rng.permutation(6)
    shapes = TreeShapes(TOP_K, K, N, 8, 1.0, torch.device("cpu"), np.zeros(8, dtype=np.int64))
    obs = shapes.positions(conf[perm], parents[perm], sizes[perm])
    want = np.full_like(obs, np.nan)
    np.put_along_axis(want, pos[perm], conf[perm], axis=1)
    assert np.array_equal(np.isnan(obs), np.isnan(want)) and np.allclose(obs[~np.isnan(obs)], want[~np.isnan(want)])
    # a bad parent, a size cut and a NaN leave no position for the node and its subtree
    bad_par = parents[:1].copy()
    bad_par[0, 5] = 7
    assert np.isnan(shapes.positions(conf[:1], bad_par, sizes[:1])[0, pos[0, 5]])
    cut = shapes.positions(conf[:1], parents[:1], np.array([TOP_K]))
    assert np.isnan(cut[0, TOP_K:]).all() and not np.isnan(cut[0, :TOP_K]).any()


def engine_step(v, rng, R, layout_of, *, idx=None):
    """One engine step: plan_tree_draft, draft the tree of that shape (each request's true confidences at the layout
    positions from layout_of(R)), record, plan, accept down the tree with those probabilities, observe."""
    depth, width, budget, padded = v.plan_tree_draft(R, req_indices=idx)
    if depth == 0:
        return depth, width, budget
    layout = layout_of(R)
    conf, parents, sizes, _ = beam_tree(layout, TOP_K, depth, width)
    conf_t, par_t, size_t = torch.from_numpy(conf), torch.from_numpy(parents), torch.from_numpy(sizes)
    v.record_confidence(conf_t, req_indices=idx, parents=par_t, tree_sizes=size_t)
    plan = v.plan(conf_t, size_t, budget=budget, parents=par_t)
    assert padded >= R + budget
    lens = plan.verify_lens[:R].numpy()
    node, req = plan.token_node.numpy(), plan.token_req.numpy()
    verified = np.zeros(conf.shape, dtype=bool)
    verified[req[node >= 0], node[node >= 0]] = True
    acc = np.zeros(R, dtype=np.int32)
    offs = np.full((R, K + 1), -1, dtype=np.int32)
    offs[:, 0] = 0
    for r in range(R):  # sample and match: at each node, the target's token is child i with probability conf
        at = -1
        while True:
            kids = np.flatnonzero(parents[r] == at)
            u, hit = rng.random(), None
            for c in kids:
                u -= conf[r, c]
                if u < 0:
                    hit = c
                    break
            if hit is None or not verified[r, hit]:
                break
            acc[r] += 1
            offs[r, acc[r]] = 1 + verified[r, :hit].sum()
            at = hit
    v.observe(plan.verify_lens, torch.from_numpy(acc), accepted_offsets=torch.from_numpy(offs))
    assert int(lens.sum()) <= budget or v.mode == "all"
    return depth, width, budget


def mean_width(width) -> float:
    """A step's beam: the int, or the mean of its per-level widths (1 for a tree of one level)."""
    return float(np.mean(width)) if isinstance(width, tuple) and width else float(1 if width == () else width)


@pytest.mark.parametrize("tree_widths", ["uniform", "per_level"])
def test_shape_shrinks_when_acceptance_falls_and_grows_again_when_it_rises(tree_widths):
    v = AdaptiveVerifier(table(), max_reqs=32, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K,
                         tree_widths=tree_widths)
    rng = np.random.default_rng(1)
    high = lambda R: random_layout(rng, R, TOP_K, K, 0.9, 0.99)  # noqa: E731
    low = lambda R: random_layout(rng, R, TOP_K, K, 0.02, 0.1)  # noqa: E731
    shapes = [engine_step(v, rng, 32, high)[:2] for _ in range(30)]
    assert np.mean([d for d, _ in shapes[-10:]]) >= 3, shapes
    shapes = [engine_step(v, rng, 32, low)[:2] for _ in range(60)]
    low_depth = np.mean([d for d, _ in shapes[-10:]])
    assert low_depth <= 1.5, shapes
    # Back up: steps that draft nothing let the estimates drift to the prior (EXPLORE_DECAY), and once level 1 is
    # drafted again its fresh confidences pull the deeper levels back.
    shapes = [engine_step(v, rng, 32, high)[:2] for _ in range(60)]
    assert np.mean([d for d, _ in shapes[-10:]]) >= max(2.0, low_depth + 1), shapes
    assert np.mean([mean_width(w) for _, w in shapes[-10:]]) >= 2 and max(d for d, _ in shapes[-10:]) == K, shapes
    assert v.metrics()["depth_mean"] > 0
    if tree_widths == "per_level":  # levels 1 .. depth - 1, none wider than the level above, none wider than k
        assert all(isinstance(w, tuple) and len(w) == max(d - 1, 0) and list(w) == sorted(w, reverse=True)
                   and all(1 <= x <= TOP_K for x in w) for d, w in shapes), shapes


def test_cheaper_wide_levels_draft_wider_beams():
    """The same confidences: a drafter whose later levels cost little per row takes a wider beam than a costly one."""
    widths = []
    for per_row in (0.05, 0.0001):
        ct = av.CostTable.from_points({1: 5.0, 64: 5.2, 256: 6.0, 1024: 9.0},
                                      {1: 0.5 + 3 * per_row, 4096: 0.5 + 3 * 4096 * per_row}, max_tokens=2048,
                                      draft_levels=K, draft_level_ms={1: per_row, 4096: 4096 * per_row})
        v = AdaptiveVerifier(ct, max_reqs=16, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K)
        rng = np.random.default_rng(2)
        fixed = random_layout(np.random.default_rng(9), 16, TOP_K, K, 0.7, 0.9)
        widths.append(np.mean([engine_step(v, rng, 16, lambda R: fixed)[1] for _ in range(15)][5:]))
    assert widths[0] < widths[1], widths


@pytest.mark.parametrize("mode", ["lagged", "global", "all", "off"])
def test_per_level_widths_modes(mode):
    """tree_widths="per_level": the width is a tuple of levels 1 .. depth - 1's widths; "all" every level at the
    full beam, "off" nothing; the budget never exceeds the nodes the shape drafts."""
    rng = np.random.default_rng(13)
    v = AdaptiveVerifier(table(), max_reqs=16, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K, mode=mode,
                         tree_widths="per_level")
    for _ in range(8):
        depth, width, budget = engine_step(v, rng, 16, lambda R: random_layout(rng, R, TOP_K, K, 0.5, 0.95))
        assert isinstance(width, tuple) and len(width) == max(depth - 1, 0), width
        nodes = TOP_K + TOP_K * sum(width) if depth else 0
        assert budget <= 16 * min(nodes, N)
    if mode == "off":
        assert (depth, width, budget) == (0, (), 0)
    if mode == "all":
        assert (depth, width, budget) == (K, (TOP_K,) * (K - 1), 16 * (TOP_K + (K - 1) * TOP_K * TOP_K))


def test_modes_requests_and_errors():
    rng = np.random.default_rng(3)
    layout = lambda R: random_layout(rng, R, TOP_K, K, 0.6, 0.9)  # noqa: E731
    for mode in ("lagged", "greedy", "global", "all", "off"):
        v = AdaptiveVerifier(table(), max_reqs=16, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K,
                             mode=mode)
        for _ in range(3):
            depth, width, budget = engine_step(v, rng, 16, layout)
        if mode == "off":
            assert (depth, width, budget) == (0, 1, 0)
        if mode == "all":  # every level at the full beam, every node
            assert (depth, width, budget) == (K, TOP_K, 16 * (TOP_K + (K - 1) * TOP_K * TOP_K))
    v = AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K)
    engine_step(v, rng, 4, layout, idx=np.array([5, 2, 7, 0]))
    v.add_request([5])  # a new request in slot 5 before the record was folded in: not folded into slot 5
    v.plan_tree_draft(4, req_indices=[5, 2, 7, 0])
    assert np.isnan(v._tree.shapes.last[5]).all() and not np.isnan(v._tree.shapes.last[2]).all()
    engine_step(v, rng, 4, layout, idx=np.array([5, 2, 7, 0]))
    v.plan_tree_draft(4, req_indices=[5, 2, 7, 0])
    assert not np.isnan(v._tree.shapes.last[5]).all()
    v.add_request([5])  # and after: the batch estimates, not the last request's tree
    assert np.isnan(v._tree.shapes.last[5]).all()
    assert v.plan_tree_draft(3, [1, 0, 2], req_indices=[5, 2, 7])[0] <= 2
    with pytest.raises(ValueError, match="drafts_host"):
        v.plan_tree_draft(2, [K + 1, 0])
    with pytest.raises(ValueError, match="req_indices"):
        v.plan_tree_draft(2, req_indices=[1, 1])
    assert v.plan_tree_draft(0) == (0, 1, 0, 0)
    with pytest.raises(ValueError, match="tree_top_k"):
        AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, tree_top_k=2)  # (needs max_nodes)
    with pytest.raises(ValueError, match="tree_top_k"):
        AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, max_nodes=N).plan_tree_draft(2)
    with pytest.raises(ValueError, match="cost_table"):
        AdaptiveVerifier(av.CostTable.from_points({1: 5.0}, 1.0), max_reqs=8, max_drafts=K, block_size=16,
                         max_nodes=N, tree_top_k=TOP_K).plan_tree_draft(2)
    short = av.CostTable.from_points({1: 5.0}, {1: 1.0}, draft_levels=2)  # a drafter of 2 levels: no deeper tree
    v2 = AdaptiveVerifier(short, max_reqs=8, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K)
    assert v2.plan_tree_draft(4)[0] <= 2
    v2.mode = "all"
    assert v2.plan_tree_draft(4)[:2] == (2, TOP_K)
    with pytest.raises(ValueError, match="tree_top_k"):  # 16 x 17 shapes: more than one call weighs (256)
        AdaptiveVerifier(table(), max_reqs=8, max_drafts=16, block_size=16, max_nodes=N, tree_top_k=16)
    with pytest.raises(ValueError, match="tree_widths"):  # C(12, 5) = 792 profiles x 7 depths
        AdaptiveVerifier(table(), max_reqs=8, max_drafts=6, block_size=16, max_nodes=N, tree_top_k=8,
                         tree_widths="per_level")
    for bad in (dict(max_nodes=N, tree_top_k=2, tree_widths="wide"), dict(tree_widths="wide"),
                dict(tree_widths=np.array(["uniform"])), dict(max_nodes=N, tree_widths="per_level")):
        with pytest.raises(ValueError, match="tree_widths"):  # (checked without trees too; per_level needs k)
            AdaptiveVerifier(table(), max_reqs=8, max_drafts=K, block_size=16, **bad)


@pytest.mark.parametrize("tree_widths", ["uniform", "per_level"])
def test_drafting_the_planned_tree_is_lossless(tree_widths):
    """The loop of an engine with an EAGLE-2 drafter on a Markov target: each step plan_tree_draft decides the depth,
    width and budget from earlier steps, the drafter expands the ``width`` best nodes of each level into their top-k
    tokens under Q (confidence: Q's probability), plan() allocates the budget on the live tree and
    tree_rejection_sample verifies one-hot against P. The emitted tokens must be a Markov chain with P's
    transitions: a chi-square test per context, with the shape really varying."""
    V, R, steps, k = 5, 8, 400, 2
    P = np.array([[0.5, 0.2, 0.1, 0.1, 0.1], [0.1, 0.6, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2],
                  [0.05, 0.05, 0.1, 0.7, 0.1], [0.3, 0.1, 0.1, 0.1, 0.4]])
    Q = np.array([[0.6, 0.2, 0.1, 0.05, 0.05], [0.2, 0.4, 0.2, 0.1, 0.1], [0.1, 0.2, 0.3, 0.3, 0.1],
                  [0.1, 0.1, 0.1, 0.6, 0.1], [0.4, 0.1, 0.1, 0.1, 0.3]])
    rng = np.random.default_rng(4)
    torch.manual_seed(4)
    v = AdaptiveVerifier(table(0.4), max_reqs=R, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=k,
                         tree_widths=tree_widths)
    last = rng.integers(0, V, R)
    counts = np.zeros((V, V), dtype=np.int64)
    logP = torch.from_numpy(np.log(P).astype(np.float32))
    shapes = []
    for _ in range(steps):
        depth, width, budget, _ = v.plan_tree_draft(R)
        shapes.append((depth, width))
        toks, conf, parents = [[] for _ in range(R)], [[] for _ in range(R)], [[] for _ in range(R)]
        for r in range(R):  # level by level: the `width` best nodes (path confidence) each get their top-k tokens
            frontier = [(-1, int(last[r]), 1.0)]
            for lvl in range(depth):
                nxt = []
                beam = width if isinstance(width, int) else (width[lvl - 1] if lvl else 1)
                for node, tok, s in sorted(frontier, key=lambda f: -f[2])[:beam]:
                    for t in np.argsort(-Q[tok], kind="stable")[:k]:
                        toks[r].append(int(t))
                        conf[r].append(Q[tok, t])
                        parents[r].append(node)
                        nxt.append((len(toks[r]) - 1, int(t), s * Q[tok, t]))
                frontier = nxt
        n = max(1, max(len(t) for t in toks))
        pad = lambda rows, v0: torch.tensor([x + [v0] * (n - len(x)) for x in rows])  # noqa: E731
        conf_t, par_t = pad(conf, 0.0).float(), pad(parents, -1).int()
        ids_t, sizes = pad(toks, 0).int(), torch.tensor([len(t) for t in toks], dtype=torch.int32)
        v.record_confidence(conf_t, parents=par_t, tree_sizes=sizes)
        plan = v.plan(conf_t, sizes, budget=budget, parents=par_t, anchor_tokens=torch.from_numpy(last).int(),
                      draft_tokens=ids_t)
        T = int(plan.num_tokens)
        ids = plan.input_ids[:T].long()
        out, emitted, offs = av.tree_rejection_sample(logP[ids], plan.query_start_loc[:R + 1], plan.token_parent[:T],
                                                      plan.input_ids[:T], n + 1, temperature=torch.ones(R))
        for r in range(R):
            for t in out[r, :int(emitted[r])].tolist():
                counts[last[r], t] += 1
                last[r] = t
        v.observe(plan.verify_lens, (emitted - 1).clamp(min=0), accepted_offsets=offs)
    assert len(set(shapes)) >= 2, sorted(set(shapes))
    for c in range(V):
        n = counts[c].sum()
        assert n > 200, (c, n)
        assert chisquare(counts[c], n * P[c]).pvalue > 1e-4, (c, counts[c], n * P[c])


@pytest.mark.cuda
def test_cuda_verifier_decides_as_the_cpu_one():
    """The same steps on a CUDA verifier (pinned copies of the recorded trees and of the calibration counts, read
    at the next call) and on a CPU one: the same (depth, width, budget) every step once the copies land (the CUDA
    side takes a count copy only when its event is done, so the comparison waits for it each step)."""
    decisions = []
    for device in ("cpu", "cuda"):
        v = AdaptiveVerifier(table(), max_reqs=16, max_drafts=K, block_size=16, max_nodes=N, tree_top_k=TOP_K,
                             device=device)
        rng = np.random.default_rng(6)
        out = []
        for step in range(12):
            layout = random_layout(rng, 16, TOP_K, K, 0.3, 0.95)
            depth, width, budget, _ = v.plan_tree_draft(16)
            out.append((depth, width, budget))
            if depth == 0:
                continue
            conf, parents, sizes, _ = beam_tree(layout, TOP_K, depth, width)
            conf_t, par_t, size_t = (torch.from_numpy(x).to(device) for x in (conf, parents, sizes))
            v.record_confidence(conf_t, parents=par_t, tree_sizes=size_t)
            plan = v.plan(conf_t, size_t, budget=budget, parents=par_t)
            offs = torch.full((16, K + 1), -1, dtype=torch.int32, device=device)
            offs[:, 0] = 0
            v.observe(plan.verify_lens, torch.zeros(16, dtype=torch.int32, device=device), accepted_offsets=offs)
            if device == "cuda":
                torch.cuda.synchronize()
        decisions.append(out)
    assert decisions[0] == decisions[1]
