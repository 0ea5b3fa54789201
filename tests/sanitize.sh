#!/usr/bin/env bash
# The C++ under AddressSanitizer and UndefinedBehaviorSanitizer (-fsanitize=address,undefined,
# -fno-sanitize-recover=all: the first report fails the run).
#
# Builds a CPU-only copy of the package with AV_SANITIZE=1 into $AV_SANITIZE_DIR (default build/sanitize; the
# installed or in-tree package is left alone), then runs, against that copy, a fuzz campaign over every public op
# (AV_SANITIZE_FUZZ_CALLS, default 2,500, as tests/test_fuzz.py) and the kernel tests
# of every area: the C++ CPU kernels (planner's SIMD walk, samplers, attention, verifier helpers) and the CUDA
# sources under the host emulator (emu_build.py adds the same flags when AV_SANITIZE=1). Python and torch are
# not instrumented: libasan is preloaded so that its runtime comes first, and leak detection is off (the
# interpreter's own allocations at exit are not ours).
#
# Usage: bash tests/sanitize.sh [extra pytest arguments]   (PYTHON=... to choose the interpreter; needs
# pybind11, cmake and ninja, which '.[test]' brings). Recorded runs: benchmarks/results/*-sanitizers.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
work=${AV_SANITIZE_DIR:-build/sanitize}
mkdir -p "$work"
work=$(cd "$work" && pwd)

rm -rf "$work/pkg"
mkdir -p "$work/pkg"
cp -r python/adaptive_verify "$work/pkg/"
rm -f "$work/pkg/adaptive_verify/"_C*.so
AV_CUDA=0 AV_SANITIZE=1 cmake -S . -B "$work/build" -G Ninja -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" -DAV_OUTPUT_DIR="$work/pkg/adaptive_verify" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build"

# libasan first; libstdc++ too, or ASan's __cxa_throw interceptor finds no real function in a python binary that
# does not link libstdc++ (a CHECK failure at the first C++ exception).
export LD_PRELOAD="$(${CXX:-g++} -print-file-name=libasan.so) $(${CXX:-g++} -print-file-name=libstdc++.so)"
# (the fuzz workers' address-space limit cannot coexist with ASan's shadow: allocations are bounded by ASan here)
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:max_allocation_size_mb=12288:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export AV_SANITIZE=1 PYTHONPATH="$work/pkg"
"$PY" - <<'PYEOF'
import adaptive_verify as av
info = av.build_info()
assert info["sanitizers"] == "address,undefined", f"not the sanitized build: {info}"
print("sanitize: running against", av.__file__)
PYEOF
# The fuzz campaign of tests/test_fuzz.py through the CLI (its workers' time limits assume an uninstrumented
# interpreter; the CLI reports a hang or crash the same way, and exits 1 on any failure).
# AV_SANITIZE_FUZZ_CALLS=0 skips the campaign; AV_SANITIZE_TESTS replaces the test list (e.g. one area's files).
if [ "${AV_SANITIZE_FUZZ_CALLS:-2500}" != 0 ]; then
  "$PY" -m adaptive_verify.fuzz --calls "${AV_SANITIZE_FUZZ_CALLS:-2500}" --seed 20261201 --jobs 2
fi
default_tests="tests/test_emu_selftest.py
  tests/test_planner.py tests/test_planner_tree.py tests/test_planner_priorities.py tests/test_planner_emu.py
  tests/test_planner_depth.py tests/test_planner_tree_shape.py
  tests/test_sampling.py tests/test_sampling_tree.py tests/test_sampling_truncation.py
  tests/test_sampling_nonfinite.py tests/test_sampling_emu.py
  tests/test_confidence.py tests/test_attention.py tests/test_attention_tree.py tests/test_attention_emu.py
  tests/test_attention_tree_emu.py tests/test_attention_fp8.py tests/test_attention_mla.py
  tests/test_attention_variants.py tests/test_attention_metadata.py tests/test_commit_tree_kv.py
  tests/test_verifier_host.py tests/test_stats.py"
# shellcheck disable=SC2086  (a whitespace-separated list of paths)
"$PY" -m pytest -q -p no:cacheprovider ${AV_SANITIZE_TESTS:-$default_tests} "$@"
