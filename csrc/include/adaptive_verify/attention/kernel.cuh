// CUDA kernels of the attention area. So far: write_kv (one thread per 16-byte word of a K or V row,
// or per element when rows are not 16-byte aligned). Slots of -1 are skipped; slots outside the cache
// are skipped and counted (the host cannot check device-resident slots without a sync).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "adaptive_verify/attention/params.h"

namespace adaptive_verify {
namespace attention {

template <typename Word>
__global__ void write_kv_kernel(const WriteKvParams p) {
  const int64_t words_per_row = int64_t(p.head_dim) * p.elem_size / int64_t(sizeof(Word));
  const int64_t per_token = int64_t(p.num_kv_heads) * words_per_row;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.num_tokens * per_token) return;
  const int64_t t = idx / per_token, h = (idx % per_token) / words_per_row, w = idx % words_per_row;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_blocks * p.block_size) {
    if (slot != -1 && h == 0 && w == 0) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
    return;
  }
  const int64_t dst = (slot * p.num_kv_heads + h) * words_per_row + w;
  const int64_t k_src = (t * p.k_stride_t + h * p.k_stride_h) * p.elem_size / int64_t(sizeof(Word)) + w;
  const int64_t v_src = (t * p.v_stride_t + h * p.v_stride_h) * p.elem_size / int64_t(sizeof(Word)) + w;
  static_cast<Word*>(p.k_cache)[dst] = static_cast<const Word*>(p.k)[k_src];
  static_cast<Word*>(p.v_cache)[dst] = static_cast<const Word*>(p.v)[v_src];
}

inline cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const int64_t row_bytes = int64_t(p.head_dim) * p.elem_size;
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const bool vec = row_bytes % 16 == 0 && aligned(p.k) && aligned(p.v) && aligned(p.k_cache) && aligned(p.v_cache) &&
                   (p.k_stride_t * p.elem_size) % 16 == 0 && (p.k_stride_h * p.elem_size) % 16 == 0 &&
                   (p.v_stride_t * p.elem_size) % 16 == 0 && (p.v_stride_h * p.elem_size) % 16 == 0;
  const int threads = 256;
  if (vec) {
    const int64_t n = p.num_tokens * p.num_kv_heads * (row_bytes / 16);
    write_kv_kernel<uint4><<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(p);
  } else if (p.elem_size == 2) {
    const int64_t n = p.num_tokens * p.num_kv_heads * p.head_dim;
    write_kv_kernel<uint16_t><<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(p);
  } else {
    const int64_t n = p.num_tokens * p.num_kv_heads * p.head_dim;
    write_kv_kernel<uint32_t><<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace attention
}  // namespace adaptive_verify
