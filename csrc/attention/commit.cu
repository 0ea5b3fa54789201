// Entry point of commit_tree_kv's CUDA kernel (attention/commit.cuh), apart from the attention kernels so that
// neither rebuild waits for the other.
#include "adaptive_verify/attention/commit.cuh"
#include "adaptive_verify/cuda_api.h"

namespace adaptive_verify {
namespace attention {

int commit_tree_kv_cuda(const CommitTreeKvParams& p, void* s) {
  return int(launch_commit_tree_kv(p, cudaStream_t(s)));
}

}  // namespace attention
}  // namespace adaptive_verify
