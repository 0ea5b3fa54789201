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
from test_sampling_cuda import _batch, realistic_case, sample_case, ties_and_nans_case

sampling_module = importlib.import_module("adaptive_verify.sampling")


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
