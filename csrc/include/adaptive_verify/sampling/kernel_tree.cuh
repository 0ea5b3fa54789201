// CUDA tree sampler: one 256-thread block per request walks the accepted path (tree.h) with the v1 kernel's
// block-wide row reductions (kernel.cuh, GpuRows), so it draws the CPU kernel's integers.
//
// NOTES:
//  - A block per request, as v1's rejection kernel: a request's rows are read one after the other (the next row is
//    known only once this row's draw is), and only the path's rows are read at all.
//  - Every thread runs the child scan itself (at most 63 token_parent / input_ids entries, the same addresses for
//    all threads: broadcast loads) on the draw that block_best handed to all of them, so control flow stays
//    uniform without another barrier.
#pragma once

#include <cstdint>

#include "adaptive_verify/sampling/kernel.cuh"
#include "adaptive_verify/sampling/tree.h"

namespace adaptive_verify {
namespace sampling {

template <typename T>
__global__ void __launch_bounds__(SamplerConfig::kThreads) tree_sample_kernel(const TreeSampleParams p) {
  __shared__ BlockScratch sh;
  GpuRows<T> rows{sh, p.error_counts};
  tree_request<T>(p, blockIdx.x, rows, threadIdx.x == 0);
}

inline cudaError_t launch_tree_sample(const TreeSampleParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  if (p.max_query_len < 1 || p.max_query_len > kMaxTreeTokens) return cudaErrorInvalidValue;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    return launch_kernel(tree_sample_kernel<decltype(tag)>, dim3(unsigned(p.num_reqs)), dim3(SamplerConfig::kThreads),
                         0, stream, p);
  });
}

}  // namespace sampling
}  // namespace adaptive_verify
