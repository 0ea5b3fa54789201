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

}  // namespace attention
}  // namespace adaptive_verify
