// Entry point of flashinfer_plan's CUDA kernels (attention/metadata.cuh).
#include "adaptive_verify/attention/metadata.cuh"
#include "adaptive_verify/cuda_api.h"

namespace adaptive_verify {
namespace attention {

int flashinfer_plan_cuda(const FlashInferParams& p, void* s) { return int(launch_flashinfer_plan(p, cudaStream_t(s))); }

}  // namespace attention
}  // namespace adaptive_verify
