// CUDA kernels of the attention area.
//
// write_kv: one thread per 16-byte word of a K or V row (per element when rows are not 16-byte aligned);
// into an fp8 cache, one thread per element, quantised. Slots of -1 are skipped; slots outside the cache are
// skipped and counted (no host sync to check them).
//
// verify_attention: two split-KV implementations, chosen per call by AttentionParams::kernel:
//   kAttentionRowwise (default): kernel_rowwise.cuh, one warp per query row; validated on an H200
//     (2026-11-29) but latency-bound (~1 us per KV position);
//   kAttentionMma / kAttentionMmaFused (the candidate): kernel_mma.cuh, tensor cores (mma.sync) with the
//     request's GQA rows packed into the MMA M dimension and a cp.async pipeline; the fused variant merges
//     in the partials launch (the last block of each (request, KV head, row chunk)); run only under the
//     host emulator (tests/emu) so far.
// A tiled SIMT candidate (K/V tiles in shared memory) was removed on 2026-12-01: it never ran on a GPU, and
// the tensor-core kernel reads K/V once for up to 128 rows where it read them once per 16.
// All write the same workspace ((max, sum) and acc[D] per (token, head, split), attention_workspace_floats
// in params.h)
// and use the same split boundaries (kSplitTokens) as the CPU kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "adaptive_verify/attention/kernel_mla.cuh"
#include "adaptive_verify/attention/kernel_rowwise.cuh"
#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/dtype.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace attention {

template <typename Word>
__global__ void write_kv_kernel(const WriteKvParams p) {
  const int64_t words_per_row = int64_t(p.head_dim) * p.elem_size / int64_t(sizeof(Word));
  const int64_t per_token = int64_t(p.num_kv_heads) * words_per_row;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.num_tokens * per_token) return;
  const int64_t t = idx / per_token, h = (idx % per_token) / words_per_row, w = idx % words_per_row;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_blocks * p.block_size) {
    if (slot != -1 && h == 0 && w == 0) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
    return;
  }
  const int64_t dst = ((slot * write_row(p) + p.cache_offset) * p.elem_size) / int64_t(sizeof(Word)) +
                      h * words_per_row + w;
  const int64_t k_src = (t * p.k_stride_t + h * p.k_stride_h) * p.elem_size / int64_t(sizeof(Word)) + w;
  static_cast<Word*>(p.k_cache)[dst] = static_cast<const Word*>(p.k)[k_src];
  if (p.v_cache == nullptr) return;  // K only (MLA)
  const int64_t v_src = (t * p.v_stride_t + h * p.v_stride_h) * p.elem_size / int64_t(sizeof(Word)) + w;
  static_cast<Word*>(p.v_cache)[dst] = static_cast<const Word*>(p.v)[v_src];
}

// write_kv into an fp8 cache: one thread per element (t, KV head, d) of K and V, x / scale in float rounded by
// float_to_fp8_e4m3 (the CPU kernel's function: the same bits). Bad slots as write_kv_kernel; a per-head scale
// that is NaN, infinite or <= 0 is used as given and counted once per KV head (by token 0's first element).
template <typename T>
__global__ void write_kv_fp8_kernel(const WriteKvParams p) {
  const int64_t per_token = int64_t(p.num_kv_heads) * p.head_dim;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.num_tokens * per_token) return;
  const int64_t t = idx / per_token, d = idx % p.head_dim;
  const int32_t h = int32_t((idx % per_token) / p.head_dim);
  const float ks = kv_scale(p, h, false), vs = kv_scale(p, h, true);
  if (t == 0 && d == 0) {
    if (p.k_scales != nullptr && !kv_scale_ok(ks)) atomicAdd(p.error_counts + kCountKvScale, 1);
    if (p.v_scales != nullptr && !kv_scale_ok(vs)) atomicAdd(p.error_counts + kCountKvScale, 1);
  }
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_blocks * p.block_size) {
    if (slot != -1 && h == 0 && d == 0) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
    return;
  }
  const int64_t dst = slot * write_row(p) + p.cache_offset + int64_t(h) * p.head_dim + d;
  const float k = to_float(static_cast<const T*>(p.k)[t * p.k_stride_t + h * p.k_stride_h + d]);
  static_cast<uint8_t*>(p.k_cache)[dst] = float_to_fp8_e4m3(k / ks);
  if (p.v_cache == nullptr) return;  // K only (MLA)
  const float v = to_float(static_cast<const T*>(p.v)[t * p.v_stride_t + h * p.v_stride_h + d]);
  static_cast<uint8_t*>(p.v_cache)[dst] = float_to_fp8_e4m3(v / vs);
}

inline cudaError_t launch_verify_attention(const AttentionParams& p, cudaStream_t stream) {
  const bool mma = p.kernel == kAttentionMma || p.kernel == kAttentionMmaFused;
  if (p.kernel != kAttentionRowwise && !mma) return cudaErrorInvalidValue;
  if (mma && p.dtype == kFloat32) return cudaErrorInvalidValue;  // tensor cores: 16-bit inputs
  if (p.kv_dtype != p.dtype && p.kv_dtype != kFloat8E4M3) return cudaErrorInvalidValue;
  const bool mla = p.head_dim == kMlaHeadDim && value_dim(p) == kMlaValueDim && p.num_kv_heads == 1 &&
                   p.v_cache == p.k_cache;
  const bool gqa = (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && value_dim(p) == p.head_dim;
  if (!mla && !gqa) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.num_reqs > 65535) return cudaErrorInvalidValue;  // grid.z
  const int32_t S = attention_splits(p);
  float* ws_ml = p.workspace;
  float* ws_acc = p.workspace + 2 * p.num_tokens * p.num_q_heads * int64_t(S);
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const bool vec_loads = aligned(p.k_cache) && aligned(p.v_cache);  // rows are 16-byte multiples
  cudaError_t err = cudaSuccess;
  const bool ok = dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto d_tag) {
      constexpr int D = decltype(d_tag)::value;
      if constexpr (sizeof(T) == 2) {
        if (mma) {
          err = launch_attention_mma<T, D>(p, S, ws_ml, ws_acc, vec_loads, stream);
          return;
        }
      }
      err = launch_attention_rowwise<T, D>(p, S, ws_ml, ws_acc, stream);
    };
    if (p.head_dim == kMlaHeadDim) {  // MLA (verify_attention_mla): 16-bit q only
      if constexpr (sizeof(T) == 2) {
        if (mma) err = launch_attention_mla_mma<T>(p, S, ws_ml, ws_acc, stream);
        else err = launch_attention_rowwise<T, kMlaHeadDim, kMlaValueDim>(p, S, ws_ml, ws_acc, stream);
      } else {
        err = cudaErrorInvalidValue;
      }
      return;
    }
    switch (p.head_dim) {
      case 64: launch(std::integral_constant<int, 64>{}); break;
      case 128: launch(std::integral_constant<int, 128>{}); break;
      case 256: launch(std::integral_constant<int, 256>{}); break;
      default: break;
    }
  });
  if (!ok) return cudaErrorInvalidValue;
  return err;
}

inline cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.cache_dtype == kFloat8E4M3) {
    const int threads = 256;
    const int64_t n = p.num_tokens * p.num_kv_heads * p.head_dim;
    const dim3 grid{unsigned((n + threads - 1) / threads)}, block{unsigned(threads)};
    if (p.dtype == kBFloat16) return launch_kernel(write_kv_fp8_kernel<bf16_t>, grid, block, 0, stream, p);
    if (p.dtype == kFloat16) return launch_kernel(write_kv_fp8_kernel<half_t>, grid, block, 0, stream, p);
    return cudaErrorInvalidValue;
  }
  const int64_t row_bytes = int64_t(p.head_dim) * p.elem_size;
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  // (aligned(nullptr): a K-only write has no V)
  const bool vec = row_bytes % 16 == 0 && aligned(p.k) && aligned(p.v) && aligned(p.k_cache) && aligned(p.v_cache) &&
                   (write_row(p) * p.elem_size) % 16 == 0 && (p.cache_offset * p.elem_size) % 16 == 0 &&
                   (p.k_stride_t * p.elem_size) % 16 == 0 && (p.k_stride_h * p.elem_size) % 16 == 0 &&
                   (p.v_stride_t * p.elem_size) % 16 == 0 && (p.v_stride_h * p.elem_size) % 16 == 0;
  const int threads = 256;
  const int64_t n = p.num_tokens * p.num_kv_heads * (vec ? row_bytes / 16 : p.head_dim);
  const dim3 grid{unsigned((n + threads - 1) / threads)}, block{unsigned(threads)};
  if (vec) return launch_kernel(write_kv_kernel<uint4>, grid, block, 0, stream, p);
  if (p.elem_size == 2) return launch_kernel(write_kv_kernel<uint16_t>, grid, block, 0, stream, p);
  return launch_kernel(write_kv_kernel<uint32_t>, grid, block, 0, stream, p);
}

}  // namespace attention
}  // namespace adaptive_verify
