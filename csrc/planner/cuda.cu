// Entry points of the CUDA planner kernels (the kernels themselves live in kernel.cuh).
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/planner/kernel.cuh"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cuda(const SurvivalParams& p, void* stream) {
  return int(launch_prefix_survival(p, static_cast<cudaStream_t>(stream)));
}

int plan_cuda(const Params& p, void* stream) { return int(launch_plan(p, static_cast<cudaStream_t>(stream))); }

int64_t cuda_workspace_keys(int64_t num_reqs, int64_t max_drafts) { return workspace_keys(num_reqs, max_drafts); }

}  // namespace planner
}  // namespace adaptive_verify
