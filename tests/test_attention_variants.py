"""verify_attention's model variants: attention sinks (gpt-oss), sliding windows (gpt-oss, Gemma, Mistral) and logit
soft-capping (Gemma 2), alone and together with trees, fp8 caches and return_lse, on the C++ CPU kernel and, under the
host emulator, the CUDA kernels' source (row-wise, tensor-core two-launch and fused); GPU tests at the end.

Poison: on top of test_attention.py's (NaN wherever no request reads), every cache page wholly below a request's
window start holds NaN and its block-table entry points far out of range: a kernel that reads a block id or a K/V row
outside every token's window fails (the CPU raises, the emulator flags the access, or NaN reaches the output).
Tolerance: test_attention.py's rule against the float64 reference.
"""
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import attention as attention_module
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref

from test_attention import FAR, NAN, bits, call, check_against_reference, random_problem
from test_attention_emu import build_emu, emu_call
from test_attention_fp8 import quantised


def random_trees(p, seed):
    """[T] int64: per request a random topological tree (ancestors and itself); padding entries 0."""
    g = torch.Generator().manual_seed(seed)
    masks = []
    for q_len in p.q_lens:
        anc = []
        for i in range(q_len):
            parent = int(torch.randint(0, i, (1,), generator=g)) if i else -1
            anc.append((anc[parent] if parent >= 0 else 0) | (1 << i))
        masks += [a - (1 << 64) if a >= 1 << 63 else a for a in anc]
    return torch.tensor(masks + [0] * (p.T - len(masks)), dtype=torch.int64)


def poison_outside_windows(p, window_left):
    """NaN in every page wholly below each request's window start, and its table entry far out of range (no kernel
    may read either). Pages are per request (random_problem draws each request its own)."""
    if window_left < 0:
        return
    bs = p.k_cache.shape[1]
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        start = max(0, p.seq_lens_list[r] - p.q_lens[r] - window_left)
        for b in range(start // bs):  # pages whose last position is below the start
            page = int(p.block_table[r, b])
            for cache in (p.k_cache, p.v_cache):
                if cache.dtype == torch.float8_e4m3fn:
                    cache.view(torch.uint8)[page] = 0x7F  # e4m3fn's NaN
                else:
                    cache[page] = NAN
            p.block_table[r, b] = FAR


def variant_problem(seed, dtype, D, block_size, Hkv, group, mql, *, sinks, window, softcap, tree, fp8,
                    max_seq=1400, R=5):
    p = random_problem(seed, dtype, D, block_size, Hkv, group, R=R, max_query_len=mql, max_seq=max_seq, q_scale=3.0)
    kw = dict(window_left=window, softcap=softcap)
    if sinks:
        g = torch.Generator().manual_seed(seed + 1)
        kw["sinks"] = torch.randn(Hkv * group, generator=g) * 3 + 4  # comparable to a row's whole softmax mass
    if fp8:
        k_scale, v_scale = torch.rand(Hkv) * 0.02 + 0.01, 0.02
        big = 1.0 / 0.02
        p.k_cache, p.v_cache = (p.k_cache.float() * big).to(dtype), (p.v_cache.float() * big).to(dtype)
        quantised(p, k_scale, v_scale)
        kw.update(k_scale=k_scale, v_scale=v_scale)
    if tree:
        kw["tree_mask"] = random_trees(p, seed + 2)
    poison_outside_windows(p, window)
    return p, kw


def check(p, got, lse, kw):
    check_against_reference(p, got, lse, **kw)


# (dtype, D, block_size, Hkv, group, max_query_len, sinks, window, softcap, tree, fp8)
CASES = [
    (torch.bfloat16, 64, 16, 2, 8, 4, True, 128, 0.0, False, False),      # gpt-oss: sinks + window, D 64, group 8
    (torch.bfloat16, 64, 32, 1, 16, 9, True, -1, 0.0, True, False),       # gpt-oss full layer, a tree, group 16
    (torch.float16, 256, 64, 2, 2, 3, False, 300, 50.0, False, False),    # Gemma 2: window + soft-capping
    (torch.bfloat16, 128, 16, 2, 4, 16, False, 513, 0.0, True, False),    # Mistral-style window, trees through it
    (torch.float16, 128, 128, 1, 8, 5, True, 40, 30.0, True, True),       # everything at once, fp8 cache
    (torch.bfloat16, 256, 256, 2, 1, 2, False, 0, 0.0, False, False),     # a window of one position (itself)
    (torch.bfloat16, 64, 16, 2, 2, 7, True, 5, 0.0, True, False),         # a window cutting through the tree
]
IDS = [f"{str(c[0])[6:]}-D{c[1]}-g{c[4]}-{'sink' if c[6] else 'nosink'}-w{c[7]}-cap{c[8]:g}"
       f"{'-tree' if c[9] else ''}{'-fp8' if c[10] else ''}" for c in CASES]


def make(case, seed=0, **over):
    dtype, D, bs, Hkv, group, mql, sinks, window, softcap, tree, fp8 = CASES[case]
    return variant_problem(seed + 500 + case, dtype, D, bs, Hkv, group, mql, sinks=sinks, window=window,
                           softcap=softcap, tree=tree, fp8=fp8, **over)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_cpu_matches_reference(case):
    p, kw = make(case)
    got, lse = call(p, **kw)
    check(p, got, lse, kw)


def test_each_variant_changes_the_result():
    """Not vacuous: a sink, a window and a cap each change the output (a kernel ignoring one fails here even where the
    reference tolerance is loose)."""
    p = random_problem(77, torch.bfloat16, 64, 16, 2, 4, R=3, max_query_len=4, max_seq=600, q_scale=3.0)
    base, _ = call(p)
    for kw in (dict(sinks=torch.full((p.q.shape[1],), 2.0)), dict(window_left=10), dict(softcap=5.0)):
        got, lse = call(p, **kw)
        check(p, got, lse, kw)
        assert not torch.equal(bits(base), bits(got)), kw


def test_sinks_with_rows_that_see_nothing():
    """A tree token whose mask hides every block token and that has no context sees nothing: zeros as without a sink,
    and lse = its head's sink (the sink is the whole denominator)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(3, 4, 64, generator=g).to(torch.bfloat16)
    k_cache = torch.randn(1, 16, 1, 64, generator=g).to(torch.bfloat16)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    qsl, seq, table = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), \
        torch.zeros(1, 1, dtype=torch.int32)
    mask = torch.tensor([1, 0, 5], dtype=torch.int64)  # token 1 sees nothing (no context, no bit)
    out, lse = av.verify_attention(q, k_cache, k_cache, table, seq, qsl, 3, tree_mask=mask, sinks=sinks,
                                   return_lse=True)
    assert (out[1] == 0).all() and torch.allclose(lse[1], sinks)
    want, want_lse = ref.verify_attention(q, k_cache, k_cache, table, seq, qsl, 3, tree_mask=mask, sinks=sinks,
                                          return_lse=True)
    assert torch.allclose(out.float(), want.float(), atol=1e-2) and torch.allclose(lse, want_lse, atol=1e-5)


def test_a_chain_mask_gives_no_masks_bits_with_a_window():
    p, kw = make(3)
    kw.pop("tree_mask")
    chain = torch.zeros(p.T, dtype=torch.int64)
    for r in range(p.R):
        rows = p.rows(r)
        chain[rows] = torch.tensor([(1 << (i + 1)) - 1 for i in range(p.q_lens[r])], dtype=torch.int64)
    a, la = call(p, **kw)
    b, lb = call(p, tree_mask=chain, **kw)
    assert torch.equal(bits(a), bits(b)) and torch.equal(bits(la), bits(lb))


def test_batch_invariance():
    p, kw = make(4)
    got, lse = call(p, **kw)
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        rows = p.rows(r)
        one = {k: (v[rows] if k == "tree_mask" else v) for k, v in kw.items()}
        alone, alone_lse = av.verify_attention(p.q[rows], p.k_cache, p.v_cache, p.block_table[r:r + 1],
                                               p.seq_lens[r:r + 1], torch.tensor([0, p.q_lens[r]], dtype=torch.int32),
                                               p.max_query_len, return_lse=True, **one)
        assert torch.equal(bits(alone), bits(got[rows])) and torch.equal(bits(alone_lse), bits(lse[rows])), r


def test_errors_name_the_argument():
    p, _ = make(0)
    args = p.args()
    Hq = p.q.shape[1]
    for bad, exc, name in [
        (dict(sinks=torch.zeros(Hq + 1)), ValueError, "sinks"),
        (dict(sinks=torch.zeros(Hq, dtype=torch.float64)), TypeError, "sinks"),
        (dict(sinks=torch.full((Hq,), float("nan"))), ValueError, "sinks must be finite"),
        (dict(sinks=torch.full((Hq,), float("inf"))), ValueError, "sinks must be finite"),
        (dict(window_left=-2), ValueError, "window_left"),
        (dict(window_left=2**31), ValueError, "window_left"),
        (dict(window_left=3.0), TypeError, "window_left"),
        (dict(window_left=True), TypeError, "window_left"),
        (dict(softcap=-1.0), ValueError, "softcap"),
        (dict(softcap=float("nan")), ValueError, "softcap"),
        (dict(softcap=1e39), ValueError, "softcap"),
        (dict(softcap="5"), TypeError, "softcap"),
    ]:
        with pytest.raises(exc, match=name):
            av.verify_attention(*args, **bad)


# ---- the CUDA kernels' source under the host emulator ----


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emu(tmp_path_factory)


def emu_variants(emu, kernel, p, kw, **extra):
    """emu_call with the variant fields set on the struct the Python layer builds."""
    original = attention_module._attention_params

    def with_variants(*a, **k):
        params = original(*a, **k)
        params.sinks = kw["sinks"].data_ptr() if "sinks" in kw else 0
        params.window_left, params.softcap = kw.get("window_left", -1), kw.get("softcap", 0.0)
        return params

    attention_module._attention_params = with_variants
    try:
        return emu_call(emu, kernel, p, tree_mask=kw.get("tree_mask"), k_scale=kw.get("k_scale"),
                        v_scale=kw.get("v_scale"), **extra)
    finally:
        attention_module._attention_params = original


@pytest.mark.parametrize("kernel", ["mma", "mma_fused"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_emulated_mma_kernels(emu, kernel, case):
    p, kw = make(case, max_seq=1200, R=4)
    out, lse, counts = emu_variants(emu, kernel, p, kw)
    check(p, out, lse, kw)
    assert int(counts.sum()) == 0


@pytest.mark.parametrize("case", [0, 4], ids=[IDS[0], IDS[4]])
def test_emulated_rowwise_kernel(emu, case):
    p, kw = make(case, max_seq=150, R=3)
    out, lse, counts = emu_variants(emu, "rowwise", p, kw)
    check(p, out, lse, kw)
    assert int(counts.sum()) == 0


def test_emulated_kernels_count_non_finite_sinks(emu):
    p, kw = make(0, max_seq=100, R=2)
    Hq = p.q.shape[1]
    kw["sinks"] = torch.zeros(Hq)
    kw["sinks"][[1, 5]] = torch.tensor([float("nan"), float("inf")])
    for kernel in ("rowwise", "mma", "mma_fused"):
        _, _, counts = emu_variants(emu, kernel, p, kw, allow_nan=True)
        assert counts[av_errors.COUNTER_NAMES.index("sink_out_of_range")] == 2, kernel


# ---- on a GPU (skipped without one) ----


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["rowwise", "mma", "mma_fused"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_cuda_matches_reference(kernel, case):
    p, kw = make(case)
    dev = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    q, kc, vc, bt, sl, qsl, mql = p.args()
    out, lse = av.verify_attention(q.cuda(), kc.cuda(), vc.cuda(), bt.cuda(), sl.cuda(), qsl.cuda(), mql,
                                   return_lse=True, cuda_kernel=kernel, **dev)
    check(p, out.cpu(), lse.cpu(), kw)
