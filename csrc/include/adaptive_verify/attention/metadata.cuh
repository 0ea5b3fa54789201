// CUDA kernels of flashinfer_plan (metadata.h), two launches whose grids depend only on host bounds (R), so a
// captured graph replays any lengths:
//   1. scan: one block; each thread takes a contiguous run of requests, the block scans the runs' page and mask-byte
//      totals, and each thread writes its requests' kv_indptr, mask_indptr and kv_last_page_len. A request whose
//      lengths the host bounds do not allow (metadata.h meta_lens) is written as empty and counted.
//   2. fill: block r copies request r's pages into kv_indices and writes its packed mask bytes (skipped and counted
//      if they would pass mask_capacity); block R zeroes kv_indices past kv_indptr[R].
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/metadata.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace attention {

constexpr int kMetaScanThreads = 1024;

__global__ void __launch_bounds__(kMetaScanThreads) flashinfer_scan_kernel(const FlashInferParams p) {
  __shared__ int64_t pages_s[kMetaScanThreads], bytes_s[kMetaScanThreads];
  const int t = threadIdx.x;
  const int32_t per = (p.num_reqs + kMetaScanThreads - 1) / kMetaScanThreads;
  const int32_t r0 = t * per, r1 = r0 + per < p.num_reqs ? r0 + per : p.num_reqs;
  int64_t pages = 0, bytes = 0;
  for (int32_t r = r0; r < r1; ++r) {
    const MetaLens m = meta_lens(p, r);
    if (!m.valid) atomicAdd(p.error_counts + kCountQueryLenOutOfRange, 1);
    pages += m.pages;
    if (p.packed_mask != nullptr) bytes += mask_bytes(m);
  }
  pages_s[t] = pages;
  bytes_s[t] = bytes;
  __syncthreads();
  if (t == 0) {  // exclusive scan of 1024 run totals: serial, a few microseconds
    int64_t a = 0, b = 0;
    for (int i = 0; i < kMetaScanThreads; ++i) {
      const int64_t pa = pages_s[i], pb = bytes_s[i];
      pages_s[i] = a;
      bytes_s[i] = b;
      a += pa;
      b += pb;
    }
  }
  __syncthreads();
  pages = pages_s[t];
  bytes = bytes_s[t];
  if (t == 0) {
    p.kv_indptr[0] = 0;
    if (p.mask_indptr != nullptr) p.mask_indptr[0] = 0;
  }
  for (int32_t r = r0; r < r1; ++r) {
    const MetaLens m = meta_lens(p, r);
    pages += m.pages;
    p.kv_indptr[r + 1] = int32_t(pages);
    p.kv_last_page_len[r] = m.pages > 0 ? m.kv_len - (m.pages - 1) * p.page_size : 0;
    if (p.mask_indptr != nullptr) {
      bytes += mask_bytes(m);
      p.mask_indptr[r + 1] = int32_t(bytes < p.mask_capacity ? bytes : p.mask_capacity);
    }
  }
}

__global__ void flashinfer_fill_kernel(const FlashInferParams p) {
  const int32_t r = blockIdx.x;
  if (r == p.num_reqs) {  // the tail of kv_indices
    const int64_t total = int64_t(p.num_reqs) * p.max_blocks;
    for (int64_t i = p.kv_indptr[p.num_reqs] + threadIdx.x; i < total; i += blockDim.x) p.kv_indices[i] = 0;
    return;
  }
  const MetaLens m = meta_lens(p, r);
  const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
  const int32_t first = p.kv_indptr[r];
  for (int32_t b = threadIdx.x; b < m.pages; b += blockDim.x) p.kv_indices[first + b] = table[b];
  if (p.packed_mask == nullptr) return;
  const int64_t start = p.mask_indptr[r], n = mask_bytes(m);
  if (start + n > p.mask_capacity) {  // beyond the host bound: nothing written (mask_indptr is clamped), counted
    if (threadIdx.x == 0 && n > 0) atomicAdd(p.error_counts + kCountQueryLenOutOfRange, 1);
    return;
  }
  for (int64_t byte = threadIdx.x; byte < n; byte += blockDim.x) p.packed_mask[start + byte] = mask_byte(p, m, byte);
}

inline cudaError_t launch_flashinfer_plan(const FlashInferParams& p, cudaStream_t stream) {
  if (p.num_reqs < 0 || p.num_reqs > 65534) return cudaErrorInvalidValue;
  cudaError_t err = launch_kernel(flashinfer_scan_kernel, dim3(1), dim3(kMetaScanThreads), 0, stream, p);
  if (err != cudaSuccess) return err;
  return launch_kernel(flashinfer_fill_kernel, dim3(unsigned(p.num_reqs + 1)), dim3(128), 0, stream, p);
}

}  // namespace attention
}  // namespace adaptive_verify
