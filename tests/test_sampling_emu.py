"""The sampler's CUDA kernels (sampling/kernel.cuh "v1", validated on an H200; sampling/kernel_splitv.cuh
"splitv", the split-vocabulary candidate, not yet run on a GPU), launched by their real launchers, run on the
CPU by the fiber emulator in tests/emu and are compared with the C++ CPU kernel: the same integers and the
same error counts, on the cases of test_sampling_cuda.py at sizes the emulator runs in seconds.

The emulated kernels replace adaptive_verify._C.rejection_sample / sample for the duration of a call (they take
the same parameter structs), so the Python layer (validation, outputs) is the one real calls use. v1 passing
here is a check of the emulator itself against hardware-validated code.
"""
import ctypes
import importlib

import pytest
import torch

import adaptive_verify as av
import emu_build
import test_sampling_nonfinite as nonfinite
from adaptive_verify import reference as ref
from test_sampling_cuda import _batch, realistic_case, sample_case, ties_and_nans_case

sampling_module = importlib.import_module("adaptive_verify.sampling")
sampling_params = importlib.import_module("adaptive_verify.sampling_params")


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("sampling_emu", tmp_path_factory)
    for fn in (lib.av_emu_rejection_sample, lib.av_emu_sample):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["v1", "splitv"])
def emulated(request, monkeypatch, emu_lib):
    """Returns run(fn): fn() with the emulated kernel of this parametrization in place of the CPU kernel (the
    module setting sampling.CUDA_KERNEL puts its id in the parameter struct, as on CUDA)."""
    monkeypatch.setattr(sampling_module, "CUDA_KERNEL", request.param)
    proxy = emu_build.EmulatedC(sampling_module._C, {
        "rejection_sample": lambda p, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_rejection_sample, p),
        "sample": lambda p, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_sample, p),
    })
    run = emu_build.emulated_runner(monkeypatch, sampling_module, proxy)
    run.lib = emu_lib
    return run


def _check_same(run, logits, qsl, drafts, **kw):
    """Emulated CUDA kernel == CPU kernel on outputs and on every error counter."""
    av.reset_error_counts("cpu")
    cpu = av.rejection_sample(logits, qsl, drafts, **kw)
    cpu_counts = av.error_counts("cpu")
    av.reset_error_counts("cpu")
    emu = run(lambda: av.rejection_sample(logits, qsl, drafts, **kw))
    assert torch.equal(cpu[0], emu[0]) and torch.equal(cpu[1], emu[1])
    assert av.error_counts("cpu") == cpu_counts
    av.reset_error_counts("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 7, 1000, 32003])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_emulated_matches_cpu(emulated, dtype, V, probs):
    R, K = (16, 5) if V < 10000 else (4, 3)
    logits, qsl, drafts, q, temperature, seeds = _batch(R, K, V, dtype, V + probs, probs)
    _check_same(emulated, logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=12345)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rejection_sample_emulated_ties_and_nans(emulated, dtype):
    """test_sampling_cuda's case: ties across chunks, NaN / -inf entries and rows, misaligned rows, one
    request spread over many chunks."""
    logits, qsl, drafts, R = ties_and_nans_case(dtype)
    for temperature in (torch.zeros(R), torch.full((R,), 0.7)):
        _check_same(emulated, logits, qsl, drafts, temperature=temperature,
                    seeds=torch.arange(R, dtype=torch.int64) * 31, offset=3)


@pytest.mark.parametrize("greedy", [True, False])
def test_rejection_sample_emulated_realistic_drafts(emulated, greedy):
    """Chains of every length (splitv's early exit records rejections and skips later rows); threads also
    resumed in reverse."""
    R = 24
    logits, qsl, drafts, temperature = realistic_case(R, 7, 4000, greedy)
    for reverse in (0, 1):
        emulated.lib.av_emu_set_reverse(reverse)
        try:
            _check_same(emulated, logits, qsl, drafts, temperature=temperature,
                        seeds=torch.arange(R, dtype=torch.int64), offset=9)
        finally:
            emulated.lib.av_emu_set_reverse(0)


def test_rejection_sample_emulated_huge_scaled_logits(emulated):
    """|max logit / temperature| >= 2^20: splitv re-runs the race on v1's routine."""
    logits, qsl, drafts, _, _, seeds = _batch(6, 3, 7000, torch.float32, 3, False)
    _check_same(emulated, logits * 1e6, qsl, drafts, temperature=torch.full((6,), 0.5), seeds=seeds, offset=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 5, 32000])
def test_sample_emulated_matches_cpu(emulated, dtype, V):
    logits, temperature, seeds = sample_case(12 if V < 10000 else 3, V, dtype)
    cpu = av.sample(logits, temperature, seeds, 3)
    emu = emulated(lambda: av.sample(logits, temperature, seeds, 3))
    assert torch.equal(cpu, emu)


def _truncation(R, V, seed):
    g = torch.Generator().manual_seed(seed)
    top_k = torch.tensor([0, 1, 3, 40, V + 1, -2])[torch.randint(0, 6, (R,), generator=g)].to(torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1e-6, float("nan"), 1.5])[torch.randint(0, 6, (R,), generator=g)]
    min_p = torch.tensor([0.0, 0.05, 0.3, 1.0, -0.5, 2.0])[torch.randint(0, 6, (R,), generator=g)]
    return top_k, top_p, min_p


def _check_same_logprobs(run, logits, qsl, drafts, **kw):
    """With logprobs: CUDA source (v1, whatever was chosen) == CPU kernel, outputs and counters. Out-of-range
    sampling parameters (the CPU raises) are compared through their documented device behaviour: the
    reference with the filter off, and the counter."""
    av.reset_error_counts("cpu")
    emu = run(lambda: av.rejection_sample(logits, qsl, drafts, logprobs=True, **kw))
    emu_counts = av.error_counts("cpu")
    av.reset_error_counts("cpu")
    want = ref.rejection_sample(logits, qsl, drafts, logprobs=True, **kw)
    for a, b in zip(emu, want):
        assert torch.equal(a, b)
    return emu_counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [3, 700, 9000])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_emulated_with_truncation_and_logprobs(emulated, dtype, V, probs, monkeypatch):
    """Sampling parameters (valid, off and out of range) and logprobs: the CUDA source's rank histograms (shared-
    memory atomics) give the reference's kept sets bit for bit; bad values are off and counted once per request."""
    R, K = (12, 4) if V < 5000 else (4, 3)
    logits, qsl, drafts, q, temperature, seeds = _batch(R, K, V, dtype, V + 3 * probs, probs)
    top_k, top_p, min_p = _truncation(R, V, V)
    real = (qsl[1:] > qsl[:-1])  # padding rows (q_len 0) sample nothing, so their parameters are never read
    bad = int((((top_k < 0) | ~((top_p > 0) & (top_p <= 1)) | ~((min_p >= 0) & (min_p <= 1))) & real).sum())
    # The CPU path refuses out-of-range values before any kernel runs; the emulated kernel must see them, so
    # the host check is bypassed here (it runs for CPU tensors only, the kernel's own handling is under test).
    monkeypatch.setattr(sampling_module, "_truncation", lambda k, p, m, n, v, device: sampling_params._Truncation(k, p, m))
    counts = _check_same_logprobs(emulated, logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds,
                                  offset=5, top_k=top_k, top_p=top_p, min_p=min_p)
    assert counts["sampling_param_out_of_range"] == bad


@pytest.mark.parametrize("V", [2, 5000])
def test_sample_emulated_with_truncation_and_logprobs(emulated, V):
    logits, temperature, seeds = sample_case(10, V, torch.bfloat16)
    top_k, top_p, min_p = _truncation(10, V, V + 1)
    keep = (top_k >= 0) & (top_p > 0) & (top_p <= 1) & (min_p >= 0) & (min_p <= 1)
    top_k, top_p, min_p = top_k[keep], top_p[keep], min_p[keep]
    logits, temperature, seeds = logits[keep], temperature[keep], seeds[keep]
    kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, logprobs=True)
    cpu = av.sample(logits, temperature, seeds, 3, **kw)
    emu = emulated(lambda: av.sample(logits, temperature, seeds, 3, **kw))
    assert torch.equal(cpu[0], emu[0]) and torch.equal(cpu[1], emu[1])


@pytest.mark.parametrize("V", [777, 20000])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_emulated_nonfinite_logits(emulated, V, probs):
    """Rows of every non-finite pattern (test_sampling_nonfinite.py: +inf, NaN, -inf, only -inf and NaN, finite
    logits that overflow once scaled) and draft probabilities with NaN / inf / negative entries: the same integers
    and counts as the CPU kernel (splitv hands rows with a +inf scaled logit to v1's routine); with logprobs (v1),
    the reference's bits. V = 20000 spreads a row over several splitv chunks."""
    R, K = (16, 3) if V < 5000 else (5, 2)
    logits, qsl, drafts, temperature, seeds = nonfinite.batch(R, K, V, torch.bfloat16, seed=V + probs)
    q = nonfinite.nonfinite_probs(R, K, V, drafts, seed=V) if probs else None
    _check_same(emulated, logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=4)
    _check_same_logprobs(emulated, logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=4)


def test_sample_emulated_nonfinite_logits(emulated):
    N, V = 24, 9000
    logits = nonfinite.nonfinite_logits(N, V, torch.float32, seed=3)
    temperature, seeds = torch.tensor([0.0, 0.5, 1.0]).repeat(N // 3), torch.arange(N)
    cpu = av.sample(logits, temperature, seeds, 3)
    emu = emulated(lambda: av.sample(logits, temperature, seeds, 3))
    assert torch.equal(cpu, emu)
    assert torch.equal(emu, ref.sample(logits, temperature, seeds, 3))
