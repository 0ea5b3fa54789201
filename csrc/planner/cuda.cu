// Entry points of the CUDA planner (planner/kernel.cuh: the one planner algorithm on one thread block).
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/planner/kernel.cuh"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cuda(const SurvivalParams& p, void* stream) {
  return int(launch_prefix_survival(p, static_cast<cudaStream_t>(stream)));
}

int plan_cuda(const Params& p, void* stream) { return int(launch_plan(p, static_cast<cudaStream_t>(stream))); }

}  // namespace planner
}  // namespace adaptive_verify
