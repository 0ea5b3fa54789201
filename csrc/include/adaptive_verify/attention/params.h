// Arguments of verify_attention, write_kv and commit_tree_kv as raw pointers and sizes (no torch types).
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// KV tokens per split-KV chunk. Fixed, so a request's partial results and their log-sum-exp merge do
// not depend on the rest of the batch (batch invariance); the CPU kernel uses the same boundaries.
constexpr int32_t kSplitTokens = 512;

// Most query tokens per request: the anchor plus up to 63 drafts or tree nodes (a tree mask row is 64 bits;
// the planner's chains stop at K + 1 = 33). Every kernel takes rows in chunks, so this is a host bound only.
constexpr int32_t kMaxQueryLen = 64;

// CUDA implementation of verify_attention (AttentionParams::kernel); the CPU kernel ignores it. Two kernels:
// the one validated on hardware (the default) and one candidate in two variants (a template flag's worth of
// difference). All write the same workspace; other values make the CUDA launcher return
// cudaErrorInvalidValue. The bindings export the names (ATTENTION_KERNELS) to python/adaptive_verify/attention.
constexpr int32_t kAttentionRowwise = 0;   // default: one warp per query row (validated on an H200)
constexpr int32_t kAttentionMma = 1;       // candidate: tensor cores, GQA rows in the MMA M dimension
constexpr int32_t kAttentionMmaFused = 2;  // kAttentionMma whose last block per row chunk merges (one launch)

// Dequantisation scales of an fp8 KV cache (vLLM's k_scale / v_scale), fields of AttentionParams and WriteKvParams:
// per tensor (the float k_scale, or a one-element device tensor k_scales read with stride 0) or per KV head (a [Hkv]
// device tensor, stride 1). A null pointer uses the float; caches of q's dtype use neither (1). The cache holds
// value / scale. Scale of KV head h (of V when `is_v`):
template <typename P>
AV_HD float kv_scale(const P& p, int32_t h, bool is_v) {
  const float* ptr = is_v ? p.v_scales : p.k_scales;
  if (ptr == nullptr) return is_v ? p.v_scale : p.k_scale;
  return ptr[int64_t(h) * (is_v ? p.v_scale_stride : p.k_scale_stride)];
}

// Whether a scale is usable: finite and > 0 (the kernels use any value as given and count the others).
AV_HD bool kv_scale_ok(float s) { return s > 0.f && s <= 3.4028234663852886e38f; }

struct AttentionParams {
  const void* q = nullptr;  // [T, Hq, D] of `dtype`, strides (q_stride_t, q_stride_h, 1)
  int64_t q_stride_t = 0, q_stride_h = 0;
  const void* k_cache = nullptr;  // [num_blocks, block_size, Hkv, D] contiguous, of `kv_dtype`
  const void* v_cache = nullptr;
  // kv_dtype: `dtype`, or kFloat8E4M3 (the cache holds value / scale: K = k_cache * k_scale of its KV head).
  int32_t kv_dtype = 0;
  float k_scale = 1.f, v_scale = 1.f;      // per tensor, when the pointers are null (kv_scale above)
  const float* k_scales = nullptr;         // [Hkv] or [1] float32 on the op's device, or null
  const float* v_scales = nullptr;
  int32_t k_scale_stride = 0, v_scale_stride = 0;  // 1: per KV head; 0: one value
  const int32_t* block_table = nullptr;  // [R, max_blocks], row stride block_table_stride
  int64_t block_table_stride = 0;
  int32_t max_blocks = 0;
  const int32_t* seq_lens = nullptr;         // [R]
  const int32_t* query_start_loc = nullptr;  // [R + 1]
  // [T] or null (causal chains): bit k of tree_mask[t] set iff token t attends to its request's query token at
  // offset k (draft trees; tree_mask.h has the exact rule, bits above the token's own offset are ignored).
  const int64_t* tree_mask = nullptr;
  int32_t dtype = 0;
  int32_t num_reqs = 0;
  int64_t num_tokens = 0;  // T
  int32_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  // Dims of V and of the output: 0 or head_dim (GQA/MHA), or kMlaValueDim for MLA (head_dim kMlaHeadDim, one KV
  // "head", v_cache == k_cache: V is the first kMlaValueDim values of the latent row that K is; value_dim() below).
  int32_t v_head_dim = 0;
  int64_t num_blocks = 0;
  int32_t max_query_len = 0;
  float scale = 1.f;
  // Model variants (docs/design.md, "Sinks, windows and soft-capping"): a learned logit per query head in the softmax
  // denominator ([Hq] float32 or null), a window of window_left positions to a token's left (-1: none; tree_mask.h
  // says what a position is), and logit soft-capping s -> softcap * tanh(s / softcap) of the scaled scores (0: off).
  const float* sinks = nullptr;
  int32_t window_left = -1;
  float softcap = 0.f;
  void* out = nullptr;   // [T, Hq, value_dim] of `dtype`, contiguous
  float* lse = nullptr;  // [T, Hq] or null
  int32_t* error_counts = nullptr;
  int32_t kernel = kAttentionRowwise;  // kAttention* above (CUDA only)
  float* workspace = nullptr;          // CUDA only: attention_workspace_floats(*this) floats
};

// MLA in its absorbed form (verify_attention_mla): a latent row of kMlaValueDim values then kMlaRopeDim RoPE values;
// scores over all kMlaHeadDim, values the first kMlaValueDim. Up to kMlaMaxHeads query heads share the one row.
constexpr int32_t kMlaValueDim = 512, kMlaRopeDim = 64, kMlaHeadDim = kMlaValueDim + kMlaRopeDim;
constexpr int32_t kMlaMaxHeads = 128;

AV_HD int32_t value_dim(const AttentionParams& p) { return p.v_head_dim > 0 ? p.v_head_dim : p.head_dim; }
AV_HD bool is_mla(const AttentionParams& p) { return p.head_dim == kMlaHeadDim; }

// Split-KV splits of a call: the block table's positions in kSplitTokens pieces (at least one). Host bounds
// only, so a captured graph's grid and workspace fit any lengths.
inline int32_t attention_splits(const AttentionParams& p) {
  const int64_t max_context = int64_t(p.max_blocks) * p.block_size;
  const int64_t s = (max_context + kSplitTokens - 1) / kSplitTokens;
  return int32_t(s < 1 ? 1 : s);
}

// Tensor-core kernels (kernel_mma.cuh): 16 query rows per warp, at most kMmaMaxWarps warps per block; the
// block count per (split, KV head, request) covers max_query_len * group rows.
constexpr int kMmaMaxWarps = 8;
// kAttentionMmaFused merges in its partials launch only requests of at most this many splits (4096 tokens):
// the merging block takes its rows one warp at a time, so a long request's merge (up to 256 splits at 128k)
// would be a serial tail; longer requests go to the merge kernel, which spreads every (token, head) over
// the GPU and is launched only when the call's host bound allows such a request.
constexpr int32_t kFusedMergeMaxSplits = 8;
struct MmaLaunchShape {
  int32_t warps = 0, chunks = 0;
};
inline MmaLaunchShape mma_launch_shape(const AttentionParams& p) {
  const int64_t group = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
  const int64_t rows = int64_t(p.max_query_len) * group;
  int64_t warps = (rows + 15) / 16;
  warps = warps < 1 ? 1 : (warps > kMmaMaxWarps ? kMmaMaxWarps : warps);
  return MmaLaunchShape{int32_t(warps), int32_t((rows + warps * 16 - 1) / (warps * 16))};
}

// Floats of CUDA workspace a call needs: (max, sum) then acc[D] per (token, q head, split), the same layout
// for every kernel; kAttentionMmaFused adds an int32 arrival counter per (request, KV head, row chunk).
inline int64_t attention_workspace_floats(const AttentionParams& p) {
  int64_t n = p.num_tokens * p.num_q_heads * int64_t(attention_splits(p)) * (value_dim(p) + 2);
  if (p.kernel == kAttentionMmaFused) n += int64_t(p.num_reqs) * p.num_kv_heads * mma_launch_shape(p).chunks;
  return n;
}

struct WriteKvParams {
  const void* k = nullptr;  // [T, Hkv, D] of `dtype`, strides (k_stride_t, k_stride_h, 1)
  const void* v = nullptr;
  int64_t k_stride_t = 0, k_stride_h = 0, v_stride_t = 0, v_stride_h = 0;
  void* k_cache = nullptr;  // [num_blocks, block_size, Hkv, D] contiguous (rows of cache_row elements)
  void* v_cache = nullptr;  // null (with v): K only (MLA's latent cache)
  // Elements between consecutive slots of a cache (0: Hkv * D) and the element offset of head 0 within a slot's row:
  // MLA writes its 512 latent values at offset 0 and its 64 RoPE values at offset 512 of 576-element rows.
  int64_t cache_row = 0, cache_offset = 0;
  const int64_t* slot_mapping = nullptr;  // [T]; -1 skips the token
  int64_t num_tokens = 0;
  int32_t num_kv_heads = 0, head_dim = 0, block_size = 0;
  int64_t num_blocks = 0;
  int32_t elem_size = 0;  // bytes per element of k / v (a plain copy is dtype-agnostic)
  // kFloat8E4M3 caches: k / v of `dtype` (bf16 / fp16) are divided by the scale of their KV head in float and
  // rounded to e4m3 (float_to_fp8_e4m3: nearest even, saturating at +-448, NaN kept); any other value: a copy.
  int32_t cache_dtype = 0;
  int32_t dtype = 0;
  float k_scale = 1.f, v_scale = 1.f;      // per tensor, when the pointers are null (kv_scale above)
  const float* k_scales = nullptr;         // [Hkv] or [1] float32 on the op's device, or null
  const float* v_scales = nullptr;
  int32_t k_scale_stride = 0, v_scale_stride = 0;  // 1: per KV head; 0: one value
  int32_t* error_counts = nullptr;
};

// Elements between a cache's consecutive slots in write_kv.
AV_HD int64_t write_row(const WriteKvParams& p) {
  return p.cache_row > 0 ? p.cache_row : int64_t(p.num_kv_heads) * p.head_dim;
}

// commit_tree_kv (docs/design.md, "Draft trees"): request r's accepted path, entries i = 1 .. num_accepted[r] of
// accepted_offsets[r] (offsets within its verified block; entry 0 is the anchor's and is not read), moves from KV
// index context_lens[r] + accepted_offsets[r, i] to context_lens[r] + i, its depth (commit.h says when a path is
// valid).
struct CommitTreeKvParams {
  void* k_cache = nullptr;  // [num_blocks, block_size, Hkv, D] contiguous
  void* v_cache = nullptr;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t row_bytes = 0;                  // bytes of one slot's K (or V) entry: Hkv * D * element size
  const int32_t* block_table = nullptr;   // [R, max_blocks], row stride block_table_stride
  int64_t block_table_stride = 0;
  int32_t max_blocks = 0;
  const int32_t* context_lens = nullptr;  // [R]
  const int32_t* accepted_offsets = nullptr;  // [R, width], row stride accepted_offsets_stride
  int64_t accepted_offsets_stride = 0;
  int32_t width = 0;
  const int32_t* num_accepted = nullptr;  // [R] accepted nodes (the anchor not counted)
  int32_t num_reqs = 0;
  int32_t* error_counts = nullptr;
};

}  // namespace attention
}  // namespace adaptive_verify
