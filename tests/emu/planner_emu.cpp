// The planner's CUDA kernels (planner/kernel.cuh "v1", planner/kernel_v2.cuh "v2") run on the host by the
// fiber emulator (cuda_emu.h), behind a C entry point that takes the same packed arguments as
// adaptive_verify._C.plan (tests/test_planner_emu.py swaps it in). Built by the tests with the host
// compiler; not part of the package.
#include "cuda_emu.h"

#include <vector>

#include "adaptive_verify/planner/kernel.cuh"
#include "adaptive_verify/planner/kernel_v2.cuh"
#include "adaptive_verify/planner/packed.h"

namespace pl = adaptive_verify::planner;

extern "C" {

// packed: planner::kPlanWords little-endian words (planner.py _PLAN_STRUCT); their kernel word picks v1
// (0) or v2 (1), as on CUDA. Returns 0, or 1 with the emulator's message in err.
int av_emu_plan(const char* packed, char* err, int err_len) {
  pl::PackedPlan args = pl::unpack_plan(packed);
  pl::Params& p = args.params;
  const int64_t n_slots = int64_t(p.num_reqs) * p.max_drafts;
  const int64_t n_pad = pl::next_pow2(n_slots);
  // As launch_plan / launch_plan_v2: keys in (dynamic) shared memory when they fit, else a global
  // workspace (allocated here: the CPU-side caller passes none).
  const bool smem = pl::workspace_keys(p.num_reqs, p.max_drafts) == 0;
  std::vector<uint64_t> workspace(smem ? 0 : size_t(pl::workspace_keys(p.num_reqs, p.max_drafts)));
  p.workspace = smem ? nullptr : workspace.data();
  const size_t smem_bytes = smem ? size_t(n_pad) * sizeof(uint64_t) : 0;
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (p.kernel == pl::kPlannerV2) {
      const int threads = pl::threads_for_v2(n_slots, p.num_reqs);
      const int32_t nb = pl::buckets_for_v2(n_pad);
      av_emu::launch(av_emu::Dim3{1, 1, 1}, av_emu::Dim3{unsigned(threads), 1, 1}, smem_bytes,
                     [&] { pl::plan_kernel_v2(p, n_pad, nb); });
    } else if (p.kernel == pl::kPlannerV1) {
      const int threads = pl::threads_for(n_pad, p.num_reqs);
      av_emu::launch(av_emu::Dim3{1, 1, 1}, av_emu::Dim3{unsigned(threads), 1, 1}, smem_bytes,
                     [&] { pl::plan_kernel(p, n_pad); });
    } else {
      throw av_emu::Failure("unknown planner kernel");
    }
  });
}

}  // extern "C"
