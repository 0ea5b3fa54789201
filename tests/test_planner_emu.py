"""The planner's CUDA kernel (planner/kernel.cuh: the one planner algorithm, planner/algorithm.h, on a thread
block), launched by its real launcher, runs on the CPU under the fiber emulator in tests/emu, and is compared
with the C++ CPU kernel field by field, exactly: the cases of test_planner_cuda.py, without a GPU.

The emulated kernel replaces adaptive_verify._C.plan for the duration of a call (it takes the same parameter
struct), so the Python layer, its validation and its output allocation are the ones real calls use.
"""
import ctypes
import importlib
import warnings

import pytest
import torch

import adaptive_verify as av
import emu_build
from adaptive_verify import errors as av_errors
from test_planner_cuda import _assert_same, _cost_table, _plan, matches_cpu_cases, stress_cases

ops_module = importlib.import_module("adaptive_verify.planner.launch")  # every planner launch passes there


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("planner_emu", tmp_path_factory)
    lib.av_emu_plan.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_plan.restype = ctypes.c_int
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["forward", "reverse"])
def emulated(request, monkeypatch, emu_lib):
    """Returns run(fn): fn() with the emulated kernel, fibers resumed in thread order or in reverse, in place of
    the CPU kernel."""
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    proxy = emu_build.EmulatedC(ops_module._C, {
        "plan": lambda params, on_cuda, stream: emu_build.status_of(emu_lib.av_emu_plan, params)})
    return emu_build.emulated_runner(monkeypatch, ops_module, proxy)


def _compare(ct, cases, run):
    for prob, kw, what in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mode="global" warns when verification is undeclared
            cpu = _plan(prob, ct, **kw)
            emu = run(lambda: _plan(prob, ct, **kw))
        _assert_same(cpu, emu, what)


# (1200, 16): 19200 slots, past the kernel's shared memory: the global-workspace path.
@pytest.mark.parametrize("R,K", [(1, 1), (7, 3), (83, 7), (256, 8), (300, 16), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu(R, K, mode, emulated):
    _compare(_cost_table(), matches_cpu_cases(R, K, mode), emulated)


@pytest.mark.parametrize("kind", ["constant", "cluster", "wild"])
@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (700, 32)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu_stress(kind, R, K, mode, emulated):
    """Survivals that stress the buckets (one value everywhere, a tight cluster, values outside [0, 1]), with
    min/max verify and a capacity."""
    _compare(_cost_table(), stress_cases(kind, R, K, mode), emulated)


@pytest.mark.parametrize("R,K", [(1, 1), (83, 7), (256, 8), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "fixed"])
def test_emulated_kernel_plans_from_confidences(R, K, mode, emulated):
    """plan_verification(conf=...): the kernel's survival prologue (the block's threads write rows, then a barrier
    before the walk reads them) gives the CPU kernel's survival bits, plan and NaN counts."""
    g = torch.Generator().manual_seed(R * 31 + K)
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    conf[torch.rand(R, K, generator=g) < 0.03] = float("nan")
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    kw = dict(mode=mode, min_verify=1, extra_tokens=3)
    if mode == "fixed":
        kw["budget"] = R * K // 3
    ct = _cost_table()
    results = []
    for runner in (lambda fn: fn(), emulated):
        av_errors.reset_error_counts()
        survival = torch.full((R, K), -1.0)
        plan = runner(lambda: av.plan_verification(None, drafts, ct, conf=conf, survival_out=survival, **kw))
        results.append((plan, survival, av_errors.error_counts()))
    (cpu, cpu_s, cpu_err), (emu, emu_s, emu_err) = results
    _assert_same(cpu, emu, "conf=")
    assert torch.equal(cpu_s, emu_s) and cpu_err == emu_err
    av_errors.reset_error_counts()


def test_emulated_kernel_makes_out_of_range_context_lengths_padding_and_counts_them(emulated):
    """Issue 16, finding 8: context_lens near 2**31 wrapped seq_lens and positions negative. The CPU kernel raises
    ValueError naming context_lens; the CUDA kernel (no sync to check) writes that request's seq_lens 0, positions 0
    and slots -1, counts it in error_counts()["context_len_out_of_range"], and plans every other request as usual."""
    top = av.planner.MAX_CONTEXT_LEN
    R, K, bs = 5, 4, 2**31 - 1  # one block holds every position: only the context lengths can be wrong
    survival = torch.full((R, K), 0.5)
    drafts = torch.full((R,), K, dtype=torch.int32)
    bad_ctx = torch.tensor([3, top, -1, 2**31 - 1, 7], dtype=torch.int32)
    good_ctx = torch.where((bad_ctx < 0) | (bad_ctx > top), torch.zeros_like(bad_ctx), bad_ctx)
    kw = dict(mode="all", block_table=torch.arange(2 * R, dtype=torch.int32).view(R, 2), block_size=bs)
    with pytest.raises(ValueError, match="context_lens"):
        av.plan_verification(survival, drafts, context_lens=bad_ctx, **kw)
    want = av.plan_verification(survival, drafts, context_lens=good_ctx, **kw)
    av_errors.reset_error_counts()
    got = emulated(lambda: av.plan_verification(survival, drafts, context_lens=bad_ctx, **kw))
    assert av_errors.error_counts()["context_len_out_of_range"] == 2
    assert av_errors.error_counts()["slot_out_of_range"] == 0  # the bad requests' slots are not counted twice
    av_errors.reset_error_counts()
    bad_rows = [2, 3]
    assert got.seq_lens.tolist() == [0 if r in bad_rows else v for r, v in enumerate(want.seq_lens.tolist())]
    for r in range(R):
        rows = got.token_req == r
        if r in bad_rows:
            assert (got.positions[rows] == 0).all() and (got.slot_mapping[rows] == -1).all()
        else:
            assert torch.equal(got.positions[rows], want.positions[rows])
            assert torch.equal(got.slot_mapping[rows], want.slot_mapping[rows])
    for name in ("verify_lens", "budget", "query_start_loc", "token_req", "num_tokens"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
