// CUDA kernels of the confidence area. All are bandwidth-bound streams over their inputs:
// - confidence: one block per request; the K * S (row, H-slice) dot products are spread over the warps
//   with 16-byte loads, partial sums combined in a fixed order (deterministic run to run);
// - draft_margin: one block per (request, position) row streaming the vocabulary with 16-byte loads;
// - confidence_from_logits and the statistics update: one thread per element.
#pragma once


#include <cstdint>

#include "adaptive_verify/confidence/math.h"
#include "adaptive_verify/confidence/params.h"
#include "adaptive_verify/dtype.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace confidence {

struct ConfidenceConfig {
  static constexpr int kWarps = 8;  // 256 threads: enough loads in flight per SM at decode-size R
  static constexpr int kMaxSlices = kWarps;
  static constexpr int kBytesPerLoad = 16;
};

template <typename T>
struct VecWidth {
  static constexpr int value = ConfidenceConfig::kBytesPerLoad / sizeof(T);  // 4 floats or 8 halves
};

// Dot product of x[0, n) and w[0, n) by one warp; the full sum is returned to lane 0.
template <typename T, bool kVec>
__device__ float warp_dot(const T* x, const float* w, int64_t n) {
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  int64_t i = 0;
  if constexpr (kVec) {
    constexpr int V = VecWidth<T>::value;
    const int64_t n_vec = n / V * V;
    for (i = int64_t(lane) * V; i < n_vec; i += 32 * V) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + i);
      const T* xv = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; k += 4) {
        const float4 wv = *reinterpret_cast<const float4*>(w + i + k);
        acc = fmaf(to_float(xv[k + 0]), wv.x, acc);
        acc = fmaf(to_float(xv[k + 1]), wv.y, acc);
        acc = fmaf(to_float(xv[k + 2]), wv.z, acc);
        acc = fmaf(to_float(xv[k + 3]), wv.w, acc);
      }
    }
    i = n_vec;
  }
  for (int64_t t = i + lane; t < n; t += 32) acc = fmaf(to_float(x[t]), w[t], acc);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(ConfidenceConfig::kWarps * 32) confidence_kernel(const ConfidenceParams p, int32_t slices) {
  constexpr int kWarps = ConfidenceConfig::kWarps;
  __shared__ float partial[32][ConfidenceConfig::kMaxSlices];  // [K][S]
  __shared__ float conf[32];
  const int32_t r = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t K = p.max_drafts;
  const T* hidden = static_cast<const T*>(p.hidden) + int64_t(r) * p.hidden_stride_r;
  const T* markov = static_cast<const T*>(p.markov);
  // Slice boundaries are multiples of the vector width so every slice starts 16-byte aligned.
  const int64_t H = p.hidden_size;
  const int64_t slice = ((H + slices - 1) / slices + VecWidth<T>::value - 1) / VecWidth<T>::value * VecWidth<T>::value;
  for (int item = warp; item < K * slices; item += kWarps) {
    const int32_t j = item / slices, s = item % slices;
    const int64_t begin = s * slice < H ? s * slice : H;
    const int64_t end = begin + slice < H ? begin + slice : H;
    float z = warp_dot<T, kVec>(hidden + int64_t(j) * p.hidden_stride_k + begin, p.weight + begin, end - begin);
    if (s == 0 && markov != nullptr) {
      // Q is small (a few hundred): scalar loads keep this path free of alignment conditions.
      z += warp_dot<T, false>(markov + int64_t(r) * p.markov_stride_r + int64_t(j) * p.markov_stride_k,
                              p.weight + H, p.markov_size);
    }
    if (lane == 0) partial[j][s] = z;
  }
  __syncthreads();
  if (threadIdx.x < K) {
    const int32_t j = threadIdx.x;
    float z = 0.f;
    for (int s = 0; s < slices; ++s) z += partial[j][s];
    conf[j] = head_confidence(z + (p.bias_ptr != nullptr ? *p.bias_ptr : p.bias), p.temperature, j);
  }
  __syncthreads();
  if (p.survival) {
    if (threadIdx.x == 0) {
      float a = 1.f;
      for (int32_t j = 0; j < K; ++j) {
        a = __fmul_rn(a, conf[j]);
        p.out[int64_t(r) * K + j] = a;
      }
    }
  } else if (threadIdx.x < K) {
    p.out[int64_t(r) * K + threadIdx.x] = conf[threadIdx.x];
  }
}

template <typename T>
__global__ void from_logits_kernel(const LogitParams p) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.num_reqs) return;
  const T* row = static_cast<const T*>(p.logits) + int64_t(r) * p.logits_stride;
  float a = 1.f;
  for (int32_t j = 0; j < p.max_drafts; ++j) {
    const float c = head_confidence(to_float(row[j]), p.temperature, j);
    a = p.survival ? __fmul_rn(a, c) : c;
    p.out[int64_t(r) * p.max_drafts + j] = a;
  }
}

struct MarginConfig {
  static constexpr int kThreads = 256;
};

__device__ __forceinline__ void push_checked(Top2& t, float x, int32_t& nan_count) {
  if (x != x) {
    ++nan_count;
    return;
  }
  t.push(x);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(MarginConfig::kThreads) margin_kernel(const MarginParams p) {
  __shared__ float s_first[MarginConfig::kThreads / 32], s_second[MarginConfig::kThreads / 32];
  __shared__ int32_t s_nan;
  const int32_t row_id = blockIdx.x;  // r * K + j
  const int32_t r = row_id / p.max_drafts, j = row_id % p.max_drafts;
  const T* row = static_cast<const T*>(p.logits) + int64_t(r) * p.stride_r + int64_t(j) * p.stride_k;
  if (threadIdx.x == 0) s_nan = 0;
  Top2 t{-INFINITY, -INFINITY};
  int32_t nan_count = 0;
  int64_t v = 0;
  if constexpr (kVec) {
    constexpr int V = VecWidth<T>::value;
    const int64_t n_vec = p.vocab / V * V;
    for (v = int64_t(threadIdx.x) * V; v < n_vec; v += int64_t(blockDim.x) * V) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + v);
      const T* xv = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; ++k) push_checked(t, to_float(xv[k]), nan_count);
    }
    v = n_vec;
  }
  for (int64_t u = v + threadIdx.x; u < p.vocab; u += blockDim.x) push_checked(t, to_float(row[u]), nan_count);
  for (int off = 16; off > 0; off >>= 1) {
    Top2 o{__shfl_xor_sync(0xffffffffu, t.first, off), __shfl_xor_sync(0xffffffffu, t.second, off)};
    t.merge(o);
  }
  __syncthreads();  // s_nan initialised
  if (nan_count) atomicAdd(&s_nan, nan_count);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    s_first[warp] = t.first;
    s_second[warp] = t.second;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Top2 all{-INFINITY, -INFINITY};
    for (int w = 0; w < int(blockDim.x >> 5); ++w) all.merge(Top2{s_first[w], s_second[w]});
    p.out[row_id] = all.first - all.second;
    if (s_nan) atomicAdd(p.error_counts + kCountNanLogits, s_nan);
  }
}

__global__ void stats_kernel(const StatsParams p) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(p.num_reqs) * p.max_drafts) return;
  const int32_t r = int32_t(idx / p.max_drafts), j = int32_t(idx % p.max_drafts);
  const int32_t accepted = p.num_accepted[r];
  if (j == 0 && p.totals != nullptr) {  // one thread per row adds the row to the running totals
    const int64_t v = p.verify_lens[r], a = accepted < v ? accepted : v;
    atomicAdd(reinterpret_cast<unsigned long long*>(p.totals), static_cast<unsigned long long>(v));
    atomicAdd(reinterpret_cast<unsigned long long*>(p.totals + 1), static_cast<unsigned long long>(a));
  }
  if (j >= p.verify_lens[r] || j > accepted) return;
  const int64_t position = (p.row_position != nullptr ? int64_t(p.row_position[r]) : 0) + j;
  if (position < 0 || position >= p.num_positions) {  // only row_position can put it there
    atomicAdd(p.error_counts + kCountStatsPosition, 1);
    return;
  }
  const float c = p.conf[r * p.conf_stride + j];
  if (c != c) {
    atomicAdd(p.error_counts + kCountNanConfidence, 1);
    return;
  }
  const int64_t cell = position * p.num_bins + bin_of(c, p.num_bins);
  // int64 counters through unsigned 64-bit atomics (two's complement: the same bits).
  atomicAdd(reinterpret_cast<unsigned long long*>(p.trials + cell), 1ull);
  if (j < accepted) atomicAdd(reinterpret_cast<unsigned long long*>(p.survivals + cell), 1ull);
  atomicAdd(reinterpret_cast<unsigned long long*>(p.conf_sum + cell), static_cast<unsigned long long>(conf_fixed(c)));
}


inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

inline cudaError_t launch_confidence(const ConfidenceParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0 || p.max_drafts == 0) return cudaSuccess;
  if (p.max_drafts > 32) return cudaErrorInvalidValue;
  // Small K leaves warps idle: split each row's H over several warps (fixed for given K, so the
  // summation order, hence the result, does not depend on anything but the shapes).
  int32_t slices = ConfidenceConfig::kWarps / p.max_drafts;
  slices = slices < 1 ? 1 : (slices > ConfidenceConfig::kMaxSlices ? ConfidenceConfig::kMaxSlices : slices);
  return launch_for_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t bytes = sizeof(T);
    const bool vec = aligned16(p.hidden) && aligned16(p.weight) && (p.hidden_stride_r * bytes) % 16 == 0 &&
                     (p.hidden_stride_k * bytes) % 16 == 0;
    const dim3 grid{unsigned(p.num_reqs)}, block{unsigned(ConfidenceConfig::kWarps * 32)};
    return vec ? launch_kernel(confidence_kernel<T, true>, grid, block, 0, stream, p, slices)
               : launch_kernel(confidence_kernel<T, false>, grid, block, 0, stream, p, slices);
  });
}

inline cudaError_t launch_from_logits(const LogitParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    return launch_kernel(from_logits_kernel<decltype(tag)>, dim3(unsigned((p.num_reqs + 127) / 128)), dim3(128), 0,
                         stream, p);
  });
}

inline cudaError_t launch_margin(const MarginParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.num_reqs) * p.max_drafts;
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row; the host also rejects it
  return launch_for_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t bytes = sizeof(T);
    const bool vec = aligned16(p.logits) && (p.stride_r * bytes) % 16 == 0 && (p.stride_k * bytes) % 16 == 0;
    const dim3 grid{unsigned(rows)}, block{unsigned(MarginConfig::kThreads)};
    return vec ? launch_kernel(margin_kernel<T, true>, grid, block, 0, stream, p)
               : launch_kernel(margin_kernel<T, false>, grid, block, 0, stream, p);
  });
}

inline cudaError_t launch_stats(const StatsParams& p, cudaStream_t stream) {
  const int64_t n = int64_t(p.num_reqs) * p.max_drafts;
  if (n == 0) return cudaSuccess;
  return launch_kernel(stats_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, p);
}

}  // namespace confidence
}  // namespace adaptive_verify
