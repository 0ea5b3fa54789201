#!/usr/bin/env bash
# GPU check: build for the local GPU, run the CUDA tests, the GPU benchmarks and compute-sanitizer on the
# kernels not yet validated on hardware, write a markdown report.
#
#   benchmarks/gpu_check.sh REPORT.md
#
# Meant for a machine with an NVIDIA GPU and no registry access: it uses the torch, nvcc, cmake, ninja and
# pybind11 already installed, plus any wheels carried in .whl/ (none is needed: the kernels use raw PTX, not
# CUTLASS/CuTe).
# Budget: AV_GPU_CHECK_BUDGET_S seconds in all (default 480: under 8 minutes on an H200). Every step runs
# even if an earlier one fails, each within its own limit and within what is left of the budget, so the
# report and the log archive are always written before a caller's timeout; the report says which failed.
set -uo pipefail
report=${1:?usage: benchmarks/gpu_check.sh REPORT.md}
cd "$(dirname "$0")/.."
mkdir -p "$(dirname "$report")"
# Logs go beside the report as each step finishes, so a run killed at its time limit still leaves them.
log="$(dirname "$report")/logs"
mkdir -p "$log"
export PYTHONUNBUFFERED=1
start=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/av_site .whl/*.whl \
    && export PYTHONPATH=/tmp/av_site${PYTHONPATH:+:$PYTHONPATH}
fi

cap=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}')" 2>/dev/null || echo "")
case "$cap" in
  90) arch=90a ;;
  100) arch=100a ;;
  103) arch=103a ;;
  "") arch=90a ;;
  *) arch=$cap ;;
esac

stamp() { echo "$1 $(( $(date +%s) - start )) s" >>"$log/steps.txt"; }
budget=${AV_GPU_CHECK_BUDGET_S:-480}
# cap N: N seconds, or what is left of the budget less 15 s for the report, whichever is smaller (>= 1).
cap() {
  local left=$(( budget - ($(date +%s) - start) - 15 ))
  [ "$left" -lt 1 ] && left=1
  echo $(( $1 < left ? $1 : left ))
}
status() { if [ "$1" -eq 0 ]; then echo "ok"; else echo "FAILED (exit $1)"; fi; }

# 1. build for the local GPU only (fast), with register/smem/spill report
AV_CUDA_ARCHS=$arch AV_PTXAS_VERBOSE=1 MAX_JOBS=16 timeout "$(cap 200)" python3 -m pip install --no-build-isolation --no-deps -v -e . \
  >"$log/build.txt" 2>&1
build_rc=$?
stamp build_rc
grep -E "ptxas info|spill|Compiling entry" "$log/build.txt" | sed 's/^ *//' >"$log/ptxas.txt" || true

# A build that cannot run CUDA here would make every CUDA test skip: say so loudly instead.
cuda_ok=$(python3 -c "import adaptive_verify as av; i = av.build_info(); print('yes' if av.cuda_available() else 'NO: ' + i['cuda_unusable_reason'])" 2>&1 | tail -1)
case "$cuda_ok" in yes) cuda_usable_rc=0 ;; *) cuda_usable_rc=1 ;; esac

# 2. tests: the CUDA tests only (CI runs the CPU suite, the emulator tests included; leaving it out keeps
# time for the sanitizer runs below). The tests of the kernels not yet run on a GPU (verify_attention's
# candidate "mma" / "mma_fused", the sampler's candidate "splitv", the planner's one-algorithm kernel of
# 2026-12-01, the tree sampler, tests/test_sampling_tree.py, fp8 KV caches, MLA, the attention variants and the backend metadata) go in a
# process of their own, after the others: a
# fault there would poison the CUDA context for every later test.
candidates="mma or splitv or planner or sampling_tree or fp8 or mla or variants or metadata or fa4"
timeout "$(cap 240)" python3 -m pytest tests -q -m cuda -k "not ($candidates)" -rf --tb=short --durations=15 -p no:cacheprovider \
  >"$log/cuda_tests.txt" 2>&1
cuda_rc=$?
stamp cuda_rc
timeout "$(cap 180)" python3 -m pytest tests -q -m cuda -k "$candidates" -rf --tb=short --durations=15 -p no:cacheprovider \
  >"$log/cuda_tests_candidates.txt" 2>&1
cuda_cand_rc=$?
stamp cuda_cand_rc

# 3. benchmarks (the attention benchmark times every verify_attention CUDA kernel: rowwise, the default, and
# the candidate mma / mma_fused; the CUDA tests above run each of them too; a second run covers the largest
# sizes, R = 256 and 16k contexts, with the kernels fast enough to time there)
timeout "$(cap 100)" python3 benchmarks/bench_planner.py --device cuda --min-time 0.1 --markdown "$log/bench_planner.md" \
  --json "$log/bench_planner.json" >"$log/bench_planner.txt" 2>&1
bench_rc=$?
stamp bench_rc
timeout "$(cap 60)" python3 benchmarks/bench_planner.py --depth --device cuda --min-time 0.1 \
  --markdown "$log/bench_planner_depth.md" --json "$log/bench_planner_depth.json" >"$log/bench_planner_depth.txt" 2>&1
bench_depth_rc=$?
stamp bench_depth_rc
timeout "$(cap 60)" python3 benchmarks/bench_planner.py --tree-shape --device cuda --min-time 0.1 \
  --markdown "$log/bench_planner_tree_shape.md" --json "$log/bench_planner_tree_shape.json" \
  >"$log/bench_planner_tree_shape.txt" 2>&1
bench_shape_rc=$?
stamp bench_shape_rc
timeout "$(cap 90)" python3 benchmarks/bench_confidence.py --device cuda --min-time 0.1 --markdown "$log/bench_confidence.md" \
  --json "$log/bench_confidence.json" >"$log/bench_confidence.txt" 2>&1
bench_conf_rc=$?
stamp bench_conf_rc
timeout "$(cap 100)" python3 benchmarks/bench_sampling.py --device cuda --min-time 0.1 --markdown "$log/bench_sampling.md" \
  --json "$log/bench_sampling.json" >"$log/bench_sampling.txt" 2>&1
bench_samp_rc=$?
stamp bench_samp_rc
timeout "$(cap 100)" python3 benchmarks/bench_attention.py --device cuda --reqs 1 8 32 128 --contexts 512 2048 8192 \
  --markdown "$log/bench_attention.md" --json "$log/bench_attention.json" >"$log/bench_attention.txt" 2>&1
bench_att_rc=$?
stamp bench_att_rc
timeout "$(cap 90)" python3 benchmarks/bench_attention.py --device cuda --kernels mma mma_fused --reqs 32 256 --contexts 16384 \
  --markdown "$log/bench_attention_large.md" --json "$log/bench_attention_large.json" >"$log/bench_attention_large.txt" 2>&1
bench_att_large_rc=$?
stamp bench_att_large_rc
timeout "$(cap 60)" python3 benchmarks/bench_attention.py --device cuda --kv-dtypes fp8 --reqs 32 128 --contexts 8192 \
  --markdown "$log/bench_attention_fp8.md" --json "$log/bench_attention_fp8.json" >"$log/bench_attention_fp8.txt" 2>&1
bench_att_fp8_rc=$?
stamp bench_att_fp8_rc
timeout "$(cap 60)" python3 benchmarks/bench_attention.py --device cuda --mla --kv-dtypes bf16 fp8 \
  --markdown "$log/bench_attention_mla.md" --json "$log/bench_attention_mla.json" >"$log/bench_attention_mla.txt" 2>&1
bench_att_mla_rc=$?
stamp bench_att_mla_rc
timeout "$(cap 60)" python3 benchmarks/bench_attention.py --device cuda --variants --kernels mma \
  --markdown "$log/bench_attention_variants.md" --json "$log/bench_attention_variants.json" \
  >"$log/bench_attention_variants.txt" 2>&1
bench_att_var_rc=$?
stamp bench_att_var_rc
timeout "$(cap 30)" python3 benchmarks/bench_attention.py --device cuda --metadata \
  --markdown "$log/bench_attention_metadata.md" --json "$log/bench_attention_metadata.json" \
  >"$log/bench_attention_metadata.txt" 2>&1
bench_att_meta_rc=$?
stamp bench_att_meta_rc

# 4. compute-sanitizer on the kernels not yet validated on hardware (small inputs, benchmarks/sanitize_kernels.py):
# shared-memory races (racecheck) and out-of-bounds accesses (memcheck), which the host emulator cannot see.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  timeout "$(cap 75)" "$sanitizer" --tool racecheck --error-exitcode 1 python3 benchmarks/sanitize_kernels.py \
    >"$log/racecheck.txt" 2>&1
  racecheck_rc=$?
  timeout "$(cap 75)" "$sanitizer" --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_kernels.py \
    >"$log/memcheck.txt" 2>&1
  memcheck_rc=$?
else
  echo "compute-sanitizer not found" >"$log/racecheck.txt"
  cp "$log/racecheck.txt" "$log/memcheck.txt"
  racecheck_rc=127
  memcheck_rc=127
fi
stamp sanitizer_rc

{
  echo "# GPU check: $(date -u +%Y-%m-%d)"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- device: $(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null | head -1)"
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "- CUDA compiler: $(nvcc --version 2>/dev/null | tail -1)"
  echo "- torch: $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"
  echo "- built for: sm_$arch; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| step | result |"
  echo "|---|---|"
  echo "| build | $(status $build_rc) |"
  echo "| CUDA kernels usable | $cuda_ok |"
  echo "| CUDA tests (validated kernels: rowwise attention, sampler v1, confidence, write_kv) | $(status $cuda_rc): $(tail -1 "$log/cuda_tests.txt") |"
  echo "| CUDA tests (candidates: mma attention, sampler splitv, the one-algorithm planner, the tree sampler, fp8 KV, MLA, variants, metadata) | $(status $cuda_cand_rc): $(tail -1 "$log/cuda_tests_candidates.txt") |"
  echo "| planner benchmark | $(status $bench_rc) |"
  echo "| draft-depth benchmark (choose_draft_depth, not yet run on a GPU) | $(status $bench_depth_rc) |"
  echo "| tree-shape benchmark (choose_tree_shape, not yet run on a GPU) | $(status $bench_shape_rc) |"
  echo "| confidence benchmark | $(status $bench_conf_rc) |"
  echo "| sampling benchmark | $(status $bench_samp_rc) |"
  echo "| attention benchmark (rowwise, mma, mma_fused) | $(status $bench_att_rc) |"
  echo "| attention benchmark, R = 256 and 16k contexts (mma, mma_fused) | $(status $bench_att_large_rc) |"
  echo "| attention benchmark, fp8 KV (every kernel, not yet run on a GPU) | $(status $bench_att_fp8_rc) |"
  echo "| MLA attention benchmark (rowwise, mma; not yet run on a GPU) | $(status $bench_att_mla_rc) |"
  echo "| attention variants benchmark (sinks, windows, soft-capping; mma) | $(status $bench_att_var_rc) |"
  echo "| backend metadata benchmark (flashinfer_plan) | $(status $bench_att_meta_rc) |"
  echo "| compute-sanitizer racecheck (opt-in kernels) | $(status $racecheck_rc): $(tail -1 "$log/racecheck.txt") |"
  echo "| compute-sanitizer memcheck (opt-in kernels) | $(status $memcheck_rc): $(tail -1 "$log/memcheck.txt") |"
  echo
  echo "## Kernel resources (ptxas)"
  echo
  echo '```'
  cat "$log/ptxas.txt"
  echo '```'
  echo
  for b in planner planner_depth planner_tree_shape confidence sampling attention attention_large attention_fp8 attention_mla attention_variants attention_metadata; do
    if [ -s "$log/bench_$b.md" ]; then cat "$log/bench_$b.md"; else echo '```'; tail -40 "$log/bench_$b.txt"; echo '```'; fi
    echo
  done
  echo
  for run in "cuda_tests:$cuda_rc:" "cuda_tests_candidates:$cuda_cand_rc: (candidate kernels)"; do
    IFS=: read -r name rc what <<<"$run"
    [ "$rc" -eq 0 ] && continue
    echo "## CUDA test failures$what"
    echo
    echo '```'
    grep -E "^(FAILED|ERROR)|Error|assert" "$log/$name.txt" | head -60
    echo '```'
  done
  for t in racecheck memcheck; do
    echo "## compute-sanitizer $t (tail)"
    echo
    echo '```'
    tail -25 "$log/$t.txt"
    echo '```'
  done
  if [ $build_rc -ne 0 ]; then
    echo "## Build log (tail)"
    echo
    echo '```'
    tail -60 "$log/build.txt"
    echo '```'
  fi
  echo
  echo "Step end times: $(tr "\n" ";" <"$log/steps.txt")"
  echo "Total time: $(( $(date +%s) - start )) s"
} >"$report"
# The device tool brings back only a few files: one archive holds every log.
tar czf "$(dirname "$report")/logs.tgz" -C "$(dirname "$report")" logs && rm -rf "$log"
echo "report written to $report"
[ $build_rc -eq 0 ] && [ $cuda_usable_rc -eq 0 ] && [ $cuda_rc -eq 0 ] && [ $cuda_cand_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $bench_conf_rc -eq 0 ] && [ $bench_samp_rc -eq 0 ] && [ $bench_att_rc -eq 0 ] && [ $bench_att_large_rc -eq 0 ]
