// Arguments of the sampling ops as raw pointers and sizes (no torch types).
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace sampling {

struct RejectionParams {
  const void* logits = nullptr;  // [T, V] of `dtype`, row stride logits_stride, last dim contiguous
  int64_t logits_stride = 0;
  int32_t dtype = 0;
  int64_t num_tokens = 0;  // T
  int64_t vocab = 0;       // V
  const int32_t* query_start_loc = nullptr;  // [R + 1]
  const void* draft_tokens = nullptr;        // [R, K] int32 or int64 (draft_tokens_int64), row stride
  int64_t draft_tokens_stride = 0;
  int32_t draft_tokens_int64 = 0;
  const float* draft_probs = nullptr;  // [R, K, V] float32 or null (one-hot drafts), strides (r, k, 1)
  int64_t draft_probs_stride_r = 0, draft_probs_stride_k = 0;
  const float* temperature = nullptr;  // [R] or null (all greedy)
  const int64_t* seeds = nullptr;      // [R] or null (all zero)
  uint64_t offset = 0;                 // used when offset_ptr is null
  const int64_t* offset_ptr = nullptr;  // 0-d int64 on the kernel's device, or null
  int32_t num_reqs = 0, max_drafts = 0;  // R, K
  int32_t* output_tokens = nullptr;  // [R, K + 1]
  int32_t* num_emitted = nullptr;    // [R]
  int32_t* error_counts = nullptr;
};

// sample(): one token per row of logits [N, V] (RNG stream 2, position 0).
struct SampleParams {
  const void* logits = nullptr;
  int64_t logits_stride = 0;
  int32_t dtype = 0;
  int64_t vocab = 0;
  int32_t num_rows = 0;
  const float* temperature = nullptr;
  const int64_t* seeds = nullptr;
  uint64_t offset = 0;
  const int64_t* offset_ptr = nullptr;
  int32_t* tokens = nullptr;  // [N]
  int32_t* error_counts = nullptr;
};

}  // namespace sampling
}  // namespace adaptive_verify
