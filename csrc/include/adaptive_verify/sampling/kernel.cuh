// CUDA sampler: one 256-thread block per request runs the shared algorithm (algorithm.h); every row-wide
// step is a block reduction whose result all threads receive, so control flow stays uniform.
//
// NOTES:
//  - 256 threads = sampling::kLanes: thread t owns the canonical softmax lane t (v = t, t + 256, ...) and
//    the fixed tree that follows, so the softmax sum has the CPU kernel's bits.
//  - Argmax-type reductions (greedy, races) are order-independent (ties go to the smaller id), so they
//    can use warp shuffles freely.
//  - Loads are scalar and coalesced (consecutive threads read consecutive ids); rows are read once per
//    pass, and only the rows a request needs (up to its first rejection) are read at all.
#pragma once


#include <cstdint>

#include "adaptive_verify/launch.h"
#include "adaptive_verify/sampling/algorithm.h"

namespace adaptive_verify {
namespace sampling {

struct SamplerConfig {
  static constexpr int kThreads = kLanes;
  static_assert(kThreads == 256, "the canonical softmax sum assigns one lane per thread");
};

struct BlockScratch {
  float s[SamplerConfig::kThreads / 32];
  int64_t v[SamplerConfig::kThreads / 32];
  float lanes[SamplerConfig::kThreads];
  float bcast_f;
  int64_t bcast_v;
  RankHist hist;  // one level of a truncation selection (integer counts and masses: any add order, same bits)
};

// (score, id) argmax over the warp under `better` (id < 0: none), every lane gets the warp's winner.
__device__ __forceinline__ void warp_best(float& s, int64_t& v) {
  for (int off = 16; off > 0; off >>= 1) {
    const float os = __shfl_xor_sync(0xffffffffu, s, off);
    const int64_t ov = __shfl_xor_sync(0xffffffffu, v, off);
    if (ov >= 0 && (v < 0 || better(os, ov, s, v))) {
      s = os;
      v = ov;
    }
  }
}

// (score, id) argmax over the block under `better`; every thread gets the winner's id (-1 if none).
__device__ int64_t block_best(float s, int64_t v, BlockScratch& sh) {
  warp_best(s, v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sh.s[warp] = s;
    sh.v[warp] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bs = sh.s[0];
    int64_t bv = sh.v[0];
    for (int w = 1; w < SamplerConfig::kThreads / 32; ++w)
      if (sh.v[w] >= 0 && (bv < 0 || better(sh.s[w], sh.v[w], bs, bv))) {
        bs = sh.s[w];
        bv = sh.v[w];
      }
    sh.bcast_v = bv;
  }
  __syncthreads();
  const int64_t out = sh.bcast_v;
  __syncthreads();
  return out;
}

__device__ float block_max(float m, BlockScratch& sh) {
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sh.s[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float all = sh.s[0];
    for (int w = 1; w < SamplerConfig::kThreads / 32; ++w) all = fmaxf(all, sh.s[w]);
    sh.bcast_f = all;
  }
  __syncthreads();
  const float out = sh.bcast_f;
  __syncthreads();
  return out;
}

template <typename T>
struct GpuRows {
  BlockScratch& sh;
  int32_t* error_counts;

  __device__ void count_nan(int32_t n) const {
    if (n && error_counts != nullptr) atomicAdd(error_counts + kCountNanLogits, n);
  }

  __device__ int64_t argmax(const T* row, int64_t V) const {
    ArgmaxBest best;
    for (int64_t v = threadIdx.x; v < V; v += SamplerConfig::kThreads) best.push(to_float(row[v]), v);
    count_nan(best.nan);
    const int64_t w = block_best(best.x, best.id, sh);
    return w < 0 ? 0 : w;
  }

  __device__ float max_scaled(const T* row, int64_t V, float temp, bool count) const {
    ScaledMax mx;
    for (int64_t v = threadIdx.x; v < V; v += SamplerConfig::kThreads) mx.push(fdiv(to_float(row[v]), temp));
    if (count) count_nan(mx.nan);
    return block_max(mx.m, sh);
  }

  __device__ int64_t race(const T* row, int64_t V, float temp, float m, const Rng& rng, int32_t j, uint32_t stream,
                          uint64_t limit) const {
    RaceBest best{softmax_max(m) - kRaceWindow, RaceUniforms{rng, j, stream}, limit};
    // Each thread takes 4 consecutive ids: one Philox call serves all four (argmax order is free here).
    for (int64_t v0 = int64_t(threadIdx.x) * 4; v0 < V; v0 += 4 * SamplerConfig::kThreads)
      for (int64_t v = v0; v < v0 + 4 && v < V; ++v) best.push(scaled_logit(to_float(row[v]), temp, m), v);
    const int64_t w = block_best(best.score, best.id, sh);
    return w < 0 ? 0 : w;
  }

  __device__ int64_t sampled(const T* row, int64_t V, float temp, const Truncation& t, const Rng& rng, int32_t j,
                             uint32_t stream) {
    return truncated_race<T>(*this, row, V, temp, t, rng, j, stream);
  }

  // One level of a selection (algorithm.h, RankHist), in shared memory: integer atomics, so the result does not
  // depend on the order threads add in. Every thread gets the finished histogram.
  __device__ const RankHist& rank_histogram(const T* row, int64_t V, float temp, float m, uint64_t limit,
                                            uint64_t prefix, int shift, bool with_mass) const {
    RankHist& h = sh.hist;
    __syncthreads();  // the previous level's readers are done
    for (int b = threadIdx.x; b < 256; b += SamplerConfig::kThreads) {
      h.count[b] = 0;
      h.mass[b] = 0;
      h.lo[b] = ~0ull;
      h.hi[b] = 0;
    }
    __syncthreads();
    for (int64_t v = threadIdx.x; v < V; v += SamplerConfig::kThreads) {
      uint64_t key, mass;
      const int b = rank_bucket(scaled_logit(to_float(row[v]), temp, m), v, m, limit, prefix, shift, with_mass, &key, &mass);
      if (b < 0) continue;
      atomicAdd(&h.count[b], 1u);
      if (with_mass) atomicAdd(&h.mass[b], (unsigned long long)mass);
      atomicMin(&h.lo[b], (unsigned long long)key);
      atomicMax(&h.hi[b], (unsigned long long)key);
    }
    __syncthreads();
    return h;
  }

  // Softmax max (given) and canonical sum over the kept tokens.
  __device__ SoftmaxStats softmax_stats(const T* row, int64_t V, float temp, float m, uint64_t limit) const {
    float lane = 0.f;
    for (int64_t v = threadIdx.x; v < V; v += SamplerConfig::kThreads) {
      const float z = scaled_logit(to_float(row[v]), temp, m);
      if (kept(z, v, limit)) lane = fadd(lane, av_exp(fsub(z, softmax_max(m))));
    }
    sh.lanes[threadIdx.x] = lane;
    __syncthreads();
    for (int s = SamplerConfig::kThreads / 2; s >= 1; s /= 2) {
      if (threadIdx.x < s) sh.lanes[threadIdx.x] = fadd(sh.lanes[threadIdx.x], sh.lanes[threadIdx.x + s]);
      __syncthreads();
    }
    const float sum = sh.lanes[0];
    __syncthreads();
    return SoftmaxStats{m, sum};
  }

  __device__ int64_t residual_race(const T* row, const float* q, int64_t V, float temp, const SoftmaxStats& st,
                                   const Rng& rng, int32_t j, uint64_t limit) const {
    if (!(st.max > -INFINITY)) return 0;
    ResidualBest best;
    RaceUniforms u{rng, j, kRace};
    for (int64_t v = threadIdx.x; v < V; v += SamplerConfig::kThreads)
      best.push(to_float(row[v]), q[v], temp, st, u, v, limit);
    const int64_t w = block_best(best.key_w, best.id_w, sh);
    const int64_t pw = block_best(best.key_p, best.id_p, sh);
    return w >= 0 ? w : (pw >= 0 ? pw : 0);
  }
};

template <typename T>
__global__ void __launch_bounds__(SamplerConfig::kThreads) rejection_kernel(const RejectionParams p) {
  __shared__ BlockScratch sh;
  GpuRows<T> rows{sh, p.error_counts};
  rejection_request<T>(p, blockIdx.x, rows, threadIdx.x == 0);
}

template <typename T>
__global__ void __launch_bounds__(SamplerConfig::kThreads) sample_kernel(const SampleParams p) {
  __shared__ BlockScratch sh;
  GpuRows<T> rows{sh, p.error_counts};
  sample_row<T>(p, blockIdx.x, rows, threadIdx.x == 0);
}


inline cudaError_t launch_rejection(const RejectionParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    return launch_kernel(rejection_kernel<decltype(tag)>, dim3(unsigned(p.num_reqs)), dim3(SamplerConfig::kThreads),
                         0, stream, p);
  });
}

inline cudaError_t launch_sample(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    return launch_kernel(sample_kernel<decltype(tag)>, dim3(unsigned(p.num_rows)), dim3(SamplerConfig::kThreads), 0,
                         stream, p);
  });
}

}  // namespace sampling
}  // namespace adaptive_verify
