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


@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed"])
def test_emulated_kernel_weights_and_step_cap(R, K, mode, emulated):
    """Priorities (the block's max-weight reduction, weighted words, the unweighted expected tokens) and the
    latency target: the CUDA source gives the CPU kernel's integers. Unusable weights, which the CPU refuses,
    weigh 1 on the device and are counted: compared with the CPU run on weights where they are 1."""
    g = torch.Generator().manual_seed(R + K)
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    survival = av.prefix_survival(conf, drafts)
    w = torch.tensor([0.0, 0.5, 1.0, 3.0, 7.5])[torch.randint(0, 5, (R,), generator=g)]
    ct = _cost_table()
    kw = dict(mode=mode, min_verify=1, weights=w, max_step_ms=float(ct.fixed_cost(R) + ct.verify_cost(R + R * K // 3)),
              verification="onehot")
    if mode == "fixed":
        kw["budget"] = R * K
    _assert_same(av.plan_verification(survival, drafts, ct, **kw),
                 emulated(lambda: av.plan_verification(survival, drafts, ct, **kw)), "weights")
    bad = w.clone()
    bad[0], bad[-1] = float("nan"), -2.0
    ones = bad.clone()
    ones[0] = ones[-1] = 1.0
    av_errors.reset_error_counts()
    emu = emulated(lambda: av.plan_verification(survival, drafts, ct, **{**kw, "weights": bad}))
    assert av_errors.error_counts()["weight_out_of_range"] == (2 if R > 1 else 1)
    av_errors.reset_error_counts()
    _assert_same(av.plan_verification(survival, drafts, ct, **{**kw, "weights": ones}), emu, "bad weights")
