"""verify_attention with draft-tree masks on a GPU, skipped without one, for every CUDA kernel ("rowwise", "mma",
"mma_fused"): random trees against the float64 reference (and run to run bit for bit), a chain's mask against
tree_mask=None bit for bit, nodes a token does not see never reaching it, batch invariance, and a CUDA graph
replaying new masks. The same cases run under the host emulator in test_attention_tree_emu.py."""
import pytest
import torch

import adaptive_verify as av

from test_attention import bits, check_against_reference
from test_attention_tree import CASES, poison_nodes, random_tree_problem, seen_by

pytestmark = [
    pytest.mark.cuda,
]

KERNELS = ["rowwise", "mma", "mma_fused"]  # verify_attention(cuda_kernel=...)


def _cuda_args(p, k_cache=None, v_cache=None):
    q, kc, vc, bt, sl, qsl, mql = p.args()
    kc = kc if k_cache is None else k_cache
    vc = vc if v_cache is None else v_cache
    return (q.cuda(), kc.cuda(), vc.cuda(), bt.cuda(), sl.cuda(), qsl.cuda(), mql)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,D,block_size,group,q_lens", CASES,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-g{g}" for d, D, bs, g, _ in CASES])
def test_tree_cuda_matches_reference(dtype, D, block_size, group, q_lens, kernel):
    Hkv = 2 if group <= 4 else 1
    p = random_tree_problem(40 + D + block_size + group, dtype, D, block_size, Hkv, group, q_lens, max_seq=3000)
    mask = p.tree_mask.cuda()
    out = torch.full_like(p.q, float("nan")).cuda()
    got, lse = av.verify_attention(*_cuda_args(p), out=out, return_lse=True, cuda_kernel=kernel, tree_mask=mask)
    assert not torch.isnan(got).any()
    check_against_reference(p, got.cpu(), lse.cpu(), tree_mask=p.tree_mask)
    again = av.verify_attention(*_cuda_args(p), cuda_kernel=kernel, tree_mask=mask)
    assert torch.equal(bits(again), bits(got)), "run-to-run difference: a race"


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_cuda_chain_mask_gives_the_bits_of_no_mask(kernel):
    p = random_tree_problem(21, torch.bfloat16, 128, 16, 1, 8, [64, 1, 0, 17, 33], styles=["chain"] * 5)
    masked = av.verify_attention(*_cuda_args(p), return_lse=True, cuda_kernel=kernel, tree_mask=p.tree_mask.cuda())
    plain = av.verify_attention(*_cuda_args(p), return_lse=True, cuda_kernel=kernel)
    assert torch.equal(bits(masked[0]), bits(plain[0])) and torch.equal(bits(masked[1]), bits(plain[1]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_cuda_hidden_nodes_never_reach_a_token(kernel):
    """Large K/V (8.0) at some nodes of request 1: tokens that do not see them keep their exact bits."""
    p = random_tree_problem(74, torch.bfloat16, 64, 16, 2, 4, [40, 64], max_seq=600, styles=["levels", "random"])
    mask = p.tree_mask.cuda()
    clean = av.verify_attention(*_cuda_args(p), cuda_kernel=kernel, tree_mask=mask).cpu()
    offsets = [2, 11, 63]
    kc, vc = poison_nodes(p, 1, offsets, 8.0)
    out = av.verify_attention(*_cuda_args(p, kc, vc), cuda_kernel=kernel, tree_mask=mask).cpu()
    unseen = torch.ones(p.T, dtype=torch.bool)
    unseen[[p.rows(1).start + i for i in seen_by(p.parents[1], offsets)]] = False
    assert torch.equal(bits(out[unseen]), bits(clean[unseen]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_cuda_batch_invariance(kernel):
    p = random_tree_problem(7, torch.bfloat16, 128, 16, 2, 4, [5, 64, 0, 23, 1, 40], max_seq=2500)
    whole = av.verify_attention(*_cuda_args(p), cuda_kernel=kernel, tree_mask=p.tree_mask.cuda()).cpu()
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        q, kc, vc, bt, sl, qsl, mql = p.args()
        rows = p.rows(r)
        alone = av.verify_attention(q[rows].cuda(), kc.cuda(), vc.cuda(), bt[r:r + 1].cuda(), sl[r:r + 1].cuda(),
                                    torch.tensor([0, p.q_lens[r]], dtype=torch.int32, device="cuda"), mql,
                                    cuda_kernel=kernel, tree_mask=p.tree_mask[rows].cuda()).cpu()
        assert torch.equal(bits(alone), bits(whole[rows])), f"request {r} differs alone vs in the batch"


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_cuda_graph_replays_new_masks(kernel):
    """Capture once; replays with other trees written into the same mask buffer give eager's bits."""
    p = random_tree_problem(9, torch.float16, 64, 32, 1, 8, [12, 64, 3], max_seq=1500)
    args = _cuda_args(p)
    mask = p.tree_mask.cuda()
    out = torch.empty_like(args[0])

    def step():
        return av.verify_attention(*args, out=out, cuda_kernel=kernel, tree_mask=mask)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (1, 2, 3):
        other = random_tree_problem(9, torch.float16, 64, 32, 1, 8, [12, 64, 3], max_seq=1500,
                                    styles=[("star", "random", "levels")[seed - 1]] * 3)
        mask.copy_(other.tree_mask)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = av.verify_attention(*args, cuda_kernel=kernel, tree_mask=mask)
        assert torch.equal(bits(out), bits(eager)), f"replay {seed} differs from eager"
