"""verify_attention_mla (multi-head latent attention over a paged latent cache), write_kv_mla and commit_tree_kv_mla:
the C++ CPU kernel against the float64 torch reference, and the CUDA kernels' source (the row-wise kernel and the
tensor-core MLA kernel) under the host emulator; GPU tests at the end (skipped without one).

Problems are test_attention.py's paged batches with one KV "head" of 576 values (its K cache is the latent cache): the
slots no request may read are NaN, block-table entries past a request's needs point far out of range, padding query
rows are NaN and out= is NaN-filled, so a kernel that reads what it must not or leaves an element unwritten fails.
Tolerance: test_attention.py's rule against the float64 reference (twice the float32 reference's error plus one ulp of
the output dtype); lse within 1e-4 plus twice the float32 reference's lse error. fp8 caches are compared with the
reference over the dequantised cache (the decode is exact, so the same rule holds).
"""
import ctypes

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import attention as attention_module
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from adaptive_verify.attention_fp8 import FP8

from test_attention import FAR, NAN, NEG_INF, bits, random_problem, ulp
from test_attention_emu import EARLY, LATE, build_emu

D, DV = 576, 512


class Mla:
    """A paged MLA batch: test_attention's random_problem with Hkv = 1 and D = 576; kv_cache [blocks, bs, 576]."""

    def __init__(self, seed, dtype, H, block_size, mql, *, R=4, max_seq=700, fp8_scale=None):
        self.p = random_problem(seed, dtype, D, block_size, 1, H, R=R, max_query_len=mql, max_seq=max_seq)
        self.kv_cache = self.p.k_cache[:, :, 0, :]
        self.kv_scale = fp8_scale
        if fp8_scale is not None:  # values spanning e4m3's range once divided by the scale (NaN poison stays NaN)
            big = self.kv_cache.float() * (40 * float(torch.as_tensor(fp8_scale)))
            self.kv_cache = ref.quantize_fp8(big[:, :, None, :], fp8_scale)[:, :, 0, :].contiguous()
        self.scale = 0.06

    def args(self):
        p = self.p
        return p.q, self.kv_cache, p.block_table, p.seq_lens, p.query_start_loc, p.max_query_len

    def call(self, **kw):
        out = torch.full((self.p.T, self.p.q.shape[1], DV), NAN, dtype=self.p.q.dtype)
        got, lse = av.verify_attention_mla(*self.args(), scale=self.scale, kv_scale=self.kv_scale, out=out,
                                           return_lse=True, **kw)
        assert got.data_ptr() == out.data_ptr()
        return got, lse

    def check(self, got, lse, tree_mask=None):
        p = self.p
        kw = dict(scale=self.scale, kv_scale=self.kv_scale, return_lse=True, tree_mask=tree_mask)
        ref64, lse64 = ref.verify_attention_mla(p.q.double(), self.kv_cache.double(), *self.args()[2:], **kw)
        ref32, lse32 = ref.verify_attention_mla(*self.args(), dtype=torch.float32, **kw)
        ref32 = ref32.to(p.q.dtype).double()
        assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} output elements NaN"
        pad = p.padding_mask()
        assert (got[pad] == 0).all() and (lse[pad] == NEG_INF).all()
        for r in range(p.R):
            if p.q_lens[r] == 0:
                continue
            rows = p.rows(r)
            want = ref64[rows]
            err = (got[rows].double() - want).abs().max().item()
            tol = 2 * (ref32[rows] - want).abs().max().item() + ulp(p.q.dtype, want.abs().max().item())
            assert err <= tol, f"request {r} (q_len {p.q_lens[r]}, seq_len {p.seq_lens_list[r]}): {err:.3g} > {tol:.3g}"
            seen = torch.isfinite(lse64[rows])
            assert torch.equal(torch.isfinite(lse[rows]), seen)
            lse_ref = (lse32[rows][seen].double() - lse64[rows][seen].double()).abs().max().item() if seen.any() else 0
            assert (lse[rows][seen].double() - lse64[rows][seen].double()).abs().max().item() <= 1e-4 + 2 * lse_ref


def tree_masks(m: Mla, seed):
    """[T] int64: per request a random topological tree (each token's ancestors and itself)."""
    g = torch.Generator().manual_seed(seed)
    masks = []
    for q_len in m.p.q_lens:
        anc = []
        for i in range(q_len):
            parent = int(torch.randint(0, i, (1,), generator=g)) if i else -1
            anc.append((anc[parent] if parent >= 0 else 0) | (1 << i))
        masks += [a - (1 << 64) if a >= 1 << 63 else a for a in anc]
    return torch.tensor(masks + [0] * (m.p.T - len(masks)), dtype=torch.int64)


# (dtype, H, block_size, max_query_len, fp8 scale): H from one head to 128, rows from 1 to several 64-row chunks
CASES = [
    (torch.bfloat16, 16, 64, 4, None),
    (torch.float16, 1, 16, 1, None),
    (torch.bfloat16, 128, 32, 2, None),
    (torch.float16, 20, 256, 5, 0.02),
    (torch.bfloat16, 7, 16, 33, None),
    (torch.bfloat16, 64, 128, 3, 0.5),
]
IDS = [f"{str(d)[6:]}-H{H}-bs{bs}-mql{m}-{'fp8' if s else 'b16'}" for d, H, bs, m, s in CASES]


@pytest.mark.parametrize("dtype,H,block_size,mql,fp8", CASES, ids=IDS)
def test_cpu_matches_reference(dtype, H, block_size, mql, fp8):
    m = Mla(10 + H + mql, dtype, H, block_size, mql, max_seq=900, fp8_scale=fp8)
    m.check(*m.call())


def test_cpu_tree_masks_and_batch_invariance():
    m = Mla(3, torch.bfloat16, 16, 16, 9, R=4, max_seq=600, fp8_scale=0.05)
    mask = tree_masks(m, 4)
    got, lse = m.call(tree_mask=mask)
    m.check(got, lse, tree_mask=mask)
    p = m.p
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        rows = p.rows(r)
        alone = av.verify_attention_mla(p.q[rows], m.kv_cache, p.block_table[r:r + 1], p.seq_lens[r:r + 1],
                                        torch.tensor([0, p.q_lens[r]], dtype=torch.int32), p.max_query_len,
                                        scale=m.scale, kv_scale=m.kv_scale, tree_mask=mask[rows])
        assert torch.equal(bits(alone), bits(got[rows])), f"request {r}: bits depend on the batch"


@pytest.mark.parametrize("fp8", [False, True])
def test_write_kv_mla(fp8):
    """kv_c at values 0..511 and k_pe at 512..575 of each slot's row (quantised by kv_scale into an fp8 cache); slot -1
    skipped; the rest of the cache untouched; then the written rows read back through verify_attention_mla."""
    g = torch.Generator().manual_seed(6)
    T, nb, bs = 9, 3, 16
    kv_c = torch.randn(T, DV, generator=g).to(torch.bfloat16)
    k_pe = torch.randn(T, D - DV, generator=g).to(torch.bfloat16)
    slots = torch.randperm(nb * bs, generator=g)[:T].to(torch.int64)
    slots[4] = -1
    cache = torch.full((nb, bs, D), NAN, dtype=torch.bfloat16)
    scale = 0.01 if fp8 else None
    if fp8:
        cache = cache.to(FP8)
    av.write_kv_mla(kv_c, k_pe, cache, slots, kv_scale=scale)
    full = torch.cat([kv_c, k_pe], dim=1)
    want = ref.quantize_fp8(full[:, None, :], scale)[:, 0] if fp8 else full
    raw = (lambda t: t.view(torch.uint8)) if fp8 else bits  # noqa: E731
    flat = cache.view(nb * bs, D)
    for t in range(T):
        if slots[t] >= 0:
            assert torch.equal(raw(flat[slots[t]]), raw(want[t])), f"token {t}"
    untouched = torch.ones(nb * bs, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.isnan(flat[untouched].float()).all()
    with pytest.raises(ValueError, match="slot_mapping"):
        av.write_kv_mla(kv_c, k_pe, cache, torch.full((T,), nb * bs, dtype=torch.int64), kv_scale=scale)


def test_commit_tree_kv_mla_moves_latent_rows():
    cache = torch.randn(2, 16, D).to(torch.bfloat16)
    before = cache.clone()
    av.commit_tree_kv_mla(cache, torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([14], dtype=torch.int32),
                          torch.tensor([[0, 1, 3]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    # positions 14 + 1 (stays), 14 + 3 = block 0 offset 1 -> 14 + 2 = block 0 offset 0
    assert torch.equal(bits(cache[0, 0]), bits(before[0, 1]))
    assert torch.equal(bits(cache[1]), bits(before[1])) and torch.equal(bits(cache[0, 1:]), bits(before[0, 1:]))


def test_errors_name_the_argument():
    m = Mla(1, torch.bfloat16, 4, 16, 2, R=2, max_seq=40)
    q, kv, bt, sl, qsl, mql = m.args()
    with pytest.raises(TypeError, match="scale"):
        av.verify_attention_mla(q, kv, bt, sl, qsl, mql)  # scale is required
    with pytest.raises(ValueError, match="q: head dim"):
        av.verify_attention_mla(q[..., :512], kv, bt, sl, qsl, mql, scale=0.1)
    with pytest.raises(ValueError, match="q: MLA takes 1 to 128"):
        av.verify_attention_mla(q.repeat(1, 33, 1), kv, bt, sl, qsl, mql, scale=0.1)
    with pytest.raises(ValueError, match="kv_cache must have shape"):
        av.verify_attention_mla(q, kv[..., :512].contiguous(), bt, sl, qsl, mql, scale=0.1)
    with pytest.raises(ValueError, match="kv_cache"):
        av.verify_attention_mla(q, kv.unsqueeze(2), bt, sl, qsl, mql, scale=0.1)
    with pytest.raises(TypeError, match="kv_cache"):
        av.verify_attention_mla(q, kv.half(), bt, sl, qsl, mql, scale=0.1)
    with pytest.raises(ValueError, match="kv_scale"):
        av.verify_attention_mla(q, kv, bt, sl, qsl, mql, scale=0.1, kv_scale=0.5)
    with pytest.raises(ValueError, match="kv_scale"):
        av.verify_attention_mla(q, kv.to(FP8), bt, sl, qsl, mql, scale=0.1, kv_scale=-2.0)
    with pytest.raises(ValueError, match="scale"):
        av.verify_attention_mla(q, kv, bt, sl, qsl, mql, scale=float("nan"))
    with pytest.raises(ValueError, match="out"):
        av.verify_attention_mla(q, kv, bt, sl, qsl, mql, scale=0.1, out=torch.empty(q.shape, dtype=q.dtype))
    with pytest.raises(ValueError, match="seq_lens"):
        av.verify_attention_mla(q, kv, bt, sl - 50, qsl, mql, scale=0.1)
    with pytest.raises(ValueError, match="k_pe"):
        av.write_kv_mla(torch.zeros(2, 512, dtype=torch.bfloat16), torch.zeros(2, 32, dtype=torch.bfloat16), kv,
                        torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("fp8", [False, True])
def test_mla_step_compiles_fullgraph(fp8):
    """write_kv_mla -> verify_attention_mla under torch.compile(fullgraph=True) equals eager (both are custom ops with
    fake implementations), and the ops pass torch.library.opcheck with a K-only write (v and v_cache None)."""
    from torch import _dynamo as dynamo
    g = torch.Generator().manual_seed(1)
    T, H, nb, bs = 6, 8, 4, 16
    dtype = torch.bfloat16

    def inputs():
        cache = torch.zeros(nb, bs, D, dtype=FP8 if fp8 else dtype)
        return (torch.randn(T, H, D, generator=g).to(dtype), torch.randn(T, DV, generator=g).to(dtype),
                torch.randn(T, D - DV, generator=g).to(dtype), cache)

    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    seq = torch.tensor([20, 9], dtype=torch.int32)
    qsl = torch.tensor([0, 4, 6], dtype=torch.int32)
    slots = torch.tensor([16, 17, 18, 19, 39, 40], dtype=torch.int64)
    scale = 0.5 if fp8 else None

    def step(q, kv_c, k_pe, cache):
        av.write_kv_mla(kv_c, k_pe, cache, slots, kv_scale=scale)
        return av.verify_attention_mla(q, cache, bt, seq, qsl, 4, scale=0.05, kv_scale=scale), cache

    x = inputs()
    eager = step(*[t.clone() for t in x])
    dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(*[t.clone() for t in x])
    assert torch.equal(bits(eager[0]), bits(compiled[0]))
    assert torch.equal(eager[1].view(torch.uint8), compiled[1].view(torch.uint8))
    err = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
    if not fp8:
        k_only = (x[1].unsqueeze(1), None, x[3].unsqueeze(2), None, slots, err, 1.0, None, 1.0, None, D, 0)
        torch.library.opcheck(torch.ops.adaptive_verify.write_kv_.default, k_only)


# ---- the CUDA kernels' source under the host emulator ----


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emu(tmp_path_factory)


def emu_call(emu, kernel, m: Mla, *, copy_mode=LATE, tree_mask=None, params_out=None):
    """verify_attention_mla through an emulated CUDA kernel with the parameter struct a real call builds; returns
    (out, lse, error counts). params_out (a list) receives the struct and its buffers for a replay."""
    q, kv, bt, sl, qsl, mql = m.args()
    T, H, _ = q.shape
    out = torch.full((T, H, DV), NAN, dtype=q.dtype)
    lse = torch.full((T, H), NAN, dtype=torch.float32)
    counts = torch.zeros(av_errors.error_buffer("cpu").numel(), dtype=torch.int32)
    rows = kv.unsqueeze(2)
    s = 1.0 if m.kv_scale is None else float(m.kv_scale)
    params = attention_module._attention_params(q, rows, rows, bt, sl, qsl, out, lse, counts, mql, bt.shape[1],
                                                m.scale, attention_module.CUDA_KERNELS[kernel], tree_mask, s, None, s,
                                                None)
    err = ctypes.create_string_buffer(512)
    status = emu(ctypes.addressof(params), copy_mode, 0, kv.numel() * kv.element_size(), err, len(err))
    assert status == 0, f"emulator: {err.value.decode()}"
    if params_out is not None:
        params_out += [params, out, lse, counts]
    return out, lse, counts


@pytest.mark.parametrize("case", [0, 1, 2, 3, 5], ids=[IDS[i] for i in (0, 1, 2, 3, 5)])
def test_emulated_mma_kernel(emu, case):
    dtype, H, block_size, mql, fp8 = CASES[case]
    m = Mla(10 + H + mql, dtype, H, block_size, mql, R=3, max_seq=600, fp8_scale=fp8)
    out, lse, counts = emu_call(emu, "mma", m)
    m.check(out, lse)
    assert int(counts.sum()) == 0


def test_emulated_mma_kernel_tree_and_early_copies(emu):
    """A tree mask, and cp.async data landing at issue: the same bits as landing at the wait."""
    m = Mla(5, torch.bfloat16, 12, 16, 7, R=3, max_seq=300)
    mask = tree_masks(m, 8)
    late = emu_call(emu, "mma", m, tree_mask=mask)
    m.check(late[0], late[1], tree_mask=mask)
    early = emu_call(emu, "mma", m, copy_mode=EARLY, tree_mask=mask)
    assert torch.equal(bits(late[0]), bits(early[0])) and torch.equal(bits(late[1]), bits(early[1]))
    fused = emu_call(emu, "mma_fused", m, tree_mask=mask)  # the same kernel
    assert torch.equal(bits(late[0]), bits(fused[0]))


def test_emulated_mma_kernel_is_batch_invariant(emu):
    """Each request's bits equal those of the request run alone (same max_query_len): rows never share arithmetic
    with another request's."""
    m = Mla(17, torch.bfloat16, 24, 16, 3, R=3, max_seq=400, fp8_scale=0.2)
    out, lse, _ = emu_call(emu, "mma", m)
    p = m.p
    for r in range(p.R):
        if p.q_lens[r] == 0:
            continue
        alone = Mla(17, torch.bfloat16, 24, 16, 3, R=3, max_seq=400, fp8_scale=0.2)
        a = alone.p
        rows = p.rows(r)
        a.q = p.q[rows].contiguous()
        a.block_table, a.seq_lens = p.block_table[r:r + 1].contiguous(), p.seq_lens[r:r + 1].clone()
        a.query_start_loc = torch.tensor([0, p.q_lens[r]], dtype=torch.int32)
        a.T, a.R, a.q_lens, a.seq_lens_list = p.q_lens[r], 1, [p.q_lens[r]], [p.seq_lens_list[r]]
        got, got_lse, _ = emu_call(emu, "mma", alone)
        assert torch.equal(bits(got), bits(out[rows])) and torch.equal(bits(got_lse), bits(lse[rows])), r


def test_emulated_rowwise_kernel(emu):
    m = Mla(2, torch.float16, 3, 16, 3, R=3, max_seq=80, fp8_scale=0.1)
    out, lse, counts = emu_call(emu, "rowwise", m)
    m.check(out, lse)
    assert int(counts.sum()) == 0


def test_emulated_replay_of_a_frozen_struct_with_new_lengths(emu):
    """What a captured CUDA graph does: the same parameter struct (pointers, host bounds) run again after the
    lengths, block table and cache contents changed in place; the result follows the new contents."""
    m = Mla(21, torch.bfloat16, 16, 32, 4, R=3, max_seq=500, fp8_scale=0.1)  # (an fp8 cache: its decode path too)
    frozen = []
    emu_call(emu, "mma", m, params_out=frozen)
    params, out, lse, counts = frozen
    p = m.p
    g = torch.Generator().manual_seed(22)
    new_q = [int(torch.randint(0, 5, (1,), generator=g)) for _ in range(p.R)]  # 0: a padding row now
    for r in range(p.R):
        new_q[r] = min(new_q[r], p.seq_lens_list[r])
    qsl = torch.tensor([0] + torch.tensor(new_q).cumsum(0).tolist(), dtype=torch.int32)
    p.query_start_loc.copy_(qsl)
    p.seq_lens.copy_(torch.tensor([max(n, s - 7) for n, s in zip(new_q, p.seq_lens_list)], dtype=torch.int32))
    p.q.copy_(torch.randn(p.q.shape, generator=g).to(p.q.dtype))
    p.q_lens, p.seq_lens_list = new_q, p.seq_lens.tolist()
    err = ctypes.create_string_buffer(512)
    out.fill_(NAN)
    assert emu(ctypes.addressof(params), LATE, 0, m.kv_cache.numel() * m.kv_cache.element_size(), err, len(err)) == 0
    m.check(out, lse)


def test_emulated_bad_block_ids_are_skipped_and_counted(emu):
    m = Mla(9, torch.bfloat16, 8, 16, 2, R=2, max_seq=100)
    p = m.p
    r = max(range(p.R), key=lambda i: p.seq_lens_list[i])
    p.block_table[r, 0] = FAR
    out, _, counts = emu_call(emu, "mma", m)
    assert counts[av_errors.COUNTER_NAMES.index("slot_out_of_range")] > 0
    assert not torch.isnan(out).any()


# ---- on a GPU (skipped without one) ----


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["rowwise", "mma"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_cuda_matches_reference(kernel, case):
    dtype, H, block_size, mql, fp8 = CASES[case]
    m = Mla(10 + H + mql, dtype, H, block_size, mql, max_seq=900, fp8_scale=fp8)
    q, kv, bt, sl, qsl, mql = m.args()
    out, lse = av.verify_attention_mla(q.cuda(), kv.cuda(), bt.cuda(), sl.cuda(), qsl.cuda(), mql, scale=m.scale,
                                       kv_scale=m.kv_scale, return_lse=True, cuda_kernel=kernel)
    m.check(out.cpu(), lse.cpu())


@pytest.mark.cuda
def test_cuda_write_kv_mla_matches_cpu():
    g = torch.Generator().manual_seed(3)
    kv_c, k_pe = torch.randn(40, DV, generator=g).half(), torch.randn(40, D - DV, generator=g).half()
    slots = torch.randperm(64, generator=g)[:40].to(torch.int64)
    for dtype, scale in ((torch.float16, None), (FP8, 0.02)):
        cache = torch.zeros(4, 16, D, dtype=dtype)
        gcache = cache.cuda()
        av.write_kv_mla(kv_c, k_pe, cache, slots, kv_scale=scale)
        av.write_kv_mla(kv_c.cuda(), k_pe.cuda(), gcache, slots.cuda(), kv_scale=scale)
        assert torch.equal(gcache.cpu().view(torch.uint8), cache.view(torch.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["rowwise", "mma"])
def test_cuda_graph_replays_new_lengths(kernel):
    """Capture once with host bounds; replays with new lengths and queries (copied into the captured buffers) follow
    the new contents."""
    m = Mla(31, torch.bfloat16, 16, 64, 4, R=3, max_seq=900)
    q, kv, bt, sl, qsl, mql = [a.cuda() if isinstance(a, torch.Tensor) else a for a in m.args()]
    out = torch.empty(q.shape[0], q.shape[1], DV, dtype=q.dtype, device="cuda")
    def call():
        av.verify_attention_mla(q, kv, bt, sl, qsl, mql, scale=m.scale, out=out, cuda_kernel=kernel)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    p = m.p
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        new_q = [min(int(torch.randint(0, 5, (1,), generator=g)), s) for s in p.seq_lens_list]
        p.query_start_loc.copy_(torch.tensor([0] + torch.tensor(new_q).cumsum(0).tolist(), dtype=torch.int32))
        p.q.copy_(torch.randn(p.q.shape, generator=g).to(p.q.dtype))
        p.q_lens = new_q
        qsl.copy_(p.query_start_loc)
        q.copy_(p.q)
        graph.replay()
        torch.cuda.synchronize()
        got = out.cpu()
        lse = ref.verify_attention_mla(*m.args(), scale=m.scale, return_lse=True)[1]  # lse is not captured here
        m.check(got, lse)
