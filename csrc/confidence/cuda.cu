// Entry points of the confidence-area CUDA kernels (kernels in kernel.cuh).
#include "adaptive_verify/confidence/kernel.cuh"
#include "adaptive_verify/cuda_api.h"

namespace adaptive_verify {
namespace confidence {

int confidence_cuda(const ConfidenceParams& p, void* s) { return int(launch_confidence(p, cudaStream_t(s))); }
int confidence_from_logits_cuda(const LogitParams& p, void* s) { return int(launch_from_logits(p, cudaStream_t(s))); }
int draft_margin_cuda(const MarginParams& p, void* s) { return int(launch_margin(p, cudaStream_t(s))); }
int stats_update_cuda(const StatsParams& p, void* s) { return int(launch_stats(p, cudaStream_t(s))); }

}  // namespace confidence
}  // namespace adaptive_verify
