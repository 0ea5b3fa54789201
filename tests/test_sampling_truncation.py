"""Sampling parameters (top_k, top_p, min_p) and logprobs of rejection_sample and sample: the reference's kept set
on hand-written rows, the C++ CPU kernel against the reference bit for bit on random batches, greedy
equivalence at top_k = 1, batch invariance, argument checks. Distribution tests: test_sampling_stats.py;
the CUDA source under the emulator: test_sampling_emu.py."""
import math

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import errors as av_errors
from adaptive_verify import reference as ref
from test_sampling import DTYPES, NAN, _assert_same, _qsl, _random_batch, _sub_batch


def kept_ids(z, **kw):
    return ref.kept_tokens(torch.tensor(z, dtype=torch.float32), **kw).nonzero().flatten().tolist()


# ------------------------------------------------------------------------------------------------------
# the truncated set, by hand
# ------------------------------------------------------------------------------------------------------


def test_top_k_keeps_exactly_k_with_ties_to_the_lower_ids():
    z = [1.0, 3.0, 2.0, 3.0, 2.0, 0.0]
    assert kept_ids(z, top_k=1) == [1]
    assert kept_ids(z, top_k=2) == [1, 3]
    assert kept_ids(z, top_k=3) == [1, 2, 3]  # of the two 2.0s, id 2 before id 4
    assert kept_ids(z, top_k=6) == list(range(6)) == kept_ids(z, top_k=0) == kept_ids(z, top_k=99)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = torch.log(p).tolist()
    assert kept_ids(z, top_p=0.5) == [0]  # 0.5 reaches 0.5
    assert kept_ids(z, top_p=0.51) == [0, 1]
    assert kept_ids(z, top_p=0.8) == [0, 1]
    assert kept_ids(z, top_p=0.81) == [0, 1, 2]
    assert kept_ids(z, top_p=1e-9) == [0]  # the top token is always kept
    assert kept_ids(z, top_p=1.0) == [0, 1, 2, 3]


def test_min_p_is_relative_to_the_top_probability():
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    z = torch.log(p).tolist()
    assert kept_ids(z, min_p=0.5) == [1, 2, 3]  # p >= 0.2
    assert kept_ids(z, min_p=0.6) == [1, 3]
    assert kept_ids(z, min_p=1.0) == [1]
    assert kept_ids(z, min_p=0.0) == [0, 1, 2, 3]


def test_filters_compose_in_vllms_order():
    """min-p, then top-k, then top-p on what is left, renormalised. With p = [0.45, 0.35, 0.1, 0.1]: top-p 0.56 on
    the whole row keeps [0, 1] (0.45 < 0.56); after min-p 0.5 (p >= 0.225 leaves [0, 1]) or top-k 2, the
    renormalised 0.5625 already reaches 0.56, so only [0] is kept. Applying min-p last would keep [0, 1]."""
    p = torch.tensor([0.45, 0.35, 0.1, 0.1])
    z = torch.log(p).tolist()
    assert kept_ids(z, top_p=0.56) == [0, 1]
    assert kept_ids(z, min_p=0.5) == [0, 1]
    assert kept_ids(z, min_p=0.5, top_p=0.56) == [0]
    assert kept_ids(z, top_k=2, top_p=0.56) == [0]
    assert kept_ids(z, top_k=2, top_p=0.57) == [0, 1]
    assert kept_ids(z, top_k=3, top_p=0.9) == [0, 1, 2]  # renormalised over 0.9: 0.8 / 0.9 < 0.9
    assert kept_ids(z, min_p=0.3, top_k=3) == [0, 1]


def test_nan_and_negative_infinity():
    z = [NAN, 1.0, float("-inf"), 1.0]
    assert kept_ids(z, top_k=1) == [1]
    assert kept_ids(z) == [1, 2, 3]
    assert kept_ids([NAN, NAN]) == []


# ------------------------------------------------------------------------------------------------------
# the CPU kernel against the reference
# ------------------------------------------------------------------------------------------------------


def _params(g, n, V, off_rate=0.3):
    """Per-request top_k, top_p, min_p with a mix of off values, extremes and typical ones."""
    top_k = torch.tensor([0, 1, 2, 5, 40, V, V + 3])[torch.randint(0, 7, (n,), generator=g)].to(torch.int32)
    top_p = torch.tensor([1.0, 0.95, 0.8, 0.5, 0.1, 1e-6])[torch.randint(0, 6, (n,), generator=g)]
    min_p = torch.tensor([0.0, 0.05, 0.2, 0.6, 1.0, 1e-30])[torch.randint(0, 6, (n,), generator=g)]
    return top_k, top_p, min_p


@pytest.mark.parametrize("V", [1, 3, 33, 700, 5003])
@pytest.mark.parametrize("probs", [None, "one-hot", "full"])
def test_kernel_matches_reference_with_truncation_and_logprobs(V, probs):
    g = torch.Generator().manual_seed(V + 17 * len(probs or ""))
    R = 8 if V > 1000 else 14
    for i, dtype in enumerate(DTYPES):
        K = [2, 5, 1][i]
        logits, qsl, drafts, q, temperature, seeds, q_len = _random_batch(g, R, K, V, dtype, torch.int32, probs)
        top_k, top_p, min_p = _params(g, R, V)
        kw = dict(draft_probs=q, temperature=temperature, seeds=seeds, offset=11 + i, top_k=top_k, top_p=top_p,
                  min_p=min_p, logprobs=True)
        out = (torch.full((R, K + 1), -7, dtype=torch.int32), torch.full((R,), -7, dtype=torch.int32),
               torch.full((R, K + 1), 7.0))
        got = av.rejection_sample(logits, qsl, drafts, out=out, **kw)
        want = ref.rejection_sample(logits, qsl, drafts, **kw)
        what = f"V={V} {dtype} probs={probs}"
        _assert_same(got, want, what)
        assert torch.equal(got[2], want[2]), f"{what}\nlogprobs\n{got[2]}\nreference\n{want[2]}"
        assert all(a.data_ptr() == b.data_ptr() for a, b in zip(got, out))


@pytest.mark.parametrize("V", [2, 33, 5003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_matches_reference_with_truncation_and_logprobs(V, dtype):
    g = torch.Generator().manual_seed(V + 5)
    N = 18
    logits = (torch.randn(N, V, generator=g) * 3).to(dtype)
    logits[2] = (logits[2].float() * 2).round().to(dtype) / 2  # ties
    logits[5, : V // 2] = NAN
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-6, 1e6] * 3)
    seeds = torch.randint(-2**63, 2**63 - 1, (N,), generator=g, dtype=torch.int64)
    top_k, top_p, min_p = _params(g, N, V)
    kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, logprobs=True)
    tokens, lps = av.sample(logits, temperature, seeds, 9, **kw)
    want_tokens, want_lps = ref.sample(logits, temperature, seeds, 9, **kw)
    assert torch.equal(tokens, want_tokens), f"{tokens.tolist()} != {want_tokens.tolist()}"
    assert torch.equal(lps, want_lps), f"{lps.tolist()} != {want_lps.tolist()}"


def test_every_kept_set_and_no_token_outside_it():
    """Many draws of one row under each filter: every emitted token is in the reference's kept set, and (with
    enough draws) every kept token shows up."""
    V, n = 40, 4000
    g = torch.Generator().manual_seed(2)
    row = torch.randn(V, generator=g) * 1.2
    for kw in (dict(top_k=3), dict(top_p=0.6), dict(min_p=0.3), dict(top_k=6, top_p=0.9, min_p=0.1)):
        keep = ref.kept_tokens(row / 0.9, **kw)
        full = {k: torch.full((n,), v, dtype=torch.int32 if k == "top_k" else torch.float32) for k, v in kw.items()}
        tokens = av.sample(row.expand(n, V).contiguous(), torch.full((n,), 0.9), torch.arange(n, dtype=torch.int64),
                           **full)
        seen = set(tokens.tolist())
        assert seen <= set(keep.nonzero().flatten().tolist()), kw
        assert seen == set(keep.nonzero().flatten().tolist()), kw


def test_top_k_one_is_greedy_at_any_temperature():
    g = torch.Generator().manual_seed(6)
    R, K, V = 12, 4, 300
    logits, qsl, drafts, _, _, seeds, _ = _random_batch(g, R, K, V, torch.float32, torch.int32, None)
    logits = logits.nan_to_num(nan=-1e4)
    greedy = av.rejection_sample(logits, qsl, drafts)
    for T in (0.3, 1.0, 5.0):
        hot = av.rejection_sample(logits, qsl, drafts, temperature=torch.full((R,), T), seeds=seeds,
                                  top_k=torch.ones(R, dtype=torch.int32))
        _assert_same(hot, greedy, f"T={T}")
        s = av.sample(logits, torch.full((logits.shape[0],), T), torch.arange(logits.shape[0]),
                      top_k=torch.ones(logits.shape[0], dtype=torch.int32))
        assert torch.equal(s, av.sample(logits))


def test_off_values_change_nothing():
    g = torch.Generator().manual_seed(8)
    R, K, V = 10, 3, 90
    logits, qsl, drafts, q, temperature, seeds, _ = _random_batch(g, R, K, V, torch.float32, torch.int32, "full")
    base = av.rejection_sample(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds)
    off = av.rejection_sample(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds,
                              top_k=torch.zeros(R, dtype=torch.int32), top_p=torch.ones(R), min_p=torch.zeros(R))
    _assert_same(off, base)


@pytest.mark.parametrize("probs", [None, "full"])
def test_batch_invariance_with_truncation(probs):
    g = torch.Generator().manual_seed(12)
    R, K, V = 16, 4, 64
    logits, qsl, drafts, q, temperature, seeds, _ = _random_batch(g, R, K, V, torch.float32, torch.int32,
                                                                   "full" if probs else None)
    top_k, top_p, min_p = _params(g, R, V)
    full = av.rejection_sample(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=3,
                               top_k=top_k, top_p=top_p, min_p=min_p, logprobs=True)
    for order in ([5], list(range(R))[::-1], torch.randperm(R, generator=g)[: R // 2].tolist()):
        args, kw = _sub_batch(logits, qsl, drafts, q, temperature, seeds, order)
        idx = torch.tensor(order)
        got = av.rejection_sample(*args, **kw, offset=3, top_k=top_k[idx], top_p=top_p[idx], min_p=min_p[idx],
                                  logprobs=True)
        for a, b in zip(got, full):
            assert torch.equal(a, b[idx]), f"order {order}"


def test_logprobs_are_the_untruncated_log_softmax():
    g = torch.Generator().manual_seed(4)
    R, K, V = 6, 3, 50
    logits = torch.randn(R * (K + 1), V, generator=g) * 2
    qsl = _qsl([K + 1] * R)
    drafts = torch.randint(0, V, (R, K), generator=g, dtype=torch.int32)
    T = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 1.5])
    tokens, emitted, lps = av.rejection_sample(logits, qsl, drafts, temperature=T, seeds=torch.arange(R),
                                               top_k=torch.full((R,), 3, dtype=torch.int32), logprobs=True)
    for r in range(R):
        t = float(T[r]) if float(T[r]) > 0 else 1.0
        for n in range(int(emitted[r])):
            row = logits[r * (K + 1) + n].double() / t
            exact = torch.log_softmax(row, 0)[int(tokens[r, n])].item()
            assert math.isclose(float(lps[r, n]), exact, rel_tol=1e-5, abs_tol=1e-5)
        assert bool((lps[r, int(emitted[r]):] == float("-inf")).all())


# ------------------------------------------------------------------------------------------------------
# argument checks
# ------------------------------------------------------------------------------------------------------


def test_bad_sampling_parameters_are_rejected_on_cpu():
    R, K, V = 2, 1, 10
    logits = torch.randn(R * 2, V)
    qsl = _qsl([2, 2])
    drafts = torch.zeros(R, K, dtype=torch.int32)
    call = lambda **kw: av.rejection_sample(logits, qsl, drafts, temperature=torch.ones(R), **kw)  # noqa: E731
    with pytest.raises(ValueError, match="top_k"):
        call(top_k=torch.tensor([1, -1], dtype=torch.int32))
    with pytest.raises(ValueError, match="top_p"):
        call(top_p=torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError, match="top_p"):
        call(top_p=torch.tensor([NAN, 0.5]))
    with pytest.raises(ValueError, match="min_p"):
        call(min_p=torch.tensor([1.5, 0.0]))
    with pytest.raises(TypeError, match="top_p"):
        call(top_p=torch.tensor([0.5, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="top_k"):
        call(top_k=torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="logprobs"):
        call(logprobs=1)
    with pytest.raises(TypeError, match="out"):
        call(logprobs=True, out=(torch.empty(R, K + 1, dtype=torch.int32), torch.empty(R, dtype=torch.int32)))
    with pytest.raises(ValueError, match="top_k"):
        av.sample(logits, torch.ones(4), top_k=torch.tensor([0, 0, -3, 0], dtype=torch.int32))
    got = call(top_k=torch.tensor([1, 2], dtype=torch.int64))  # int64 is converted
    assert got[0].shape == (R, K + 1)


def test_top_p_vocabulary_bound():
    logits = torch.zeros(1, av.sampling.MAX_VOCAB_TOP_P + 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="top_p"):
        av.sample(logits, torch.ones(1), top_p=torch.tensor([0.9]))


def test_counter_name_exists():
    assert "sampling_param_out_of_range" in av_errors.error_counts()
