// Device-side view of one request's lengths, shared by the verify_attention kernels (kernel_rowwise.cuh,
// kernel_mma.cuh, merge.cuh).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/tree_mask.h"

namespace adaptive_verify {
namespace attention {

// fp8 KV: counts KV head h's scales that are NaN, infinite or <= 0 (per-head tensors cannot be checked on the host
// without a sync; the kernels use them as given). One thread per KV head and call.
__device__ __forceinline__ void count_bad_kv_scales(const AttentionParams& p, int32_t h) {
  if (p.k_scales != nullptr && !kv_scale_ok(kv_scale(p, h, false))) atomicAdd(p.error_counts + kCountKvScale, 1);
  if (p.v_scales != nullptr && !kv_scale_ok(kv_scale(p, h, true))) atomicAdd(p.error_counts + kCountKvScale, 1);
}

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

// The first split a valid request's partials write: 0, or under a sliding window the split holding the earliest
// position any of its tokens may see (tree_mask.h request_window_start); splits below it are neither computed nor
// merged.
__device__ __forceinline__ int32_t request_first_split(const AttentionParams& p, const RequestSpan& span) {
  return request_window_start(span.kv_len - span.q_len, p.window_left) / kSplitTokens;
}

// What block (split s, row chunk `chunk` of `chunk_rows` rows, KV head h) of a chunked partials kernel
// (kernel_mma.cuh) does for request r. Rows are the request's q_len x group query rows,
// row = i * group + g (query token i, q head h * group + g).
struct ChunkWork {
  bool active;             // false: nothing to write (invalid request, or rows / split past the request)
  int32_t group, rows;     // Hq / Hkv, and the request's q_len * group rows
  int32_t row0, nrows;     // the block's rows: row0 .. row0 + nrows - 1
  int32_t last_of_token0;  // row `row` sees positions <= last_of_token0 + row / group
  int32_t s0, s_end;       // the split's first position and the last the block reads
  int32_t s_begin;         // the first position it reads: s0, or a sliding window's start (request_window_start)
  bool counts_bad;         // counts bad block ids: the chunk holding the last rows reads up to kv_len - 1
};

// An invalid request's tokens are padding (the merge writes zeros without reading the workspace); one
// thread of the grid (`counter`, with h == 0) counts it if it has tokens.
__device__ __forceinline__ ChunkWork chunk_work(const AttentionParams& p, const RequestSpan& span, int32_t r,
                                                int32_t s, int32_t chunk, int32_t chunk_rows, int32_t h,
                                                bool counter) {
  ChunkWork w{};
  if (!span.valid) {
    if (counter && h == 0 && p.query_start_loc[r + 1] != p.query_start_loc[r])
      atomicAdd(p.error_counts + kCountQueryLenOutOfRange, 1);
    return w;
  }
  w.group = p.num_q_heads / p.num_kv_heads;
  w.rows = span.q_len * w.group;
  w.row0 = chunk * chunk_rows;
  w.s0 = s * kSplitTokens;
  // Past the request's rows or context, or below every token's window: nothing to write (the merge reads only the
  // request's splits from request_first_split on).
  if (w.row0 >= w.rows || w.s0 > span.kv_len - 1 || s < request_first_split(p, span)) return w;
  w.active = true;
  w.nrows = w.rows - w.row0 < chunk_rows ? w.rows - w.row0 : chunk_rows;
  w.last_of_token0 = span.kv_len - span.q_len;
  const int32_t block_last = w.last_of_token0 + (w.row0 + w.nrows - 1) / w.group;  // its last row sees most
  w.s_end = w.s0 + kSplitTokens - 1 < block_last ? w.s0 + kSplitTokens - 1 : block_last;
  const int32_t from = request_window_start(w.last_of_token0, p.window_left);
  w.s_begin = w.s0 > from ? w.s0 : from;
  w.counts_bad = h == 0 && chunk == (w.rows - 1) / chunk_rows;
  return w;
}

// Splits of a valid request: ceil(kv_len / kSplitTokens), at most num_splits.
__device__ __forceinline__ int32_t request_splits(const RequestSpan& span, int32_t num_splits) {
  const int32_t splits = int32_t((int64_t(span.kv_len) + kSplitTokens - 1) / kSplitTokens);
  return splits < num_splits ? splits : num_splits;
}

// The request owning `token`: the last r with query_start_loc[r] <= token (non-decreasing for valid
// inputs), by bisection, if token lies in its rows and it is valid; else -1 (a padding token).
__device__ __forceinline__ int32_t token_owner(const AttentionParams& p, int64_t token) {
  int32_t lo = 0, hi = p.num_reqs;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (p.query_start_loc[mid] <= token) lo = mid; else hi = mid - 1;
  }
  if (lo >= p.num_reqs) return -1;
  const RequestSpan span = request_span(p, lo);
  return span.valid && token >= span.begin && token < span.begin + span.q_len ? lo : -1;
}

// Splits the partials kernel wrote for the request owning `token`: [first, used) with used at most num_splits,
// ceil(kv_len / kSplitTokens); used 0 for a padding token or an invalid request (the merges write zeros then).
struct SplitRange {
  int32_t first, used;
};
__device__ __forceinline__ SplitRange token_split_range(const AttentionParams& p, int64_t token, int32_t num_splits) {
  const int32_t owner = token_owner(p, token);
  if (owner < 0) return SplitRange{0, 0};
  const RequestSpan span = request_span(p, owner);
  return SplitRange{request_first_split(p, span), request_splits(span, num_splits)};
}
__device__ __forceinline__ int32_t token_splits(const AttentionParams& p, int64_t token, int32_t num_splits) {
  return token_split_range(p, token, num_splits).used;
}

// Counts the sinks of query heads h * group .. h * group + group - 1 that are NaN or infinite (one thread per KV
// head and call; the merges use them as given).
__device__ __forceinline__ void count_bad_sinks(const AttentionParams& p, int32_t h, int32_t group) {
  if (p.sinks == nullptr) return;
  for (int32_t g = 0; g < group; ++g)
    if (!(fabsf(p.sinks[h * group + g]) <= 3.4028234663852886e38f)) atomicAdd(p.error_counts + kCountSink, 1);
}

}  // namespace attention
}  // namespace adaptive_verify
