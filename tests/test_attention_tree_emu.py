"""verify_attention's CUDA kernels with draft-tree masks, run on the CPU by the fiber emulator (tests/emu, as in
test_attention_emu.py): the tensor-core kernel ("mma", "mma_fused") and the row-wise one, through their real
launcher, against the float64 reference and the C++ CPU kernel. Trees are test_attention_tree.py's.

What is checked: random trees of every style against the reference (q_len up to 64, so two row chunks at
group 4; GQA ratios, dtypes, head dims, block sizes); a chain's mask gives tree_mask=None's bits on every kernel;
bits above a token's own offset change nothing; K/V of nodes a token does not see never reach it (large finite
values (8.0) for the tensor-core kernel, whose P V multiplies a block's hidden V rows by exactly 0; NaN K and V for the
row-wise kernel, which never loads them); "mma_fused" gives "mma"'s bits; batch invariance.
"""
import pytest
import torch

from test_attention import bits, check_against_reference
from test_attention_emu import build_emu, emu_call
from test_attention_tree import (NAN, TreeProblem, poison_nodes, random_request, random_tree_problem, seen_by,
                                 tree_call)

each_kernel = pytest.mark.parametrize("kernel", ["mma", "mma_fused"])


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    """The emulator's verify_attention entry point (built once per source hash, shared with test_attention_emu)."""
    return build_emu(tmp_path_factory)

# (dtype, D, block_size, group, q_lens): rows per request up to 64 x 4 = 256 (two 8-warp row chunks)
CASES = [
    (torch.bfloat16, 128, 16, 4, [64, 5, 0, 17]),
    (torch.float16, 64, 32, 8, [9, 16, 1]),
    (torch.bfloat16, 256, 64, 1, [33, 64]),
    (torch.float16, 64, 256, 16, [3, 8]),
    (torch.bfloat16, 64, 128, 2, [40, 2, 63]),
]


def tcall(emu, kernel, p, **kw):
    return emu_call(emu, kernel, p, tree_mask=kw.pop("tree_mask", p.tree_mask), **kw)


@pytest.mark.parametrize("dtype,D,block_size,group,q_lens", CASES,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-g{g}" for d, D, bs, g, _ in CASES])
@each_kernel
def test_tree_kernel_matches_reference(emu, kernel, dtype, D, block_size, group, q_lens):
    Hkv = 2 if group <= 4 else 1
    p = random_tree_problem(70 + D + block_size + group, dtype, D, block_size, Hkv, group, q_lens, max_seq=700)
    out, lse, counts = tcall(emu, kernel, p)
    check_against_reference(p, out, lse, tree_mask=p.tree_mask)
    assert int(counts.sum()) == 0


def test_rowwise_tree_kernel_matches_reference_and_cpu(emu):
    """The hardware-validated row-wise kernel with masks (small: it is slow under the emulator), across a split
    boundary."""
    g = torch.Generator().manual_seed(71)
    reqs = [random_request(g, n, s, 4, 2, 64, torch.bfloat16) for n, s in [(12, 530), (5, 20)]]
    p = TreeProblem(reqs, 16, ["random", "star"], seed=71, max_query_len=12)
    out, lse, _ = tcall(emu, "rowwise", p)
    check_against_reference(p, out, lse, tree_mask=p.tree_mask)
    cpu, cpu_lse = tree_call(p)
    # same positions and split boundaries as the CPU kernel, another dot-product order: fp32 rounding apart
    finite = torch.isfinite(cpu_lse)  # padding tokens: -inf on both
    assert torch.equal(torch.isfinite(lse), finite) and (lse[~finite] == cpu_lse[~finite]).all()
    assert (out.float() - cpu.float()).abs().max() <= 1e-2 and (lse[finite] - cpu_lse[finite]).abs().max() <= 1e-4


@pytest.mark.parametrize("kernel", ["rowwise", "mma", "mma_fused"])
def test_chain_mask_gives_the_bits_of_no_mask(emu, kernel):
    small = kernel == "rowwise"
    p = random_tree_problem(72, torch.bfloat16, 64, 16, 2, 4, [6, 1] if small else [64, 1, 0, 30],
                            max_seq=80 if small else 700, styles=["chain"] * (2 if small else 4))
    masked = tcall(emu, kernel, p)
    plain = emu_call(emu, kernel, p)
    assert torch.equal(bits(masked[0]), bits(plain[0])) and torch.equal(bits(masked[1]), bits(plain[1]))


@each_kernel
def test_bits_above_the_token_are_ignored(emu, kernel):
    p = random_tree_problem(73, torch.float16, 128, 32, 1, 8, [20, 3], max_seq=300)
    noisy = p.tree_mask.clone()
    for r in range(p.R):
        for i, t in enumerate(range(p.rows(r).start, p.rows(r).stop)):
            noisy[t] = int(p.tree_mask[t]) | (-1 << (i + 1))  # every bit above i (the sign bit too)
    clean = tcall(emu, kernel, p)
    got = tcall(emu, kernel, p, tree_mask=noisy)
    assert torch.equal(bits(got[0]), bits(clean[0])) and torch.equal(bits(got[1]), bits(clean[1]))


@each_kernel
def test_hidden_nodes_never_reach_a_token(emu, kernel):
    """Large K and V (8.0 everywhere) at some nodes: tokens that do not see them keep their exact bits (their scores are
    masked before the softmax and their P is exactly 0 on those V rows); the tokens that see them agree with the
    reference. NaN K there too (a masked score never reads it)."""
    p = random_tree_problem(74, torch.bfloat16, 64, 16, 2, 4, [40, 64], max_seq=600, styles=["levels", "random"])
    clean = tcall(emu, kernel, p)
    r = 1
    offsets = [2, 11, 63]
    kc, vc = poison_nodes(p, r, offsets, 8.0)
    out, lse, _ = tcall(emu, kernel, p, k_cache=kc, v_cache=vc)
    seen = seen_by(p.parents[r], offsets)
    unseen = torch.ones(p.T, dtype=torch.bool)
    unseen[[p.rows(r).start + i for i in seen]] = False
    assert len(seen) < p.q_lens[r]
    assert torch.equal(bits(out[unseen]), bits(clean[0][unseen])) and torch.equal(bits(lse[unseen]),
                                                                                  bits(clean[1][unseen]))
    saved = p.k_cache, p.v_cache
    p.k_cache, p.v_cache = kc, vc
    try:
        check_against_reference(p, out, lse, tree_mask=p.tree_mask)
    finally:
        p.k_cache, p.v_cache = saved
    kc_nan, _ = poison_nodes(p, r, offsets, NAN, v=False)
    out_nan, _, _ = tcall(emu, kernel, p, k_cache=kc_nan, allow_nan=True)
    assert torch.equal(bits(out_nan[unseen]), bits(clean[0][unseen]))
    assert torch.isnan(out_nan[~unseen]).all()


def test_rowwise_hidden_nan_nodes_never_reach_a_token(emu):
    """The row-wise kernel skips a hidden position before loading it: NaN K and V there change no bit of the
    tokens that do not see them, and make the tokens that do NaN."""
    p = random_tree_problem(75, torch.float16, 64, 16, 1, 2, [10], max_seq=40, styles=["random"])
    clean = tcall(emu, "rowwise", p)
    offsets = [4]
    kc, vc = poison_nodes(p, 0, offsets, NAN)
    out, _, _ = tcall(emu, "rowwise", p, k_cache=kc, v_cache=vc, allow_nan=True)
    seen = seen_by(p.parents[0], offsets)
    for i in range(p.q_lens[0]):
        t = p.rows(0).start + i
        assert torch.isnan(out[t]).all() if i in seen else torch.equal(bits(out[t]), bits(clean[0][t]))


@pytest.mark.parametrize("case", [0, 1])
def test_fused_tree_gives_the_two_launch_bits(emu, case):
    dtype, D, block_size, group, q_lens = CASES[case]
    Hkv = 2 if group <= 4 else 1
    p = random_tree_problem(70 + D + block_size + group, dtype, D, block_size, Hkv, group, q_lens, max_seq=700)
    two = tcall(emu, "mma", p)
    one = tcall(emu, "mma_fused", p)
    assert torch.equal(bits(two[0]), bits(one[0])) and torch.equal(bits(two[1]), bits(one[1]))


@each_kernel
def test_tree_batch_invariance(emu, kernel):
    dtype, D, block_size, Hkv, group = torch.bfloat16, 64, 32, 1, 4
    g = torch.Generator().manual_seed(76)
    target = random_request(g, 37, 600, Hkv * group, Hkv, D, dtype)
    alone = TreeProblem([target], block_size, ["random"], seed=1, extra_tokens=0, spare_blocks=0, max_query_len=64)
    a = tcall(emu, kernel, alone)
    others = [random_request(g, n, s, Hkv * group, Hkv, D, dtype) for n, s in [(64, 300), (0, 0), (8, 130)]]
    batch = TreeProblem(others[:2] + [target] + others[2:], block_size, ["levels", "star", "random", "chain"],
                        seed=2, extra_tokens=3, spare_blocks=2, max_query_len=64)
    batch.tree_mask[batch.rows(2)] = alone.tree_mask[alone.rows(0)]
    b = tcall(emu, kernel, batch)
    rows = batch.rows(2)
    assert torch.equal(bits(b[0][rows]), bits(a[0])) and torch.equal(bits(b[1][rows]), bits(a[1]))


@pytest.mark.parametrize("kernel", ["rowwise", "mma"])
def test_bad_block_ids_are_counted_as_without_a_mask(emu, kernel):
    """A block id out of range is skipped and counted once per position the request may read, whatever the mask
    (the causal bound, not the tree, decides what is read): a bad page in the context and one under the block."""
    g = torch.Generator().manual_seed(77)
    reqs = [random_request(g, 12, 60, 4, 2, 64, torch.float16), random_request(g, 9, 40, 4, 2, 64, torch.float16)]
    p = TreeProblem(reqs, 16, ["star", "random"], seed=77, max_query_len=12)
    bt = p.block_table.clone()
    bt[0, 1] = -3       # positions 16..31 of request 0 (its context)
    bt[1, 2] = 10**6    # positions 32..39 of request 1, its block's last tokens among them
    plain = emu_call(emu, kernel, p, block_table=bt)
    masked = tcall(emu, kernel, p, block_table=bt)
    assert int(plain[2][2]) == 16 + 8 and int(masked[2][2]) == int(plain[2][2])  # kCountSlotOutOfRange
