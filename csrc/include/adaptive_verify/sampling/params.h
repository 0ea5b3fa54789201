// Arguments of the sampling ops as raw pointers and sizes (no torch types).
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace sampling {

// CUDA implementation, chosen per call by the Python layer (cuda_kernel=); the CPU kernel ignores it. Calls
// with truncation (top_k, top_p, min_p) or logprobs run kSamplerV1 whatever was chosen.
enum SamplerKernel : int32_t {
  kSamplerV1 = 0,      // kernel.cuh: one block per request (rejection_sample) / row (sample)
  kSamplerSplitV = 1,  // kernel_splitv.cuh: rows split into vocabulary chunks, partials merged in order
};

// One chunk's result in the split-vocabulary workspace (16 bytes, [slots, chunks]).
struct SplitVPartial {
  float key;     // greedy: largest logit; race: best race score
  int32_t id;    // its id (ties: smallest), -1 when none
  int32_t nan;   // NaN logits (greedy) / NaN scaled logits (race) in the chunk
  float zmax;    // race: largest scaled logit of the chunk (-inf when none); greedy: = key
};
static_assert(sizeof(SplitVPartial) == 16, "one partial is one 16-byte store");

// Chunking of the split-vocabulary kernels, from host-known bounds only (V, dtype, slot count), so a
// captured graph replays with the same grid. A tile is what one 256-thread block holds in registers at
// once (8 x 16-byte vectors a thread); a chunk is a whole number of tiles, one block each.
// Workspace: [slots, chunks] partials, then (rejection_sample only: num_reqs > 0) int32 [slots] chunk
// counters and int32 [num_reqs] early-exit states, which must be zero at launch.
struct SplitVShape {
  static constexpr int64_t kTileBytes = 256 * 8 * 16;
  // Enough blocks to fill an H200/B200 a few times over; beyond that a block takes several tiles.
  static constexpr int64_t kTargetBlocks = 1024;
  static constexpr int64_t kMaxChunks = 65535;  // gridDim.y
  int64_t tile_elems = 0, tiles_per_chunk = 0, num_chunks = 0;
  int64_t partial_bytes = 0, workspace_bytes = 0;
};

inline int elem_bytes_of(int32_t dtype) { return dtype == 0 ? 4 : 2; }  // kFloat32 : fp16 / bf16

inline SplitVShape splitv_shape(int32_t dtype, int64_t V, int64_t slots, int64_t num_reqs) {
  SplitVShape s;
  if (slots < 0) slots = 0;
  if (num_reqs < 0) num_reqs = 0;
  s.tile_elems = SplitVShape::kTileBytes / elem_bytes_of(dtype);
  const int64_t tiles = V < 1 ? 1 : (V + s.tile_elems - 1) / s.tile_elems;
  int64_t want = slots < 1 ? SplitVShape::kTargetBlocks : (SplitVShape::kTargetBlocks + slots - 1) / slots;
  if (want > tiles) want = tiles;
  if (want > SplitVShape::kMaxChunks) want = SplitVShape::kMaxChunks;
  if (want < 1) want = 1;
  s.tiles_per_chunk = (tiles + want - 1) / want;
  s.num_chunks = (tiles + s.tiles_per_chunk - 1) / s.tiles_per_chunk;
  s.partial_bytes = slots * s.num_chunks * int64_t(sizeof(SplitVPartial));
  s.workspace_bytes = s.partial_bytes + (num_reqs > 0 ? (slots + num_reqs) * int64_t(sizeof(int32_t)) : 0);
  return s;
}

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
  const int32_t* top_k = nullptr;    // [R] or null: 0 (or >= V) = off
  const float* top_p = nullptr;      // [R] or null: 1 = off
  const float* min_p = nullptr;      // [R] or null: 0 = off
  int32_t* output_tokens = nullptr;  // [R, K + 1]
  int32_t* num_emitted = nullptr;    // [R]
  float* logprobs = nullptr;         // [R, K + 1] or null: untruncated log-probability of each emitted token
  int32_t* error_counts = nullptr;
  int32_t kernel = kSamplerV1;     // SamplerKernel (CUDA only; truncation or logprobs run kSamplerV1)
  void* workspace = nullptr;       // kSamplerSplitV: splitv_shape(dtype, V, R * (K + 1), R), zero-filled
  int64_t workspace_bytes = 0;
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
  const int32_t* top_k = nullptr;  // [N] or null, as in RejectionParams
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  int32_t* tokens = nullptr;    // [N]
  float* logprobs = nullptr;    // [N] or null
  int32_t* error_counts = nullptr;
  int32_t kernel = kSamplerV1;  // as in RejectionParams: splitv_shape(dtype, V, N, 0), any contents
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// tree_rejection_sample(): one-hot "sample and match" down each request's verified draft tree (tree.h). Tokens
// are the tree planner's layout: request r's q_len tokens start at query_start_loc[r], the anchor at offset 0,
// then the verified nodes, parents before children.
struct TreeSampleParams {
  const void* logits = nullptr;  // [T, V] of `dtype`, row stride logits_stride, last dim contiguous
  int64_t logits_stride = 0;
  int32_t dtype = 0;
  int64_t num_tokens = 0;  // T
  int64_t vocab = 0;       // V
  const int32_t* query_start_loc = nullptr;  // [R + 1]
  const int32_t* token_parent = nullptr;     // [T]: parent's offset within the request (the anchor's is not read)
  const void* input_ids = nullptr;           // [T] int32 or int64 (input_ids_int64): each token's id
  int32_t input_ids_int64 = 0;
  const float* temperature = nullptr;  // [R] or null (all greedy)
  const int64_t* seeds = nullptr;      // [R] or null (all zero)
  uint64_t offset = 0;                 // used when offset_ptr is null
  const int64_t* offset_ptr = nullptr;  // 0-d int64 on the kernel's device, or null
  int32_t num_reqs = 0;       // R
  int32_t max_query_len = 0;  // W in [1, kMaxTreeTokens]: the outputs' width; longer requests are clamped
  const int32_t* top_k = nullptr;  // [R] or null, as in RejectionParams
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  int32_t* output_tokens = nullptr;     // [R, W] contiguous
  int32_t* num_emitted = nullptr;       // [R]
  int32_t* accepted_offsets = nullptr;  // [R, W] contiguous
  float* logprobs = nullptr;            // [R, W] contiguous or null: as RejectionParams::logprobs
  int32_t* error_counts = nullptr;
};

}  // namespace sampling
}  // namespace adaptive_verify
