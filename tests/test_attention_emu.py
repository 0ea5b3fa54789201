"""verify_attention's CUDA kernels, the row-wise one (validated on an H200: it checks the emulator) and the
tensor-core candidate (two launches, and fused into one; csrc/include/adaptive_verify/attention/), launched by
their real launcher (launch_verify_attention), run on the CPU by the fiber emulator in tests/emu: their real
CUDA source, compiled by the host compiler, with every CUDA thread a fiber and warp shuffles / ballots,
ldmatrix, mma.sync and cp.async emulated (the last three from the PTX fragment layouts).

This is how the kernels' indexing (GQA row packing, MMA fragments, the smem swizzle, the cp.async pipeline,
masking, split bookkeeping) is tested on machines without a GPU. The emulator also fails a run on
out-of-bounds or misaligned shared/global accesses, divergent barriers and reads of a pipeline stage before
its wait (see tests/emu/cuda_emu.h). Each problem runs with cp.async data landing late (at the wait) and,
for a sample, early (at issue). The same problems run on hardware in test_attention_cuda.py.

Tolerances are test_attention.py's: against the float64 reference, within twice the error of the float32
reference rounded to the output dtype plus one ulp.
"""
import ctypes

import pytest
import torch

import emu_build
from adaptive_verify import attention as attention_module
from adaptive_verify import errors as av_errors
from adaptive_verify.attention_fp8 import FP8, kv_scale_fields

from test_attention import (FAR, GQA_RATIOS, NAN, NEG_INF, Problem, bits, check_against_reference,
                            random_problem, random_request)

LATE, EARLY = 0, 1  # cp.async data lands at the wait / at issue
KERNELS = attention_module.CUDA_KERNELS  # rowwise, mma, mma_fused (AttentionParams::kernel)
# The candidate's kernels run every case. The row-wise kernel (validated on hardware) runs a few small ones
# only: emulated shuffles per KV position per row make it slow here, and on it the emulator is the thing tested.
each_kernel = pytest.mark.parametrize("kernel", ["mma", "mma_fused"])


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    """The emulator's verify_attention entry point (tests/emu/attention_emu.cpp)."""
    return build_emu(tmp_path_factory)


def build_emu(tmp_path_factory):
    dll = emu_build.build("attention_emu", tmp_path_factory)
    fn = dll.av_emu_verify_attention
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    dll.av_emu_set_reverse.argtypes = [ctypes.c_int]
    dll.av_emu_set_reverse(0)
    fn.set_reverse = dll.av_emu_set_reverse
    return fn


def emu_call(emu, kernel, p, *, copy_mode=LATE, plain_loads=False, scale=None, block_table=None,
             seq_lens=None, tree_mask=None, k_cache=None, v_cache=None, allow_nan=False, k_scale=None, v_scale=None):
    """verify_attention through an emulated CUDA kernel (a KERNELS name), with the parameter struct the Python
    layer builds for a real call (tree_mask [T] int64 for draft trees; k_cache / v_cache replace the problem's);
    returns (out, lse, error counts)."""
    q, kc, vc, bt, sl, qsl, mql = p.args()
    kc = kc if k_cache is None else k_cache
    vc = vc if v_cache is None else v_cache
    bt = bt if block_table is None else block_table
    sl = sl if seq_lens is None else seq_lens
    T, Hq, D = q.shape
    out = torch.full_like(q, NAN)
    lse = torch.full((T, Hq), NAN, dtype=torch.float32)
    counts = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
    scale = D ** -0.5 if scale is None else scale
    fp8 = kc.dtype == FP8
    k_value, k_scales = kv_scale_fields("k_scale", k_scale, fp8, kc.shape[2], kc.device)
    v_value, v_scales = kv_scale_fields("v_scale", v_scale, fp8, kc.shape[2], kc.device)
    params = attention_module._attention_params(q, kc, vc, bt, sl, qsl, out, lse, counts, mql, bt.shape[1], scale,
                                                KERNELS[kernel], tree_mask, k_value, k_scales, v_value, v_scales)
    err = ctypes.create_string_buffer(512)
    status = emu(ctypes.addressof(params), copy_mode, int(plain_loads), kc.numel() * kc.element_size(), err, len(err))
    assert status == 0, f"emulator: {err.value.decode()}"
    if not allow_nan:
        assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements NaN (unwritten or read NaN)"
    return out, lse, counts


# (dtype, D, block_size, group, max_query_len): every dtype, head dim, block size and GQA ratio, with
# max_query_len * group covering one warp, several warps, a full 8-warp block and two row chunks.
CASES = [
    (torch.bfloat16, 128, 16, 8, 2),
    (torch.float16, 128, 32, 8, 16),
    (torch.bfloat16, 64, 64, 16, 16),
    (torch.float16, 64, 128, 1, 5),
    (torch.bfloat16, 256, 256, 4, 7),
    (torch.float16, 256, 16, 2, 1),
    (torch.bfloat16, 128, 128, 1, 16),
    (torch.float16, 64, 16, 4, 3),
    (torch.bfloat16, 64, 16, 2, 33),  # the planner's longest chain: 66 rows in 5 warps
    (torch.float16, 128, 32, 4, 64),  # the longest query: 256 rows, two 8-warp row chunks
]


@pytest.mark.parametrize("dtype,D,block_size,group,mql", CASES,
                         ids=[f"{str(d)[6:]}-D{D}-bs{bs}-g{g}-mql{m}" for d, D, bs, g, m in CASES])
@each_kernel
def test_kernel_matches_reference(emu, kernel, dtype, D, block_size, group, mql):
    Hkv = 2 if group <= 4 else 1
    p = random_problem(300 + D + block_size + group, dtype, D, block_size, Hkv, group, R=4, max_query_len=mql,
                       max_seq=1100)
    out, lse, counts = emu_call(emu, kernel, p)
    check_against_reference(p, out, lse)
    assert int(counts.sum()) == 0


@pytest.mark.parametrize("case", [0, 2, 4], ids=lambda i: "-".join(map(str, CASES[i][1:])))
def test_mma_kernel_with_copies_landing_at_issue(emu, case):
    """cp.async data written as soon as it is issued: a stage refilled while a warp still reads it would
    change the result; equal bits to the late-landing run."""
    dtype, D, block_size, group, mql = CASES[case]
    kernel = "mma"  # the only kernel with cp.async
    Hkv = 2 if group <= 4 else 1
    p = random_problem(300 + D + block_size + group, dtype, D, block_size, Hkv, group, R=4, max_query_len=mql,
                       max_seq=1100)
    late = emu_call(emu, kernel, p, copy_mode=LATE)
    early = emu_call(emu, kernel, p, copy_mode=EARLY)
    assert torch.equal(bits(late[0]), bits(early[0])) and torch.equal(bits(late[1]), bits(early[1]))


@each_kernel
@pytest.mark.parametrize("case", [1, 4], ids=lambda i: "-".join(map(str, CASES[i][1:])))
def test_kernel_with_threads_resumed_in_reverse(emu, kernel, case):
    """Warps (and lanes) resumed last to first: a barrier the kernel needs but lacks shows up in one order or
    the other (see cuda_emu.h); the result must not change by a bit."""
    dtype, D, block_size, group, mql = CASES[case]
    Hkv = 2 if group <= 4 else 1
    p = random_problem(300 + D + block_size + group, dtype, D, block_size, Hkv, group, R=4, max_query_len=mql,
                       max_seq=1100)
    forward = emu_call(emu, kernel, p)
    emu.set_reverse(1)
    try:
        backward = emu_call(emu, kernel, p)
    finally:
        emu.set_reverse(0)
    assert torch.equal(bits(forward[0]), bits(backward[0])) and torch.equal(bits(forward[1]), bits(backward[1]))


@pytest.mark.parametrize("case", [0, 1, 3], ids=lambda i: "-".join(map(str, CASES[i][1:])))
def test_fused_merge_gives_the_two_launch_bits(emu, case):
    """mma_fused merges in the partials launch (the last block of each request, KV head and row chunk) with
    the merge kernel's own routine: the same bits as mma, padding tokens included, whichever block comes
    last (blocks also run in reverse order)."""
    dtype, D, block_size, group, mql = CASES[case]
    Hkv = 2 if group <= 4 else 1
    p = random_problem(300 + D + block_size + group, dtype, D, block_size, Hkv, group, R=4, max_query_len=mql,
                       max_seq=1100)
    two = emu_call(emu, "mma", p)
    for reverse in (0, 1):
        emu.set_reverse(reverse)
        try:
            one = emu_call(emu, "mma_fused", p)
        finally:
            emu.set_reverse(0)
        assert torch.equal(bits(two[0]), bits(one[0])) and torch.equal(bits(two[1]), bits(one[1]))


def test_fused_leaves_long_requests_to_the_merge_kernel(emu):
    """A request of more than 8 splits (4096 tokens) is merged by the merge kernel, the others in the
    partials launch: still the two-launch bits, for every request."""
    p = random_problem(61, torch.bfloat16, 64, 64, 1, 2, R=4, max_query_len=4, max_seq=4700)
    assert max(p.seq_lens_list) > 8 * 512 and min(n for n, q in zip(p.seq_lens_list, p.q_lens) if q) <= 8 * 512
    two = emu_call(emu, "mma", p)
    one = emu_call(emu, "mma_fused", p)
    check_against_reference(p, one[0], one[1])
    assert torch.equal(bits(two[0]), bits(one[0])) and torch.equal(bits(two[1]), bits(one[1]))


@each_kernel
def test_kernel_plain_loads_path(emu, kernel):
    """Caches whose base is not 16-byte aligned take element copies instead of cp.async: same bits."""
    p = random_problem(41, torch.bfloat16, 128, 32, 2, 4, R=3, max_query_len=4, max_seq=700)
    vec = emu_call(emu, kernel, p)
    plain = emu_call(emu, kernel, p, plain_loads=True)
    assert torch.equal(bits(vec[0]), bits(plain[0])) and torch.equal(bits(vec[1]), bits(plain[1]))


@each_kernel
def test_kernel_split_and_block_boundaries(emu, kernel):
    """seq_len == q_len, lengths either side of pages, of the kernel's tiles and of the 512-token splits."""
    dtype, D, Hkv, group, block_size = torch.float16, 128, 1, 8, 16
    g = torch.Generator().manual_seed(6)
    cases = [(1, 1), (4, 4), (16, 16), (3, 31), (3, 32), (3, 33), (16, 47), (2, 64), (5, 65)]
    cases += [(1 + (n + d) % 16, n + d) for n in (512, 1024) for d in (-1, 0, 1)]
    reqs = [random_request(g, q, s, Hkv * group, Hkv, D, dtype) for q, s in cases]
    p = Problem(reqs, block_size, extra_tokens=0, max_query_len=16, seed=6)
    out, lse, _ = emu_call(emu, kernel, p)
    check_against_reference(p, out, lse)


@each_kernel
def test_kernel_large_scores(emu, kernel):
    """Scores up to ~100 and a sharp softmax (the running max must be subtracted before exp2)."""
    p = random_problem(12, torch.bfloat16, 64, 32, 2, 4, R=3, max_query_len=6, max_seq=900, q_scale=30.0)
    out, lse, _ = emu_call(emu, kernel, p)
    check_against_reference(p, out, lse)


@pytest.mark.parametrize("scale", [0.3, 1e-3])
@each_kernel
def test_kernel_scale(emu, kernel, scale):
    p = random_problem(22, torch.float16, 64, 32, 2, 2, R=3, max_query_len=5, max_seq=600)
    out, lse, _ = emu_call(emu, kernel, p, scale=scale)
    check_against_reference(p, out, lse, scale=scale)


@each_kernel
def test_kernel_batch_invariance(emu, kernel):
    """A request's output and lse are bitwise identical alone and inside a batch, at another position and
    in other pages."""
    dtype, D, block_size, Hkv, group, mql = torch.bfloat16, 128, 32, 2, 4, 8
    g = torch.Generator().manual_seed(8)
    Hq = Hkv * group
    target = random_request(g, 5, 1300, Hq, Hkv, D, dtype)
    alone = emu_call(emu, kernel,
                     Problem([target], block_size, extra_tokens=0, spare_blocks=0, max_query_len=mql, seed=1))
    others = [random_request(g, n, s, Hq, Hkv, D, dtype) for n, s in [(2, 900), (0, 0), (8, 130), (1, 1)]]
    p = Problem(others[:2] + [target] + others[2:], block_size, extra_tokens=3, spare_blocks=2, max_query_len=mql,
                seed=2)
    got = emu_call(emu, kernel, p)
    rows = p.rows(2)
    assert torch.equal(bits(got[0][rows]), bits(alone[0])) and torch.equal(bits(got[1][rows]), bits(alone[1]))


@each_kernel
def test_kernel_bad_lengths_are_padding_and_counted(emu, kernel):
    """A request whose seq_lens is below its q_len (unknowable on the host without a sync) becomes padding
    and is counted once; the others are unaffected."""
    p = random_problem(11, torch.bfloat16, 128, 16, 1, 2, R=4, max_seq=600)
    seq = p.seq_lens.clone()
    r = next(i for i in range(p.R) if p.q_lens[i] > 0)
    seq[r] = 0
    out, _, counts = emu_call(emu, kernel, p, seq_lens=seq)
    assert (out[p.rows(r)] == 0).all()
    assert int(counts[6]) == 1  # kCountQueryLenOutOfRange
    good, _, _ = emu_call(emu, kernel, p)
    others = torch.ones(p.T, dtype=torch.bool)
    others[p.rows(r)] = False
    assert torch.equal(bits(out[others]), bits(good[others]))


def _dense_attention(p, r, skip=()):
    """float64 attention of request r's tokens over its context minus the positions in `skip`."""
    q = p.q[p.rows(r)].double()                                    # [q_len, Hq, D]
    n, kv_len = p.q_lens[r], p.seq_lens_list[r]
    pos = torch.arange(kv_len)
    ids = p.block_table[r].long()[pos // p.k_cache.shape[1]]
    k = p.k_cache[ids, pos % p.k_cache.shape[1]].double()         # [kv_len, Hkv, D]
    v = p.v_cache[ids, pos % p.k_cache.shape[1]].double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("thd,phd->thp", q, k) * q.shape[-1] ** -0.5  # [q_len, Hq, kv_len]
    hidden = pos[None, :] > (kv_len - n + torch.arange(n))[:, None]   # causal within the verified block
    hidden = hidden | torch.isin(pos, torch.tensor(sorted(skip), dtype=torch.long))[None, :]
    scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
    return torch.einsum("thp,phd->thd", scores.softmax(-1), v)


@each_kernel
def test_kernel_skips_and_counts_bad_block_ids(emu, kernel):
    """A block id out of range where a request reads: its positions are skipped (never read: the
    emulator's bounds check would fail), left out of the softmax, and counted once per position."""
    g = torch.Generator().manual_seed(13)
    reqs = [random_request(g, 3, 100, 8, 2, 64, torch.float16), random_request(g, 2, 70, 8, 2, 64, torch.float16)]
    p = Problem(reqs, 16, extra_tokens=1, max_query_len=4, seed=13)
    bt = p.block_table.clone()
    bt[0, 2] = FAR  # positions 32..47 of request 0
    bt[1, 0] = -7   # positions 0..15 of request 1
    out, lse, counts = emu_call(emu, kernel, p, block_table=bt)
    assert int(counts[2]) == 32  # kCountSlotOutOfRange
    for r, skip in [(0, range(32, 48)), (1, range(0, 16))]:
        want = _dense_attention(p, r, skip)
        err = (out[p.rows(r)].double() - want).abs().max().item()
        assert err <= 4e-3, f"request {r}: max error {err:.3g} against attention without the skipped block"


@each_kernel
def test_kernel_only_padding_and_stale_rows(emu, kernel):
    g = torch.Generator().manual_seed(3)
    reqs = [random_request(g, 0, 0, 4, 2, 64, torch.float16) for _ in range(3)]
    p = Problem(reqs, 16, extra_tokens=5, max_query_len=4, dtype=torch.float16, Hq=4, Hkv=2, D=64)
    out, lse, counts = emu_call(emu, kernel, p)
    assert (out == 0).all() and (lse == NEG_INF).all() and int(counts.sum()) == 0


@each_kernel
def test_launch_covers_every_gqa_ratio_and_query_length(emu, kernel):
    """Every (group, max_query_len) pair's rows are covered by the launch (a row left out would stay NaN)."""
    g = torch.Generator().manual_seed(17)
    for group in GQA_RATIOS:
        for mql in (1, 3, 16):
            reqs = [random_request(g, n, s, group, 1, 64, torch.bfloat16) for n, s in [(mql, 40), (1, 20)]]
            p = Problem(reqs, 16, extra_tokens=1, max_query_len=mql, seed=group * 100 + mql)
            out, lse, _ = emu_call(emu, kernel, p)
            check_against_reference(p, out, lse)


@pytest.mark.parametrize("dtype,D,block_size,group,mql", [(torch.bfloat16, 64, 16, 4, 3), (torch.float16, 128, 32, 2, 5)])
def test_rowwise_kernel_through_its_launcher(emu, dtype, D, block_size, group, mql):
    """The hardware-validated row-wise kernel, through the same launch_verify_attention as on CUDA: agreeing
    with the reference here checks the emulator and the launch path, and spans two 512-token splits."""
    Hkv = 2 if group <= 4 else 1
    p = random_problem(500 + D, dtype, D, block_size, Hkv, group, R=2, max_query_len=mql, max_seq=600)
    out, lse, counts = emu_call(emu, "rowwise", p)
    check_against_reference(p, out, lse)
    assert int(counts.sum()) == 0
