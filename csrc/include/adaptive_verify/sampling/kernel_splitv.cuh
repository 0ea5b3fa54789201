// Split-vocabulary CUDA sampler (AV_SAMPLER_KERNEL=v2). Two launches:
//   1. splitv_partial_kernel, one block per (slot, chunk), block index slot * chunks + c: slot = one logits
//      row a decision may need (rejection_sample: position j of request r at slot j * R + r, so that all
//      requests' position 0 comes first; sample: row i). A block reduces vocabulary chunk c of its row to a
//      SplitVPartial (greedy: (max, argmax); race: (best score, id) and the chunk's max) with 16-byte
//      loads, a 32 KiB tile at a time held in registers. rejection_sample's early exit: the last block of
//      a draft row (a counter per row) merges the row's partials and, when the draft is rejected, records
//      it in the request's state; blocks of later positions that start after that skip their row.
//   2. a merge, one 256-thread block per request (row for sample): runs the shared control flow
//      (algorithm.h, rejection_request) with a backend whose argmax / race merge the row's partials,
//      so the accept/reject chain, the error counting and the outputs are v1's code.
// Same integers as v1 and the CPU kernel (tests/test_sampling_cuda.py runs both kernels).
//
// NOTES:
//  - Why the merge is exact. Greedy: v1's argmax is the maximum of a total order, (value, then smaller
//    id; NaN never; -inf a real candidate), so any partition of the ids merged under the same order gives
//    the same id. Race: a score z_v - av_log(E_v) depends on (z_v, v, seed, offset, j) alone and the winner
//    is again the maximum of a total order, (score, then smaller id). What differs is the window floor:
//    v1 skips z < fl(G - kRaceWindow), G the row's max; a block uses fl(M - kRaceWindow), M <= G the
//    running max of the tiles it has read, so it skips a subset of what v1 skips. An extra entry has
//    z < fl(G - 20.25); while |G| < 2^20 (ulp <= 1/8 there), its score is below G - 3.48 and the score of
//    v1's max entry is at least G - 2.88 (-av_log(E) lies in [-2.82, 16.64]): it can neither win nor tie.
//    For finite |G| >= 2^20 (scaled logits beyond a million), and for G = +inf (the race is then over limit
//    logits, algorithm.h scaled_logit), the merge re-runs that row with v1's block routine, which is v1 by
//    definition.
//  - Bytes: v1 stops reading a request at its first rejection. The partial launch reads a row unless a
//    rejection at an earlier position of its request was recorded when its block started, so rows past the
//    first rejection are read when their blocks run concurrently with the deciding ones (at most all
//    1 + L[r] rows: (K + 1) / (accepted + 1) times v1's bytes). Why the skip is safe: a rejection is
//    recorded only for a row whose merged decision is final (not in the |G| >= 2^20 regime), so every
//    skipped row lies past the request's first rejection, which the merge never reads. The merge ignores
//    the rows past the first rejection, including their NaN counts.
//  - draft_probs with temperature > 0 (canonical softmax sum, residual race) is not split: the partial
//    launch skips those requests and the merge runs them with v1's block routine.
//  - NaN counts: a partial counts its chunk; the merge adds them only for the rows the chain consumes, as
//    v1 counts once per row read for a decision.
//  - Work skipped without changing a result (each exact, see its definition): a 16-byte vector of fp16 /
//    bf16 without NaN whose packed max is below the thread's best (greedy) or only raises the tile max;
//    race entries whose log-free bound (race_bound) is below the thread's best score, and Philox calls for
//    quads where no entry can reach it with any uniform.
//  - Unverified on hardware when written: the H200 was not available; ptxas: 0 spills, <= 128 registers.
//    Its source runs in the CPU suite under the host emulator (tests/test_sampling_emu.py: the same
//    integers and error counts as the CPU kernel).
#pragma once


#include <cstdint>
#include <type_traits>

#include "adaptive_verify/sampling/kernel.cuh"

namespace adaptive_verify {
namespace sampling {

struct SplitVConfig {
  static constexpr int kThreads = SamplerConfig::kThreads;
  static constexpr int kVecs = int(SplitVShape::kTileBytes / (16 * kThreads));  // 16-byte vectors a thread
  // Two resident blocks: 64 KiB of loads in flight per SM, and up to 128 registers a thread.
  static constexpr int kMinBlocksPerSm = 2;
  static_assert(kVecs * 16 * kThreads == SplitVShape::kTileBytes, "a tile is kThreads x kVecs 16-byte vectors");
  static_assert(kThreads == 256, "block_best / block_max / BlockScratch reduce over 256 threads");
};

// Below this |row max| (scaled), chunk-local window floors skip nothing that could win (NOTES).
constexpr float kSplitVExactRange = 1048576.f;  // 2^20

enum RowMode : int32_t { kRowSkip = 0, kRowArgmax = 1, kRowRace = 2 };

// What the partial launch computes for one slot.
struct RowJob {
  int64_t row = 0;  // logits row
  int32_t mode = kRowSkip;
  int32_t req = 0;         // request (rejection_sample) / row (sample)
  bool is_draft = false;   // rejection_sample: the row judges draft j (j < L), not the bonus
  float temp = 0.f;
  Rng rng{0, 0};
  int32_t j = 0;
  uint32_t stream = kRace;
};

__device__ __forceinline__ uint64_t offset_of(uint64_t offset, const int64_t* offset_ptr) {
  return offset_ptr != nullptr ? uint64_t(*offset_ptr) : offset;
}

// Slot j * R + r: row j of request r, when rejection_request would read it for a split decision
// (same padding / clamping rules as algorithm.h).
__device__ RowJob row_job(const RejectionParams& p, int64_t slot) {
  RowJob job;
  const int32_t K = p.max_drafts;
  const int32_t r = int32_t(slot % p.num_reqs), j = int32_t(slot / p.num_reqs);
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  if (end <= begin || begin < 0 || end > p.num_tokens) return job;
  const int64_t L = end - begin - 1 < K ? end - begin - 1 : K;
  if (j > L) return job;
  const float temp = p.temperature != nullptr ? p.temperature[r] : 0.f;
  const bool greedy = !(temp > 0.f);
  if (!greedy && p.draft_probs != nullptr) return job;  // merged on v1's block routine
  job.row = begin + j;
  job.mode = greedy ? kRowArgmax : kRowRace;
  job.req = r;
  job.is_draft = j < L;
  job.temp = temp;
  job.rng = Rng{p.seeds != nullptr ? uint64_t(p.seeds[r]) : 0ull, offset_of(p.offset, p.offset_ptr)};
  job.j = j;
  job.stream = kRace;
  return job;
}

// Slot i: row i of sample() (race on stream kSample, position 0, when temperature > 0).
__device__ RowJob row_job(const SampleParams& p, int64_t slot) {
  RowJob job;
  const float temp = p.temperature != nullptr ? p.temperature[slot] : 0.f;
  job.row = slot;
  job.mode = temp > 0.f ? kRowRace : kRowArgmax;
  job.req = int32_t(slot);
  job.temp = temp;
  job.rng = Rng{p.seeds != nullptr ? uint64_t(p.seeds[slot]) : 0ull, offset_of(p.offset, p.offset_ptr)};
  job.j = 0;
  job.stream = kSample;
  return job;
}

// ---- tile loads: 16-byte vectors, element loads where a row is misaligned or at the vocabulary's end ----

template <typename T>
struct ElemTraits {
  static constexpr int kBits = 8 * int(sizeof(T));
  static constexpr int kPerVec = 16 / int(sizeof(T));
};

__device__ __forceinline__ uint32_t raw_bits(float x) { return float_bits(x); }
__device__ __forceinline__ uint32_t raw_bits(half_t x) { return x.bits; }
__device__ __forceinline__ uint32_t raw_bits(bf16_t x) { return x.bits; }

__device__ __forceinline__ uint32_t word(const uint4& r, int k) {
  return k == 0 ? r.x : (k == 1 ? r.y : (k == 2 ? r.z : r.w));
}

template <typename T>
__device__ __forceinline__ float elem(const uint4& r, int e);
template <>
__device__ __forceinline__ float elem<float>(const uint4& r, int e) {
  return bits_float(word(r, e));
}
template <>
__device__ __forceinline__ float elem<half_t>(const uint4& r, int e) {
  return to_float(half_t{uint16_t(word(r, e >> 1) >> (16 * (e & 1)))});
}
template <>
__device__ __forceinline__ float elem<bf16_t>(const uint4& r, int e) {
  return to_float(bf16_t{uint16_t(word(r, e >> 1) >> (16 * (e & 1)))});
}

// Largest of a 16-byte vector of 16-bit logits, by packed max (NaN-propagating): false when any lane is
// NaN (then the caller takes every element one by one, counting them). Exact: fp16/bf16 -> float is exact.
template <typename T>
__device__ __forceinline__ bool vec_max_no_nan(const uint4& r, float& vm);
template <>
__device__ __forceinline__ bool vec_max_no_nan<float>(const uint4&, float&) {
  return false;  // fp32: always element by element
}
__device__ __forceinline__ float max_of_halves(__nv_bfloat162 m) {
  return __bfloat162float(__hmax_nan(__low2bfloat16(m), __high2bfloat16(m)));
}
__device__ __forceinline__ float max_of_halves(__half2 m) {
  return __half2float(__hmax_nan(__low2half(m), __high2half(m)));
}
template <typename H2>
__device__ __forceinline__ float packed_max(const uint4& r) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  H2 h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = *reinterpret_cast<const H2*>(&w[k]);
  return max_of_halves(__hmax2_nan(__hmax2_nan(h[0], h[1]), __hmax2_nan(h[2], h[3])));
}
template <>
__device__ __forceinline__ bool vec_max_no_nan<bf16_t>(const uint4& r, float& vm) {
  vm = packed_max<__nv_bfloat162>(r);
  return vm == vm;
}
template <>
__device__ __forceinline__ bool vec_max_no_nan<half_t>(const uint4& r, float& vm) {
  vm = packed_max<__half2>(r);
  return vm == vm;
}

// Id of element e of vector i of this thread in the tile starting at tile0.
template <typename T>
__device__ __forceinline__ int64_t elem_id(int64_t tile0, int i, int e) {
  return tile0 + (int64_t(i) * SplitVConfig::kThreads + threadIdx.x) * ElemTraits<T>::kPerVec + e;
}

// Ids [tile0, min(end, tile0 + tile)) into registers; a thread's ids increase with (i, e).
template <typename T>
__device__ __forceinline__ void load_tile(const T* row, int64_t tile0, int64_t end, bool aligned,
                                          uint4 (&regs)[SplitVConfig::kVecs]) {
  constexpr int E = ElemTraits<T>::kPerVec, B = ElemTraits<T>::kBits;
#pragma unroll
  for (int i = 0; i < SplitVConfig::kVecs; ++i) {
    const int64_t v0 = elem_id<T>(tile0, i, 0);
    if (aligned && v0 + E <= end) {
      regs[i] = __ldg(reinterpret_cast<const uint4*>(row + v0));
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (v0 + e < end) w[(e * B) / 32] |= raw_bits(row[v0 + e]) << ((e * B) % 32);
      regs[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// ---- launch 1: one partial per (slot, chunk) ----

// An upper bound on race_score(z, u) from u's bits, without a log: E = -log(u) >= 1 - u = n 2^-24 (exact:
// n = 2^24 - 2k - 1 odd, 1 <= n < 2^24, u = (k + 0.5) 2^-23), so -log(E) <= -log(1 - u) <= (24 -
// floor(log2 n)) ln 2 = (clz(n) - 7) ln 2. The margin 1e-3 + 1e-5 |z| covers av_log's errors (< 2e-5 on
// E in [6e-8, 17]), ln 2 rounded up, and the roundings of the score and of this sum: an entry whose bound is
// below the best score so far scores below it. In the race, 1 - u is 2^-k-small with odds 2^-k, so most
// entries more than a few units below the best skip both logs.
// kAnyUniformBits (u = 1 - 2^-24: n = 1, clz = 31) gives the largest bound over every u: c = 24 ln 2, a
// monotone function of clz computed the same way, so it bounds the score whatever the random bits.
constexpr uint32_t kAnyUniformBits = 0xffffffffu;
__device__ __forceinline__ float race_bound(float z, uint32_t bits) {
  const uint32_t n = 0x00ffffffu - 2u * (bits >> 9);
  const float c = float(__clz(n) - 7) * 0.6931472f;
  return (z + c) + (1e-3f + 1e-5f * fabsf(z));
}

// Merge of partials under v1's order: (best key, id), -1 when none; the largest zmax.
struct PartialMerge {
  float key = -INFINITY, zmax = -INFINITY;
  int64_t id = -1;
  int32_t nan = 0;
  __device__ void push(const SplitVPartial& q) {
    nan += q.nan;
    zmax = fmaxf(zmax, q.zmax);
    if (q.id >= 0 && (id < 0 || better(q.key, q.id, key, id))) {
      key = q.key;
      id = q.id;
    }
  }
  // False for a race row in the |G| >= 2^20 regime and for a row with a +inf scaled logit (its race is over
  // limit logits, algorithm.h scaled_logit, which the partials do not compute): only v1's routine decides those.
  // A row without any number (G = -inf) is final: no partial has a winner, and the merge emits id 0 as v1 does.
  __device__ bool final_for(int32_t mode) const {
    return mode != kRowRace || zmax == -INFINITY || fabsf(zmax) < kSplitVExactRange;
  }
};

// rejection_sample's early-exit area after the partials (zero at launch): chunks done per slot, and per
// request the largest K + 1 - j over the recorded rejections at position j (0: none).
struct SplitVChain {
  int32_t* counters;
  int32_t* state;
  __device__ SplitVChain(void* workspace, int64_t num_slots, int64_t num_chunks)
      : counters(reinterpret_cast<int32_t*>(static_cast<char*>(workspace) +
                                            num_slots * num_chunks * int64_t(sizeof(SplitVPartial)))),
        state(counters + num_slots) {}
};

// Thread 0 of a draft row's last block: merge the row (other blocks' partials are visible after their
// __threadfence + counter increment and ours) and record a rejection.
__device__ void record_decision(const RejectionParams& p, const RowJob& job, const SplitVPartial* row_parts,
                                int32_t num_chunks, int32_t* state) {
  PartialMerge m;
  for (int32_t c = 0; c < num_chunks; ++c) {
    const int4 raw = __ldcg(reinterpret_cast<const int4*>(row_parts + c));  // L2: written by other SMs
    m.push(SplitVPartial{__int_as_float(raw.x), raw.y, raw.z, __int_as_float(raw.w)});
  }
  if (!m.final_for(job.mode)) return;
  const int64_t emit = m.id < 0 ? 0 : m.id;
  const int64_t x = draft_id<float>(p, job.req, job.j);
  if (!(x >= 0 && x < p.vocab && emit == x)) atomicMax(state + job.req, p.max_drafts + 1 - job.j);
}

template <typename T, typename Params>
__global__ void __launch_bounds__(SplitVConfig::kThreads, SplitVConfig::kMinBlocksPerSm)
    splitv_partial_kernel(const Params p, int64_t num_slots, int32_t num_chunks, int64_t tiles_per_chunk) {
  constexpr int kThreads = SplitVConfig::kThreads, kVecs = SplitVConfig::kVecs, E = ElemTraits<T>::kPerVec;
  constexpr bool kChain = std::is_same<Params, RejectionParams>::value;
  __shared__ BlockScratch sh;
  __shared__ int32_t nan_w[kThreads / 32];
  __shared__ int32_t skip;
  const int64_t slot = int64_t(blockIdx.x) / num_chunks;
  const int32_t chunk = int32_t(int64_t(blockIdx.x) % num_chunks);
  const RowJob job = row_job(p, slot);
  if (job.mode == kRowSkip) return;  // uniform over the block; the merge never reads this slot
  if constexpr (kChain) {  // a rejection recorded at an earlier position: this row is never needed
    const SplitVChain chain(p.workspace, num_slots, num_chunks);
    if (threadIdx.x == 0) skip = __ldcg(chain.state + job.req) > p.max_drafts + 1 - job.j;
    __syncthreads();
    if (skip) return;  // uniform
  }
  const int64_t tile_elems = int64_t(kThreads) * kVecs * E;
  const int64_t begin = int64_t(chunk) * tiles_per_chunk * tile_elems;
  const int64_t end = begin + tiles_per_chunk * tile_elems < p.vocab ? begin + tiles_per_chunk * tile_elems : p.vocab;
  const T* row = static_cast<const T*>(p.logits) + job.row * p.logits_stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;

  float key, zmax;
  int64_t id;
  int32_t nan;
  if (job.mode == kRowArgmax) {
    ArgmaxBest best;  // pushes in increasing id: its "first of equals" is the smallest id
    for (int64_t tile0 = begin; tile0 < end; tile0 += tile_elems) {
      uint4 regs[kVecs];
      load_tile<T>(row, tile0, end, aligned, regs);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        // A whole vector without NaN whose max is below the best changes nothing (not even the NaN count).
        float vm;
        if (elem_id<T>(tile0, i, E - 1) < end && vec_max_no_nan<T>(regs[i], vm) && vm < best.x) continue;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int64_t v = elem_id<T>(tile0, i, e);
          if (v < end) best.push(elem<T>(regs[i], e), v);
        }
      }
    }
    key = zmax = best.x;
    id = best.id;
    nan = best.nan;
  } else {
    // Tile max, then the race over the tile's entries at or above the running window floor; the race is
    // RaceBest's arithmetic with one Philox call per 4 ids (v0 is a multiple of 4) and a log-free pre-test.
    const bool finite_temp = job.temp < INFINITY;  // uniform over the block
    const uint32_t ctr1 = (uint32_t(job.j) << 8) | job.stream;
    const uint32_t off0 = uint32_t(job.rng.offset), off1 = uint32_t(job.rng.offset >> 32);
    const uint32_t key0 = uint32_t(job.rng.seed), key1 = uint32_t(job.rng.seed >> 32);
    float running = -INFINITY;  // max scaled logit of the tiles read so far: <= the row's max
    float best_s = -INFINITY;
    int64_t best_v = -1;
    nan = 0;
    for (int64_t tile0 = begin; tile0 < end; tile0 += tile_elems) {  // uniform trip count: block_max inside
      uint4 regs[kVecs];
      load_tile<T>(row, tile0, end, aligned, regs);
      float m;
      if (finite_temp) {
        // x / temp (temp finite, > 0) is NaN iff x is, and rounds monotonically: ScaledMax's max and NaN
        // count from the raw logits and one division.
        float xm = -INFINITY;
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
          float vm;
          if (elem_id<T>(tile0, i, E - 1) < end && vec_max_no_nan<T>(regs[i], vm)) {
            xm = vm > xm ? vm : xm;
            continue;
          }
#pragma unroll
          for (int e = 0; e < E; ++e)
            if (elem_id<T>(tile0, i, e) < end) {
              const float x = elem<T>(regs[i], e);
              nan += x != x;
              xm = x > xm ? x : xm;
            }
        }
        m = fdiv(xm, job.temp);
      } else {
        ScaledMax mx;
#pragma unroll
        for (int i = 0; i < kVecs; ++i)
#pragma unroll
          for (int e = 0; e < E; ++e)
            if (elem_id<T>(tile0, i, e) < end) mx.push(fdiv(elem<T>(regs[i], e), job.temp));
        nan += mx.nan;
        m = mx.m;
      }
      running = fmaxf(running, block_max(m, sh));
      const float floor_z = running - kRaceWindow;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int64_t v0 = elem_id<T>(tile0, i, 0);
#pragma unroll
        for (int h = 0; h < E / 4; ++h) {
          float z[4];
          bool alive[4], any = false;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            z[e] = v0 + 4 * h + e < end ? fdiv(elem<T>(regs[i], 4 * h + e), job.temp) : NAN;
            // In the window (NaN: never), and not below the best even with the largest noise any uniform gives
            alive[e] = z[e] >= floor_z && !(best_v >= 0 && race_bound(z[e], kAnyUniformBits) < best_s);
            any |= alive[e];
          }
          if (!any) continue;  // no Philox call
          const U32x4 w = philox(uint32_t((v0 >> 2) + h), ctr1, off0, off1, key0, key1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!alive[e]) continue;
            if (best_v >= 0 && race_bound(z[e], w.x[e]) < best_s) continue;  // cannot beat, nor tie, the best
            const float score = fsub(z[e], av_log(-av_log(to_uniform(w.x[e]))));  // race_score
            const int64_t v = v0 + 4 * h + e;
            if (better(score, v, best_s, best_v)) {
              best_s = score;
              best_v = v;
            }
          }
        }
      }
    }
    key = best_s;
    id = best_v;
    zmax = running;
  }

  // Block reduction under the same order as v1's block_best, plus the NaN count; thread 0 stores.
  warp_best(key, id);
  for (int off = 16; off > 0; off >>= 1) nan += __shfl_xor_sync(0xffffffffu, nan, off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sh.s[warp] = key;
    sh.v[warp] = id;
    nan_w[warp] = nan;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      nan += nan_w[w];
      if (sh.v[w] >= 0 && (id < 0 || better(sh.s[w], sh.v[w], key, id))) {
        key = sh.s[w];
        id = sh.v[w];
      }
    }
    SplitVPartial* parts = static_cast<SplitVPartial*>(p.workspace);
    parts[blockIdx.x] = SplitVPartial{key, int32_t(id), nan, zmax};
    if constexpr (kChain) {
      if (job.is_draft) {
        const SplitVChain chain(p.workspace, num_slots, num_chunks);
        __threadfence();  // our partial before our count
        if (atomicAdd(chain.counters + slot, 1) == num_chunks - 1) {
          __threadfence();  // every count seen: every partial of the row is visible
          record_decision(p, job, parts + slot * num_chunks, num_chunks, chain.state);
        }
      }
    }
  }
}

// ---- launch 2: the merge, as a backend of rejection_request ----

template <typename T>
struct SplitVRows {
  GpuRows<T> v1;                 // rows the partial launch skipped, and the out-of-range fallback
  const SplitVPartial* parts;    // this request's (row j, chunk c) partials at j * row_stride + c
  int64_t row_stride;
  int32_t num_chunks;
  bool race_from_parts;          // false with draft_probs: the bonus race was not split
  int32_t next_argmax_row = 0;   // greedy requests call argmax once per row, j = 0, 1, ... (algorithm.h)

  // Row j's winner id (-1 if none) to every thread; its NaN count to each thread's share, its max zmax.
  __device__ int64_t merged(int32_t j, int32_t& nan, float& zmax) const {
    PartialMerge m;
    for (int c = threadIdx.x; c < num_chunks; c += SplitVConfig::kThreads) m.push(parts[int64_t(j) * row_stride + c]);
    nan = m.nan;
    zmax = block_max(m.zmax, v1.sh);
    return block_best(m.key, m.id, v1.sh);
  }

  __device__ int64_t argmax(const T*, int64_t) {
    int32_t nan;
    float zmax;
    const int64_t w = merged(next_argmax_row++, nan, zmax);
    v1.count_nan(nan);
    return w < 0 ? 0 : w;
  }

  // A race from the partials when they hold its decision; truncated races never come here (the launcher runs
  // the v1 kernel for them), but answer them exactly anyway.
  __device__ int64_t sampled(const T* row, int64_t V, float temp, const Truncation& t, const Rng& rng, int32_t j,
                             uint32_t stream) {
    if (!race_from_parts || t.active()) return v1.sampled(row, V, temp, t, rng, j, stream);
    int32_t nan;
    float g;
    const int64_t w = merged(j, nan, g);
    PartialMerge whole;  // only its zmax (g, the same on every thread) matters here
    whole.zmax = g;
    if (!whole.final_for(kRowRace)) return v1.sampled(row, V, temp, t, rng, j, stream);  // counts its NaNs itself
    v1.count_nan(nan);
    return w < 0 ? 0 : w;
  }

  __device__ float max_scaled(const T* row, int64_t V, float temp, bool count) const {
    return v1.max_scaled(row, V, temp, count);
  }

  __device__ SoftmaxStats softmax_stats(const T* row, int64_t V, float temp, float m, uint64_t limit) const {
    return v1.softmax_stats(row, V, temp, m, limit);
  }

  __device__ const RankHist& rank_histogram(const T* row, int64_t V, float temp, float m, uint64_t limit,
                                            uint64_t prefix, int shift, bool with_mass) const {
    return v1.rank_histogram(row, V, temp, m, limit, prefix, shift, with_mass);
  }

  __device__ int64_t race(const T* row, int64_t V, float temp, float m, const Rng& rng, int32_t j, uint32_t stream,
                          uint64_t limit) const {
    return v1.race(row, V, temp, m, rng, j, stream, limit);
  }

  __device__ int64_t residual_race(const T* row, const float* q, int64_t V, float temp, const SoftmaxStats& st,
                                   const Rng& rng, int32_t j, uint64_t limit) const {
    return v1.residual_race(row, q, V, temp, st, rng, j, limit);
  }
};

template <typename T>
__global__ void __launch_bounds__(SplitVConfig::kThreads) splitv_rejection_merge_kernel(const RejectionParams p,
                                                                                       int32_t num_chunks) {
  __shared__ BlockScratch sh;
  const int32_t r = blockIdx.x;
  SplitVRows<T> rows{GpuRows<T>{sh, p.error_counts},
                     static_cast<const SplitVPartial*>(p.workspace) + int64_t(r) * num_chunks,
                     int64_t(p.num_reqs) * num_chunks, num_chunks, p.draft_probs == nullptr};
  rejection_request<T>(p, r, rows, threadIdx.x == 0);
}

template <typename T>
__global__ void __launch_bounds__(SplitVConfig::kThreads) splitv_sample_merge_kernel(const SampleParams p,
                                                                                    int32_t num_chunks) {
  __shared__ BlockScratch sh;
  const int32_t i = blockIdx.x;
  const RowJob job = row_job(p, i);
  SplitVRows<T> rows{GpuRows<T>{sh, p.error_counts},
                     static_cast<const SplitVPartial*>(p.workspace) + int64_t(i) * num_chunks, num_chunks, num_chunks,
                     true};
  const T* row = static_cast<const T*>(p.logits) + int64_t(i) * p.logits_stride;
  const int64_t tok = job.mode == kRowRace ? rows.sampled(row, p.vocab, job.temp, Truncation{}, job.rng, 0, kSample)
                                           : rows.argmax(row, p.vocab);
  if (threadIdx.x == 0) p.tokens[i] = int32_t(tok);
}

// can_implement: the workspace the host sized from splitv_shape, 16-byte aligned; a grid that fits.
inline bool splitv_can_implement(const void* workspace, int64_t workspace_bytes, const SplitVShape& s, int64_t slots) {
  return workspace != nullptr && (reinterpret_cast<uintptr_t>(workspace) & 15u) == 0 &&
         workspace_bytes >= s.workspace_bytes && s.num_chunks <= SplitVShape::kMaxChunks &&
         slots * s.num_chunks <= int64_t(INT32_MAX);
}

inline cudaError_t launch_rejection_splitv(const RejectionParams& p, cudaStream_t stream) {
  if (p.num_reqs == 0) return cudaSuccess;
  const int64_t slots = int64_t(p.num_reqs) * (p.max_drafts + 1);
  const SplitVShape s = splitv_shape(p.dtype, p.vocab, slots, p.num_reqs);
  if (!splitv_can_implement(p.workspace, p.workspace_bytes, s, slots)) return cudaErrorInvalidValue;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(splitv_partial_kernel<T, RejectionParams>, dim3(uint32_t(slots * s.num_chunks)),
                                          dim3(SplitVConfig::kThreads), 0, stream, p, slots, int32_t(s.num_chunks),
                                          s.tiles_per_chunk);
    if (err != cudaSuccess) return err;
    return launch_kernel(splitv_rejection_merge_kernel<T>, dim3(unsigned(p.num_reqs)), dim3(SplitVConfig::kThreads), 0,
                         stream, p, int32_t(s.num_chunks));
  });
}

inline cudaError_t launch_sample_splitv(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  const SplitVShape s = splitv_shape(p.dtype, p.vocab, p.num_rows, 0);
  if (!splitv_can_implement(p.workspace, p.workspace_bytes, s, p.num_rows)) return cudaErrorInvalidValue;
  return launch_for_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_kernel(splitv_partial_kernel<T, SampleParams>,
                                          dim3(uint32_t(int64_t(p.num_rows) * s.num_chunks)), dim3(SplitVConfig::kThreads),
                                          0, stream, p, int64_t(p.num_rows), int32_t(s.num_chunks), s.tiles_per_chunk);
    if (err != cudaSuccess) return err;
    return launch_kernel(splitv_sample_merge_kernel<T>, dim3(unsigned(p.num_rows)), dim3(SplitVConfig::kThreads), 0,
                         stream, p, int32_t(s.num_chunks));
  });
}

// The sampler's entry points on CUDA: the kernel the params name (SamplerKernel).
// Truncation and logprobs are implemented by the v1 kernel only: such calls run it whatever `kernel` says.
inline bool needs_v1(const RejectionParams& p) {
  return p.top_k != nullptr || p.top_p != nullptr || p.min_p != nullptr || p.logprobs != nullptr;
}
inline bool needs_v1(const SampleParams& p) {
  return p.top_k != nullptr || p.top_p != nullptr || p.min_p != nullptr || p.logprobs != nullptr;
}

inline cudaError_t launch_rejection_sample(const RejectionParams& p, cudaStream_t stream) {
  if (needs_v1(p)) return launch_rejection(p, stream);
  switch (p.kernel) {
    case kSamplerV1: return launch_rejection(p, stream);
    case kSamplerSplitV: return launch_rejection_splitv(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

inline cudaError_t launch_sample_rows(const SampleParams& p, cudaStream_t stream) {
  if (needs_v1(p)) return launch_sample(p, stream);
  switch (p.kernel) {
    case kSamplerV1: return launch_sample(p, stream);
    case kSamplerSplitV: return launch_sample_splitv(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace sampling
}  // namespace adaptive_verify
