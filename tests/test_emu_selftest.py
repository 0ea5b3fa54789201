"""The host emulator's own checks (tests/emu/cuda_emu.h), each shown to fire on a deliberately broken kernel
(tests/emu/selftest_emu.cpp) and to stay quiet on a correct one: the emulator-based kernel tests
(test_*_emu.py) are only as strong as these checks."""
import ctypes
import re

import pytest
import torch

import emu_build


@pytest.fixture(scope="session")
def selftest(tmp_path_factory):
    lib = emu_build.build("selftest_emu", tmp_path_factory)
    fn = lib.av_emu_selftest
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    lib.av_emu_set_reverse.argtypes = [ctypes.c_int]

    def run(which):
        # Thread order is the emulator's one per-process setting (its state is shared by every emulated library,
        # whatever loaded it last): these checks are written for forward order.
        lib.av_emu_set_reverse(0)
        out = torch.full((64,), -1, dtype=torch.int32)
        err = ctypes.create_string_buffer(512)
        status = fn(which, out.data_ptr(), err, len(err))
        return status, err.value.decode(), out

    return run


def test_correct_kernels_pass(selftest):
    status, msg, out = selftest(0)  # neighbour exchange through smem with a barrier
    assert status == 0, msg
    assert out.tolist() == [(t + 33) % 64 + 1 for t in range(64)]
    status, msg, out = selftest(6)  # cp.async, wait, barrier, read a neighbour's words
    assert status == 0, msg
    assert out[:32].tolist() == [1000 + 4 * ((t + 1) % 32) for t in range(32)]
    status, msg, out = selftest(10)  # __shfl_xor_sync
    assert status == 0, msg
    assert out[:32].tolist() == [t ^ 1 for t in range(32)]


def test_missing_barrier_reads_stale_shared_memory(selftest):
    """Warps run one at a time up to a __syncthreads: without it, warp 0 reads warp 1's slots unwritten."""
    status, msg, out = selftest(1)
    assert status == 0, msg
    assert out.tolist() != [(t + 33) % 64 + 1 for t in range(64)]


@pytest.mark.parametrize("which,message", [
    (2, "deadlock|exited while others wait"),
    (3, "exited while others wait"),
    (4, "outside the block's dynamic shared memory"),
    (5, "not 16-byte aligned"),
    (8, "still pending"),
    (9, "not 16-byte aligned"),  # a cp.async source off its 16-byte grid
])
def test_checks_fire(selftest, which, message):
    status, msg, _ = selftest(which)
    assert status == 1 and re.search(message, msg), msg


def test_reading_before_the_cp_async_wait_sees_old_data(selftest):
    """Copies land at the wait: a read between the issue and the wait sees what smem held (0xff bytes), for
    every neighbour whose thread had not reached its own wait yet."""
    status, msg, out = selftest(7)
    assert status == 0, msg
    assert int((out[:32] == -1).sum()) >= 30  # 0xffffffff: the poison the emulator fills smem with
