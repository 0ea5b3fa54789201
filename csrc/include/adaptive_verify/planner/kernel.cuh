// CUDA planner: the one planner algorithm (algorithm.h) run by one thread block, survival -> budget ->
// allocation -> metadata in ONE launch with no host synchronisation, so an engine can capture it in a CUDA
// graph. Draft trees run the same kernel (Params::parents set: algorithm.h calls tree.h's per-request pieces).
// Also the kernel of prefix_survival and tree_survival (one thread per request).
//
// NOTES:
//  - One block is the right shape: a decode step has at most a few thousand candidates, and every phase
//    needs a block-wide barrier; a multi-block version would need grid syncs or more launches and would be
//    bound by launch latency anyway.
//  - The backend below supplies block-wide reductions (warp shuffles, one slot per warp), shared-memory
//    atomics for the histogram and the gather, and the in-bucket sort as rank-by-counting (each candidate
//    counts the keys below its own in its bucket: cost the sum of squared bucket sizes over the threads,
//    small for the spread-out survivals of real drafts, O(n^2 / threads) when everything ties).
//  - The workspace lives in dynamic shared memory up to kMaxSmemBytes (12 bytes per slot plus the bucket
//    counters), else in a global workspace the caller allocates (plan_workspace_bytes), with the same code.
//  - The tensor-parallel guarantee (every rank plans the same integers) comes from algorithm.h: integer
//    ranking, fixed-point sums and one double division per Theta, identical on every backend.
// Written without a GPU (2026-12-01): its source runs in the CPU suite under the host emulator
// (tests/test_planner_emu.py, integer for integer against the CPU kernel). The earlier bitonic-sort kernel,
// validated on an H200 at 42 us for R=256, K=8, was removed with the unification (docs/design.md).
#pragma once

#include <cstdint>

#include "adaptive_verify/launch.h"
#include "adaptive_verify/planner/algorithm.h"
#include "adaptive_verify/planner/cuda_shape.h"
#include "adaptive_verify/planner/math.h"
#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

namespace detail {

// Block-wide scratch: one slot per warp plus a broadcast slot.
struct Scratch {
  int64_t i64[33];
  double f64[33];
};

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ int64_t warp_min(int64_t v) {
  for (int off = 16; off > 0; off >>= 1) {
    const int64_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o < v ? o : v;
  }
  return v;
}

// (t, b) with the larger t, ties to the smaller b; b < 0 means "no candidate" and never wins.
__device__ __forceinline__ void argmax_step(double& t, int64_t& b, double ot, int64_t ob) {
  if (ob >= 0 && (b < 0 || ot > t || (ot == t && ob < b))) {
    t = ot;
    b = ob;
  }
}

}  // namespace detail

// The block backend of algorithm.h: every reduction returns the same value to every thread.
struct CudaBackend {
  static constexpr bool kStrict = false;           // bad inputs are clamped and counted (no host sync)
  static constexpr int64_t kFirstScanChunk = 1024;  // greedy: order a whole block's worth of ranks at once
  detail::Scratch& s;

  __device__ int tid() const { return int(threadIdx.x); }
  __device__ int threads() const { return int(blockDim.x); }
  __device__ void sync() { __syncthreads(); }

  __device__ uint64_t sum(uint64_t v) {
    const int lane = tid() & 31, warp = tid() >> 5, nwarps = threads() >> 5;
    int64_t x = detail::warp_sum(int64_t(v));
    if (lane == 0) s.i64[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t w = lane < nwarps ? s.i64[lane] : 0;
      w = detail::warp_sum(w);
      if (lane == 0) s.i64[32] = w;
    }
    __syncthreads();
    const int64_t total = s.i64[32];
    __syncthreads();
    return uint64_t(total);
  }

  __device__ int64_t min(int64_t v) {
    const int lane = tid() & 31, warp = tid() >> 5, nwarps = threads() >> 5;
    v = detail::warp_min(v);
    if (lane == 0) s.i64[warp] = v;
    __syncthreads();
    if (warp == 0) {
      int64_t w = lane < nwarps ? s.i64[lane] : INT64_MAX;
      w = detail::warp_min(w);
      if (lane == 0) s.i64[32] = w;
    }
    __syncthreads();
    const int64_t out = s.i64[32];
    __syncthreads();
    return out;
  }

  // Exclusive prefix sum in thread order; *total gets the block total.
  __device__ uint64_t exclusive_scan(uint64_t v, uint64_t* total) {
    const int lane = tid() & 31, warp = tid() >> 5, nwarps = threads() >> 5;
    int64_t x = int64_t(v);
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (lane == 31) s.i64[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t w = lane < nwarps ? s.i64[lane] : 0;
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, w, off);
        if (lane >= off) w += y;
      }
      if (lane < nwarps) s.i64[lane] = w;
    }
    __syncthreads();
    const int64_t before = warp > 0 ? s.i64[warp - 1] : 0;
    *total = uint64_t(s.i64[nwarps - 1]);
    __syncthreads();
    return uint64_t(before + x - int64_t(v));
  }

  __device__ void argmax(double t, int64_t b, double* t_out, int64_t* b_out) {
    const int lane = tid() & 31, warp = tid() >> 5, nwarps = threads() >> 5;
    for (int off = 16; off > 0; off >>= 1)
      detail::argmax_step(t, b, __shfl_xor_sync(0xffffffffu, t, off), __shfl_xor_sync(0xffffffffu, b, off));
    if (lane == 0) {
      s.f64[warp] = t;
      s.i64[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
      double wt = lane < nwarps ? s.f64[lane] : 0.0;
      int64_t wb = lane < nwarps ? s.i64[lane] : -1;
      for (int off = 16; off > 0; off >>= 1)
        detail::argmax_step(wt, wb, __shfl_xor_sync(0xffffffffu, wt, off), __shfl_xor_sync(0xffffffffu, wb, off));
      if (lane == 0) {
        s.f64[32] = wt;
        s.i64[32] = wb;
      }
    }
    __syncthreads();
    *t_out = s.f64[32];
    *b_out = s.i64[32];
    __syncthreads();
  }

  __device__ int32_t fetch_add(int32_t* a, int32_t v) { return atomicAdd(a, v); }
  __device__ void add(int32_t* a, int32_t v) { atomicAdd(a, v); }
  __device__ void add(uint64_t* a, uint64_t v) {
    atomicAdd(reinterpret_cast<unsigned long long*>(a), static_cast<unsigned long long>(v));
  }
  __device__ void count_error(int32_t* counters, int slot, int32_t n) {
    if (counters != nullptr) atomicAdd(counters + slot, n);
  }

  // The phases with no CUDA-specific version: algorithm.h's, strided over the block.
  __device__ WalkTotals walk_and_count(const Params& p, const Workspace& ws, const Buckets& bk) {
    return generic_walk_and_count(p, *this, ws, bk);
  }
  // choose_tree_shape's widths: no room to keep the words (the workspace may be shared memory), so walk again.
  __device__ void keep_words(const Workspace&, int64_t) {}
  __device__ void restore_words(const Params& p, const Workspace& ws, const Buckets& bk, int64_t) {
    generic_walk_and_count(p, *this, ws, bk);
  }
  __device__ void gather(const Workspace& ws, const Buckets& bk, int64_t n_slots, int32_t lo, int32_t hi) {
    generic_gather(*this, ws, bk, n_slots, lo, hi);
  }
  __device__ void count_verified(const Params& p, const Workspace& ws, const Threshold& th) {
    generic_count_verified(p, *this, ws, th);
  }
  __device__ MetadataTotals write_metadata(const Params& p, const Workspace& ws) {
    return generic_write_metadata(p, *this, ws);
  }

  // Orders each bucket of [k0, k1) by candidate key: every candidate's rank is its bucket's start plus the
  // keys below its own there (keys are unique: position and request differ), written to tmp, copied back.
  __device__ void sort_buckets(const Workspace& ws, const Buckets& bk, int32_t K, int32_t k0, int32_t k1) {
    const int64_t lo = ws.count[k0], hi = ws.count[k1];
    for (int64_t e = lo + tid(); e < hi; e += threads()) {
      const int32_t i = ws.sorted[e], u = ws.words[i], k = bk.of(u);
      const int64_t b = ws.count[k], end = ws.count[k + 1];
      int64_t rank = b;
      if (end - b > 1) {
        const uint64_t key = slot_key(ws, u, i, K);
        for (int64_t q = b; q < end; ++q) {
          const int32_t iq = ws.sorted[q];
          rank += slot_key(ws, ws.words[iq], iq, K) < key;
        }
      }
      ws.tmp[rank] = i;
    }
    __syncthreads();
    for (int64_t e = lo + tid(); e < hi; e += threads()) ws.sorted[e] = ws.tmp[e];
    __syncthreads();
  }
};

__global__ void __launch_bounds__(KernelConfig::kMaxThreads) prefix_survival_kernel(const SurvivalParams p) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.num_reqs) return;
  int32_t d = p.drafts[r];
  if (d < 0 || d > p.max_drafts) {
    atomicAdd(p.error_counts + kCountDraftsOutOfRange, 1);
    d = d < 0 ? 0 : p.max_drafts;
  }
  const float* conf = p.conf + int64_t(r) * p.conf_stride;
  float* out = p.survival + int64_t(r) * p.max_drafts;
  int32_t bad_parents = 0;
  const int32_t nan_count = p.parents != nullptr ? tree_survival_row(conf, p.parents + int64_t(r) * p.parents_stride,
                                                                     d, p.max_drafts, out, &bad_parents)
                                                 : survival_row(conf, d, p.max_drafts, out);
  if (nan_count) atomicAdd(p.error_counts + kCountNanSurvival, nan_count);
  if (bad_parents) atomicAdd(p.error_counts + kCountBadParent, bad_parents);
}

// kDepth: choose_draft_depth (algorithm.h plan's depth instantiation), the same workspace on at most
// kMaxDepthThreads threads: its depth loop holds the budget search and the per-depth state together, which at 1024
// threads' 64 registers spilled; at 512 it has 128 (the walk and the per-depth counts are strided loops anyway).
template <bool kDepth>
__global__ void __launch_bounds__(kDepth ? KernelConfig::kMaxDepthThreads : KernelConfig::kMaxThreads)
    plan_kernel(const Params p) {
  AV_DYNAMIC_SMEM(smem);
  __shared__ detail::Scratch scratch;
  const WorkspaceLayout layout = plan_layout(p.num_reqs, p.max_drafts, p.min_verify > 0, p.parents != nullptr);
  unsigned char* base = p.workspace != nullptr ? static_cast<unsigned char*>(p.workspace) : smem;
  CudaBackend be{scratch};
  plan<CudaBackend, kDepth>(p, be, carve_workspace(base, layout));  // device statuses are counters, never a return
}

inline cudaError_t launch_prefix_survival(const SurvivalParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  const int threads = 128;
  return launch_kernel(prefix_survival_kernel, dim3(unsigned((p.num_reqs + threads - 1) / threads)), dim3(threads),
                       0, stream, p);
}

inline cudaError_t launch_plan(const Params& p, cudaStream_t stream) {
  const WorkspaceLayout layout = plan_layout(p.num_reqs, p.max_drafts, p.min_verify > 0, p.parents != nullptr);
  const bool smem = layout.bytes <= KernelConfig::kMaxSmemBytes;
  if (!smem && p.workspace == nullptr) return cudaErrorInvalidValue;
  static bool opted_in[2][64] = {};  // per kernel (plan, depth), per device
  const auto kernel = p.choose_depth ? plan_kernel<true> : plan_kernel<false>;
  const cudaError_t err = opt_in_smem(kernel, int(KernelConfig::kMaxSmemBytes), opted_in[p.choose_depth ? 1 : 0]);
  if (err != cudaSuccess) return err;
  Params q = p;
  if (smem) q.workspace = nullptr;
  int threads = plan_threads(int64_t(p.num_reqs) * p.max_drafts, p.num_reqs);  // (the layout is sized for these)
  if (p.choose_depth && threads > KernelConfig::kMaxDepthThreads) threads = KernelConfig::kMaxDepthThreads;
  return launch_kernel(kernel, dim3(1), dim3(unsigned(threads)), smem ? size_t(layout.bytes) : 0, stream, q);
}

}  // namespace planner
}  // namespace adaptive_verify
