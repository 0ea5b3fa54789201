"""verify_attention's FlashAttention-4 path (adaptive_verify/attention_fa4.py), as far as a machine without a GPU (and
without FA4) can check it: the dispatch decision for every condition, and that the arguments handed to FA4's
flash_attn_varlen_func mean the plan: attention computed the way FlashAttention documents them (varlen queries,
seqused_k keys through the page table, causal aligned to the end of the keys, a left window, a learnable sink in units
of the scaled scores, soft-capping) equals verify_attention's float64 reference, variants included.
"""
import types

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import attention_fa4 as fa4
from adaptive_verify import reference as ref

from test_attention import random_problem


def test_cpu_calls_never_take_fa4():
    p = random_problem(1, torch.bfloat16, 64, 16, 2, 4, R=3, max_query_len=3, max_seq=100)
    q, kc, vc, bt = p.q, p.k_cache, p.v_cache, p.block_table
    assert av.attention_backend(q, kc, vc, bt) == "ours"
    assert av.attention_backend(q, kc, vc, bt, backend="ours") == "ours"
    with pytest.raises(ValueError, match="backend='fa4': FA4 runs on CUDA"):
        av.verify_attention(*p.args(), backend="fa4")
    with pytest.raises(ValueError, match="backend must be one of"):
        av.verify_attention(*p.args(), backend="flash")


class FakeCuda:
    """q/k/v stand-ins that report a CUDA device, for the decision alone (no data is read)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.device = shape, dtype, torch.device("cuda", 0)


@pytest.mark.parametrize("case,want", [
    (dict(), None),
    (dict(capability=9), "compute capability 9.x"),
    (dict(kv=torch.float8_e4m3fn), "fp8 caches"),
    (dict(D=256), "head dim 256"),
    (dict(bs=32), "block_size 32"),
    (dict(tree=True), "draft-tree masks"),
    (dict(max_seq_len=100), "max_seq_len"),
    (dict(installed=False), "flash-attn-4 is not installed"),
])
def test_the_decision(monkeypatch, case, want):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (case.get("capability", 10), 0))
    installed = case.get("installed", True)
    monkeypatch.setattr(fa4, "_fa4_interface", lambda: (object(), None) if installed else
                        (None, "flash-attn-4 is not installed (pip install 'adaptive-verify[sm100]')"))
    D, bs = case.get("D", 128), case.get("bs", 16)
    q = FakeCuda((10, 8, D), torch.bfloat16)
    kc = FakeCuda((40, bs, 2, D), case.get("kv", torch.bfloat16))
    bt = FakeCuda((3, 10), torch.int32)
    why = fa4.fa4_unsupported(q, kc, kc, bt, tree_mask=object() if case.get("tree") else None,
                              max_seq_len=case.get("max_seq_len"))
    assert (why is None) if want is None else (want in why), why
    assert fa4.attention_backend(q, kc, kc, bt, tree_mask=object() if case.get("tree") else None,
                                 max_seq_len=case.get("max_seq_len")) == ("fa4" if want is None else "ours")
    if case.get("capability") == 9:  # an H200 may run FA4's SM90 kernel when asked, to validate the glue
        assert fa4.attention_backend(q, kc, kc, bt, backend="fa4") == "fa4"


def test_auto_declines_sinks_with_softcap_which_fa4_spills_on(monkeypatch):
    """FA4's kernel for sinks together with soft-capping spills hundreds of SASS instructions (the CI check,
    tests/integration/test_peer_fa4.py): "auto" runs that pair on this package's kernels, each alone on FA4;
    backend="fa4" still runs the pair."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(fa4, "_fa4_interface", lambda: (object(), None))
    q, kc, bt = FakeCuda((10, 8, 128), torch.bfloat16), FakeCuda((40, 16, 2, 128), torch.bfloat16), \
        FakeCuda((3, 10), torch.int32)
    sinks = torch.zeros(8)
    assert fa4.attention_backend(q, kc, kc, bt, sinks=sinks, softcap=30.0) == "ours"
    assert fa4.attention_backend(q, kc, kc, bt, sinks=sinks) == "fa4"
    assert fa4.attention_backend(q, kc, kc, bt, softcap=30.0) == "fa4"
    assert fa4.attention_backend(q, kc, kc, bt, sinks=sinks, softcap=30.0, backend="fa4") == "fa4"


def _fa_semantics(kw):
    """Attention computed the way FlashAttention documents flash_attn_varlen_func's arguments, float64: per batch
    entry b, seqused_k[b] keys gathered through page_table[b], queries cu_seqlens_q[b]..[b+1], causal aligned to the
    end (query i of n sees keys <= seqused_k - n + i), window_size (left, right) around that diagonal, softcap on the
    scaled scores, learnable_sink[h] one more logit in the denominator (not scaled). Returns out [T, H, D], lse [T, H]."""
    q, k, v = kw["q"].double(), kw["k"].double(), kw["v"].double()
    T, H, D = q.shape
    page = k.shape[1]
    out = torch.zeros(T, H, D, dtype=torch.float64)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float64)
    cu, used, table = kw["cu_seqlens_q"].long(), kw["seqused_k"].long(), kw["page_table"].long()
    left, right = kw["window_size"]
    for b in range(table.shape[0]):
        n, n_k = int(cu[b + 1] - cu[b]), int(used[b])
        if n == 0:
            continue
        pos = torch.arange(n_k)
        keys = k[table[b][pos // page], pos % page].repeat_interleave(H // k.shape[2], dim=1)  # [n_k, H, D]
        vals = v[table[b][pos // page], pos % page].repeat_interleave(H // k.shape[2], dim=1)
        s = torch.einsum("ihd,jhd->hij", q[cu[b]:cu[b + 1]], keys) * kw["softmax_scale"]
        if kw["softcap"]:
            s = kw["softcap"] * torch.tanh(s / kw["softcap"])
        diag = n_k - n + torch.arange(n)[:, None]
        allowed = pos[None, :] <= diag + (right or 0)
        if left is not None:
            allowed = allowed & (pos[None, :] >= diag - left)
        s = s.masked_fill(~allowed[None], float("-inf"))
        terms = s if kw["learnable_sink"] is None else torch.cat(
            [s, kw["learnable_sink"].double()[:, None, None].expand(H, n, 1)], dim=-1)
        l = torch.logsumexp(terms, dim=-1)  # [H, n]
        out[cu[b]:cu[b + 1]] = torch.einsum("hij,jhd->ihd", torch.exp(s - l[..., None]), vals)
        lse[cu[b]:cu[b + 1]] = l.transpose(0, 1)
    return out, lse


@pytest.mark.parametrize("variants", [dict(), dict(sinks=True, window_left=40), dict(softcap=20.0, window_left=0),
                                      dict(sinks=True, softcap=30.0)],
                         ids=["plain", "sinks+window", "softcap+window0", "sinks+softcap"])
def test_the_arguments_mean_the_plan(variants):
    p = random_problem(11, torch.bfloat16, 128, 16, 2, 4, R=4, max_query_len=5, max_seq=700, n_padding_rows=1,
                       q_scale=2.0)
    p.k_cache, p.v_cache = torch.nan_to_num(p.k_cache), torch.nan_to_num(p.v_cache)  # FA4 needs finite page tails
    kw = dict(variants)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.linspace(-1.0, 3.0, p.q.shape[1])
    scale = 0.09
    args = fa4.fa4_arguments(*p.args(), scale=scale, **kw)
    assert args["causal"] and args["return_lse"] and args["page_table"] is p.block_table
    got, got_lse = _fa_semantics(args)
    want, want_lse = ref.verify_attention(p.q.double(), p.k_cache.double(), p.v_cache.double(), p.block_table,
                                          p.seq_lens, p.query_start_loc, p.max_query_len, scale=scale, return_lse=True,
                                          **kw)
    rows = ~p.padding_mask()
    assert torch.allclose(got[rows], want[rows].double(), atol=1e-9)
    assert torch.allclose(got_lse[rows], want_lse[rows].double(), atol=1e-5)


def test_run_fa4_writes_padding_like_our_kernels(monkeypatch):
    """FA4 writes only rows inside cu_seqlens_q: run_fa4 gives the others zeros and lse -inf, and transposes FA4's
    [Hq, T] lse."""
    p = random_problem(3, torch.bfloat16, 64, 16, 2, 2, R=3, max_query_len=3, max_seq=90, extra_tokens=3)
    T, H, D = p.q.shape
    fake = types.SimpleNamespace(flash_attn_varlen_func=lambda **kw: (torch.ones(T, H, D, dtype=p.q.dtype),
                                                                      torch.zeros(H, T)))
    monkeypatch.setattr(fa4, "_fa4_interface", lambda: (fake, None))
    out, lse = torch.full_like(p.q, float("nan")), torch.full((T, H), float("nan"))
    fa4.run_fa4(out, lse, *p.args(), scale=0.1)
    end = int(p.query_start_loc[-1])
    assert (out[:end] == 1).all() and (out[end:] == 0).all()
    assert (lse[:end] == 0).all() and (lse[end:] == float("-inf")).all()


@pytest.mark.cuda
def test_cuda_fa4_glue_matches_reference():
    """On a GPU with the [sm100] extra: backend="fa4" (FA4's SM90 kernel on an H200, its SM100 one on Blackwell)
    against the float64 reference, with sinks, a window and soft-capping. Skipped where FA4 is not installed."""
    if fa4._fa4_interface()[0] is None:
        pytest.skip(fa4._fa4_interface()[1])
    p = random_problem(13, torch.bfloat16, 128, 16, 2, 4, R=4, max_query_len=5, max_seq=900)
    p.k_cache, p.v_cache = torch.nan_to_num(p.k_cache), torch.nan_to_num(p.v_cache)
    kw = dict(sinks=torch.linspace(-1.0, 3.0, p.q.shape[1]), window_left=128, softcap=30.0)
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in p.args()]
    out, lse = av.verify_attention(*dev, backend="fa4", return_lse=True, sinks=kw["sinks"].cuda(),
                                   window_left=128, softcap=30.0)
    want, want_lse = ref.verify_attention(p.q.double(), p.k_cache.double(), p.v_cache.double(), p.block_table,
                                          p.seq_lens, p.query_start_loc, p.max_query_len, return_lse=True, **kw)
    rows = ~p.padding_mask()
    assert torch.allclose(out.cpu()[rows].double(), want[rows].double(), atol=2e-2)
    assert torch.allclose(lse.cpu()[rows].double(), want_lse[rows].double(), atol=1e-3)


@pytest.mark.parametrize("installed, says", [(None, "flash-attn-4 is not installed"),
                                             ("4.0.0b1", "flash-attn-4 4.0.0b1 is installed; this package is "
                                                         "pinned to 4.0.0b36")])
def test_fa4_import_error_says_why(monkeypatch, installed, says):
    import importlib.metadata as md

    def version(name):
        if name != "flash-attn-4":
            return md.version(name)
        if installed is None:
            raise md.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(md, "version", version)
    fa4._fa4_interface.cache_clear()  # looked up once per process: make this test's lookup the one
    try:
        assert av.fa4_import_error().startswith(says)
    finally:
        fa4._fa4_interface.cache_clear()
