// CUDA planner: survival -> keys -> sort -> budget -> allocation -> metadata in ONE launch of one
// thread block, with no host synchronisation, so an engine can capture it in a CUDA graph.
//
// NOTES:
//  - One block is the right shape: a decode step has at most a few thousand candidates, and every
//    phase needs a block-wide barrier; a multi-block version would need grid syncs or more launches
//    and would be bound by launch latency anyway.
//  - Keys live in shared memory up to kMaxSmemKeys (128 KiB of uint64, within the 227 KiB a Hopper or
//    Blackwell block can opt into). Larger problems keep the keys in a global workspace with the
//    same code: still one launch, slower sort (__syncthreads orders global memory within a block).
//  - The bitonic sort is data-oblivious: its cost depends only on next_pow2(R * K).
#pragma once

#if !defined(AV_CUDA_EMULATION)  // tests/emu runs the kernels on the host
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "adaptive_verify/planner/math.h"
#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

struct KernelConfig {
  static constexpr int kMaxThreads = 1024;
  static constexpr int kMinThreads = 64;
  static constexpr int64_t kMaxSmemKeys = 16384;  // 128 KiB of keys
  static_assert(kMaxThreads % 32 == 0 && kMinThreads % 32 == 0, "block reductions work per full warp");
  static_assert(kMaxSmemKeys * sizeof(uint64_t) <= 200 * 1024,
                "keys plus reduction scratch must fit the 227 KiB opt-in shared memory of sm_90/sm_100");
};

inline int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Keys held in a global workspace (0 when they fit shared memory).
inline int64_t workspace_keys(int64_t num_reqs, int64_t max_drafts) {
  const int64_t n_pad = next_pow2(num_reqs * max_drafts);
  return n_pad > KernelConfig::kMaxSmemKeys ? n_pad : 0;
}

inline int threads_for(int64_t n_pad, int64_t num_reqs) {
  int64_t want = n_pad / 2 > num_reqs ? n_pad / 2 : num_reqs;
  want = (want + 31) / 32 * 32;
  if (want < KernelConfig::kMinThreads) want = KernelConfig::kMinThreads;
  if (want > KernelConfig::kMaxThreads) want = KernelConfig::kMaxThreads;
  return int(want);
}

namespace detail {

// Block-wide scratch: one slot per warp plus a broadcast slot.
struct Scratch {
  int64_t i64[33];
  double f64[32];
};

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block, returned to every thread.
__device__ int64_t block_sum(int64_t v, Scratch& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) s.i64[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < nwarps ? s.i64[lane] : 0;
    w = warp_sum(w);
    if (lane == 0) s.i64[32] = w;
  }
  __syncthreads();
  const int64_t total = s.i64[32];
  __syncthreads();
  return total;
}

// Minimum over the block, returned to every thread.
__device__ int64_t block_min(int64_t v, Scratch& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const int64_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o < v ? o : v;
  }
  if (lane == 0) s.i64[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < nwarps ? s.i64[lane] : INT64_MAX;
    for (int off = 16; off > 0; off >>= 1) {
      const int64_t o = __shfl_xor_sync(0xffffffffu, w, off);
      w = o < w ? o : w;
    }
    if (lane == 0) s.i64[32] = w;
  }
  __syncthreads();
  const int64_t out = s.i64[32];
  __syncthreads();
  return out;
}

// (theta, b) with the largest theta, ties to the smallest b; b of the winner returned to every thread.
__device__ __forceinline__ void argmax_step(double& t, int64_t& b, double ot, int64_t ob) {
  if (ot > t || (ot == t && ob < b)) {
    t = ot;
    b = ob;
  }
}

__device__ int64_t block_argmax(double t, int64_t b, Scratch& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1)
    argmax_step(t, b, __shfl_xor_sync(0xffffffffu, t, off), __shfl_xor_sync(0xffffffffu, b, off));
  if (lane == 0) {
    s.f64[warp] = t;
    s.i64[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    double wt = lane < nwarps ? s.f64[lane] : -INFINITY;
    int64_t wb = lane < nwarps ? s.i64[lane] : INT64_MAX;
    for (int off = 16; off > 0; off >>= 1)
      argmax_step(wt, wb, __shfl_xor_sync(0xffffffffu, wt, off), __shfl_xor_sync(0xffffffffu, wb, off));
    if (lane == 0) s.i64[32] = wb;
  }
  __syncthreads();
  const int64_t out = s.i64[32];
  __syncthreads();
  return out;
}

// Exclusive prefix sum over the block in thread order; *total gets the block total.
__device__ int64_t block_exclusive_scan(int64_t v, int64_t* total, Scratch& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int64_t x = v;
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
  *total = s.i64[nwarps - 1];
  __syncthreads();
  return before + x - v;
}

// In-place ascending bitonic sort of n (a power of two) keys by the whole block.
__device__ void bitonic_sort(uint64_t* keys, int64_t n) {
  for (int64_t k = 2; k <= n; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int64_t lo = 2 * j * (i / j) + (i % j), hi = lo + j;
        const uint64_t a = keys[lo], b = keys[hi];
        const bool ascending = (lo & k) == 0;
        if ((a > b) == ascending) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace detail

__global__ void __launch_bounds__(KernelConfig::kMaxThreads) prefix_survival_kernel(const SurvivalParams p) {
  const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.num_reqs) return;
  int32_t d = p.drafts[r];
  if (d < 0 || d > p.max_drafts) {
    atomicAdd(p.error_counts + kCountDraftsOutOfRange, 1);
    d = d < 0 ? 0 : p.max_drafts;
  }
  const float* row = p.conf + int64_t(r) * p.conf_stride;
  float* out = p.survival + int64_t(r) * p.max_drafts;
  float a = 1.f;
  int32_t nan_count = 0;
  for (int32_t j = 0; j < p.max_drafts; ++j) {
    if (j < d) {
      const float c = row[j];
      nan_count += c != c;
      a = __fmul_rn(a, sanitize(c));  // explicit rounding: identical to the CPU's float multiply
      out[j] = a;
    } else {
      out[j] = 0.f;
    }
  }
  if (nan_count) atomicAdd(p.error_counts + kCountNanSurvival, nan_count);
}

__global__ void __launch_bounds__(KernelConfig::kMaxThreads) plan_kernel(const Params p, int64_t n_pad) {
  AV_DYNAMIC_SMEM(smem_keys_bytes);
  uint64_t* smem_keys = reinterpret_cast<uint64_t*>(smem_keys_bytes);
  __shared__ detail::Scratch scratch;
  uint64_t* keys = p.workspace != nullptr ? p.workspace : smem_keys;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int32_t R = p.num_reqs, K = p.max_drafts;

  // ---- 1. candidate keys at [r * K + j]; everything else sorts last ----
  for (int64_t i = tid; i < n_pad; i += nthreads) keys[i] = kNoCandidate;
  __syncthreads();
  int64_t counts = 0, errors = 0;  // (candidates << 32 | forced), (NaN << 32 | bad drafts)
  for (int32_t r = tid; r < R; r += nthreads) {
    uint64_t* row_keys = keys + int64_t(r) * K;
    const RowWindow w = walk_row(p.survival + int64_t(r) * p.survival_stride, p.drafts[r], K, p.min_verify,
                                 p.max_verify, r, [&](int32_t j, uint64_t key) { row_keys[j] = key; });
    counts += (int64_t(w.cap) << 32) + w.forced;
    errors += (int64_t(w.nan_count) << 32) + int64_t(w.drafts_out_of_range);
  }
  counts = detail::block_sum(counts, scratch);
  errors = detail::block_sum(errors, scratch);
  if (tid == 0 && errors != 0) {
    if (errors >> 32) atomicAdd(p.error_counts + kCountNanSurvival, int32_t(errors >> 32));
    if (errors & 0xffffffff) atomicAdd(p.error_counts + kCountDraftsOutOfRange, int32_t(errors & 0xffffffff));
  }
  const int64_t n_cand = counts >> 32, n_forced = counts & 0xffffffff;

  // ---- 2. canonical order ----
  detail::bitonic_sort(keys, n_pad);

  // ---- 3. budget: each thread owns a contiguous run of ranks ----
  const int64_t b_max = n_cand < p.budget_cap ? n_cand : p.budget_cap;
  const int64_t b_min = n_forced < b_max ? n_forced : b_max;
  const ThetaEval theta{uint64_t(R + p.extra_emitting) << 32, R + p.extra_tokens, p.verify_cost,
                        p.verify_cost_len, p.draft_cost};
  const int64_t chunk = (n_pad + nthreads - 1) / nthreads;
  const int64_t begin = tid * chunk < b_max ? tid * chunk : b_max;
  const int64_t end = begin + chunk < b_max ? begin + chunk : b_max;
  int64_t budget;
  if (p.mode == kGreedy || p.mode == kGlobal) {
    int64_t local = 0;
    for (int64_t i = begin; i < end; ++i) local += int64_t(to_fixed(key_survival(keys[i])));
    int64_t unused;
    uint64_t prefix = uint64_t(detail::block_exclusive_scan(local, &unused, scratch));  // P(begin)
    if (p.mode == kGreedy) {
      // Algorithm 1 stops at the first b >= B_min where admitting rank b does not raise Theta.
      int64_t stop = b_max;
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t next = prefix + to_fixed(key_survival(keys[i]));
        if (i >= b_min && !(theta(i + 1, next) > theta(i, prefix))) {
          stop = i;
          break;
        }
        prefix = next;
      }
      budget = detail::block_min(stop, scratch);
    } else {
      double best_t = -INFINITY;  // Theta >= 0 for valid cost tables; -inf keeps any value a candidate
      int64_t best_b = INT64_MAX;
      if (tid == 0 && b_min == 0) {
        best_t = theta(0, 0);
        best_b = 0;
      }
      for (int64_t i = begin; i < end; ++i) {
        prefix += to_fixed(key_survival(keys[i]));
        if (i + 1 >= b_min) {
          const double t = theta(i + 1, prefix);
          if (t > best_t) {
            best_t = t;
            best_b = i + 1;
          }
        }
      }
      budget = detail::block_argmax(best_t, best_b, scratch);
      if (budget == INT64_MAX) budget = b_min;  // every Theta NaN: as the CPU's scan, keep B_min
    }
  } else if (p.mode == kFixed) {
    const int64_t want = p.budget_in != nullptr ? int64_t(*p.budget_in) : p.fixed_budget;
    budget = want < b_min ? b_min : (want > b_max ? b_max : want);
  } else {
    budget = b_max;
  }
  int64_t local = 0;
  {
    const int64_t e = end < budget ? end : budget;
    for (int64_t i = begin; i < e; ++i) local += int64_t(to_fixed(key_survival(keys[i])));
  }
  const uint64_t prefix = uint64_t(detail::block_sum(local, scratch));
  const uint64_t threshold = budget < n_pad ? keys[budget] : kNoCandidate;
  if (tid == 0) {
    *p.budget_out = int32_t(budget);
    if (p.expected_tokens != nullptr)
      *p.expected_tokens = float(double((uint64_t(R) << 32) + prefix) / kFixedOne);
  }
  if (!p.write_plan) return;  // choose_budget: budget only

  // ---- 4. allocation + per-request metadata: each thread owns a contiguous run of requests ----
  const int32_t rows = (R + nthreads - 1) / nthreads;
  const int32_t r_begin = tid * rows < R ? tid * rows : R;
  const int32_t r_end = r_begin + rows < R ? r_begin + rows : R;
  int64_t my_tokens = 0;
  for (int32_t r = r_begin; r < r_end; ++r) {
    int32_t L = 0;
    walk_row(p.survival + int64_t(r) * p.survival_stride, p.drafts[r], K, p.min_verify, p.max_verify, r,
             [&](int32_t, uint64_t key) { L += key < threshold; });
    p.verify_lens[r] = L;
    my_tokens += 1 + L;
  }
  int64_t total;
  int64_t tok = detail::block_exclusive_scan(my_tokens, &total, scratch);
  int32_t slot_errors = 0;
  for (int32_t r = r_begin; r < r_end; ++r) {
    const int32_t q = 1 + p.verify_lens[r];
    if (p.query_start_loc) p.query_start_loc[r] = int32_t(p.token_offset + tok);
    const int32_t ctx = p.context_lens ? p.context_lens[r] : 0;
    if (p.seq_lens) p.seq_lens[r] = ctx + q;
    for (int32_t i = 0; i < q; ++i, ++tok) {
      if (p.token_req) p.token_req[tok] = r;
      if (p.positions) p.positions[tok] = ctx + i;
      if (p.slot_mapping) {
        const int64_t slot = slot_of(p.block_table + int64_t(r) * p.block_table_stride, p.max_blocks,
                                     p.block_size, int64_t(ctx) + i);
        slot_errors += slot < 0;
        p.slot_mapping[tok] = slot;
      }
      if (p.input_ids)
        p.input_ids[tok] = i == 0 ? p.anchor_tokens[r] : p.draft_tokens[int64_t(r) * p.draft_tokens_stride + i - 1];
    }
  }
  if (slot_errors) atomicAdd(p.error_counts + kCountSlotOutOfRange, slot_errors);

  // ---- 5. padding lanes: every element of every padded buffer is written ----
  const int32_t end_tok = int32_t(p.token_offset + total);
  for (int32_t r = R + tid; r < p.num_reqs_padded; r += nthreads) {
    p.verify_lens[r] = 0;
    if (p.query_start_loc) p.query_start_loc[r] = end_tok;
    if (p.seq_lens) p.seq_lens[r] = 0;
  }
  if (tid == 0) {
    if (p.query_start_loc) p.query_start_loc[p.num_reqs_padded] = end_tok;
    if (p.num_tokens) *p.num_tokens = end_tok;
  }
  for (int64_t t = total + tid; t < p.num_tokens_padded; t += nthreads) {
    if (p.token_req) p.token_req[t] = -1;
    if (p.positions) p.positions[t] = 0;
    if (p.slot_mapping) p.slot_mapping[t] = -1;
    if (p.input_ids) p.input_ids[t] = 0;
  }
}

#if !defined(AV_CUDA_EMULATION)
// Launchers: raw pointers and a stream in, cudaError_t out.
inline cudaError_t launch_prefix_survival(const SurvivalParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  const int threads = 128;
  prefix_survival_kernel<<<(p.num_reqs + threads - 1) / threads, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

inline cudaError_t launch_plan(const Params& p, cudaStream_t stream) {
  const int64_t n_pad = next_pow2(int64_t(p.num_reqs) * p.max_drafts);
  const bool smem = workspace_keys(p.num_reqs, p.max_drafts) == 0;
  if (!smem && p.workspace == nullptr) return cudaErrorInvalidValue;
  const size_t smem_bytes = smem ? size_t(n_pad) * sizeof(uint64_t) : 0;
  // Opt in to large dynamic shared memory once per device (a function attribute, not a stream op).
  static bool opted_in[64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 64 && !opted_in[device]) {
    err = cudaFuncSetAttribute(plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(KernelConfig::kMaxSmemKeys * sizeof(uint64_t)));
    if (err != cudaSuccess) return err;
    opted_in[device] = true;
  }
  Params q = p;
  if (smem) q.workspace = nullptr;
  plan_kernel<<<1, threads_for(n_pad, p.num_reqs), smem_bytes, stream>>>(q, n_pad);
  return cudaGetLastError();
}

#endif  // !AV_CUDA_EMULATION

}  // namespace planner
}  // namespace adaptive_verify
