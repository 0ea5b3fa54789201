// Entry points of the sampler's CUDA kernels (kernels in kernel.cuh).
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/sampling/kernel.cuh"

namespace adaptive_verify {
namespace sampling {

int rejection_sample_cuda(const RejectionParams& p, void* s) { return int(launch_rejection(p, cudaStream_t(s))); }
int sample_cuda(const SampleParams& p, void* s) { return int(launch_sample(p, cudaStream_t(s))); }

}  // namespace sampling
}  // namespace adaptive_verify
