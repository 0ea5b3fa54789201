"""The small engine over draft trees (engine/tree.py): the tree drafter's shape, greedy losslessness of every tree
mode and of mixed chain + tree batches, sampling losslessness at temperature 1, the demo's tree rows."""
import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.engine import load_pretrained
from adaptive_verify.engine.generate import generate
import token_stats
from token_stats import NEW, PROMPT, PROMPTS, SAMPLES, chi2_same, plain_samples, second_token_pvalue, token_counts
from adaptive_verify.engine.tree import draft_tree, tree_size



@pytest.fixture(scope="module")
def models():
    return token_stats.pretrained()


@pytest.fixture(scope="module")
def drafter_inputs(models):
    target, _ = models
    ids = torch.tensor([list(b"def __init__(self, name):\n        self.")])
    _, hidden = target.forward_dense(ids, attn_dtype=torch.float16)
    R = 5
    starts = [6, 10, 14, 20, 25]
    return hidden[0, [s - 1 for s in starts]], ids[0, starts].to(torch.int32), R


def test_k1_tree_is_the_drafters_greedy_chain(models, drafter_inputs):
    _, drafter = models
    h, anchors, R = drafter_inputs
    K = drafter.config.num_drafts
    tokens, parents, conf, sizes = draft_tree(drafter, h, anchors, [1] * R, 63, [K] * R)
    chain_tokens, ch, mk = drafter.draft(h, anchors)
    assert tokens.shape == (R, K) and sizes.tolist() == [K] * R
    assert torch.equal(tokens, chain_tokens)
    assert torch.equal(parents, (torch.arange(K, dtype=torch.int32) - 1).repeat(R, 1))
    assert torch.allclose(conf, drafter.confidence(ch, mk), atol=1e-6)


@pytest.mark.parametrize("k, N", [(2, 10), (3, 24), (4, 63)])
def test_tree_shape_sizes_and_best_first_selection(models, drafter_inputs, k, N):
    """Sizes follow tree_size (the host's count before drafting), per-request k and depth limits included; parents
    are topological and ancestor-closed; siblings carry distinct tokens and their confidences sum to at most 1; a
    node kept never survives less than a node dropped (the N best by path confidence)."""
    _, drafter = models
    h, anchors, R = drafter_inputs
    K = drafter.config.num_drafts
    ks = [k, 1, k, max(1, k - 1), k]
    depths = [K, K, 2, 3, 0]
    tokens, parents, conf, sizes = draft_tree(drafter, h, anchors, ks, N, depths)
    full = draft_tree(drafter, h, anchors, ks, 63, depths)  # every candidate when it fits 63 nodes
    assert sizes.tolist() == [tree_size(a, b, N) for a, b in zip(ks, depths)]
    for r in range(R):
        n = int(sizes[r])
        p = parents[r, :n].tolist()
        assert all(-1 <= p[j] < j for j in range(n))
        depth = []
        for j in range(n):
            depth.append(1 if p[j] < 0 else depth[p[j]] + 1)
        assert max(depth, default=0) <= depths[r]
        assert depth == sorted(depth)  # breadth first
        surv = []
        for j in range(n):
            surv.append(float(conf[r, j]) * (1.0 if p[j] < 0 else surv[p[j]]))
        for parent in set(p):
            kids = [j for j in range(n) if p[j] == parent]
            assert len({int(tokens[r, j]) for j in kids}) == len(kids) <= ks[r]
            assert sum(float(conf[r, j]) for j in kids) <= 1.0 + 1e-5
        nf = int(full[3][r])
        if nf > n and nf == tree_size(ks[r], depths[r], 63):  # the full list holds every candidate
            fp, fc = full[1][r, :nf].tolist(), full[2][r, :nf].tolist()
            fs = []
            for j in range(nf):
                fs.append(fc[j] * (1.0 if fp[j] < 0 else fs[fp[j]]))
            assert min(surv) >= sorted(fs, reverse=True)[n - 1] - 1e-6
    assert int(sizes[4]) == 0 and (parents[4] == -1).all()


def _plain(models, prompts, n):
    return generate(models[0], None, prompts, mode="off", max_new_tokens=n, concurrency=3)


@pytest.fixture(scope="module")
def plain_greedy(models):
    return _plain(models, PROMPTS, 40)


@pytest.mark.parametrize("kw", [
    dict(mode="tree"),
    dict(mode="tree-fixed", tree_topk=2, tree_nodes=10),
    dict(mode="tree", tree_topk=4, tree_nodes=63),
    dict(mode="lagged", tree_topk=3, tree_nodes=16),
    dict(mode="greedy", tree_topk=2, tree_nodes=24),
    dict(mode="lagged", tree_topk=[1, 3, 1, 2, 4, 1], tree_nodes=20),  # chains and trees in one batch
    dict(mode="tree-fixed", tree_topk=[3, 1, 1, 1, 2, 1], tree_nodes=12),
], ids=["tree", "tree-fixed-k2-N10", "tree-k4-N63", "lagged-k3", "greedy-k2", "mixed-lagged", "mixed-fixed"])
def test_greedy_is_lossless_in_every_tree_mode(models, plain_greedy, kw):
    """Temperature 0: plain greedy decoding's tokens exactly, with requests joining and leaving a batch of 3; drafts
    get accepted, fewer steps than plain decoding, and some accepted paths leave the first branch (their K/V moved
    by commit_tree_kv before the next step reads them)."""
    target, drafter = models
    spec = generate(target, drafter, PROMPTS, max_new_tokens=40, concurrency=3, **kw)
    assert spec.tokens == plain_greedy.tokens
    f = spec.figures
    assert f["accepted_per_step"] > 0.5 and f["steps"] < plain_greedy.figures["steps"]
    # (greedy-k2 decides its shape, plan_tree_draft, and drafts a beam of 1 here: every accepted path is then on the
    # first branch, which commit_tree_kv leaves in place)
    assert f["moved_paths"] > 0 or kw == dict(mode="greedy", tree_topk=2, tree_nodes=24)
    m = f["verifier"]
    assert m["steps"] == f["steps"] and 0.0 < m["acceptance_rate"] <= 1.0 and np.isfinite(m["ece"])




def test_sampling_is_lossless_for_mixed_chain_and_tree_batches(models):
    """Temperature 1, mode "tree" (live global budget) with chains (k = 1) and trees (k = 3) in the same batches:
    tokens 2..7 have plain sampling's distribution (two-sample chi-square over 1200 seeds, as the chain test), and
    the second token the target's exact law. The cost table makes verification nearly free, so the global budget
    verifies siblings and many accepted paths leave the first branch."""
    target, drafter = models
    n = SAMPLES
    prompt = [PROMPT] * n
    plain = plain_samples(target)
    cheap = av.CostTable.from_points({1: 5.0, 1024: 6.0}, max_tokens=1024, graph_sizes=[64, 128, 256, 384, 512, 768])
    spec = generate(target, drafter, prompt, mode="tree", max_new_tokens=NEW, concurrency=64, temperature=1.0,
                    seed=20_000, tree_topk=[1 + 2 * (i % 2) for i in range(n)], tree_nodes=12, cost_table=cheap)
    assert spec.figures["moved_paths"] > 100
    for index in range(1, NEW):
        p = chi2_same(token_counts(spec.tokens, index), token_counts(plain, index))
        assert p > 1e-3, (index, p)
    assert second_token_pvalue(target, spec.tokens) > 1e-3


def test_same_seed_same_tokens(models):
    target, drafter = models
    a = generate(target, drafter, PROMPTS, mode="tree", max_new_tokens=20, concurrency=3, temperature=1.0, seed=7)
    b = generate(target, drafter, PROMPTS, mode="tree", max_new_tokens=20, concurrency=3, temperature=1.0, seed=7)
    assert a.tokens == b.tokens


def test_tree_errors(models):
    target, drafter = models
    with pytest.raises(ValueError, match="tree_topk"):
        generate(target, drafter, ["a", "b"], mode="tree", tree_topk=[2])
    with pytest.raises(ValueError, match="tree_topk"):
        generate(target, drafter, ["a"], mode="tree", tree_topk=0)
    with pytest.raises(ValueError, match="tree_nodes"):
        generate(target, drafter, ["a"], mode="tree", tree_nodes=64)
    with pytest.raises(ValueError, match="needs draft trees"):
        generate(target, drafter, ["a"], mode="global")
    with pytest.raises(ValueError, match="draft trees take modes"):
        generate(target, drafter, ["a"], mode="off", tree_topk=2)


def test_demo_tree_rows(capsys):
    from adaptive_verify import cli

    assert cli.main(["demo", "--max-new-tokens", "12", "--mode", "off", "--mode", "tree", "--mode", "tree-fixed",
                     "--mode", "lagged"]) == 0
    out = capsys.readouterr().out
    assert "tree-fixed" in out and "every mode generated the same text: yes" in out


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_tree_graph_loop_matches_eager(temperature):
    """On CUDA, the tree step (plan, tree-masked forward, sampling, KV commit) captured per (requests, padded
    tokens) and replayed emits exactly the eager loop's tokens, in the modes whose host budget fixes the padded size
    (an eager step of a live mode runs fewer padding tokens than its graph, so its matrix shapes differ)."""
    target, drafter = load_pretrained(device="cuda")
    for kw in (dict(mode="tree-fixed"), dict(mode="lagged", tree_topk=[1, 3, 2, 1, 3, 1])):
        eager = generate(target, drafter, PROMPTS, max_new_tokens=32, concurrency=3, temperature=temperature, **kw)
        graph = generate(target, drafter, PROMPTS, max_new_tokens=32, concurrency=3, temperature=temperature,
                         cuda_graphs=True, **kw)
        assert graph.tokens == eager.tokens, kw
        assert graph.figures["graph_replays"] == graph.figures["steps"]


def test_adaptive_tree_modes_draft_the_decided_shape(models, plain_greedy):
    """Mode "tree" with one k decides each step's depth and beam (plan_tree_draft) and drafts only that tree: fewer
    nodes than the whole tree the same mode drafts on a table without per-level costs, the same greedy tokens."""
    from adaptive_verify.engine.generate import default_cost_table
    target, drafter = models
    shaped = generate(target, drafter, PROMPTS, mode="tree", max_new_tokens=40, concurrency=3, tree_topk=3,
                      tree_nodes=24)
    whole = generate(target, drafter, PROMPTS, mode="tree", max_new_tokens=40, concurrency=3, tree_topk=3,
                     tree_nodes=24, cost_table=default_cost_table())
    assert shaped.tokens == whole.tokens == plain_greedy.tokens
    assert shaped.figures["verifier"]["depth_mean"] > 0 and whole.figures["verifier"]["depth_mean"] == 0.0
    assert 0 < shaped.figures["drafted_per_step"] < whole.figures["drafted_per_step"]
    # draft_tree's beam: a beam of 1 drafts k nodes at depth 1 and k more per deeper level
    h = torch.randn(2, target.config.d_model)
    _, parents, _, sizes = draft_tree(drafter, h, torch.tensor([65, 66], dtype=torch.int32), [3, 3], 24, [3, 2], beam=1)
    assert sizes.tolist() == [tree_size(3, 3, 24, 1), tree_size(3, 2, 24, 1)] == [9, 6]
    assert parents[0, 3:6].tolist() == [parents[0, 3]] * 3  # depth 2: the k children of one node
    # per-level beams (2, 1): two level-1 nodes expanded, then one level-2 node
    _, parents, _, sizes = draft_tree(drafter, h, torch.tensor([65, 66], dtype=torch.int32), [3, 3], 24, [3, 2],
                                      beam=(2, 1))
    assert sizes.tolist() == [tree_size(3, 3, 24, (2, 1)), tree_size(3, 2, 24, (2, 1))] == [12, 9]
    assert tree_size(4, 3, 63, np.int64(2)) == tree_size(4, 3, 63, 2) == 20  # an integer beam of any kind
    level2, level3 = parents[0, 3:9].tolist(), parents[0, 9:12].tolist()
    assert len(set(level2)) == 2 and all(0 <= p < 3 for p in level2) and len(set(level3)) == 1 and 3 <= level3[0] < 9
    per_level = generate(target, drafter, PROMPTS, mode="tree", max_new_tokens=40, concurrency=3, tree_topk=3,
                         tree_nodes=24, tree_widths="per_level")
    assert per_level.tokens == plain_greedy.tokens and per_level.figures["drafted_per_step"] > 0
