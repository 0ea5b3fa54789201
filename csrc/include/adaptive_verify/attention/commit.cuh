// commit_tree_kv's CUDA kernel: one block row (blockIdx.y) per request, each thread one 16-byte (or 2-byte) word of
// a slot's K and V rows, walking the request's accepted path in order (commit.h says why that order is safe).
// Every length is read on the device and the grid depends only on R and the row size, so it is graph-safe; an
// invalid path moves nothing and is counted once (kCountAcceptedPath).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/commit.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace attention {

template <typename Word>
__global__ void commit_tree_kv_kernel(const CommitTreeKvParams p) {
  const int32_t r = int32_t(blockIdx.y);
  const int64_t words = p.row_bytes / int64_t(sizeof(Word));
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!accepted_path_ok(p, r)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(p.error_counts + kCountAcceptedPath, 1);
    return;
  }
  if (w >= words) return;
  const int32_t n = p.num_accepted[r], ctx = p.context_lens[r];
  const int32_t* off = p.accepted_offsets + int64_t(r) * p.accepted_offsets_stride;
  Word* k = static_cast<Word*>(p.k_cache);
  Word* v = static_cast<Word*>(p.v_cache);
  for (int32_t i = 1; i <= n; ++i) {
    if (off[i] == i) continue;  // already at its depth
    const int64_t src = commit_slot(p, r, int64_t(ctx) + off[i]) * words + w;
    const int64_t dst = commit_slot(p, r, int64_t(ctx) + i) * words + w;
    k[dst] = k[src];
    if (v != nullptr) v[dst] = v[src];  // (MLA: one latent cache)
  }
}

inline cudaError_t launch_commit_tree_kv(const CommitTreeKvParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0 || p.row_bytes == 0) return cudaSuccess;
  if (p.num_reqs > 65535) return cudaErrorInvalidValue;  // grid.y
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const bool vec = p.row_bytes % 16 == 0 && aligned(p.k_cache) && aligned(p.v_cache);
  const int64_t words = p.row_bytes / (vec ? 16 : 2);
  const int threads = words < 128 ? int((words + 31) / 32 * 32) : 128;
  const dim3 grid{unsigned((words + threads - 1) / threads), unsigned(p.num_reqs)}, block{unsigned(threads)};
  if (vec) return launch_kernel(commit_tree_kv_kernel<uint4>, grid, block, 0, stream, p);
  return launch_kernel(commit_tree_kv_kernel<uint16_t>, grid, block, 0, stream, p);
}

}  // namespace attention
}  // namespace adaptive_verify
