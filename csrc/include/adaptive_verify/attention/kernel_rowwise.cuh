// verify_attention, row-wise SIMT kernels (the default; validated on an H200, 2026-11-29: every CUDA test
// passes, but latency-bound at ~1 us per KV position, about 10x too slow).
//
// Split-KV in two launches whose grids depend only on host upper bounds (R, Hkv, and the block table's
// width), so a captured graph replays any lengths.
//   1. partials: block (split s, KV head h, request r); each warp takes query rows (token i, head of the
//      group) in turn, lanes split the head dim, and runs an online softmax over the split's visible
//      positions (causal, minus a draft tree's non-ancestors: tree_mask.h), writing (max, sum, acc[D]) per
//      (token, head, split);
//   2. merge: one block per token merges its splits in order by log-sum-exp.
// Same split boundaries as the CPU kernel (kSplitTokens), so outputs are batch-invariant; the dot-product
// order differs from the CPU's, so the two agree to fp32 rounding, not bit for bit.
// NOTES: this is the SIMT baseline: each warp re-reads its split's K/V for every query row it owns. The
// kernels are those validated on the H200 (launched through launch_kernel since, so the host emulator runs
// them too); kernel_mma.cuh holds the candidate replacement, selected by AttentionParams::kernel.
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/request_span.cuh"
#include "adaptive_verify/attention/tree_mask.h"
#include "adaptive_verify/dtype.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace attention {

// Element i of a cache of q's storage type T, or of an fp8 one (a runtime, warp-uniform choice: no extra
// instantiations).
template <typename T>
__device__ __forceinline__ float load_kv(const void* cache, int64_t i, bool fp8) {
  return fp8 ? to_float(static_cast<const fp8e4m3_t*>(cache)[i]) : to_float(static_cast<const T*>(cache)[i]);
}

// D: K's dims (the score); Dv: V's and the output's (D, or MLA's 512 of a 576-value latent row: V is then the
// start of the row K is, at the same address).
template <typename T, int D, int Dv>
__global__ void __launch_bounds__(128)
    attention_partials_rowwise_kernel(const AttentionParams p, int32_t num_splits, float* __restrict__ ws_ml,
                                      float* __restrict__ ws_acc) {
  constexpr int kPerLane = D / 32, kPerLaneV = Dv / 32;
  static_assert(D % 32 == 0 && Dv % 32 == 0, "lanes split the dims evenly");
  const int32_t s = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const bool fp8 = p.kv_dtype == kFloat8E4M3;
  if (s == 0 && r == 0 && threadIdx.x == 0) {
    if (fp8) count_bad_kv_scales(p, h);
    count_bad_sinks(p, h, p.num_q_heads / p.num_kv_heads);
  }
  const RequestSpan span = request_span(p, r);
  if (!span.valid) {
    if (s == 0 && h == 0 && threadIdx.x == 0 && p.query_start_loc[r + 1] != p.query_start_loc[r])
      atomicAdd(p.error_counts + kCountQueryLenOutOfRange, 1);
    return;  // its tokens are padding: the merge kernel writes zeros without reading the workspace
  }
  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t rows = span.q_len * group;
  // K's scale folds into the query (q . (k s) = (q s) . k), V's into the accumulator at the end: each cached element
  // is read as it is stored (fp8 decodes exactly), as the other kernels do.
  const float k_scale = fp8 ? kv_scale(p, h, false) : 1.f, v_scale = fp8 ? kv_scale(p, h, true) : 1.f;
  const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
  const int32_t s0 = s * kSplitTokens;
  // past this request's context, or below every token's window: the merge reads only the splits it wrote
  if (s0 > span.kv_len - 1 || s < request_first_split(p, span)) return;
  for (int32_t row = warp; row < rows; row += nwarps) {
    const int32_t i = row / group, qh = h * group + row % group;
    const int64_t token = span.begin + i;
    const int32_t context_len = span.kv_len - span.q_len;
    const int32_t last = context_len + i;  // causal bound of this row (a tree mask hides more, never less)
    const uint64_t mask = token_tree_mask(p.tree_mask, token);
    const int32_t low = window_low(mask, context_len, last, p.window_left);
    const int32_t s1 = s0 + kSplitTokens - 1 < last ? s0 + kSplitTokens - 1 : last;
    const T* qrow = static_cast<const T*>(p.q) + token * p.q_stride_t + int64_t(qh) * p.q_stride_h;
    float qv[kPerLane], acc[kPerLaneV];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) qv[e] = to_float(qrow[lane * kPerLane + e]) * p.scale * k_scale;
#pragma unroll
    for (int e = 0; e < kPerLaneV; ++e) acc[e] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int32_t from = request_window_start(context_len, p.window_left);  // no block id below it is read
    for (int32_t pos = s0 > from ? s0 : from; pos <= s1; ++pos) {
      const int32_t block = table[pos / p.block_size];
      if (block < 0 || block >= p.num_blocks) {  // cannot be checked on the host without a sync
        // Counted once per bad position, by the row that sees every position (the last token, first head).
        if (lane == 0 && h == 0 && row == rows - group) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
        continue;
      }
      // A draft tree's non-ancestors (warp-uniform: one row per warp); after the block check, so bad ids
      // are still counted once per position the request may read.
      if (!position_visible(mask, pos, context_len, last, low)) continue;
      const int64_t row_base = ((int64_t(block) * p.block_size + pos % p.block_size) * p.num_kv_heads + h) * D;
      const int64_t base = row_base + lane * kPerLane, v_base = row_base + lane * kPerLaneV;
      float sc = 0.f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) sc += qv[e] * load_kv<T>(p.k_cache, base + e, fp8);
      for (int off = 16; off > 0; off >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, off);
      if (p.softcap > 0.f) sc = p.softcap * tanhf(sc / p.softcap);
      if (sc > m) {
        const float c = expf(m - sc);
        l *= c;
#pragma unroll
        for (int e = 0; e < kPerLaneV; ++e) acc[e] *= c;
        m = sc;
      }
      const float w = expf(sc - m);
      l += w;
#pragma unroll
      for (int e = 0; e < kPerLaneV; ++e) acc[e] += w * load_kv<T>(p.v_cache, v_base + e, fp8);
    }
    const int64_t cell = (token * p.num_q_heads + qh) * num_splits + s;
    if (lane == 0) {
      ws_ml[2 * cell] = m;
      ws_ml[2 * cell + 1] = l;
    }
#pragma unroll
    for (int e = 0; e < kPerLaneV; ++e) ws_acc[cell * Dv + lane * kPerLaneV + e] = acc[e] * v_scale;
  }
}

template <typename T, int D>  // D: the output's dims (value_dim)
__global__ void __launch_bounds__(128)
    attention_merge_rowwise_kernel(const AttentionParams p, int32_t num_splits, const float* __restrict__ ws_ml,
                                   const float* __restrict__ ws_acc) {
  const int64_t token = blockIdx.x;
  T* out = static_cast<T*>(p.out);
  const SplitRange range = token_split_range(p, token, num_splits);
  const int32_t first = range.first, used = range.used;
  for (int32_t qh = 0; qh < p.num_q_heads; ++qh) {
    float M = -INFINITY, L = 0.f;
    const int64_t cell0 = (token * p.num_q_heads + qh) * num_splits;
    // l != 0 (not l > 0): a NaN or inf score must reach the output as it does on the CPU, not drop a split.
    for (int32_t s = first; s < used; ++s)
      if (ws_ml[2 * (cell0 + s) + 1] != 0.f) M = fmaxf(M, ws_ml[2 * (cell0 + s)]);
    // a sink (a request's token only) joins the denominator with no value
    const float sink = p.sinks != nullptr && used > 0 ? p.sinks[qh] : -INFINITY;  // -inf: none
    M = fmaxf(M, sink);
    for (int32_t s = first; s < used; ++s) {
      const float l = ws_ml[2 * (cell0 + s) + 1];
      if (l != 0.f) L += l * expf(ws_ml[2 * (cell0 + s)] - M);
    }
    if (sink != -INFINITY) L += expf(sink - M);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float v = 0.f;
      for (int32_t s = first; s < used; ++s) {
        const float l = ws_ml[2 * (cell0 + s) + 1];
        if (l != 0.f) v += ws_acc[(cell0 + s) * D + d] * expf(ws_ml[2 * (cell0 + s)] - M);
      }
      from_float(v * inv, out + (token * p.num_q_heads + qh) * D + d);
    }
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[token * p.num_q_heads + qh] = L > 0.f ? M + logf(L) : -INFINITY;
  }
}

// Both launches of the row-wise kernel; workspace split as in launch_verify_attention (kernel.cuh).
template <typename T, int D, int Dv = D>
inline cudaError_t launch_attention_rowwise(const AttentionParams& p, int32_t num_splits, float* ws_ml,
                                            float* ws_acc, cudaStream_t stream) {
  const dim3 grid_partials(unsigned(num_splits), unsigned(p.num_kv_heads), unsigned(p.num_reqs > 0 ? p.num_reqs : 1));
  if (p.num_reqs > 0) {
    const cudaError_t err = launch_kernel(attention_partials_rowwise_kernel<T, D, Dv>, grid_partials, dim3(128), 0,
                                          stream, p, num_splits, ws_ml, ws_acc);
    if (err != cudaSuccess) return err;
  }
  return launch_kernel(attention_merge_rowwise_kernel<T, Dv>, dim3(unsigned(p.num_tokens)), dim3(128), 0, stream, p,
                       num_splits, ws_ml, ws_acc);
}

}  // namespace attention
}  // namespace adaptive_verify
