"""Barrier counts of the planner's CUDA kernel per launch, from the host emulator (tests/emu), on a machine
without a GPU: `python benchmarks/emu_barrier_counts.py`.

The planner is latency-bound: one block, and its time is mostly serial phases separated by __syncthreads
(the bitonic-sort kernel it replaced, global mode, on an H200, 2026-11-29: 12.8 us for 47 barriers at R=16,
K=8; 42 us for 85 at R=256, K=8). A count is not a time, but it says how a kernel's critical path grows with
R * K before any GPU is at hand. Global and greedy modes (results/2026-11-30-emu-planner-barriers.md has the
earlier kernels' counts).
"""
import argparse
import ctypes
import importlib
import pathlib
import sys
import tempfile
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import emu_build  # noqa: E402
from test_planner_cuda import _cost_table, _plan, _problem  # noqa: E402


class _TmpDir:
    def __init__(self, path):
        self.path = pathlib.Path(path)

    def getbasetemp(self):
        return self.path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["16x8", "256x8", "1024x16"], help="RxK problems")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        lib = emu_build.build("planner_emu", _TmpDir(tmp))
        lib.av_emu_plan.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        ops = importlib.import_module("adaptive_verify.planner.ops")
        ops._C = emu_build.EmulatedC(ops._C, {
            "plan": lambda params, on_cuda, stream: emu_build.status_of(lib.av_emu_plan, params)})
        print("| R | K | mode | __syncthreads | warp collectives (all warps) |")
        print("|---:|---:|---|---:|---:|")
        for size in args.sizes:
            R, K = (int(x) for x in size.split("x"))
            for mode in ("global", "greedy"):
                counts = (ctypes.c_uint64 * 2)()
                lib.av_emu_counters(counts)  # reset
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _plan(_problem(R, K, 3), _cost_table(), mode=mode, num_reqs_padded=R,
                          num_tokens_padded=R * (K + 1))
                lib.av_emu_counters(counts)
                print(f"| {R} | {K} | {mode} | {counts[0]} | {counts[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
