// Entry points of the attention area's CUDA kernels (kernel.cuh dispatches to kernel_rowwise.cuh and
// kernel_mma.cuh).
#include "adaptive_verify/attention/kernel.cuh"
#include "adaptive_verify/cuda_api.h"

namespace adaptive_verify {
namespace attention {

int write_kv_cuda(const WriteKvParams& p, void* s) { return int(launch_write_kv(p, cudaStream_t(s))); }

int verify_attention_cuda(const AttentionParams& p, void* s) { return int(launch_verify_attention(p, cudaStream_t(s))); }

}  // namespace attention
}  // namespace adaptive_verify
