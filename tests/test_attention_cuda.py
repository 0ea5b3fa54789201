"""Attention-area CUDA kernels, skipped without a GPU: write_kv == the C++ CPU kernel bit for bit (also in a
captured CUDA graph, and with element offsets past 2^31); verify_attention against the float64 oracle,
batch invariance, graph replay with new lengths, and device-side length errors counted, each for every CUDA
implementation (cuda_kernel "rowwise", the default, and the candidate "mma" / "mma_fused")."""
import pytest
import torch

import adaptive_verify as av
from attention_inputs import _kv_problem
from adaptive_verify import reference as ref

pytestmark = [
    pytest.mark.cuda,
]

NAN = float("nan")


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("D,block_size,Hkv,T", [(64, 16, 1, 1), (128, 32, 8, 333), (256, 256, 2, 1000),
                                                (128, 64, 4, 77), (64, 128, 16, 4096), (256, 16, 1, 5)])
def test_write_kv_cuda_matches_cpu(dtype, D, block_size, Hkv, T):
    num_blocks = -(-T // block_size) + 5
    k, v, k_cache, v_cache, slots = _kv_problem(T + D, dtype, T, Hkv, D, num_blocks, block_size, T // 3)
    gk, gv = k_cache.cuda(), v_cache.cuda()
    av.write_kv(k.cuda(), v.cuda(), gk, gv, slots.cuda())
    av.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(bits(gk.cpu()), bits(k_cache)) and torch.equal(bits(gv.cpu()), bits(v_cache))
    want = ref.write_kv(k, v, torch.full_like(k_cache, NAN), torch.full_like(v_cache, NAN), slots)
    assert torch.equal(bits(k_cache), bits(want[0])) and torch.equal(bits(v_cache), bits(want[1]))


def test_write_kv_cuda_strided_sources():
    """k and v as slices of a fused [T, Hq + 2 Hkv, D] projection."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(50, 16 + 2 * 4, 128, generator=g).to(torch.bfloat16)
    k, v = qkv[:, 16:20], qkv[:, 20:24]
    _, _, k_cache, v_cache, slots = _kv_problem(2, torch.bfloat16, 50, 4, 128, 6, 16, 7)
    gqkv, gk, gv = qkv.cuda(), k_cache.cuda(), v_cache.cuda()
    av.write_kv(gqkv[:, 16:20], gqkv[:, 20:24], gk, gv, slots.cuda())
    want = ref.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(bits(gk.cpu()), bits(want[0])) and torch.equal(bits(gv.cpu()), bits(want[1]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d)[6:])
def test_write_kv_cuda_unaligned_sources(dtype):
    """k and v starting one element past a 16-byte boundary (the kernel's per-element path)."""
    T, Hkv, D = 40, 2, 64
    k, v, k_cache, v_cache, slots = _kv_problem(4, dtype, T, Hkv, D, 5, 16, 9)
    buf_k = torch.empty(T * Hkv * D + 1, dtype=dtype, device="cuda")
    buf_v = torch.empty(T * Hkv * D + 1, dtype=dtype, device="cuda")
    gk_src, gv_src = buf_k[1:].view(T, Hkv, D), buf_v[1:].view(T, Hkv, D)
    gk_src.copy_(k)
    gv_src.copy_(v)
    assert gk_src.data_ptr() % 16 != 0
    gk, gv = k_cache.cuda(), v_cache.cuda()
    av.write_kv(gk_src, gv_src, gk, gv, slots.cuda())
    want = ref.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(bits(gk.cpu()), bits(want[0])) and torch.equal(bits(gv.cpu()), bits(want[1]))


def test_write_kv_cuda_skips_and_counts_out_of_range_slots():
    """On CUDA a slot outside [0, num_blocks * block_size) other than -1 is skipped and counted (no sync to
    raise); one that would wrap to a valid slot in 32 bits is not written there either."""
    k, v, k_cache, v_cache, _ = _kv_problem(5, torch.float16, 6, 2, 64, 3, 16, 0)
    slots = torch.tensor([48, -1, 2**32 + 3, 7, -2, -(2**32) + 9], dtype=torch.int64)
    gk, gv = k_cache.cuda(), v_cache.cuda()
    av.reset_error_counts("cuda")
    av.write_kv(k.cuda(), v.cuda(), gk, gv, slots.cuda())
    assert av.error_counts("cuda")["slot_out_of_range"] == 4
    want = ref.write_kv(k, v, k_cache, v_cache, torch.where((slots >= 0) & (slots < 48), slots, -1))
    assert torch.equal(bits(gk.cpu()), bits(want[0])) and torch.equal(bits(gv.cpu()), bits(want[1]))
    av.reset_error_counts("cuda")


def test_write_kv_in_a_cuda_graph_with_new_slots():
    """Capture once; each replay writes new K/V through new slots (-1 included) placed in the same buffers."""
    dtype, T, Hkv, D, num_blocks, block_size = torch.float16, 48, 8, 128, 12, 32
    g = torch.Generator().manual_seed(9)
    k = torch.zeros(T, Hkv, D, dtype=dtype, device="cuda")
    v = torch.zeros(T, Hkv, D, dtype=dtype, device="cuda")
    slots = torch.full((T,), -1, dtype=torch.int64, device="cuda")
    k_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype, device="cuda")
    v_cache = torch.full((num_blocks, block_size, Hkv, D), NAN, dtype=dtype, device="cuda")

    av.write_kv(k, v, k_cache, v_cache, slots)  # warm-up outside capture (all skipped)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.write_kv(k, v, k_cache, v_cache, slots)
    torch.cuda.synchronize()
    assert torch.isnan(k_cache).all() and torch.isnan(v_cache).all(), "capture must not write"

    for step in range(4):
        new_k = torch.randn(T, Hkv, D, generator=g).to(dtype)
        new_v = torch.randn(T, Hkv, D, generator=g).to(dtype)
        new_slots = torch.randperm(num_blocks * block_size, generator=g)[:T]
        new_slots[torch.randperm(T, generator=g)[:5 + 10 * step]] = -1
        before = (k_cache.cpu(), v_cache.cpu())
        k.copy_(new_k)
        v.copy_(new_v)
        slots.copy_(new_slots)
        graph.replay()
        torch.cuda.synchronize()
        want = ref.write_kv(new_k, new_v, before[0], before[1], new_slots)
        assert torch.equal(bits(k_cache.cpu()), bits(want[0])), f"replay {step}: k_cache"
        assert torch.equal(bits(v_cache.cpu()), bits(want[1])), f"replay {step}: v_cache"


def test_write_kv_cuda_element_offsets_past_2_31():
    """Caches of more than 2^31 elements: slots near the end must land there, not at a 32-bit wrapped offset."""
    Hkv, D, block_size = 8, 256, 256
    num_blocks = (2**31 // (Hkv * D)) // block_size + 4  # slot * Hkv * D exceeds 2^31 for the last blocks
    need = 2 * num_blocks * block_size * Hkv * D * 2
    if torch.cuda.mem_get_info()[0] < need + (1 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    k_cache = torch.zeros(num_blocks, block_size, Hkv, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    total = num_blocks * block_size
    slots = torch.tensor([total - 1, total - block_size - 3, 5, -1], dtype=torch.int64, device="cuda")
    k = torch.randn(4, Hkv, D, device="cuda").to(torch.bfloat16) + 8  # nonzero everywhere
    v = torch.randn(4, Hkv, D, device="cuda").to(torch.bfloat16) - 8
    av.write_kv(k, v, k_cache, v_cache, slots)
    torch.cuda.synchronize()
    flat_k, flat_v = k_cache.view(total, Hkv, D), v_cache.view(total, Hkv, D)
    for t in range(3):
        s = int(slots[t])
        assert torch.equal(flat_k[s], k[t]) and torch.equal(flat_v[s], v[t]), f"slot {s}"
    # nothing else written (counted on the int16 bits: no temporary the size of the 4 GiB caches)
    assert int(torch.count_nonzero(bits(k_cache))) == 3 * Hkv * D
    assert int(torch.count_nonzero(bits(v_cache))) == 3 * Hkv * D


# ------------------------------------------------------------------------------------------------------
# verify_attention on CUDA (both SIMT split-KV kernels) against the float64 oracle
# ------------------------------------------------------------------------------------------------------

from test_attention import PAIRWISE, check_against_reference, random_problem  # noqa: E402

KERNELS = ["rowwise", "mma", "mma_fused"]  # verify_attention(cuda_kernel=...)


def _cuda_args(p):
    q, kc, vc, bt, sl, qsl, mql = p.args()
    return (q.cuda(), kc.cuda(), vc.cuda(), bt.cuda(), sl.cuda(), qsl.cuda(), mql)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,D,block_size,group", PAIRWISE)
def test_verify_attention_cuda_matches_reference(dtype, D, block_size, group, kernel):
    Hkv = 2 if group <= 4 else 1
    p = random_problem(101 + D + block_size + group, dtype, D, block_size, Hkv, group, max_seq=3000)
    out = torch.full_like(p.q, float("nan")).cuda()
    got, lse = av.verify_attention(*_cuda_args(p), out=out, return_lse=True, cuda_kernel=kernel)
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    check_against_reference(p, got.cpu(), lse.cpu())
    again = av.verify_attention(*_cuda_args(p), cuda_kernel=kernel)
    assert torch.equal(again, got), "run-to-run difference: a race"


@pytest.mark.parametrize("kernel", KERNELS)
def test_verify_attention_cuda_batch_invariance(kernel):
    p = random_problem(7, torch.bfloat16, 128, 16, 2, 4, R=6, max_seq=2500)
    whole = av.verify_attention(*_cuda_args(p), cuda_kernel=kernel).cpu()
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        q, kc, vc, bt, sl, qsl, mql = p.args()
        rows = p.rows(r)
        alone = av.verify_attention(q[rows].cuda(), kc.cuda(), vc.cuda(), bt[r:r + 1].cuda(), sl[r:r + 1].cuda(),
                                    torch.tensor([0, p.q_lens[r]], dtype=torch.int32, device="cuda"), mql,
                                    cuda_kernel=kernel).cpu()
        assert torch.equal(alone, whole[rows]), f"request {r} differs alone vs in the batch"


@pytest.mark.parametrize("kernel", KERNELS)
def test_verify_attention_cuda_graph_replays_new_lengths(kernel):
    p = random_problem(9, torch.float16, 64, 32, 1, 8, R=5, max_seq=1500)
    bufs = list(_cuda_args(p))
    out = torch.empty_like(bufs[0])

    def step():
        return av.verify_attention(*bufs, out=out, cuda_kernel=kernel)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # New per-request lengths in the same buffers: shorter contexts and shifted query boundaries.
    seq = bufs[4].clone()
    for shrink in (0, 7, 300):
        bufs[4].copy_(torch.maximum(seq - shrink, torch.diff(bufs[5]).to(torch.int32)))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = av.verify_attention(*bufs, cuda_kernel=kernel)
        assert torch.equal(out, eager), f"replay differs from eager after shrinking contexts by {shrink}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_verify_attention_cuda_counts_and_pads_bad_lengths(kernel):
    p = random_problem(11, torch.bfloat16, 128, 16, 1, 2, R=4, max_seq=600)
    args = list(_cuda_args(p))
    seq = args[4].clone()
    r = next(i for i in range(p.R) if p.q_lens[i] > 0)
    seq[r] = 0  # shorter than its own q_len: cannot be checked on the host without a sync
    args[4] = seq
    av.reset_error_counts("cuda")
    got = av.verify_attention(*args, cuda_kernel=kernel).cpu()
    assert (got[p.rows(r)] == 0).all(), "an invalid request must be padding"
    assert av.error_counts("cuda")["query_len_out_of_range"] == 1


@pytest.mark.parametrize("kernel", KERNELS)
def test_verify_attention_cuda_max_seq_len(kernel):
    """max_seq_len shrinks the workspace, not the result: same bits as the full table width."""
    p = random_problem(36, torch.bfloat16, 128, 16, 2, 4, R=5, max_query_len=7, max_seq=1500)
    args = list(_cuda_args(p))
    full = av.verify_attention(*args, cuda_kernel=kernel)
    longest = int(p.args()[4].max())
    bounded = av.verify_attention(*args, cuda_kernel=kernel, max_seq_len=longest)
    assert torch.equal(full.view(torch.int16), bounded.view(torch.int16))
