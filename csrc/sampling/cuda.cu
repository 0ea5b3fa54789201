// Entry points of the sampler's CUDA kernels: v1 (kernel.cuh) or split-vocabulary (kernel_splitv.cuh),
// as the params' `kernel` says.
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/sampling/kernel_splitv.cuh"

namespace adaptive_verify {
namespace sampling {

int rejection_sample_cuda(const RejectionParams& p, void* s) {
  switch (p.kernel) {
    case kSamplerV1: return int(launch_rejection(p, cudaStream_t(s)));
    case kSamplerSplitV: return int(launch_rejection_splitv(p, cudaStream_t(s)));
    default: return int(cudaErrorInvalidValue);
  }
}

int sample_cuda(const SampleParams& p, void* s) {
  switch (p.kernel) {
    case kSamplerV1: return int(launch_sample(p, cudaStream_t(s)));
    case kSamplerSplitV: return int(launch_sample_splitv(p, cudaStream_t(s)));
    default: return int(cudaErrorInvalidValue);
  }
}

}  // namespace sampling
}  // namespace adaptive_verify
