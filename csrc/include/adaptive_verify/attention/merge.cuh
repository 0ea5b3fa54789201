// Second launch of the tensor-core verify_attention kernel (kernel_mma.cuh):
// merges each (token, q head)'s split partials by log-sum-exp, in split order, into out (and lse).
// Host-compilable under AV_CUDA_EMULATION (tests/emu), so the CPU suite runs it too.
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/request_span.cuh"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// One warp (all 32 lanes: it shuffles) merges the first `used` splits of (token, q head qh), in order, and
// writes out (and lse): lane `lane` owns columns lane + 32 * e. used == 0 (a padding token) writes zeros
// and lse -inf. The partials are read through L2 (__ldcg): in the fused tensor-core kernel other blocks
// wrote them during this launch.
template <typename T, int D>
__device__ __forceinline__ void merge_token_head(const AttentionParams& p, int64_t token, int32_t qh, int32_t first,
                                                 int32_t used, int32_t num_splits, const float* ws_ml,
                                                 const float* ws_acc, int lane) {
  constexpr int kPerLane = D / 32;
  T* out = static_cast<T*>(p.out);
  float M = -INFINITY, L = 0.f;
  const int64_t cell0 = (token * p.num_q_heads + qh) * num_splits;
  // The max over the splits, lanes striding them (a max does not depend on the order), then over the warp.
  // l != 0 (not l > 0): a NaN or inf score must reach the output as it does on the CPU, not drop a split.
  for (int32_t s = first + lane; s < used; s += 32)
    if (__ldcg(ws_ml + 2 * (cell0 + s) + 1) != 0.f) M = fmaxf(M, __ldcg(ws_ml + 2 * (cell0 + s)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  // a sink (a request's token only: used > 0) joins the denominator with no value
  const float sink = p.sinks != nullptr && used > 0 ? p.sinks[qh] : -INFINITY;  // -inf: none
  M = fmaxf(M, sink);
  float v[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) v[e] = 0.f;
  // The sums in split order (fixed, so every kernel and every batch gives the same bits); unrolled so that
  // several splits' loads are in flight at once: at long contexts this loop is the merge's latency.
#pragma unroll 4
  for (int32_t s = first; s < used; ++s) {
    const float l = __ldcg(ws_ml + 2 * (cell0 + s) + 1);
    if (l != 0.f) {
      const float w = expf(__ldcg(ws_ml + 2 * (cell0 + s)) - M);
      L += l * w;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) v[e] += __ldcg(ws_acc + (cell0 + s) * D + e * 32 + lane) * w;
    }
  }
  if (sink != -INFINITY) L += expf(sink - M);
  const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) from_float(v[e] * inv, out + (token * p.num_q_heads + qh) * D + e * 32 + lane);
  if (lane == 0 && p.lse != nullptr) p.lse[token * p.num_q_heads + qh] = L > 0.f ? M + logf(L) : -INFINITY;
}

// One warp per (token, q head), merging the token's splits in order. after_fused > 0: the fused
// tensor-core kernel already wrote padding tokens and requests of at most after_fused splits; only longer
// ones are left here.
template <typename T, int D>
__global__ void __launch_bounds__(128)
    attention_merge_kernel(const AttentionParams p, int32_t num_splits, const float* __restrict__ ws_ml,
                           const float* __restrict__ ws_acc, int32_t after_fused) {
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= p.num_tokens * p.num_q_heads) return;  // no barrier in this kernel
  const int64_t token = item / p.num_q_heads;
  const int32_t qh = int32_t(item % p.num_q_heads);
  const SplitRange range = token_split_range(p, token, num_splits);
  if (after_fused > 0 && range.used <= after_fused) return;  // warp-uniform
  merge_token_head<T, D>(p, token, qh, range.first, range.used, num_splits, ws_ml, ws_acc, int(threadIdx.x & 31));
}

// Warps per merge block; launch ceil(T * Hq / kMergeWarps) blocks of 32 * kMergeWarps threads.
constexpr int kMergeWarps = 4;

}  // namespace attention
}  // namespace adaptive_verify
