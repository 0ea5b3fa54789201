"""adaptive_verify.integrations.sglang's EAGLE tree conversions against the installed SGLang (CPU), through
sglang_tree_interpreted.py (one subprocess, TRITON_INTERPRET=1): SGLang's draft-loop selection and
organize_draft_results (run from its source), its Triton tree builder in FULL_MASK and QLEN_ONLY modes and its
Triton greedy tree verify. What is SGLang's code and what is a stand-in: that file's docstring. Not run: the CUDA
builder (tree.cuh) and the bit-packed mask mode, which only it writes (its bit layout is read from tree.cuh).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import sglang as avs
from peers import require_peers

require_peers("sglang", "triton")

HERE = Path(__file__).resolve().parent

# (bs, topk, spec_steps, draft_token_num): chain-like, small, wide, the largest block (64), one step, deep
CONFIGS = [(3, 1, 3, 4), (5, 2, 4, 9), (3, 3, 5, 24), (1, 4, 6, 64), (7, 4, 1, 5), (3, 2, 6, 23)]
VOCAB = 40
# topk 2, spec_steps 3: score-list entry 9 hangs under entry 5, which is not among the drafts
ORPHAN = dict(op="build", parent_list=[[-1, 0, 1, 2, 5]], top_scores_index=[[0, 1, 2, 3, 6, 9]], seq_lens=[4], topk=2,
              steps=3, n=7)


@pytest.fixture(scope="module")
def sglang_trees():
    jobs = [dict(op="eagle_tree", seed=17 + i, bs=bs, topk=k, steps=s, n=n, vocab=VOCAB,
                 seq_lens=[(5 * i + 3 * b) % 11 for b in range(bs)])
            for i, (bs, k, s, n) in enumerate(CONFIGS)]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, str(HERE / "sglang_tree_interpreted.py")], input=json.dumps(jobs + [ORPHAN]),
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return list(zip(jobs, out[:-1])), out[-1]


def i64(x):
    return torch.tensor(x, dtype=torch.int64)


def readers(job, res):
    """Our tree from each of SGLang's forms: the draft loop's outputs, the builder's pointers, both masks."""
    bs, n = job["bs"], job["n"]
    seq = i64(job["seq_lens"])
    return {
        "eagle_draft": avs.tree_from_eagle_draft(i64(res["bonus"]), i64(res["draft_tokens"]),
                                                 i64(res["parent_list"]).reshape(bs, -1),
                                                 i64(res["top_scores_index"]), job["topk"]),
        "pointers": avs.tree_from_sglang(i64(res["draft_token"]), i64(res["FULL_MASK"]["next"]),
                                         i64(res["FULL_MASK"]["sibling"])),
        "full_mask": avs.tree_from_sglang_mask(i64(res["draft_token"]), torch.tensor(res["FULL_MASK"]["mask"]), n, bs,
                                               mask_mode="full", seq_lens=seq),
        "qlen_mask": avs.tree_from_sglang_mask(i64(res["draft_token"]), torch.tensor(res["QLEN_ONLY"]["mask"]), n, bs,
                                               mask_mode=1, seq_lens=seq),
    }


def test_every_sglang_form_reads_as_one_tree(sglang_trees):
    """SGLang's draft loop + builder: the four forms give one tree, every draft linked, at most topk children per
    node and spec_steps levels, and the two builder modes agree on the pointers and positions."""
    trees, _ = sglang_trees
    for job, res in trees:
        got = readers(job, res)
        first = got["eagle_draft"]
        for name, t in got.items():
            for a, b in zip(first, t):
                assert torch.equal(a, b), (job, name)
        assert first.tree_sizes.tolist() == [job["n"] - 1] * job["bs"]
        for r in range(job["bs"]):
            par = first.parents[r].tolist()
            depth = {-1: 0}
            for j, p in enumerate(par):
                depth[j] = depth[p] + 1
                assert depth[j] <= job["steps"]
            assert max(par.count(p) for p in set(par)) <= job["topk"]
        for f in ("positions", "index", "next", "sibling"):
            assert res["FULL_MASK"][f] == res["QLEN_ONLY"][f], f


def test_tree_to_sglang_is_sglang_builder(sglang_trees):
    """tree_to_sglang of the converted tree writes SGLang's builder outputs exactly: draft_token, positions,
    retrieve_index / next_token / next_sibling and the whole custom_mask buffer in FULL_MASK and QLEN_ONLY; our
    bit-packed words decode to the builder's QLEN_ONLY rows."""
    trees, _ = sglang_trees
    for job, res in trees:
        t = readers(job, res)["pointers"]
        seq = i64(job["seq_lens"])
        for mode, key in (("full", "FULL_MASK"), ("qlen", "QLEN_ONLY")):
            ours = avs.tree_to_sglang(t.anchor_tokens, t.parents, t.tree_sizes, t.draft_tokens, seq_lens=seq,
                                      mask_mode=mode)
            theirs = res[key]
            assert ours["draft_token"].tolist() == res["draft_token"]
            assert ours["positions"].tolist() == theirs["positions"]
            assert ours["retrieve_index"].tolist() == theirs["index"]
            assert ours["retrieve_next_token"].tolist() == theirs["next"]
            assert ours["retrieve_next_sibling"].tolist() == theirs["sibling"]
            assert ours["custom_mask"].tolist() == theirs["mask"], (job, mode)
        packed = avs.tree_to_sglang(t.anchor_tokens, t.parents, t.tree_sizes, t.draft_tokens, mask_mode="bitpacked")
        n = job["n"]
        assert packed["custom_mask"].element_size() == {1: 1, 2: 2, 3: 4, 4: 4}.get((n + 7) // 8, 8)
        want = avs.mask_bits_from_sglang(torch.tensor(res["QLEN_ONLY"]["mask"]), n, job["bs"], mask_mode="qlen")
        assert torch.equal(avs.mask_bits_from_sglang(packed["custom_mask"], n, job["bs"], mask_mode=2), want)


def test_planned_subset_mask_is_sglang_mask(sglang_trees):
    """On SGLang's trees, a planned subset's tree_mask, moved to SGLang's indices, is the builder's mask row of
    each verified token; tree_verify_input's draft_token are SGLang's tokens at those indices."""
    trees, _ = sglang_trees
    for job, res in trees:
        t = readers(job, res)["pointers"]
        bs, n = job["bs"], job["n"]
        conf = torch.rand(bs, n - 1, generator=torch.Generator().manual_seed(job["seed"])) * 0.8 + 0.2
        plan = av.plan_tree_verification(None, t.parents, t.tree_sizes, conf=conf, mode="fixed",
                                         budget=bs * (n - 1) // 3, context_lens=i64(job["seq_lens"]).to(torch.int32),
                                         anchor_tokens=t.anchor_tokens, draft_tokens=t.draft_tokens)
        theirs = avs.mask_bits_from_sglang(torch.tensor(res["FULL_MASK"]["mask"]), n, bs, mask_mode="full",
                                           seq_lens=i64(job["seq_lens"]))
        ours = avs.tree_mask_to_sglang(plan, t.node_index)
        vi = avs.tree_verify_input(plan, n, bs)
        qsl, node = plan.query_start_loc.tolist(), plan.token_node.tolist()
        for r in range(bs):
            for tok in range(qsl[r], qsl[r + 1]):
                s = 0 if node[tok] < 0 else int(t.node_index[r, node[tok]])
                assert int(ours[tok]) == int(theirs[r, s])
                assert int(vi["draft_token"][tok]) == res["draft_token"][r * n + s]
                assert int(vi["positions"][tok]) == res["FULL_MASK"]["positions"][r * n + s]


def test_greedy_results_are_sglang_verify(sglang_trees):
    """Every node verified, temperature 0, logits whose argmax is the stand-in target's prediction:
    tree_rejection_sample's results converted by tree_verify_output are SGLang's verify_tree_greedy's
    (accept_index, accepted draft counts, and the whole predict buffer)."""
    trees, _ = sglang_trees
    accepted = 0
    for job, res in trees:
        t = readers(job, res)["pointers"]
        bs, n = job["bs"], job["n"]
        plan = av.plan_tree_verification(None, t.parents, t.tree_sizes, conf=torch.full((bs, n - 1), 0.9), mode="all",
                                         anchor_tokens=t.anchor_tokens, draft_tokens=t.draft_tokens)
        T = int(plan.num_tokens)
        assert T == bs * n  # all verified, in SGLang's order: our row of block token s is r * n + s
        g = torch.Generator().manual_seed(job["seed"])
        logits = torch.randn(T, VOCAB, generator=g)
        logits[torch.arange(T), i64(res["target"]).flatten()] += 20
        tokens, emitted, offsets = av.tree_rejection_sample(logits, plan.query_start_loc, plan.token_parent[:T],
                                                            plan.input_ids[:T], n)
        out = avs.tree_verify_output(plan, tokens, emitted, offsets, node_index=t.node_index)
        greedy = res["greedy"]
        width = job["steps"] + 1
        assert out["num_correct_drafts"].tolist() == greedy["accept_num"]
        assert out["sglang_accept_index"][:, :width].tolist() == greedy["accept_index"]
        assert (out["sglang_accept_index"][:, width:] == -1).all()
        assert out["accept_index"][:, :width].tolist() == greedy["accept_index"]  # same rows: uniform blocks
        assert out["predict"].tolist() == greedy["predict"]
        accepted += sum(greedy["accept_num"])
    assert accepted > 10  # the stand-in target follows the tree often enough to exercise deep paths


def test_unlinked_draft_from_sglang_builder(sglang_trees):
    """A draft whose parent was not selected: SGLang's builder links nothing to it (its mask row: token 0 and
    itself); tree_from_sglang and tree_from_eagle_draft leave it out, the mask reader sees a child of token 0."""
    _, res = sglang_trees
    nxt, sib = i64(res["FULL_MASK"]["next"]), i64(res["FULL_MASK"]["sibling"])
    assert 6 not in nxt.flatten().tolist() + sib.flatten().tolist()
    tok = torch.arange(100, 107)
    t = avs.tree_from_sglang(tok, nxt, sib)
    d = avs.tree_from_eagle_draft(tok[:1], tok[None, 1:], i64(ORPHAN["parent_list"]), i64(ORPHAN["top_scores_index"]),
                                  2)
    for a, b in zip(t, d):
        assert torch.equal(a, b)
    assert t.tree_sizes.tolist() == [5] and t.node_index[0].tolist() == [1, 2, 3, 4, 5, -1]
    m = avs.tree_from_sglang_mask(tok, torch.tensor(res["QLEN_ONLY"]["mask"]), 7, 1, mask_mode="qlen")
    assert m.tree_sizes.tolist() == [6] and int(m.parents[0, 5]) == -1
    assert res["FULL_MASK"]["positions"][6] == 4 + 1
