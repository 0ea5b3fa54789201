// The planner's CUDA kernels (planner/kernel.cuh: the one planner algorithm on one thread block, chains and trees,
// and the prefix/tree survival kernel), launched by their real launchers (launch_plan, launch_prefix_survival), run
// on the host by the fiber emulator (cuda_emu.h). The C entry points take the same parameter structs as
// adaptive_verify._C.plan and _C.prefix_survival (tests/test_planner_emu.py swaps them in). Built by the tests
// with the host compiler; not part of the package.
#include "cuda_emu.h"

#include <vector>

#include "adaptive_verify/planner/kernel.cuh"

namespace pl = adaptive_verify::planner;

extern "C" {

// params: a planner::Params filled by the Python layer for CPU tensors. The global workspace the launcher needs
// past shared memory is allocated here (the Python layer allocates it only for CUDA tensors). Returns 0, or 1
// with the emulator's message in err (a launch that returns an error is a failure too).
int av_emu_plan(const pl::Params* params, char* err, int err_len) {
  pl::Params p = *params;
  const int64_t bytes = pl::plan_workspace_bytes(p.num_reqs, p.max_drafts, p.min_verify > 0, p.parents != nullptr);
  std::vector<uint4> workspace(size_t((bytes + 15) / 16));
  if (bytes > 0) p.workspace = workspace.data();
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (pl::launch_plan(p, nullptr) != cudaSuccess) throw av_emu::Failure("launch_plan returned an error");
  });
}

// params: a planner::SurvivalParams (prefix_survival, or tree_survival with parents set).
int av_emu_prefix_survival(const pl::SurvivalParams* params, char* err, int err_len) {
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (pl::launch_prefix_survival(*params, nullptr) != cudaSuccess)
      throw av_emu::Failure("launch_prefix_survival returned an error");
  });
}

}  // extern "C"
