// Entry points of the CUDA planner kernels: kernel.cuh (v1, the default) and kernel_v2.cuh (v2), chosen by
// Params::kernel (AV_PLANNER_KERNEL on the Python side).
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/planner/kernel.cuh"
#include "adaptive_verify/planner/kernel_v2.cuh"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cuda(const SurvivalParams& p, void* stream) {
  return int(launch_prefix_survival(p, static_cast<cudaStream_t>(stream)));
}

int plan_cuda(const Params& p, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.kernel) {
    case kPlannerV1: return int(launch_plan(p, s));
    case kPlannerV2: return int(launch_plan_v2(p, s));
    default: return int(cudaErrorInvalidValue);
  }
}

int64_t cuda_workspace_keys(int64_t num_reqs, int64_t max_drafts) { return workspace_keys(num_reqs, max_drafts); }

}  // namespace planner
}  // namespace adaptive_verify
