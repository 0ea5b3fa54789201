"""fp8 (float8_e4m3fn) KV caches: verify_attention over a quantised cache with per-tensor and per-KV-head scales,
and write_kv's quantisation, on the C++ CPU kernels and, under the host emulator, the CUDA kernels' source (the
row-wise kernel, the tensor-core candidate two-launch and fused, and write_kv's fp8 kernel).

Tolerances: attention is exact in the dequantised values (fp8 decodes exactly to bf16 / fp16 / float; the kernels
fold the scales into the scores and the output), so its error against the float64 reference over the dequantised
cache obeys test_attention.py's rule (twice the float32 reference's error plus one ulp of the output). Quantisation is
bit-exact against the reference's torch conversion; its round-trip error is at most half an e4m3 spacing: 2^-4
relative for |x / scale| in [2^-6, 448], 2^-10 absolute (times the scale) below, which the tests check.
"""
import ctypes

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import attention as attention_module
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from adaptive_verify.attention_fp8 import FP8, kv_scale_fields, set_kv_scales

import emu_build
from attention_inputs import _kv_problem
from test_attention import NAN, bits, call, check_against_reference, random_problem
from test_attention_emu import build_emu, emu_call

# (dtype, D, block_size, group, max_query_len, scale kind): every dtype, head dim and scale form.
CASES = [
    (torch.bfloat16, 128, 16, 8, 5, "head"),
    (torch.float16, 64, 32, 1, 3, "float"),
    (torch.bfloat16, 256, 64, 2, 7, "one"),
    (torch.float16, 128, 256, 4, 16, "none"),
    (torch.bfloat16, 64, 128, 16, 2, "0d"),
    (torch.float16, 256, 16, 1, 1, "head"),
]
IDS = [f"{str(d)[6:]}-D{D}-bs{bs}-g{g}-mql{m}-{k}" for d, D, bs, g, m, k in CASES]


def scales(kind, Hkv, seed):
    """(k_scale, v_scale) of a kind: None, a float, a [1] / [] tensor, or a [Hkv] tensor with distinct heads."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None, None
    if kind == "float":
        return 0.037, 0.011
    if kind == "one":
        return torch.tensor([0.02]), torch.tensor([0.05])
    if kind == "0d":
        return torch.tensor(0.03), torch.tensor(0.007)
    return (torch.rand(Hkv, generator=g) * 0.05 + 0.005, torch.rand(Hkv, generator=g) * 0.05 + 0.005)


def quantised(p, k_scale, v_scale):
    """p with its caches quantised to fp8 by the reference (NaN poison stays NaN: 0x7f)."""
    Hkv = p.k_cache.shape[2]
    flat = lambda c: c.reshape(-1, Hkv, c.shape[-1])  # noqa: E731  [slots, Hkv, D]
    p.k_cache = ref.quantize_fp8(flat(p.k_cache), k_scale).reshape(p.k_cache.shape)
    p.v_cache = ref.quantize_fp8(flat(p.v_cache), v_scale).reshape(p.v_cache.shape)
    return p


def fp8_problem(seed, dtype, D, block_size, group, mql, kind, *, R=5, max_seq=1300):
    Hkv = 2 if group <= 4 else 1
    p = random_problem(seed, dtype, D, block_size, Hkv, group, R=R, max_query_len=mql, max_seq=max_seq)
    k_scale, v_scale = scales(kind, Hkv, seed)
    # values of a few scales' size, so the cache holds the full e4m3 range (incl. subnormals)
    kf = 1.0 if k_scale is None else 40 * float(torch.as_tensor(k_scale).max())
    p.k_cache, p.v_cache = (p.k_cache.float() * kf).to(dtype), (p.v_cache.float() * kf).to(dtype)
    return quantised(p, k_scale, v_scale), k_scale, v_scale


# ---- CPU kernel ----


@pytest.mark.parametrize("dtype,D,block_size,group,mql,kind", CASES, ids=IDS)
def test_cpu_matches_reference(dtype, D, block_size, group, mql, kind):
    p, k_scale, v_scale = fp8_problem(40 + D + group, dtype, D, block_size, group, mql, kind)
    assert p.k_cache.dtype == FP8
    got, lse = call(p, k_scale=k_scale, v_scale=v_scale)
    check_against_reference(p, got, lse, k_scale=k_scale, v_scale=v_scale)


def test_per_head_scales_are_used_per_head():
    """Swapping two KV heads' scales changes exactly those heads' outputs (a kernel reading one scale for every
    head, or the wrong head's, fails)."""
    p, k_scale, v_scale = fp8_problem(7, torch.bfloat16, 64, 16, 4, 3, "head", R=3, max_seq=200)
    got, _ = call(p, k_scale=k_scale, v_scale=v_scale)
    swapped, _ = call(p, k_scale=k_scale.flip(0), v_scale=v_scale.flip(0))
    rows = ~p.padding_mask()
    assert not torch.equal(bits(got[rows]), bits(swapped[rows]))
    check_against_reference(p, swapped, call(p, k_scale=k_scale.flip(0), v_scale=v_scale.flip(0))[1],
                            k_scale=k_scale.flip(0), v_scale=v_scale.flip(0))


def test_tree_mask_and_batch_invariance():
    """A draft tree's mask over an fp8 cache, and each request's bits equal to it run alone."""
    p, k_scale, v_scale = fp8_problem(11, torch.float16, 128, 32, 2, 6, "head", R=4, max_seq=700)
    g = torch.Generator().manual_seed(3)
    masks = []
    for q_len in p.q_lens:  # random topological trees: node i's parent before it, mask = ancestors + itself
        anc = []
        for i in range(q_len):
            parent = int(torch.randint(0, i, (1,), generator=g)) if i else -1
            anc.append((anc[parent] if parent >= 0 else 0) | (1 << i))
        masks += anc
    tree_mask = torch.tensor(masks + [0] * (p.T - len(masks)), dtype=torch.int64)
    got, lse = call(p, k_scale=k_scale, v_scale=v_scale, tree_mask=tree_mask)
    check_against_reference(p, got, lse, k_scale=k_scale, v_scale=v_scale, tree_mask=tree_mask)
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        rows = p.rows(r)
        alone = av.verify_attention(p.q[rows], p.k_cache, p.v_cache, p.block_table[r:r + 1], p.seq_lens[r:r + 1],
                                    torch.tensor([0, p.q_lens[r]], dtype=torch.int32), p.max_query_len,
                                    k_scale=k_scale, v_scale=v_scale, tree_mask=tree_mask[rows])
        assert torch.equal(bits(alone), bits(got[rows])), f"request {r}: bits depend on the batch"


def test_write_kv_quantises_like_the_reference():
    """Bits against the reference's conversion on values that hit every rounding case: ties between fp8 neighbours,
    subnormals, the saturation boundary, +-inf and NaN; per-head scales; slot -1 skipped."""
    T, Hkv, D = 9, 2, 64
    k, v, k_cache, v_cache, slots = _kv_problem(5, torch.bfloat16, T, Hkv, D, 4, 16, n_skip=2)
    k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    finite = codes[torch.isfinite(codes)]
    mids = (finite.sort().values[1:] + finite.sort().values[:-1]) / 2  # exact ties in float
    special = torch.tensor([447.9, 448.0, 449.0, 464.0, 465.0, 1e6, float("inf"), -float("inf"), NAN, 2.0**-10,
                            3 * 2.0**-10, 2.0**-12, 0.0, -0.0])
    values = torch.cat([finite, mids, -mids, special])
    k = values[torch.arange(T * Hkv * D) % values.numel()].reshape(T, Hkv, D).to(torch.bfloat16)
    k_scale = torch.tensor([1.0, 0.5])  # bf16 ties stay ties after dividing by a power of two
    v_scale = 0.013
    av.write_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    want_k, want_v = ref.write_kv(k, v, k_cache.clone().fill_(0), v_cache.clone().fill_(0), slots,
                                  k_scale=k_scale, v_scale=v_scale)
    written = slots >= 0
    bs = k_cache.shape[1]
    blocks, offs = slots[written] // bs, slots[written] % bs
    assert torch.equal(k_cache[blocks, offs].view(torch.uint8), want_k[blocks, offs].view(torch.uint8))
    assert torch.equal(v_cache[blocks, offs].view(torch.uint8), want_v[blocks, offs].view(torch.uint8))
    # round trip within half an e4m3 spacing (module docstring), for the finite unsaturated values
    x = v[written].float() / v_scale
    back = v_cache[blocks, offs].float()
    ok = x.abs() <= 448
    bound = torch.where(x.abs() >= 2.0**-6, x.abs() * 2.0**-4, torch.full_like(x, 2.0**-10))
    assert ((back - x).abs()[ok] <= bound[ok]).all()


def test_errors_name_the_argument():
    p, k_scale, v_scale = fp8_problem(2, torch.bfloat16, 64, 16, 1, 2, "head", R=2, max_seq=40)
    args = p.args()
    with pytest.raises(ValueError, match="k_scale.*float8"):  # a scale with a 16-bit cache
        av.verify_attention(p.q, p.q.new_zeros(p.k_cache.shape), p.q.new_zeros(p.k_cache.shape), *args[3:],
                            k_scale=0.5)
    with pytest.raises(TypeError, match="v_cache"):
        av.verify_attention(p.q, p.k_cache, p.k_cache.to(torch.bfloat16), *args[3:])
    with pytest.raises(TypeError, match="k_cache"):
        av.verify_attention(p.q, p.k_cache.to(torch.float16), p.v_cache, *args[3:])
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="k_scale"):
            av.verify_attention(*args, k_scale=bad)
    with pytest.raises(TypeError, match="v_scale"):
        av.verify_attention(*args, v_scale="0.5")
    with pytest.raises(ValueError, match="v_scale.*finite and > 0"):
        av.verify_attention(*args, v_scale=torch.tensor([0.5, -1.0]))
    with pytest.raises(ValueError, match=r"k_scale.*\[Hkv\]"):
        av.verify_attention(*args, k_scale=torch.ones(3))
    with pytest.raises(TypeError, match="k_scale.*dtype"):
        av.verify_attention(*args, k_scale=torch.ones(2, dtype=torch.float64))
    k = torch.zeros(1, 2, 64, dtype=torch.float32)
    with pytest.raises(TypeError, match="k must have dtype"):
        av.write_kv(k, k, p.k_cache, p.v_cache, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="k_scale"):
        av.write_kv(k.bfloat16(), k.bfloat16(), p.k_cache, p.v_cache, torch.zeros(1, dtype=torch.int64), k_scale=0)
    with pytest.raises(TypeError, match="v must have dtype"):
        av.write_kv(k.bfloat16(), k.half(), p.k_cache, p.v_cache, torch.zeros(1, dtype=torch.int64))


def test_commit_tree_kv_moves_fp8_rows():
    """commit_tree_kv moves bytes: an fp8 cache's accepted path lands at its depths unchanged."""
    cache = torch.arange(2 * 16 * 1 * 64, dtype=torch.int32).remainder(126).to(torch.uint8).view(FP8)
    k_cache = cache.reshape(2, 16, 1, 64).clone()
    v_cache = k_cache.clone()
    before = k_cache.clone()
    block_table = torch.tensor([[1, 0]], dtype=torch.int32)
    av.commit_tree_kv(k_cache, v_cache, block_table, torch.tensor([3], dtype=torch.int32),
                      torch.tensor([[0, 2, 5]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    # request positions 3 + 2 -> 3 + 1 and 3 + 5 -> 3 + 2, in block 1
    assert torch.equal(k_cache[1, 4].view(torch.uint8), before[1, 5].view(torch.uint8))
    assert torch.equal(k_cache[1, 5].view(torch.uint8), before[1, 8].view(torch.uint8))


# ---- CUDA kernels' source under the host emulator ----


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emu(tmp_path_factory)


@pytest.mark.parametrize("kernel", ["mma", "mma_fused"])
@pytest.mark.parametrize("case", [0, 1, 2, 5], ids=[IDS[i] for i in (0, 1, 2, 5)])
def test_emulated_mma_kernels(emu, kernel, case):
    dtype, D, block_size, group, mql, kind = CASES[case]
    p, k_scale, v_scale = fp8_problem(40 + D + group, dtype, D, block_size, group, mql, kind)
    out, lse, counts = emu_call(emu, kernel, p, k_scale=k_scale, v_scale=v_scale)
    check_against_reference(p, out, lse, k_scale=k_scale, v_scale=v_scale)
    assert int(counts.sum()) == 0


def test_emulated_rowwise_kernel(emu):
    p, k_scale, v_scale = fp8_problem(9, torch.bfloat16, 64, 16, 2, 3, "head", R=3, max_seq=90)
    out, lse, counts = emu_call(emu, "rowwise", p, k_scale=k_scale, v_scale=v_scale)
    check_against_reference(p, out, lse, k_scale=k_scale, v_scale=v_scale)
    assert int(counts.sum()) == 0


def test_emulated_kernels_count_bad_per_head_scales(emu):
    """A per-head scale the host cannot check on CUDA (NaN, <= 0) is used as given and counted once per KV head and
    scale, by every kernel."""
    p, k_scale, v_scale = fp8_problem(9, torch.bfloat16, 64, 16, 2, 3, "head", R=3, max_seq=90)
    bad_k, bad_v = torch.tensor([NAN, 0.02]), torch.tensor([0.02, -1.0])
    for kernel in ("rowwise", "mma", "mma_fused"):
        q, kc, vc, bt, sl, qsl, mql = p.args()
        out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
        counts = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
        params = attention_module._attention_params(q, kc, vc, bt, sl, qsl, out, lse, counts, mql, bt.shape[1],
                                                    64 ** -0.5, attention_module.CUDA_KERNELS[kernel])
        set_kv_scales(params, 1.0, bad_k, 1.0, bad_v, 2)
        err = ctypes.create_string_buffer(512)
        assert emu(ctypes.addressof(params), 0, 0, kc.numel(), err, len(err)) == 0, err.value
        assert counts[av_errors.COUNTER_NAMES.index("kv_scale_out_of_range")] == 2, kernel


@pytest.fixture(scope="module")
def emu_write_kv(tmp_path_factory):
    dll = emu_build.build("attention_emu", tmp_path_factory)
    fn = dll.av_emu_write_kv
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_write_kv_fp8(emu_write_kv, dtype):
    """The CUDA fp8 write kernel: the CPU kernel's bits (the same float_to_fp8_e4m3), bad slots skipped and
    counted, a bad per-head scale counted."""
    T, Hkv, D = 7, 2, 64
    k, v, k_cache, v_cache, slots = _kv_problem(8, dtype, T, Hkv, D, 3, 16, n_skip=1)
    k = k * 300  # into the saturating range
    k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
    k_scale, v_scale = torch.tensor([0.7, 0.03]), 0.2
    want_k, want_v = k_cache.clone(), v_cache.clone()
    av.write_kv(k, v, want_k, want_v, slots, k_scale=k_scale, v_scale=v_scale)
    slots_bad = slots.clone()
    slots_bad[0] = 10**6  # out of range: skipped, counted
    counts = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
    p = attention_module.WriteKvParams()
    p.num_blocks, p.block_size, p.num_kv_heads, p.head_dim = k_cache.shape
    p.k, p.v, p.k_stride_t, p.k_stride_h = k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1)
    p.v_stride_t, p.v_stride_h = v.stride(0), v.stride(1)
    p.k_cache, p.v_cache, p.slot_mapping = k_cache.data_ptr(), v_cache.data_ptr(), slots_bad.data_ptr()
    p.num_tokens, p.elem_size, p.error_counts = T, k.element_size(), counts.data_ptr()
    p.cache_dtype, p.dtype = 3, {torch.float16: 1, torch.bfloat16: 2}[dtype]
    k_value, k_tensor = kv_scale_fields("k_scale", k_scale, True, Hkv, k.device)
    set_kv_scales(p, k_value, k_tensor, v_scale, None, Hkv)
    err = ctypes.create_string_buffer(512)
    assert emu_write_kv(ctypes.addressof(p), err, len(err)) == 0, err.value
    bs = k_cache.shape[1]
    for t in range(1, T):
        if int(slots[t]) < 0:
            continue
        b, o = int(slots[t]) // bs, int(slots[t]) % bs
        assert torch.equal(k_cache[b, o].view(torch.uint8), want_k[b, o].view(torch.uint8))
        assert torch.equal(v_cache[b, o].view(torch.uint8), want_v[b, o].view(torch.uint8))
    assert counts[av_errors.COUNTER_NAMES.index("slot_out_of_range")] == 1
    bad = torch.tensor([0.7, float("inf")])
    set_kv_scales(p, 1.0, bad, v_scale, None, Hkv)
    assert emu_write_kv(ctypes.addressof(p), err, len(err)) == 0, err.value
    assert counts[av_errors.COUNTER_NAMES.index("kv_scale_out_of_range")] == 1


# ---- on a GPU (skipped without one) ----

cuda_kernels = pytest.mark.parametrize("kernel", ["rowwise", "mma", "mma_fused"])


@pytest.mark.cuda
@cuda_kernels
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_cuda_matches_reference(kernel, case):
    dtype, D, block_size, group, mql, kind = CASES[case]
    p, k_scale, v_scale = fp8_problem(40 + D + group, dtype, D, block_size, group, mql, kind)
    dev = lambda s: s.cuda() if isinstance(s, torch.Tensor) else s  # noqa: E731
    q, kc, vc, bt, sl, qsl, mql = p.args()
    out, lse = av.verify_attention(q.cuda(), kc.cuda(), vc.cuda(), bt.cuda(), sl.cuda(), qsl.cuda(), mql,
                                   return_lse=True, cuda_kernel=kernel, k_scale=dev(k_scale), v_scale=dev(v_scale))
    check_against_reference(p, out.cpu(), lse.cpu(), k_scale=k_scale, v_scale=v_scale)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_write_kv_fp8_matches_cpu(dtype):
    T, Hkv, D = 300, 4, 128
    k, v, k_cache, v_cache, slots = _kv_problem(12, dtype, T, Hkv, D, 30, 16, n_skip=20)
    k = k * 200
    k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
    k_scale, v_scale = torch.tensor([0.5, 0.1, 1.5, 0.03]), 0.07
    gk, gv = k_cache.cuda(), v_cache.cuda()
    av.write_kv(k.cuda(), v.cuda(), gk, gv, slots.cuda(), k_scale=k_scale.cuda(), v_scale=v_scale)
    av.write_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(gk.cpu().view(torch.uint8), k_cache.view(torch.uint8))
    assert torch.equal(gv.cpu().view(torch.uint8), v_cache.view(torch.uint8))
