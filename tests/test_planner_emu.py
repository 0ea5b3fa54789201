"""The planner's CUDA kernels (planner/kernel.cuh "v1", validated on an H200; planner/kernel_v2.cuh "v2", not
yet run on a GPU) run on the CPU by the fiber emulator in tests/emu, and compared with the C++ CPU kernel
field by field, exactly: the cases of test_planner_cuda.py, without a GPU.

The emulated kernel replaces adaptive_verify._C.plan for the duration of a call (it takes the same packed
arguments), so the Python layer, its validation and its output allocation are the ones real calls use. v1
passing here is a check of the emulator itself against hardware-validated code.
"""
import ctypes
import importlib
import warnings

import pytest

import emu_build
from test_planner_cuda import _assert_same, _cost_table, _plan, matches_cpu_cases, stress_cases

planner_module = importlib.import_module("adaptive_verify.planner")
KERNELS = ["v1", "v2"]


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    lib = emu_build.build("planner_emu", tmp_path_factory)
    lib.av_emu_plan.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.av_emu_plan.restype = ctypes.c_int
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(params=["forward", "reverse"])
def emu_plan(request, emu_lib):
    """The emulated plan entry point, with fibers resumed in thread order or in reverse."""
    emu_lib.av_emu_set_reverse(request.param == "reverse")
    return emu_lib.av_emu_plan


@pytest.fixture(params=KERNELS)
def emulated(request, monkeypatch, emu_plan):
    """Returns run(fn): fn() with the emulated kernel (the variant of this parametrization) in place of the
    CPU kernel."""
    monkeypatch.setenv("AV_PLANNER_KERNEL", request.param)
    proxy = emu_build.EmulatedC(planner_module._C, {"plan": lambda packed: emu_build.status_of(emu_plan, packed)})
    return emu_build.emulated_runner(monkeypatch, planner_module, proxy)


def _compare(ct, cases, run):
    for prob, kw, what in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mode="global" warns that it is not lossless live
            cpu = _plan(prob, ct, **kw)
            emu = run(lambda: _plan(prob, ct, **kw))
        _assert_same(cpu, emu, what)


# (1200, 16): 19200 slots, past the kernels' shared-memory keys: the global-workspace path.
@pytest.mark.parametrize("R,K", [(1, 1), (7, 3), (83, 7), (256, 8), (300, 16), (1200, 16)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu(R, K, mode, emulated):
    _compare(_cost_table(), matches_cpu_cases(R, K, mode), emulated)


@pytest.mark.parametrize("kind", ["constant", "cluster", "wild"])
@pytest.mark.parametrize("R,K", [(5, 3), (256, 8), (700, 32)])
@pytest.mark.parametrize("mode", ["greedy", "global", "fixed", "all"])
def test_emulated_kernel_matches_cpu_stress(kind, R, K, mode, emulated):
    """Survivals that stress v2's buckets (one value everywhere, a tight cluster, values outside [0, 1]),
    with min/max verify and a capacity."""
    _compare(_cost_table(), stress_cases(kind, R, K, mode), emulated)
