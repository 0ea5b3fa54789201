"""adaptive_verify.integrations.sglang, EAGLE trees (topk > 1), against stand-ins of SGLang's structures: SGLang's
layout (docs/integrations/sglang.md) written by tree_to_sglang and by hand, checked against brute-force
definitions here. Needs no SGLang (test_sglang_tree_peer.py runs the real package's builder and verify).

- round trips on random trees (topk 1..4, depth 1..6, N up to 63, odd R, requests with fewer nodes or none):
  pointers, every mask mode, the draft loop's parent list;
- a planned subset: our tree_mask in SGLang's index space is SGLang's mask row, token by token, and
  tree_verify_input's custom_mask is the plan's tree_mask;
- the loop of the guide end to end (convert, plan, write_kv, verify_attention, tree_rejection_sample,
  commit_tree_kv, convert back), attention checked against SGLang's full-mask semantics;
- unlinked drafts and bad arguments.
"""
import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import sglang as avs

MODES = ("full", "qlen", "bitpacked")


def random_tree(rng, N, topk, depth):
    """parents [N] of an EAGLE-like tree: at most topk children per node, at most `depth` levels; may stop early
    (returns the size) when no node can take a child."""
    parents, d, kids = [], {-1: 0}, {}
    for j in range(N):
        open_ = [p for p in [-1] + list(range(j)) if d[p] < depth and kids.get(p, 0) < topk]
        if not open_:
            break
        p = int(rng.choice(open_))
        parents.append(p)
        d[j], kids[p] = d[p] + 1, kids.get(p, 0) + 1
    return parents


def random_batch(seed, R=None, N=None, topk=None, depth=None, V=97):
    rng = np.random.default_rng(seed)
    R = R if R is not None else int(rng.choice([1, 3, 5, 7]))
    N = N if N is not None else int(rng.integers(1, 64))
    topk = topk if topk is not None else int(rng.integers(1, 5))
    depth = depth if depth is not None else int(rng.integers(1, 7))
    parents = np.full((R, N), -1, dtype=np.int32)
    tokens = np.full((R, N), -1, dtype=np.int32)
    sizes = np.zeros(R, dtype=np.int32)
    for r in range(R):
        p = random_tree(rng, N, topk, depth)
        size = len(p) if rng.random() < 0.6 else int(rng.integers(0, len(p) + 1))  # some smaller, some empty
        sizes[r] = size
        parents[r, :size] = p[:size]
        for parent in set(p[:size]):
            kids = [j for j in range(size) if p[j] == parent]
            tokens[r, kids] = rng.choice(V, size=len(kids), replace=False)  # siblings distinct
    anchors = rng.integers(0, V, size=R).astype(np.int32)
    ctx = rng.integers(0, 12, size=R).astype(np.int32)
    t = torch.from_numpy
    return dict(R=R, N=N, parents=t(parents), tokens=t(tokens), sizes=t(sizes), anchors=t(anchors), ctx=t(ctx), V=V)


def block_parent(b, r, i):
    """SGLang block index of block token i's parent (i >= 1), or None for an unlinked padding node."""
    j = i - 1
    if j >= int(b["sizes"][r]):
        return None
    return int(b["parents"][r, j]) + 1


def brute_bits(b, r, n):
    """SGLang's mask rows of request r: token 0 and itself, plus every ancestor (unlinked nodes: 0 and itself)."""
    rows = []
    for i in range(n):
        bits, k = 1 | (1 << i), i
        while k > 0:
            p = block_parent(b, r, k)
            if p is None:
                break
            bits |= 1 << p
            k = p
        rows.append(bits - (1 << 64) if bits >= 1 << 63 else bits)
    return rows


SEEDS = list(range(24))


@pytest.mark.parametrize("seed", SEEDS)
def test_round_trip(seed):
    """tree_to_sglang writes SGLang's layout (checked against brute-force pointers, depths and mask rows) and every
    reader gives the tree back: the pointers exactly, the masks exactly for the linked nodes."""
    b = random_batch(seed)
    R, n = b["R"], b["N"] + 1
    for mode in MODES:
        sg = avs.tree_to_sglang(b["anchors"], b["parents"], b["sizes"], b["tokens"], seq_lens=b["ctx"], mask_mode=mode)
        assert sg["draft_token_num"] == n and sg["draft_token"].shape == (R * n,)
        bits = avs.mask_bits_from_sglang(sg["custom_mask"], n, R, mask_mode=mode, seq_lens=b["ctx"])
        for r in range(R):
            assert bits[r].tolist() == brute_bits(b, r, n), (mode, r)
        if mode != "full":
            continue
        nxt, sib = sg["retrieve_next_token"].tolist(), sg["retrieve_next_sibling"].tolist()
        for r in range(R):
            size = int(b["sizes"][r])
            kids = {p: [i for i in range(1, size + 1) if block_parent(b, r, i) == p] for p in range(n)}
            for p in range(n):
                assert nxt[r][p] == (kids[p][0] if kids[p] else -1)
                for a, c in zip(kids[p], kids[p][1:] + [-1]):
                    assert sib[r][a] == c
            depth = [bin(x & ((1 << 64) - 1)).count("1") - 1 for x in brute_bits(b, r, n)]  # ancestors and itself
            assert sg["positions"][r * n:(r + 1) * n].tolist() == [int(b["ctx"][r]) + d for d in depth]
            assert sg["retrieve_index"][r].tolist() == list(range(r * n, (r + 1) * n))
        back = avs.tree_from_sglang(sg["draft_token"], sg["retrieve_next_token"], sg["retrieve_next_sibling"])
        check_tree(b, back, exact=True)
    for mode in MODES:  # the mask reader cannot tell an unlinked padding node from a child of the anchor
        sg = avs.tree_to_sglang(b["anchors"], b["parents"], b["sizes"], b["tokens"], seq_lens=b["ctx"], mask_mode=mode)
        back = avs.tree_from_sglang_mask(sg["draft_token"], sg["custom_mask"], n, R, mask_mode=mode, seq_lens=b["ctx"])
        check_tree(b, back, exact=False)


def check_tree(b, t, exact):
    R, N = b["R"], b["N"]
    assert t.anchor_tokens.tolist() == b["anchors"].tolist()
    for r in range(R):
        size = int(b["sizes"][r])
        got = int(t.tree_sizes[r])
        assert got == (size if exact else N)
        assert t.parents[r, :size].tolist() == b["parents"][r, :size].tolist()
        assert t.draft_tokens[r, :size].tolist() == b["tokens"][r, :size].tolist()
        assert t.node_index[r, :got].tolist() == list(range(1, got + 1))
        assert t.parents[r, size:got].tolist() == [-1] * (got - size)  # padding nodes read as the anchor's children
        assert t.node_index[r, got:].tolist() == [-1] * (N - got)
    for f in ("anchor_tokens", "parents", "tree_sizes", "draft_tokens"):
        assert getattr(t, f).dtype == torch.int32, f


def test_eagle_draft_by_hand():
    """topk 2, spec_steps 3: SGLang's score list holds step 0's 2 tokens (indices 0, 1), then 4 per later step
    (step 1: 2..5, step 2: 6..9); parent_list = [-1, 0, 1] + the 2 indices expanded at step 1. Index 9 sits under
    index 5 (parent_list[9 // 2 = 4] = 5), which is not among the drafts: 9 is left unlinked, as SGLang's builder
    leaves it."""
    parent_list = torch.tensor([[-1, 0, 1, 2, 5]])
    sel = torch.tensor([[0, 1, 2, 3, 6, 9]])  # 2, 3 under 0 (2 // 2 = 1 -> parent_list[1] = 0); 6 under 2
    toks = torch.tensor([[10, 11, 12, 13, 14, 15]])
    t = avs.tree_from_eagle_draft(torch.tensor([5]), toks, parent_list, sel, 2)
    assert t.tree_sizes.tolist() == [5]
    assert t.parents[0].tolist() == [-1, -1, 0, 0, 2, -1]
    assert t.draft_tokens[0].tolist() == [10, 11, 12, 13, 14, -1]
    assert t.node_index[0].tolist() == [1, 2, 3, 4, 5, -1]
    # the same tree through SGLang's pointers, with block token 6 unlinked
    sg = avs.tree_to_sglang(t.anchor_tokens, t.parents[:, :5], t.tree_sizes, t.draft_tokens[:, :5], mask_mode="qlen")
    nxt = torch.cat([sg["retrieve_next_token"], torch.tensor([[-1]])], 1)
    sib = torch.cat([sg["retrieve_next_sibling"], torch.tensor([[-1]])], 1)
    again = avs.tree_from_sglang(torch.tensor([5, 10, 11, 12, 13, 14, 15]), nxt, sib)
    for a, b in zip(t, again):
        assert torch.equal(a, b)


def test_unlinked_subtree_is_left_out():
    """A draft no pointer reaches, and its own child, are left out; the nodes after them are renumbered and
    node_index keeps SGLang's indices."""
    # block: 0 -> 1 -> 4, 0 -> 2; token 3 unlinked with child 5 (3 -> 5); 0 -> 6
    nxt = torch.tensor([[1, 4, -1, 5, -1, -1, -1]])
    sib = torch.tensor([[-1, 2, 6, -1, -1, -1, -1]])
    tok = torch.arange(100, 107)
    t = avs.tree_from_sglang(tok, nxt, sib)
    assert t.tree_sizes.tolist() == [4]
    assert t.node_index[0].tolist() == [1, 2, 4, 6, -1, -1]
    assert t.parents[0].tolist()[:4] == [-1, -1, 0, -1]
    assert t.draft_tokens[0].tolist()[:4] == [101, 102, 104, 106]


def planned(seed, budget):
    b = random_batch(seed, R=5, N=int(np.random.default_rng(seed).integers(8, 64)))
    sg = avs.tree_to_sglang(b["anchors"], b["parents"], b["sizes"], b["tokens"], seq_lens=b["ctx"])
    t = avs.tree_from_sglang(sg["draft_token"], sg["retrieve_next_token"], sg["retrieve_next_sibling"])
    conf = torch.from_numpy(np.random.default_rng(seed + 1).uniform(0.2, 1.0, (b["R"], b["N"])).astype(np.float32))
    plan = av.plan_tree_verification(None, t.parents, t.tree_sizes, conf=conf, mode="fixed", budget=budget,
                                     context_lens=b["ctx"], anchor_tokens=t.anchor_tokens, draft_tokens=t.draft_tokens,
                                     num_reqs_padded=b["R"] + 2)
    return b, sg, t, plan


@pytest.mark.parametrize("seed", range(6))
def test_planned_subset_masks_agree(seed):
    """For every verified token: our tree_mask in SGLang's index space is SGLang's mask row of that token (every
    mode), its id is SGLang's, and tree_verify_input's custom_mask (every mode) decodes to the plan's tree_mask."""
    b, sg, t, plan = planned(seed, budget=3 + seed * 7)
    R, n = b["R"], b["N"] + 1
    T = int(plan.num_tokens)
    ours = avs.tree_mask_to_sglang(plan, t.node_index)
    assert ours[T:].tolist() == [0] * (ours.shape[0] - T)
    qsl, node = plan.query_start_loc.tolist(), plan.token_node.tolist()
    for mode in MODES:
        m = avs.tree_to_sglang(b["anchors"], b["parents"], b["sizes"], b["tokens"], seq_lens=b["ctx"], mask_mode=mode)
        theirs = avs.mask_bits_from_sglang(m["custom_mask"], n, R, mask_mode=mode, seq_lens=b["ctx"])
        checked = 0
        for r in range(R):
            for tok in range(qsl[r], qsl[r + 1]):
                s = 0 if node[tok] < 0 else int(t.node_index[r, node[tok]])
                assert int(ours[tok]) == int(theirs[r, s]), (mode, r, tok)
                assert int(plan.input_ids[tok]) == int(sg["draft_token"][r * n + s])
                checked += 1
        assert checked == T
        W = n
        vi = avs.tree_verify_input(plan, W, R, mask_mode=mode)
        q = [qsl[r + 1] - qsl[r] for r in range(R)]
        if mode == "bitpacked":
            got = vi["custom_mask"].view(torch.uint8).reshape(T, -1).to(torch.int64)
            words = sum(got[:, k] << (8 * k) for k in range(got.shape[1]))
            assert words.tolist() == plan.tree_mask[:T].tolist()
            continue
        ctx = b["ctx"].tolist()
        pos = 0
        for r in range(R):
            rows = q[r]
            width = (ctx[r] + rows) if mode == "full" else W
            block = vi["custom_mask"][pos: pos + rows * width].reshape(rows, width) if mode == "full" else \
                vi["custom_mask"].reshape(R, W, W)[r, :rows]
            pos += rows * width if mode == "full" else 0
            if mode == "full":
                assert bool(block[:, :ctx[r]].all())
            tree = block[:, ctx[r]:ctx[r] + rows] if mode == "full" else block[:, :rows]
            for i in range(rows):
                want = int(plan.tree_mask[qsl[r] + i])
                assert sum(1 << k for k in range(rows) if tree[i, k]) == want
            if mode == "qlen":
                assert not bool(block[:, rows:].any())
        if mode == "full":
            assert pos == vi["custom_mask"].shape[0]


def test_verify_input_pointers_and_rows():
    b, sg, t, plan = planned(3, budget=25)
    R, W = b["R"], b["N"] + 1
    vi = avs.tree_verify_input(plan, W, R)
    qsl, parent = plan.query_start_loc.tolist(), plan.token_parent.tolist()
    assert vi["tree_topk"] == -1 and vi["qo_indptr"].tolist() == qsl[:R + 1]
    for r in range(R):
        q = qsl[r + 1] - qsl[r]
        kids = {p: [i for i in range(1, q) if parent[qsl[r] + i] == p] for p in range(q)}
        for p in range(q):
            assert int(vi["retrieve_next_token"][r, p]) == (kids[p][0] if kids[p] else -1)
            for a, c in zip(kids[p], kids[p][1:] + [-1]):
                assert int(vi["retrieve_next_sibling"][r, a]) == c
        assert vi["retrieve_index"][r].tolist() == [qsl[r] + i if i < q else -1 for i in range(W)]
        assert vi["retrieve_next_token"][r, q:].tolist() == [-1] * (W - q)
    assert vi["seq_lens"].tolist() == b["ctx"].tolist()
    assert vi["positions"][:int(plan.num_tokens)].tolist() == plan.positions[:int(plan.num_tokens)].tolist()


def sglang_greedy(sg, r, n, target):
    """Stand-in of SGLang's verify_tree_greedy on one request: follow the child whose token is the prediction of the
    current token. Returns the accepted block indices (0 first) and the emitted tokens."""
    nxt, sib, tok = sg["retrieve_next_token"][r].tolist(), sg["retrieve_next_sibling"][r].tolist(), sg["draft_token"]
    path, cur = [0], 0
    while True:
        c = nxt[cur]
        while c != -1 and int(tok[r * n + c]) != target[cur]:
            c = sib[c]
        if c == -1:
            return path, [target[i] for i in path]
        path.append(c)
        cur = c


@pytest.mark.parametrize("seed", range(4))
def test_loop_end_to_end(seed):
    """The guide's loop on SGLang-layout trees: convert -> plan -> write_kv -> verify_attention(tree_mask) ->
    tree_rejection_sample (greedy) -> commit_tree_kv -> tree_verify_output. Attention equals dense attention under
    SGLang's full custom_mask; with every node verified the accepted path is SGLang's greedy walk."""
    rng = np.random.default_rng(100 + seed)
    b = random_batch(200 + seed, R=5, N=int(rng.integers(6, 40)), topk=int(rng.integers(2, 5)))
    R, N, n, V = b["R"], b["N"], b["N"] + 1, b["V"]
    sg = avs.tree_to_sglang(b["anchors"], b["parents"], b["sizes"], b["tokens"], seq_lens=b["ctx"])
    t = avs.tree_from_sglang(sg["draft_token"], sg["retrieve_next_token"], sg["retrieve_next_sibling"])
    Hq, Hkv, D, bs = 4, 2, 64, 16
    max_blocks = (12 + n) // bs + 1
    block_table = torch.from_numpy(rng.permutation(R * max_blocks).reshape(R, max_blocks).astype(np.int32))
    plan = av.plan_tree_verification(None, t.parents, t.tree_sizes, conf=torch.full((R, N), 0.8), mode="all",
                                     context_lens=b["ctx"], block_table=block_table, block_size=bs,
                                     anchor_tokens=t.anchor_tokens, draft_tokens=t.draft_tokens)
    T = int(plan.num_tokens)
    g = torch.Generator().manual_seed(seed)
    f16 = dict(generator=g, dtype=torch.float16)
    k_cache = torch.randn(R * max_blocks, bs, Hkv, D, **f16)
    v_cache = torch.randn(R * max_blocks, bs, Hkv, D, **f16)
    q = torch.randn(T, Hq, D, **f16)
    k_new, v_new = torch.randn(T, Hkv, D, **f16), torch.randn(T, Hkv, D, **f16)
    av.write_kv(k_new, v_new, k_cache, v_cache, plan.slot_mapping[:T])
    out = av.verify_attention(q, k_cache, v_cache, block_table, plan.seq_lens[:R], plan.query_start_loc[:R + 1], n,
                              tree_mask=plan.tree_mask[:T])
    vi = avs.tree_verify_input(plan, n, R, mask_mode="full")
    qsl, ctx, end = plan.query_start_loc.tolist(), b["ctx"].tolist(), plan.seq_lens.tolist()
    pos = 0
    for r in range(R):  # dense attention with SGLang's mask rows over the request's KV (context then its tokens)
        slots = [int(block_table[r, i // bs]) * bs + i % bs for i in range(end[r])]
        K = k_cache.reshape(-1, Hkv, D)[slots].repeat_interleave(Hq // Hkv, 1).double()
        Vv = v_cache.reshape(-1, Hkv, D)[slots].repeat_interleave(Hq // Hkv, 1).double()
        rows = qsl[r + 1] - qsl[r]
        mask = vi["custom_mask"][pos: pos + rows * end[r]].reshape(rows, end[r])
        pos += rows * end[r]
        s = torch.einsum("thd,khd->htk", q[qsl[r]:qsl[r + 1]].double(), K) / D ** 0.5
        want = torch.einsum("htk,khd->thd", s.masked_fill(~mask, float("-inf")).softmax(-1), Vv)
        torch.testing.assert_close(out[qsl[r]:qsl[r + 1]].double(), want, rtol=0, atol=4e-3)  # fp16 output rounding
    # target predictions: each token's row favours one of its children's ids, or an id no child has
    target = [0] * T
    logits = torch.randn(T, V, generator=g)
    parent, ids = plan.token_parent.tolist(), plan.input_ids.tolist()
    for r in range(R):
        for tok in range(qsl[r], qsl[r + 1]):
            kids = [c for c in range(tok + 1, qsl[r + 1]) if parent[c] == tok - qsl[r]]
            pick = ids[kids[int(rng.integers(len(kids)))]] if kids and rng.random() < 0.8 else int(rng.integers(V))
            logits[tok, pick] += 20
            target[tok] = int(logits[tok].argmax())
    W = n
    tokens, emitted, offsets = av.tree_rejection_sample(logits, plan.query_start_loc[:R + 1], plan.token_parent[:T],
                                                        plan.input_ids[:T], W)
    before = k_cache.clone()
    av.commit_tree_kv(k_cache, v_cache, block_table, b["ctx"], offsets, (emitted - 1).clamp(min=0))
    res = avs.tree_verify_output(plan, tokens, emitted, offsets, R, node_index=t.node_index)
    acc = res["accept_index"].tolist()
    for r in range(R):
        e = int(emitted[r])
        rows = [x for x in acc[r] if x >= 0]
        assert len(rows) == e == int(res["accept_lens"][r]) and acc[r][e:] == [-1] * (W - e)
        assert res["predict"][rows].tolist() == tokens[r, :e].tolist()
        nodes = res["accept_node"][r, :e].tolist()
        # SGLang's greedy walk over its own pointers and predictions (row of block index s = plan row of s)
        row_of = {0: qsl[r]}
        for tok in range(qsl[r] + 1, qsl[r + 1]):
            row_of[int(t.node_index[r, plan.token_node[tok]])] = tok
        path, emitted_tokens = sglang_greedy(sg, r, n, {s: target[row] for s, row in row_of.items()})
        assert nodes == path and tokens[r, :e].tolist() == emitted_tokens
        assert res["sglang_accept_index"][r, :e].tolist() == [r * n + s for s in path]
        for d in range(1, e):  # the path's K/V now sit at context_len + depth
            p = ctx[r] + d
            assert torch.equal(k_cache[int(block_table[r, p // bs]), p % bs], k_new[qsl[r] + int(offsets[r, d])])
    assert res["verified_id"].tolist() == [x for r in range(R) for x in tokens[r, :int(emitted[r])].tolist()]
    assert not torch.equal(before, k_cache) or int((emitted - 1).clamp(min=0).sum()) == 0


def test_errors_name_the_argument():
    nxt = torch.tensor([[1, -1, -1]])
    sib = torch.tensor([[-1, 2, -1]])
    tok = torch.arange(3)
    with pytest.raises(ValueError, match="retrieve_next_token"):
        avs.tree_from_sglang(tok, torch.tensor([[1, 0, -1]]), sib)  # points backwards
    with pytest.raises(ValueError, match="retrieve_next_sibling"):
        avs.tree_from_sglang(tok, nxt, torch.tensor([[-1, 3, -1]]))  # out of range
    with pytest.raises(ValueError, match="pointed to twice"):
        avs.tree_from_sglang(tok, torch.tensor([[1, 2, -1]]), sib)
    with pytest.raises(ValueError, match="retrieve_next_sibling must have"):
        avs.tree_from_sglang(tok, nxt, sib[:, :2])
    with pytest.raises(ValueError, match="draft_token"):
        avs.tree_from_sglang(tok[:2], nxt, sib)
    with pytest.raises(ValueError, match="top_scores_index"):
        avs.tree_from_eagle_draft(torch.tensor([1]), torch.tensor([[1, 2]]), torch.empty(1, 0, dtype=torch.int64),
                                  torch.tensor([[1, 0]]), 2)
    with pytest.raises(ValueError, match="topk"):
        avs.tree_from_eagle_draft(torch.tensor([1]), torch.tensor([[1]]), torch.empty(1, 0, dtype=torch.int64),
                                  torch.tensor([[0]]), 0)
    with pytest.raises(ValueError, match="mask_mode"):
        avs.mask_bits_from_sglang(torch.ones(9, dtype=torch.bool), 3, 1, mask_mode="packed")
    with pytest.raises(ValueError, match="seq_lens"):
        avs.mask_bits_from_sglang(torch.ones(9, dtype=torch.bool), 3, 1, mask_mode="full")
    with pytest.raises(ValueError, match="custom_mask"):
        avs.mask_bits_from_sglang(torch.ones(8, dtype=torch.bool), 3, 1, mask_mode=1)
    rows = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 1]]  # token 3's row skips its grandparent 1
    with pytest.raises(ValueError, match="parent's row"):
        avs.tree_from_sglang_mask(torch.arange(4), torch.tensor(rows, dtype=torch.bool).flatten(), 4, 1, mask_mode=1)
    rows[3] = [0, 0, 1, 1]  # and without token 0
    with pytest.raises(ValueError, match="token 0"):
        avs.tree_from_sglang_mask(torch.arange(4), torch.tensor(rows, dtype=torch.bool).flatten(), 4, 1, mask_mode=1)
    with pytest.raises(ValueError, match="custom_mask"):
        avs.mask_bits_from_sglang(torch.ones(3, dtype=torch.uint8), 9, 1, mask_mode="bitpacked")
    with pytest.raises(ValueError, match="parents"):
        avs.tree_to_sglang(torch.tensor([1]), torch.tensor([[0]]), torch.tensor([1]), torch.tensor([[4]]), mask_mode=1)
    with pytest.raises(ValueError, match="tree_sizes"):
        avs.tree_to_sglang(torch.tensor([1]), torch.tensor([[-1]]), torch.tensor([2]), torch.tensor([[4]]), mask_mode=1)
    with pytest.raises(ValueError, match="seq_lens"):
        avs.tree_to_sglang(torch.tensor([1]), torch.tensor([[-1]]), torch.tensor([1]), torch.tensor([[4]]))
    b, sg, t, plan = planned(1, budget=20)
    with pytest.raises(ValueError, match="max_query_len"):
        avs.tree_verify_input(plan, 1, b["R"])
    with pytest.raises(ValueError, match="node_index"):
        avs.tree_mask_to_sglang(plan, t.node_index[:1], b["R"])
