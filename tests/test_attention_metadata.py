"""The plan in attention backends' forms: flashinfer_plan (the C++ CPU kernel and, under the host emulator, the CUDA
kernels, against the oracle written from FlashInfer's documentation, bit for bit) and flash_attn_plan; and, for both,
that attention computed the way each backend reads its arguments (an evaluator written from its documentation, here)
equals verify_attention's float64 reference on the same batch: the metadata means what the plan means.
"""
import ctypes

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import attention_metadata as meta_module
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref

import emu_build


def batch(seed, R, page_size, mql, *, tree, padding=True):
    """R requests (some padding rows with q_len 0 and seq_len 0), random lengths, a shuffled block table with spare
    columns, and per request a random topological tree's masks (or None)."""
    g = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(1, mql + 1, (R,), generator=g)
    seq = q_lens + torch.randint(0, 3 * page_size + 5, (R,), generator=g)
    if padding and R > 1:
        q_lens[1], seq[1] = 0, 0
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    max_pages = int(((seq + page_size - 1) // page_size).max()) + 2 if R else 3
    table = torch.randperm(R * max_pages, generator=g).to(torch.int32).view(R, max_pages)
    masks = None
    if tree:
        rows = []
        for n in q_lens.tolist():
            anc = []
            for i in range(n):
                parent = int(torch.randint(0, i, (1,), generator=g)) if i else -1
                anc.append((anc[parent] if parent >= 0 else 0) | (1 << i))
            rows += [a - (1 << 64) if a >= 1 << 63 else a for a in anc]
        masks = torch.tensor(rows, dtype=torch.int64)
    return qsl, seq.to(torch.int32), table, masks


CASES = [(3, 16, 4, True), (9, 1, 7, True), (5, 64, 64, True), (12, 16, 33, False), (1, 32, 1, True), (0, 16, 4, False)]


@pytest.mark.parametrize("R,page,mql,tree", CASES, ids=[f"R{c[0]}-page{c[1]}-mql{c[2]}-tree{c[3]}" for c in CASES])
def test_cpu_matches_reference(R, page, mql, tree):
    qsl, seq, table, masks = batch(R + page + mql, R, page, mql, tree=tree)
    got = av.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, max_query_len=mql)
    cap = got["packed_custom_mask"].numel() if tree else None
    want = ref.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, capacity=cap)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def _paged_problem(seed, R, page, mql, tree):
    """A verification batch with real K/V in pages of `page` tokens, and its plan tensors."""
    qsl, seq, table, masks = batch(seed, R, page, mql, tree=tree, padding=False)
    g = torch.Generator().manual_seed(seed + 1)
    T, Hq, Hkv, D = int(qsl[-1]), 4, 2, 64
    blocks = table.numel()
    q = torch.randn(T, Hq, D, generator=g).to(torch.bfloat16)
    k_cache = torch.randn(blocks, page, Hkv, D, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(blocks, page, Hkv, D, generator=g).to(torch.bfloat16)
    return q, k_cache, v_cache, table, seq, qsl, masks


def _dense_attention(q, keys, values, allowed, scale):
    """softmax(scale q k^T restricted to `allowed`) v in float64, GQA by repeating KV heads: [q_len, Hq, D]."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.double(), k) * scale
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v)


def test_flashinfer_arguments_mean_the_plan():
    """Attention read the way FlashInfer documents its paged layout and custom mask (pages from paged_kv_indices,
    kv_len from the last page's length, mask bits unpacked little-endian per request) equals verify_attention's
    reference."""
    q, kc, vc, table, seq, qsl, masks = _paged_problem(3, 4, 16, 6, True)
    page = kc.shape[1]
    m = av.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, max_query_len=6)
    want = ref.verify_attention(q.double(), kc.double(), vc.double(), table, seq, qsl, 6, tree_mask=masks)
    for r in range(table.shape[0]):
        qo = slice(int(m["qo_indptr"][r]), int(m["qo_indptr"][r + 1]))
        pages = m["paged_kv_indices"][int(m["paged_kv_indptr"][r]):int(m["paged_kv_indptr"][r + 1])].long()
        kv_len = (pages.numel() - 1) * page + int(m["paged_kv_last_page_len"][r])
        keys = kc[pages].reshape(-1, *kc.shape[2:])[:kv_len]
        values = vc[pages].reshape(-1, *vc.shape[2:])[:kv_len]
        raw = m["packed_custom_mask"][int(m["mask_indptr"][r]):int(m["mask_indptr"][r + 1])]
        bits = ((raw[:, None].long() >> torch.arange(8)) & 1).reshape(-1)[:(qo.stop - qo.start) * kv_len]
        allowed = bits.bool().view(qo.stop - qo.start, kv_len)
        got = _dense_attention(q[qo], keys, values, allowed, 64 ** -0.5)
        assert torch.allclose(got, want[qo].double(), atol=1e-6), r


def test_flash_attn_arguments_mean_the_plan():
    """Attention read the way FlashAttention documents varlen + page_table + causal (seqused_k keys from the page
    table's rows; causal aligned to the end of the keys: query i of q_len sees keys up to seqused_k - q_len + i) equals
    verify_attention's reference (chains: FlashAttention has no tree mask)."""
    q, kc, vc, table, seq, qsl, _ = _paged_problem(5, 5, 16, 8, False)
    page = kc.shape[1]
    m = av.flash_attn_plan(qsl, seq, table, 8)
    assert m["cu_seqlens_q"] is qsl and m["seqused_k"] is seq and m["page_table"] is table and m["max_seqlen_q"] == 8
    want = ref.verify_attention(q.double(), kc.double(), vc.double(), table, seq, qsl, 8)
    for r in range(table.shape[0]):
        qo = slice(int(m["cu_seqlens_q"][r]), int(m["cu_seqlens_q"][r + 1]))
        n_k, n_q = int(m["seqused_k"][r]), qo.stop - qo.start
        pos = torch.arange(n_k)
        slots = m["page_table"][r].long()[pos // page]
        keys, values = kc[slots, pos % page], vc[slots, pos % page]
        allowed = pos[None, :] <= (n_k - n_q + torch.arange(n_q))[:, None]  # bottom-right causal
        got = _dense_attention(q[qo], keys, values, allowed, 64 ** -0.5)
        assert torch.allclose(got, want[qo].double(), atol=1e-6), r


def test_errors_name_the_argument():
    qsl, seq, table, masks = batch(1, 3, 16, 4, tree=True)
    with pytest.raises(ValueError, match="max_query_len is required"):
        av.flashinfer_plan(qsl, seq, table, 16, tree_mask=masks)
    with pytest.raises(ValueError, match="page_size"):
        av.flashinfer_plan(qsl, seq, table, 0)
    with pytest.raises(TypeError, match="block_table"):
        av.flashinfer_plan(qsl, seq, table.long(), 16)
    with pytest.raises(ValueError, match="query_start_loc"):
        av.flashinfer_plan(qsl[:-1], seq, table, 16)
    with pytest.raises(ValueError, match="seq_lens"):  # a q_len above seq_len
        av.flashinfer_plan(qsl, torch.zeros_like(seq), table, 16)
    with pytest.raises(ValueError, match="block table's pages"):
        av.flashinfer_plan(qsl, seq + 10**6, table, 16)
    with pytest.raises(ValueError, match="max_query_len"):  # a q_len above the mask bound
        av.flashinfer_plan(qsl, seq, table, 16, tree_mask=masks, max_query_len=1)
    with pytest.raises(TypeError, match="max_query_len"):
        av.flash_attn_plan(qsl, seq, table, 4.0)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    dll = emu_build.build("attention_emu", tmp_path_factory)
    fn = dll.av_emu_flashinfer_plan
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def emulated_call(emu):
    """A stand-in for _binding.call that runs flashinfer_plan's CUDA kernels under the emulator."""
    def call(fn, p, on_cuda, stream):
        err = ctypes.create_string_buffer(512)
        assert emu(ctypes.addressof(p), err, len(err)) == 0, err.value.decode()
        return 0
    return call


@pytest.mark.parametrize("R,page,mql,tree", CASES, ids=[f"R{c[0]}-page{c[1]}-mql{c[2]}-tree{c[3]}" for c in CASES])
def test_emulated_cuda_kernels_match_the_cpu_kernel(emu, monkeypatch, R, page, mql, tree):
    """The CUDA kernels' source, launched by its launcher under the emulator through the same parameter struct the
    Python layer builds; the int32 outputs are poisoned first (the packed mask is allocated zeroed: its bytes past
    mask_indptr[R] are documented as 0 and not written by any kernel)."""
    qsl, seq, table, masks = batch(R + page + mql, R, page, mql, tree=tree)
    want = av.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, max_query_len=mql)

    monkeypatch.setattr(meta_module, "call", emulated_call(emu))
    real_empty = torch.empty  # the int32 outputs start poisoned: the kernels must write every entry
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(0x5a5a5a5a))
    got = av.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, max_query_len=mql)
    monkeypatch.undo()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_emulated_cuda_kernels_count_and_empty_bad_requests(emu, monkeypatch):
    qsl, seq, table, masks = batch(7, 3, 16, 4, tree=True)
    seq[0] = 10**6  # beyond the table: on CUDA the request is written empty and counted
    counts = av_errors.error_buffer("cpu")
    before = int(counts[av_errors.COUNTER_NAMES.index("query_len_out_of_range")])

    monkeypatch.setattr(meta_module, "call", emulated_call(emu))
    got = av.flashinfer_plan(qsl, seq, table, 16, tree_mask=masks, max_query_len=4)
    assert int(counts[av_errors.COUNTER_NAMES.index("query_len_out_of_range")]) == before + 1
    assert int(got["paged_kv_indptr"][1]) == 0 and int(got["paged_kv_last_page_len"][0]) == 0
    av.reset_error_counts("cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("R,page,mql,tree", CASES, ids=[f"R{c[0]}-page{c[1]}-mql{c[2]}-tree{c[3]}" for c in CASES])
def test_cuda_matches_cpu(R, page, mql, tree):
    qsl, seq, table, masks = batch(R + page + mql, R, page, mql, tree=tree)
    want = av.flashinfer_plan(qsl, seq, table, page, tree_mask=masks, max_query_len=mql)
    got = av.flashinfer_plan(qsl.cuda(), seq.cuda(), table.cuda(), page,
                             tree_mask=None if masks is None else masks.cuda(), max_query_len=mql)
    for k in want:
        assert torch.equal(got[k].cpu(), want[k]), k
