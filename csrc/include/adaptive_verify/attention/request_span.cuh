// Device-side view of one request's lengths, shared by the verify_attention kernels (kernel_rowwise.cuh,
// kernel_tiled.cuh).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"

namespace adaptive_verify {
namespace attention {

// Per-request lengths read on the device; an invalid request (lengths the host could not check) is
// treated as padding and counted.
struct RequestSpan {
  int64_t begin;
  int32_t q_len, kv_len;
  bool valid;
};

__device__ __forceinline__ RequestSpan request_span(const AttentionParams& p, int32_t r) {
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  const int32_t kv_len = p.seq_lens[r];
  const int64_t q_len = end - begin;
  const bool valid = q_len > 0 && q_len <= p.max_query_len && begin >= 0 && end <= p.num_tokens && kv_len >= q_len &&
                     (int64_t(kv_len) + p.block_size - 1) / p.block_size <= p.max_blocks;
  return RequestSpan{begin, int32_t(valid ? q_len : 0), kv_len, valid};
}

// Splits the partials kernel wrote for the request owning `token`, at most num_splits: ceil(kv_len /
// kSplitTokens) of them, 0 for a padding token or an invalid request (both merge kernels write zeros then).
__device__ __forceinline__ int32_t token_splits(const AttentionParams& p, int64_t token, int32_t num_splits) {
  // The owner: the last r with query_start_loc[r] <= token (non-decreasing for valid inputs), by bisection.
  int32_t lo = 0, hi = p.num_reqs;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (p.query_start_loc[mid] <= token) lo = mid; else hi = mid - 1;
  }
  if (lo >= p.num_reqs) return 0;
  const RequestSpan span = request_span(p, lo);
  if (!span.valid || token < span.begin || token >= span.begin + span.q_len) return 0;
  const int32_t splits = int32_t((int64_t(span.kv_len) + kSplitTokens - 1) / kSplitTokens);
  return splits < num_splits ? splits : num_splits;
}

}  // namespace attention
}  // namespace adaptive_verify
