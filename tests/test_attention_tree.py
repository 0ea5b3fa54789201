"""verify_attention with draft-tree masks (tree_mask, docs/design.md "Draft trees") on CPU: the C++ kernel against
the float64 reference on random trees, a chain's mask against tree_mask=None bit for bit, positions a token must
not see (poisoned with NaN and with large values), batch invariance, the planner's own masks end to end, and bad
masks named. The CUDA source runs the same cases under the emulator (test_attention_tree_emu.py) and on a GPU
(test_attention_tree_cuda.py).

Trees: request r's block is its anchor (offset 0) then its nodes, each node's parent an earlier offset (the
layout of plan_tree_verification); a token's mask is itself plus its ancestors. Styles: "random" parents,
"star" (every node under the anchor: each sees only the anchor and itself), "chain" (parent = previous offset;
the mask is lower-triangular), "levels" (EAGLE-2 style, 4 nodes per level).
"""
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

from test_attention import NAN, NEG_INF, Problem, bits, call, check_against_reference, random_request, ulp

STYLES = ("random", "star", "chain", "levels")


def to_int64(m):
    """A 64-bit mask as the int64 it is stored in (bit 63 is the sign bit)."""
    return m - (1 << 64) if m >= 1 << 63 else m


def tree_parents(g, q_len, style):
    """Parent offset of each offset 1 .. q_len - 1 of a block (offset 0 is the anchor), topological."""
    parents = [-1]
    for j in range(1, q_len):
        if style == "chain":
            parents.append(j - 1)
        elif style == "star":
            parents.append(0)
        elif style == "levels":
            level = (j - 1) // 4  # offsets 1..4 under the anchor, then each level under the previous one
            parents.append(0 if level == 0 else 1 + 4 * (level - 1) + int(torch.randint(0, 4, (1,), generator=g)))
        else:
            parents.append(int(torch.randint(0, j, (1,), generator=g)))
    return parents


def masks_of(parents):
    """Each token's mask: itself and its ancestors (the anchor always)."""
    masks = []
    for j, p in enumerate(parents):
        masks.append((masks[p] if p >= 0 else 0) | (1 << j))
    return masks


class TreeProblem(Problem):
    """A paged batch (test_attention.Problem) whose requests' blocks are trees; tree_mask [T] int64, with
    garbage in the padding tokens' entries (never read)."""

    def __init__(self, reqs, block_size, styles, *, seed=0, **kw):
        super().__init__(reqs, block_size, seed=seed, **kw)
        g = torch.Generator().manual_seed(seed + 1)
        self.parents = [tree_parents(g, n, s) for n, s in zip(self.q_lens, styles)]
        mask = torch.randint(-2**62, 2**62, (self.T,), generator=g, dtype=torch.int64)
        for r, parents in enumerate(self.parents):
            if parents:
                mask[self.rows(r)] = torch.tensor([to_int64(m) for m in masks_of(parents)], dtype=torch.int64)
        self.tree_mask = mask


def random_tree_problem(seed, dtype, D, block_size, Hkv, group, q_lens, *, max_seq=1500, styles=None,
                        extra_tokens=3, q_scale=1.0):
    """Requests of the given q_lens (0: a padding row) with seq_len log-uniform in q_len..max_seq, trees of the
    given styles (random by default)."""
    g = torch.Generator().manual_seed(seed)
    Hq = Hkv * group
    reqs = []
    for n in q_lens:
        u = float(torch.rand((), generator=g))
        s = 0 if n == 0 else max(n, int(round(n * (max_seq / n) ** u)))
        reqs.append(random_request(g, n, s, Hq, Hkv, D, dtype, q_scale))
    styles = styles or [STYLES[int(torch.randint(0, 4, (1,), generator=g))] for _ in q_lens]
    return TreeProblem(reqs, block_size, styles, seed=seed, extra_tokens=extra_tokens,
                       max_query_len=max(max(q_lens), 1), dtype=dtype, Hq=Hq, Hkv=Hkv, D=D)


def tree_call(p, tree_mask=None, **kw):
    return call(p, tree_mask=p.tree_mask if tree_mask is None else tree_mask, **kw)


def check_tree_against_reference(p, got, lse, tree_mask=None):
    """check_against_reference with the problem's masks (tolerance: test_attention's)."""
    mask = p.tree_mask if tree_mask is None else tree_mask
    check_against_reference(p, got, lse, tree_mask=mask)


# ------------------------------------------------------------------------------------------------------
# against the reference
# ------------------------------------------------------------------------------------------------------

# (dtype, D, block_size, group, q_lens): every dtype, head dim, block size and GQA ratio; awkward q_lens up to
# the 64-token limit (the anchor and 63 nodes), several requests of different lengths and a padding row.
CASES = [
    (torch.bfloat16, 128, 16, 8, [7, 64, 0, 1, 33]),
    (torch.float16, 64, 32, 1, [64, 5, 17]),
    (torch.bfloat16, 256, 64, 4, [2, 0, 63, 9]),
    (torch.float16, 128, 128, 16, [13, 40, 3]),
    (torch.bfloat16, 64, 256, 2, [1, 31, 64, 64]),
]


@pytest.mark.parametrize("dtype,D,block_size,group,q_lens", CASES,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-g{g}" for d, D, bs, g, _ in CASES])
def test_tree_matches_reference(dtype, D, block_size, group, q_lens):
    Hkv = 2 if group <= 4 else 1
    p = random_tree_problem(40 + D + block_size + group, dtype, D, block_size, Hkv, group, q_lens)
    got, lse = tree_call(p)
    check_tree_against_reference(p, got, lse)


@pytest.mark.parametrize("style", STYLES)
def test_every_tree_style_matches_reference(style):
    p = random_tree_problem(7, torch.bfloat16, 64, 16, 2, 4, [64, 11, 30], styles=[style] * 3, max_seq=700)
    got, lse = tree_call(p)
    check_tree_against_reference(p, got, lse)


def test_tree_spans_split_boundaries():
    """Blocks that straddle the 512-token splits: the tree's positions fall in two splits."""
    g = torch.Generator().manual_seed(5)
    cases = [(64, 512), (64, 540), (40, 1024 + 20), (64, 64), (9, 9)]
    reqs = [random_request(g, n, s, 8, 2, 128, torch.float16) for n, s in cases]
    p = TreeProblem(reqs, 32, ["random", "levels", "star", "random", "chain"], seed=5, max_query_len=64)
    got, lse = tree_call(p)
    check_tree_against_reference(p, got, lse)


def test_the_tree_changes_the_result():
    """The mask is honoured: a star tree's nodes differ from the same tokens attended causally (a test that
    ignored the mask entirely would pass every comparison above only if the reference ignored it too)."""
    p = random_tree_problem(9, torch.float16, 64, 16, 1, 1, [20], styles=["star"], max_seq=40)
    tree, _ = tree_call(p)
    chain, _ = call(p)
    rows = p.rows(0)
    assert torch.equal(bits(tree[rows][:2]), bits(chain[rows][:2]))  # the anchor and node 1 see the same set
    assert (tree[rows][2:] - chain[rows][2:]).abs().amax(dim=(1, 2)).min() > 0  # every later node differs


def test_reference_tree_is_attention_over_the_ancestors():
    """The reference's masked form against a plain loop: each token's softmax over its context and the K/V of
    the tokens on its path to the anchor (walking parents, not masks)."""
    p = random_tree_problem(11, torch.float16, 64, 16, 2, 2, [12, 5], max_seq=60)
    want = ref.verify_attention(p.q.double(), p.k_cache.double(), p.v_cache.double(), p.block_table, p.seq_lens,
                                p.query_start_loc, p.max_query_len, tree_mask=p.tree_mask, dtype=torch.float64)
    bs = p.k_cache.shape[1]
    for r in range(p.R):
        n, kv_len = p.q_lens[r], p.seq_lens_list[r]
        ctx = kv_len - n
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.append(ctx + j)
                j = p.parents[r][j]
            pos = torch.tensor(list(range(ctx)) + sorted(path))
            ids = p.block_table[r].long()[pos // bs]
            k = p.k_cache[ids, pos % bs].double().repeat_interleave(2, 1)  # [n_seen, Hq, D]
            v = p.v_cache[ids, pos % bs].double().repeat_interleave(2, 1)
            q = p.q[p.rows(r).start + i].double()                           # [Hq, D]
            w = torch.softmax(torch.einsum("hd,phd->hp", q, k) * 64 ** -0.5, -1)
            torch.testing.assert_close(want[p.rows(r).start + i], torch.einsum("hp,phd->hd", w, v), rtol=1e-12,
                                       atol=1e-12)


# ------------------------------------------------------------------------------------------------------
# chains, extra bits, nothing visible
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,D,block_size,group", [(torch.bfloat16, 128, 16, 8), (torch.float16, 64, 64, 1),
                                                      (torch.bfloat16, 256, 32, 2)])
def test_chain_mask_gives_the_bits_of_no_mask(dtype, D, block_size, group):
    """Bits 0..i for token i: exactly tree_mask=None's output and lse, bit for bit."""
    p = random_tree_problem(21, dtype, D, block_size, 1 if group == 8 else 2, group, [64, 1, 0, 17, 33],
                            styles=["chain"] * 5)
    masked = tree_call(p)
    plain = call(p)
    assert torch.equal(bits(masked[0]), bits(plain[0])) and torch.equal(bits(masked[1]), bits(plain[1]))


def test_bits_above_the_token_are_ignored():
    """Bits above a token's own offset (later tokens of its block, and offsets >= q_len) change nothing."""
    p = random_tree_problem(23, torch.bfloat16, 64, 16, 2, 4, [64, 10, 3], max_seq=900)
    noisy = p.tree_mask.clone()
    g = torch.Generator().manual_seed(23)
    for r in range(p.R):
        for i, t in enumerate(range(p.rows(r).start, p.rows(r).stop)):
            above = int(torch.randint(0, 2**62, (1,), generator=g)) << 2 & ~((2 << i) - 1) & (2**64 - 1)
            noisy[t] = to_int64(int(p.tree_mask[t]) & (2**64 - 1) | above | (1 << 63))
    assert not torch.equal(noisy, p.tree_mask)
    clean = tree_call(p)
    got = tree_call(p, tree_mask=noisy)
    assert torch.equal(bits(got[0]), bits(clean[0])) and torch.equal(bits(got[1]), bits(clean[1]))


def test_token_that_sees_nothing_gets_zeros():
    """No context (seq_len == q_len) and a mask without bits: zeros and lse -inf, like padding (reference too);
    a token with only the anchor bit sees the anchor alone."""
    g = torch.Generator().manual_seed(3)
    p = Problem([random_request(g, 4, 4, 2, 1, 64, torch.float16)], 16, max_query_len=4, seed=3)
    mask = torch.tensor([0b1, 0, 0b1, 0b1000] + [0] * (p.T - 4), dtype=torch.int64)
    got, lse = call(p, tree_mask=mask)
    assert (got[1] == 0).all() and (lse[1] == NEG_INF).all()
    check_against_reference(p, got, lse, tree_mask=mask)
    # one visible position: its softmax weight is exactly 1, so the output is that position's V (both q heads)
    v = p.v_cache[p.block_table[0, 0].long()]  # [block_size, Hkv, D]: positions 0..3 are the block's tokens
    assert torch.equal(got[2], v[0].expand(2, -1)) and torch.equal(got[3], v[3].expand(2, -1))


# ------------------------------------------------------------------------------------------------------
# what a token must not see
# ------------------------------------------------------------------------------------------------------


def poison_nodes(p, r, offsets, value, *, k=True, v=True):
    """Copies of the caches with request r's block tokens at `offsets` set to `value`."""
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    bs = kc.shape[1]
    ctx = p.seq_lens_list[r] - p.q_lens[r]
    for o in offsets:
        pos = ctx + o
        blk = int(p.block_table[r, pos // bs])
        if k:
            kc[blk, pos % bs] = value
        if v:
            vc[blk, pos % bs] = value
    return kc, vc


def seen_by(parents, offsets):
    """Offsets of the tokens whose ancestor set (itself included) meets `offsets`."""
    masks = masks_of(parents)
    return {i for i, m in enumerate(masks) if any(m >> o & 1 for o in offsets)}


@pytest.mark.parametrize("value", [NAN, 8.0], ids=["nan", "large"])
def test_hidden_tree_positions_never_reach_a_token(value):
    """K/V of some nodes poisoned (NaN, or 8.0 everywhere: scores and values far from the others'): the tokens
    that do not see them keep their exact bits; those that do are NaN (NaN poison) or match the reference."""
    p = random_tree_problem(31, torch.bfloat16, 128, 16, 2, 2, [40, 64], max_seq=700, styles=["levels", "random"])
    clean = tree_call(p)
    for r in range(p.R):
        offsets = [3, 9, p.q_lens[r] - 1]
        kc, vc = poison_nodes(p, r, offsets, value)
        q, _, _, bt, sl, qsl, mql = p.args()
        out, lse = av.verify_attention(q, kc, vc, bt, sl, qsl, mql, return_lse=True, tree_mask=p.tree_mask)
        seen = seen_by(p.parents[r], offsets)
        for i in range(p.q_lens[r]):
            t = p.rows(r).start + i
            if i in seen:
                assert value == value or torch.isnan(out[t]).all()  # a finite poison: the reference checks below
            else:
                assert torch.equal(bits(out[t]), bits(clean[0][t])) and torch.equal(bits(lse[t]), bits(clean[1][t]))
        others = torch.ones(p.T, dtype=torch.bool)
        others[p.rows(r)] = False
        assert torch.equal(bits(out[others]), bits(clean[0][others]))
        if value == value:  # a finite poison: the reference agrees on the rows that see it too
            check_against_reference_with_caches(p, kc, vc, out, lse)


def check_against_reference_with_caches(p, kc, vc, got, lse):
    saved = p.k_cache, p.v_cache
    p.k_cache, p.v_cache = kc, vc
    try:
        check_tree_against_reference(p, got, lse)
    finally:
        p.k_cache, p.v_cache = saved


def test_padding_tokens_mask_entries_are_not_read():
    """Padding tokens (past query_start_loc[R], and rows of q_len 0) get zeros whatever their mask says."""
    p = random_tree_problem(33, torch.float16, 64, 16, 1, 2, [5, 0, 9], extra_tokens=6)
    a = tree_call(p)
    mask = p.tree_mask.clone()
    mask[p.padding_mask()] = -1
    b = tree_call(p, tree_mask=mask)
    assert torch.equal(bits(a[0]), bits(b[0])) and (b[0][p.padding_mask()] == 0).all()


# ------------------------------------------------------------------------------------------------------
# batch invariance, determinism, the planner's masks
# ------------------------------------------------------------------------------------------------------


def test_tree_batch_invariance():
    """A tree request's output and lse are bitwise identical alone and inside a batch of other trees (at
    another position, in other pages, with other masks around it)."""
    dtype, D, block_size, Hkv, group = torch.bfloat16, 128, 32, 2, 4
    g = torch.Generator().manual_seed(8)
    Hq = Hkv * group
    target = random_request(g, 37, 1300, Hq, Hkv, D, dtype)
    alone = TreeProblem([target], block_size, ["random"], seed=1, extra_tokens=0, spare_blocks=0, max_query_len=64)
    a = tree_call(alone)
    others = [random_request(g, n, s, Hq, Hkv, D, dtype) for n, s in [(64, 900), (0, 0), (8, 130), (1, 1)]]
    batch = TreeProblem(others[:2] + [target] + others[2:], block_size, ["levels", "star", "random", "chain", "star"],
                        seed=2, extra_tokens=3, spare_blocks=2, max_query_len=64)
    batch.tree_mask[batch.rows(2)] = alone.tree_mask[alone.rows(0)]  # the same tree
    b = tree_call(batch)
    rows = batch.rows(2)
    assert torch.equal(bits(b[0][rows]), bits(a[0])) and torch.equal(bits(b[1][rows]), bits(a[1]))
    again = tree_call(batch)
    assert torch.equal(bits(again[0]), bits(b[0])) and torch.equal(bits(again[1]), bits(b[1]))


def test_planner_tree_masks_end_to_end():
    """plan_tree_verification's layout (query_start_loc, seq_lens, slot_mapping, tree_mask) drives write_kv and
    verify_attention; each token's output is attention over its context and its path to the anchor, found by
    walking the plan's token_parent (not its masks)."""
    g = torch.Generator().manual_seed(4)
    R, N, bs, Hkv, group, D = 3, 63, 16, 2, 2, 64
    parents = torch.full((R, N), -1, dtype=torch.int32)
    for j in range(1, N):
        parents[:, j] = torch.randint(-1, j, (R,), generator=g)
    sizes = torch.tensor([63, 20, 0], dtype=torch.int32)
    survival = av.tree_survival(torch.rand(R, N, generator=g) * 0.5 + 0.5, parents, sizes)
    context = torch.tensor([100, 0, 7], dtype=torch.int32)
    max_blocks = (100 + 64) // bs + 1
    block_table = torch.randperm(R * max_blocks, generator=g).to(torch.int32).view(R, max_blocks)
    plan = av.plan_tree_verification(survival, parents, sizes, mode="fixed", budget=70, context_lens=context,
                                     block_table=block_table, block_size=bs, num_reqs_padded=4,
                                     num_tokens_padded=90)
    T = plan.tree_mask.shape[0]
    k_cache = torch.randn(R * max_blocks, bs, Hkv, D, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(R * max_blocks, bs, Hkv, D, generator=g).to(torch.bfloat16)
    k_new = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    v_new = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    av.write_kv(k_new, v_new, k_cache, v_cache, plan.slot_mapping)
    q = torch.randn(T, Hkv * group, D, generator=g).to(torch.bfloat16)
    bt = torch.cat([block_table, torch.zeros(1, max_blocks, dtype=torch.int32)])  # the padding row's
    out = av.verify_attention(q, k_cache, v_cache, bt, plan.seq_lens, plan.query_start_loc, 64,
                              tree_mask=plan.tree_mask)
    qsl, parent, req = plan.query_start_loc.tolist(), plan.token_parent.tolist(), plan.token_req.tolist()
    assert qsl[1] - qsl[0] > 1 and qsl[2] - qsl[1] > 1  # real trees in two requests
    for t in range(T):
        r = req[t]
        if r < 0:
            assert (out[t] == 0).all()
            continue
        begin, ctx = qsl[r], int(context[r])
        path, j = [], t - begin
        while j >= 0:
            path.append(ctx + j)
            j = parent[begin + j]
        pos = torch.tensor(list(range(ctx)) + sorted(path))
        ids = bt[r].long()[pos // bs]
        k = k_cache[ids, pos % bs].double().repeat_interleave(group, 1)  # [n_seen, Hq, D]
        v = v_cache[ids, pos % bs].double().repeat_interleave(group, 1)
        w = torch.softmax(torch.einsum("hd,phd->hp", q[t].double(), k) * D ** -0.5, -1)
        want = torch.einsum("hp,phd->hd", w, v)
        err = (out[t].double() - want).abs().max().item()
        assert err <= 2 * ulp(torch.bfloat16, want.abs().max().item()) + 1e-3, f"token {t}: error {err:.3g}"


# ------------------------------------------------------------------------------------------------------
# bad masks
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask,exc,match", [
    (lambda T: torch.zeros(T, dtype=torch.int32), TypeError, "tree_mask must have dtype"),
    (lambda T: torch.zeros(T, dtype=torch.float64), TypeError, "tree_mask must have dtype"),
    (lambda T: torch.zeros(T + 1, dtype=torch.int64), ValueError, r"tree_mask must have shape \("),
    (lambda T: torch.zeros(T, 1, dtype=torch.int64), ValueError, "tree_mask must have shape"),
    (lambda T: torch.zeros(2 * T, dtype=torch.int64)[::2], ValueError, "tree_mask must have a contiguous"),
    (lambda T: torch.zeros(T, dtype=torch.int64, device="meta"), ValueError, "tree_mask must be on cpu"),
    (lambda T: [1] * T, TypeError, "tree_mask must be a torch.Tensor"),
    (lambda T: 0, TypeError, "tree_mask must be a torch.Tensor"),
], ids=["int32", "float64", "long", "2d", "strided", "device", "list", "int"])
def test_bad_tree_mask_is_named(mask, exc, match):
    p = random_tree_problem(1, torch.bfloat16, 64, 16, 1, 1, [3, 2])
    with pytest.raises(exc, match=match):
        av.verify_attention(*p.args(), tree_mask=mask(p.T))


def test_max_query_len_above_64_names_tree_mask():
    p = random_tree_problem(1, torch.bfloat16, 64, 16, 1, 1, [3, 2])
    args = list(p.args())
    args[-1] = 65
    with pytest.raises(ValueError, match=r"max_query_len must be in \[1, 64\] \(a tree_mask row"):
        av.verify_attention(*args, tree_mask=p.tree_mask)

