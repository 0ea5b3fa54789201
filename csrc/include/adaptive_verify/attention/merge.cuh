// Second launch of the tiled and tensor-core verify_attention kernels (kernel_tiled.cuh, kernel_mma.cuh):
// merges each (token, q head)'s split partials by log-sum-exp, in split order, into out (and lse).
// Host-compilable under AV_CUDA_EMULATION (tests/emu), so the CPU suite runs it too.
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/request_span.cuh"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// One warp per (token, q head): lanes own columns lane + 32 * e and merge the token's splits in order.
template <typename T, int D>
__global__ void __launch_bounds__(128)
    attention_merge_kernel(const AttentionParams p, int32_t num_splits, const float* __restrict__ ws_ml,
                           const float* __restrict__ ws_acc) {
  constexpr int kPerLane = D / 32;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (item >= p.num_tokens * p.num_q_heads) return;  // no barrier in this kernel
  const int64_t token = item / p.num_q_heads;
  const int32_t qh = int32_t(item % p.num_q_heads);
  T* out = static_cast<T*>(p.out);
  const int32_t used = token_splits(p, token, num_splits);
  float M = -INFINITY, L = 0.f;
  const int64_t cell0 = (token * p.num_q_heads + qh) * num_splits;
  // l != 0 (not l > 0): a NaN or inf score must reach the output as it does on the CPU, not drop a split.
  for (int32_t s = 0; s < used; ++s)
    if (ws_ml[2 * (cell0 + s) + 1] != 0.f) M = fmaxf(M, ws_ml[2 * (cell0 + s)]);
  float v[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) v[e] = 0.f;
  for (int32_t s = 0; s < used; ++s) {
    const float l = ws_ml[2 * (cell0 + s) + 1];
    if (l != 0.f) {
      const float w = expf(ws_ml[2 * (cell0 + s)] - M);
      L += l * w;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) v[e] += ws_acc[(cell0 + s) * D + e * 32 + lane] * w;
    }
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) from_float(v[e] * inv, out + (token * p.num_q_heads + qh) * D + e * 32 + lane);
  if (lane == 0 && p.lse != nullptr) p.lse[token * p.num_q_heads + qh] = L > 0.f ? M + logf(L) : -INFINITY;
}

// Warps per merge block; launch ceil(T * Hq / kMergeWarps) blocks of 32 * kMergeWarps threads.
constexpr int kMergeWarps = 4;

}  // namespace attention
}  // namespace adaptive_verify
