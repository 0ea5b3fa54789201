// CUDA planner, second kernel ("v2", AV_PLANNER_KERNEL=v2): the same integers as the bitonic-sort kernel of
// kernel.cuh (v1) and the C++ CPU kernel, with the work of every phase spread over the block's threads.
// Still one launch of one thread block, no host synchronisation, graph-capturable. Not yet run on a GPU; its
// source runs in the CPU suite under the host emulator (tests/test_planner_emu.py: the CPU kernel's integers).
//
// NOTES: why it is faster than v1, phase by phase (n = R * K slots):
//  - Ranking words instead of 64-bit keys. A candidate's word u = bits(s) + (forced ? 2^30 : 0) (s the
//    sanitised running-minimum survival, as walk_row) orders exactly as the leading fields of candidate_key
//    (a larger word ranks earlier). The budget needs only the sorted *values* (P(b) sums survivals, and
//    candidates with equal words have equal survivals), so ties in u need no resolving there; the single
//    tie that matters, the threshold key at rank `budget`, is resolved afterwards by (position, request)
//    without any sort (see "threshold").
//  - Counting sort of the words into buckets that are linear in the survival's bits over the range the
//    candidates actually span (per half: forced, not forced), so buckets are logarithmic in s and adapt
//    to clustered inputs. Histogram and scatter are integer shared-memory atomics (the counts are exact;
//    the order inside a bucket after the scatter is arbitrary, which is harmless because a bucket is then
//    ranked by value). A bucket whose smallest and largest word are equal is already sorted; any other is
//    ranked by counting within the bucket (cost: the sum of squared sizes of the mixed buckets; with
//    ~n buckets for n candidates that is O(n) for spread-out survivals, O(n^2 / threads) at worst).
//  - Budget: P(b) for every rank from one block scan over thread-owned runs of ranks (32.32 fixed point,
//    integer, exact), Theta for every candidate b in parallel (the same ThetaEval as the CPU), then a block min (greedy: first b that
//    does not improve) or a deterministic argmax (global: largest Theta, ties to the smallest b; a NaN
//    Theta never wins; NaN at B_min keeps B_min, as the CPU's sequential scan).
//  - Threshold: with u_t the word at rank `budget`, every request's words are non-increasing in j (running
//    minimum; forced words carry the tag), so a request's words above u_t are its first a_r slots and its
//    words equal to u_t the next len_r. Candidates tied at u_t are ordered by (position, request): a
//    33-entry difference array over positions finds the threshold's position, a block scan over requests
//    its request. verify_lens[r] follows from (a_r, len_r) alone.
//  - Metadata: requests in tiles of blockDim; a block scan gives each tile's token offsets, and every thread
//    writes tokens (coalesced), finding its token's request by binary search over the tile's offsets.
//  - Memory: the sorted words and the scattered words, 2 x int32 per slot, are exactly the 8 bytes per slot
//    of v1's keys, so shared memory up to KernelConfig::kMaxSmemKeys slots and the same global workspace
//    (workspace_keys) beyond it.
#pragma once

#if !defined(AV_CUDA_EMULATION)  // tests/emu runs the kernels on the host
#include <cuda_runtime.h>
#endif

#include <climits>
#include <cstdint>

#include "adaptive_verify/planner/kernel.cuh"
#include "adaptive_verify/planner/math.h"
#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

struct KernelConfigV2 {
  static constexpr int kMaxThreads = KernelConfig::kMaxThreads;
  static constexpr int kMinThreads = 128;
  static constexpr int kSlotsPerThread = 4;  // threads ~ n / 4: a guess to tune on hardware
  static constexpr int kMaxBuckets = 2048;   // both halves together
  static constexpr int kMinBuckets = 64;
  static constexpr int32_t kForcedTag = int32_t(1) << 30;  // above the bits of every s in [0, 1]
  static constexpr int32_t kNoSlot = -1;
  static_assert(kMinBuckets / 2 >= 32, "each half needs at least 32 buckets for the shift search");
  static_assert((kMaxBuckets & (kMaxBuckets - 1)) == 0, "bucket counts are powers of two");
  static_assert(0x3f800000 < kForcedTag, "the forced tag must sit above the bits of 1.0f");
};

inline int threads_for_v2(int64_t n_slots, int64_t num_reqs) {
  int64_t want = n_slots / KernelConfigV2::kSlotsPerThread;
  if (want < num_reqs) want = num_reqs;
  want = (want + 31) / 32 * 32;
  if (want < KernelConfigV2::kMinThreads) want = KernelConfigV2::kMinThreads;
  if (want > KernelConfigV2::kMaxThreads) want = KernelConfigV2::kMaxThreads;
  return int(want);
}

inline int32_t buckets_for_v2(int64_t n_pad) {
  int64_t nb = n_pad;
  if (nb < KernelConfigV2::kMinBuckets) nb = KernelConfigV2::kMinBuckets;
  if (nb > KernelConfigV2::kMaxBuckets) nb = KernelConfigV2::kMaxBuckets;
  return int32_t(nb);
}

namespace v2 {

struct Shared {
  int32_t start[KernelConfigV2::kMaxBuckets + 1];  // counts, then first rank of each bucket
  int32_t cursor[KernelConfigV2::kMaxBuckets];     // scatter cursors
  int32_t lo[KernelConfigV2::kMaxBuckets];         // smallest word in the bucket
  int32_t hi[KernelConfigV2::kMaxBuckets];         // largest word in the bucket
  int32_t tile_off[KernelConfigV2::kMaxThreads + 1];  // token offsets of a tile of requests
  int32_t tie_diff[kMaxDrafts + 2];                // difference array of tied candidates per position
  unsigned long long n_cand, n_forced, nan_rows, bad_drafts, sum_above;
  int32_t bits_lo[2], bits_hi[2];  // survival bits range per half: 0 forced, 1 not forced
  int32_t nan_at_bmin;
  int32_t pos_t, rank_at_pos, req_t;  // threshold: position, rank among ties at it, request
};

template <typename T>
__device__ __forceinline__ T warp_add(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ int32_t warp_min(int32_t v) {
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ int32_t warp_max(int32_t v) {
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Bucket of a word: forced half first, then the non-forced half; inside a half, (hi - bits) >> shift, so a
// larger word never gets a larger bucket.
struct BucketMap {
  int32_t hi0, shift0;  // forced half: buckets [0, offset1)
  int32_t hi1, shift1, offset1;  // non-forced half

  __device__ __forceinline__ int32_t operator()(int32_t u) const {
    const int32_t bits = u & (KernelConfigV2::kForcedTag - 1);
    return u >= KernelConfigV2::kForcedTag ? (hi0 - bits) >> shift0 : offset1 + ((hi1 - bits) >> shift1);
  }
};

// Smallest shift with ((hi - lo) >> shift) < buckets: then (hi - bits) >> shift is a bucket of the half.
__device__ __forceinline__ int32_t half_shift(int32_t lo, int32_t hi, int32_t buckets) {
  if (hi < lo || buckets <= 0) return 0;  // empty half: never looked up
  int32_t shift = 0;
  while (((hi - lo) >> shift) >= buckets) ++shift;
  return shift;
}

__device__ __forceinline__ uint64_t word_fixed(int32_t u) {
  return to_fixed(bits_float(uint32_t(u) & uint32_t(KernelConfigV2::kForcedTag - 1)));
}

// (theta, b) argmax in the order of detail::argmax_step; b == INT64_MAX marks "no candidate".
__device__ __forceinline__ void consider(double& best_t, int64_t& best_b, double t, int64_t b) {
  if (t == t && (best_b == INT64_MAX || t > best_t || (t == best_t && b < best_b))) {
    best_t = t;
    best_b = b;
  }
}

}  // namespace v2

__global__ void __launch_bounds__(KernelConfigV2::kMaxThreads) plan_kernel_v2(const Params p, int64_t n_pad,
                                                                               int32_t nb) {
  using Cfg = KernelConfigV2;
  AV_DYNAMIC_SMEM(smem_words_bytes);
  uint64_t* smem_words = reinterpret_cast<uint64_t*>(smem_words_bytes);
  __shared__ v2::Shared sh;
  __shared__ detail::Scratch scratch;
  uint64_t* base = p.workspace != nullptr ? p.workspace : smem_words;
  int32_t* sorted = reinterpret_cast<int32_t*>(base);  // slot words, then the words in rank order
  int32_t* scattered = sorted + n_pad;                 // words by bucket, then (a_r | len_r << 8) per request
  const int tid = threadIdx.x, nthreads = blockDim.x, lane = tid & 31;
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const int64_t n_slots = int64_t(R) * K;

  // ---- 0. shared state ----
  for (int32_t i = tid; i < nb; i += nthreads) {
    sh.start[i] = 0;
    sh.cursor[i] = 0;
    sh.lo[i] = INT32_MAX;
    sh.hi[i] = INT32_MIN;
  }
  for (int32_t i = tid; i < kMaxDrafts + 2; i += nthreads) sh.tie_diff[i] = 0;
  if (tid == 0) {
    sh.start[nb] = 0;
    sh.n_cand = sh.n_forced = sh.nan_rows = sh.bad_drafts = sh.sum_above = 0;
    sh.bits_lo[0] = sh.bits_lo[1] = INT32_MAX;
    sh.bits_hi[0] = sh.bits_hi[1] = INT32_MIN;
    sh.nan_at_bmin = 0;
    sh.pos_t = 0;
    sh.rank_at_pos = 0;
    sh.req_t = 0;
  }
  __syncthreads();

  // ---- 1. walk: a word per slot (kNoSlot past the window), counts, survival range per half ----
  {
    uint32_t cand = 0, forced = 0, nan_rows = 0, bad = 0;
    int32_t lo0 = INT32_MAX, hi0 = INT32_MIN, lo1 = INT32_MAX, hi1 = INT32_MIN;
    for (int32_t r = tid; r < R; r += nthreads) {
      int32_t drafts = p.drafts[r];
      if (drafts < 0 || drafts > K) {
        ++bad;
        drafts = drafts < 0 ? 0 : K;
      }
      const int32_t cap = drafts < p.max_verify ? drafts : p.max_verify;
      const float* row = p.survival + int64_t(r) * p.survival_stride;
      int32_t* out = sorted + int64_t(r) * K;
      float running = 1.f;
      int32_t j = 0;
      for (; j < cap; ++j) {
        const float raw = row[j];
        if (raw != raw) {  // NaN ends the window, as walk_row
          ++nan_rows;
          break;
        }
        const float s = sanitize(raw);
        running = s < running ? s : running;
        const int32_t bits = int32_t(float_bits(running));
        if (j < p.min_verify) {
          lo0 = min(lo0, bits);
          hi0 = max(hi0, bits);
          out[j] = bits + Cfg::kForcedTag;
        } else {
          lo1 = min(lo1, bits);
          hi1 = max(hi1, bits);
          out[j] = bits;
        }
      }
      cand += uint32_t(j);
      if (p.min_verify > 0) forced += uint32_t(p.min_verify < j ? p.min_verify : j);
      for (; j < K; ++j) out[j] = Cfg::kNoSlot;
    }
    cand = v2::warp_add(cand);
    forced = v2::warp_add(forced);
    nan_rows = v2::warp_add(nan_rows);
    bad = v2::warp_add(bad);
    lo0 = v2::warp_min(lo0);
    hi0 = v2::warp_max(hi0);
    lo1 = v2::warp_min(lo1);
    hi1 = v2::warp_max(hi1);
    if (lane == 0) {
      atomicAdd(&sh.n_cand, (unsigned long long)cand);
      atomicAdd(&sh.n_forced, (unsigned long long)forced);
      atomicAdd(&sh.nan_rows, (unsigned long long)nan_rows);
      atomicAdd(&sh.bad_drafts, (unsigned long long)bad);
      atomicMin(&sh.bits_lo[0], lo0);
      atomicMax(&sh.bits_hi[0], hi0);
      atomicMin(&sh.bits_lo[1], lo1);
      atomicMax(&sh.bits_hi[1], hi1);
    }
  }
  __syncthreads();
  const int64_t n_cand = int64_t(sh.n_cand), n_forced = int64_t(sh.n_forced);
  if (tid == 0) {
    if (sh.nan_rows) atomicAdd(p.error_counts + kCountNanSurvival, int32_t(sh.nan_rows));
    if (sh.bad_drafts) atomicAdd(p.error_counts + kCountDraftsOutOfRange, int32_t(sh.bad_drafts));
  }
  v2::BucketMap bucket;
  {
    const int32_t forced_buckets = n_forced > 0 ? nb / 2 : 0;
    bucket.hi0 = sh.bits_hi[0];
    bucket.shift0 = v2::half_shift(sh.bits_lo[0], sh.bits_hi[0], forced_buckets);
    bucket.hi1 = sh.bits_hi[1];
    bucket.shift1 = v2::half_shift(sh.bits_lo[1], sh.bits_hi[1], nb - forced_buckets);
    bucket.offset1 = forced_buckets;
  }

  // ---- 2. histogram: count and word range per bucket (integer atomics: exact, order-free) ----
  // Warp-aggregated: the lanes that share a bucket (__match_any_sync) add their count once, through their
  // lowest lane; only words that differ from that lane's word update the range themselves. Many equal
  // survivals would otherwise serialise on one shared-memory address. Trip counts are warp-uniform so the
  // warp intrinsics see all 32 lanes.
  for (int64_t i0 = tid - lane; i0 < n_slots; i0 += nthreads) {
    const int64_t i = i0 + lane;
    const int32_t u = i < n_slots ? sorted[i] : Cfg::kNoSlot;
    const int32_t k = u >= 0 ? bucket(u) : -1;
    const uint32_t peers = __match_any_sync(0xffffffffu, k);
    const int leader = __ffs(peers) - 1;
    const int32_t leader_u = __shfl_sync(0xffffffffu, u, leader);
    if (k >= 0) {
      if (lane == leader) {
        atomicAdd(&sh.start[k], __popc(peers));
        atomicMin(&sh.lo[k], u);
        atomicMax(&sh.hi[k], u);
      } else if (u != leader_u) {
        atomicMin(&sh.lo[k], u);
        atomicMax(&sh.hi[k], u);
      }
    }
  }
  __syncthreads();

  // ---- 3. first rank of every bucket (start[nb] = n_cand); each thread owns a run of buckets ----
  {
    const int32_t per = (nb + nthreads) / nthreads;  // ceil((nb + 1) / nthreads)
    const int32_t k_lo = min(tid * per, nb + 1), k_hi = min(k_lo + per, nb + 1);
    int64_t local = 0;
    for (int32_t k = k_lo; k < k_hi; ++k) local += sh.start[k];
    int64_t total;
    int64_t rank = detail::block_exclusive_scan(local, &total, scratch);
    for (int32_t k = k_lo; k < k_hi; ++k) {
      const int32_t c = sh.start[k];
      sh.start[k] = int32_t(rank);
      rank += c;
    }
  }
  __syncthreads();

  // ---- 4. scatter the words into their buckets (order inside a bucket: arbitrary; warp-aggregated) ----
  for (int64_t i0 = tid - lane; i0 < n_slots; i0 += nthreads) {
    const int64_t i = i0 + lane;
    const int32_t u = i < n_slots ? sorted[i] : Cfg::kNoSlot;
    const int32_t k = u >= 0 ? bucket(u) : -1;
    const uint32_t peers = __match_any_sync(0xffffffffu, k);
    const int leader = __ffs(peers) - 1;
    int32_t slot = 0;
    if (k >= 0 && lane == leader) slot = atomicAdd(&sh.cursor[k], __popc(peers));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(peers & ((1u << lane) - 1u));
    if (k >= 0) scattered[sh.start[k] + slot] = u;
  }
  __syncthreads();

  // ---- 5. rank inside each bucket by value (equal words are interchangeable: the result is unique) ----
  for (int64_t i = tid; i < n_cand; i += nthreads) {
    const int32_t u = scattered[i];
    const int32_t k = bucket(u);
    if (sh.lo[k] == sh.hi[k]) {
      sorted[i] = u;
    } else {
      const int32_t s = sh.start[k], e = sh.start[k + 1];
      int32_t rank = s;
      for (int32_t q = s; q < e; ++q) {
        const int32_t v = scattered[q];
        rank += (v > u) | ((v == u) & (q < i));
      }
      sorted[rank] = u;
    }
  }
  __syncthreads();

  // ---- 6. budget ----
  const int64_t b_max = n_cand < p.budget_cap ? n_cand : p.budget_cap;
  const int64_t b_min = n_forced < b_max ? n_forced : b_max;
  const ThetaEval theta{uint64_t(R + p.extra_emitting) << 32, R + p.extra_tokens, p.verify_cost,
                        p.verify_cost_len, p.draft_cost};
  int64_t budget = b_max;
  if ((p.mode == kGreedy || p.mode == kGlobal) && b_min < b_max) {
    // Each thread owns a run of ranks [i_lo, i_hi): one block scan gives P at its start.
    const bool greedy = p.mode == kGreedy;
    const int64_t per = (b_max + nthreads - 1) / nthreads;
    const int64_t i_lo = min(int64_t(tid) * per, b_max), i_hi = min(i_lo + per, b_max);
    int64_t local = 0;
    for (int64_t i = i_lo; i < i_hi; ++i) local += int64_t(v2::word_fixed(sorted[i]));
    int64_t unused;
    uint64_t before = uint64_t(detail::block_exclusive_scan(local, &unused, scratch));  // P(i_lo)
    if (greedy) {
      // Algorithm 1 stops at the first b >= B_min where admitting rank b does not raise Theta.
      int64_t stop = INT64_MAX;
      for (int64_t i = i_lo; i < i_hi; ++i) {
        const uint64_t next = before + v2::word_fixed(sorted[i]);
        if (i >= b_min && !(theta(i + 1, next) > theta(i, before))) {
          stop = i;
          break;
        }
        before = next;
      }
      stop = detail::block_min(stop, scratch);
      budget = stop == INT64_MAX ? b_max : stop;
    } else {
      double best_t = -INFINITY;
      int64_t best_b = INT64_MAX;
      if (b_min == 0 && tid == 0) {
        const double t0 = theta(0, 0);
        if (t0 != t0) sh.nan_at_bmin = 1;
        v2::consider(best_t, best_b, t0, 0);
      }
      for (int64_t i = i_lo; i < i_hi; ++i) {
        before += v2::word_fixed(sorted[i]);  // P(i + 1)
        if (i + 1 >= b_min) {
          const double t = theta(i + 1, before);
          if (i + 1 == b_min && t != t) sh.nan_at_bmin = 1;
          v2::consider(best_t, best_b, t, i + 1);
        }
      }
      budget = detail::block_argmax(best_t, best_b, scratch);  // its barriers publish nan_at_bmin
      if (sh.nan_at_bmin || budget == INT64_MAX) budget = b_min;  // NaN at B_min: the CPU's scan keeps B_min
    }
  } else if (p.mode == kFixed) {
    const int64_t want = p.budget_in != nullptr ? int64_t(*p.budget_in) : p.fixed_budget;
    budget = want < b_min ? b_min : (want > b_max ? b_max : want);
  }
  {
    int64_t local = 0;
    for (int64_t i = tid; i < budget; i += nthreads) local += int64_t(v2::word_fixed(sorted[i]));
    const uint64_t prefix = uint64_t(detail::block_sum(local, scratch));
    if (tid == 0) {
      *p.budget_out = int32_t(budget);
      if (p.expected_tokens != nullptr)
        *p.expected_tokens = float(double((uint64_t(R) << 32) + prefix) / kFixedOne);
    }
  }
  if (!p.write_plan) return;  // choose_budget: budget only (uniform)

  // ---- 7. threshold: the candidate at rank `budget` as (u_t, pos_t, req_t) ----
  const bool has_threshold = budget < n_cand;
  const int32_t u_t = has_threshold ? sorted[budget] : Cfg::kNoSlot;  // kNoSlot: every candidate is above
  {
    uint32_t above_sum = 0;
    for (int32_t r = tid; r < R; r += nthreads) {
      int32_t drafts = p.drafts[r];
      drafts = drafts < 0 ? 0 : (drafts > K ? K : drafts);
      const int32_t cap = drafts < p.max_verify ? drafts : p.max_verify;
      const float* row = p.survival + int64_t(r) * p.survival_stride;
      float running = 1.f;
      int32_t above = 0, len = 0;
      for (int32_t j = 0; j < cap; ++j) {
        const float raw = row[j];
        if (raw != raw) break;
        const float s = sanitize(raw);
        running = s < running ? s : running;
        const int32_t u = int32_t(float_bits(running)) + (j < p.min_verify ? Cfg::kForcedTag : 0);
        above += u > u_t;
        len += u == u_t;
      }
      scattered[r] = above | (len << 8);  // the scattered words are dead after phase 5
      if (len > 0) {
        atomicAdd(&sh.tie_diff[above], 1);
        atomicAdd(&sh.tie_diff[above + len], -1);
      }
      above_sum += uint32_t(above);
    }
    above_sum = v2::warp_add(above_sum);
    if (lane == 0 && above_sum) atomicAdd(&sh.sum_above, (unsigned long long)above_sum);
  }
  __syncthreads();
  if (has_threshold) {  // uniform
    if (tid == 0) {
      // Ties at u_t are ordered by position, then request: m of them rank before the threshold.
      const int64_t m = budget - int64_t(sh.sum_above);
      int64_t cum = 0, level = 0;
      for (int32_t j = 0; j <= K; ++j) {
        level += sh.tie_diff[j];  // candidates tied at u_t in position j
        if (cum + level > m) {
          sh.pos_t = j;
          sh.rank_at_pos = int32_t(m - cum);
          break;
        }
        cum += level;
      }
    }
    __syncthreads();
    const int32_t pos_t = sh.pos_t, want = sh.rank_at_pos;
    int64_t carry = 0;
    for (int32_t r0 = 0; r0 < R; r0 += nthreads) {  // uniform trip count and break
      const int32_t r = r0 + tid;
      int64_t flag = 0;
      if (r < R) {
        const int32_t w = scattered[r], a = w & 0xff, len = w >> 8;
        flag = a <= pos_t && pos_t < a + len;
      }
      int64_t total;
      const int64_t ex = detail::block_exclusive_scan(flag, &total, scratch);
      if (flag && carry + ex == want) sh.req_t = r;
      carry += total;
      if (carry > want) break;
    }
    __syncthreads();
  }
  const int32_t pos_t = sh.pos_t, req_t = sh.req_t;

  // ---- 8. allocation and metadata, requests in tiles of blockDim ----
  int64_t tok_base = 0;  // local token index of the tile's first token
  int32_t slot_errors = 0;
  for (int32_t r0 = 0; r0 < R; r0 += nthreads) {  // uniform trip count
    const int32_t r = r0 + tid;
    int64_t q = 0;
    if (r < R) {
      const int32_t w = scattered[r], a = w & 0xff, len = w >> 8;
      int32_t L = a + min(max(pos_t - a, 0), len);
      L += (a <= pos_t && pos_t < a + len && r < req_t) ? 1 : 0;
      p.verify_lens[r] = L;
      q = 1 + L;
    }
    int64_t total;
    const int64_t ex = detail::block_exclusive_scan(q, &total, scratch);
    sh.tile_off[tid] = int32_t(ex);
    if (r < R) {
      if (p.query_start_loc) p.query_start_loc[r] = int32_t(p.token_offset + tok_base + ex);
      if (p.seq_lens) p.seq_lens[r] = (p.context_lens ? p.context_lens[r] : 0) + int32_t(q);
    }
    __syncthreads();
    const int32_t rows = R - r0 < nthreads ? R - r0 : nthreads;
    for (int32_t t = tid; t < int32_t(total); t += nthreads) {
      int32_t lo = 0, hi = rows - 1;  // last request of the tile whose first token is <= t
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (sh.tile_off[mid] <= t) lo = mid; else hi = mid - 1;
      }
      const int32_t rr = r0 + lo, i = t - sh.tile_off[lo];
      const int64_t tok = tok_base + t;
      const int32_t ctx = p.context_lens ? p.context_lens[rr] : 0;
      if (p.token_req) p.token_req[tok] = rr;
      if (p.positions) p.positions[tok] = ctx + i;
      if (p.slot_mapping) {
        const int64_t slot = slot_of(p.block_table + int64_t(rr) * p.block_table_stride, p.max_blocks,
                                     p.block_size, int64_t(ctx) + i);
        slot_errors += slot < 0;
        p.slot_mapping[tok] = slot;
      }
      if (p.input_ids)
        p.input_ids[tok] =
            i == 0 ? p.anchor_tokens[rr] : p.draft_tokens[int64_t(rr) * p.draft_tokens_stride + i - 1];
    }
    tok_base += total;
    __syncthreads();  // tile_off is rewritten by the next tile
  }
  if (slot_errors) atomicAdd(p.error_counts + kCountSlotOutOfRange, slot_errors);

  // ---- 9. padding lanes: every element of every padded buffer is written ----
  const int32_t end_tok = int32_t(p.token_offset + tok_base);
  for (int32_t r = R + tid; r < p.num_reqs_padded; r += nthreads) {
    p.verify_lens[r] = 0;
    if (p.query_start_loc) p.query_start_loc[r] = end_tok;
    if (p.seq_lens) p.seq_lens[r] = 0;
  }
  if (tid == 0) {
    if (p.query_start_loc) p.query_start_loc[p.num_reqs_padded] = end_tok;
    if (p.num_tokens) *p.num_tokens = end_tok;
  }
  for (int64_t t = tok_base + tid; t < p.num_tokens_padded; t += nthreads) {
    if (p.token_req) p.token_req[t] = -1;
    if (p.positions) p.positions[t] = 0;
    if (p.slot_mapping) p.slot_mapping[t] = -1;
    if (p.input_ids) p.input_ids[t] = 0;
  }
}

#if !defined(AV_CUDA_EMULATION)
inline cudaError_t launch_plan_v2(const Params& p, cudaStream_t stream) {
  const int64_t n_slots = int64_t(p.num_reqs) * p.max_drafts;
  const int64_t n_pad = next_pow2(n_slots);
  const bool smem = workspace_keys(p.num_reqs, p.max_drafts) == 0;  // same 8 bytes per slot as v1
  if (!smem && p.workspace == nullptr) return cudaErrorInvalidValue;
  const size_t smem_bytes = smem ? size_t(n_pad) * sizeof(uint64_t) : 0;
  static bool opted_in[64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 64 && !opted_in[device]) {
    err = cudaFuncSetAttribute(plan_kernel_v2, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(KernelConfig::kMaxSmemKeys * sizeof(uint64_t)));
    if (err != cudaSuccess) return err;
    opted_in[device] = true;
  }
  Params q = p;
  if (smem) q.workspace = nullptr;
  plan_kernel_v2<<<1, threads_for_v2(n_slots, p.num_reqs), smem_bytes, stream>>>(q, n_pad, buckets_for_v2(n_pad));
  return cudaGetLastError();
}

#endif  // !AV_CUDA_EMULATION

}  // namespace planner
}  // namespace adaptive_verify
