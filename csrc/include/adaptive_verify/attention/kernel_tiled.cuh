// verify_attention, shared-memory-tiled SIMT kernels: selected by AttentionParams::kernel = kAttentionTiled;
// the row-wise kernels (kernel_rowwise.cuh) stay the default until these pass the CUDA tests on a GPU.
//
// Split-KV in two launches whose grids depend only on host upper bounds (R, Hkv, max_query_len and the
// block table's width), so a captured graph replays any lengths.
//   1. partials: block (split s, row chunk c, KV head h, request r) of 128 threads. The request's
//      q_len x group query rows of KV head h (GQA rows packed together) are taken kRows = 16 at a time,
//      one chunk per block; the block walks its split in tiles of 64 positions (32 when a row is over
//      256 bytes), copying each tile's K and V rows into smem once with 16-byte loads, and computes all
//      its rows against the tile: fp32 dots over D from smem, a per-row online softmax (one warp per 4
//      rows, shuffle reductions), and P.V into register accumulators. It writes (max, sum, acc[D]) per
//      (token, head, split), in the same workspace layout as the row-wise kernel;
//   2. merge (merge.cuh): one warp per (token, head) merges the token's splits in order by log-sum-exp.
// Same split boundaries as the CPU kernel (kSplitTokens), so outputs are batch-invariant; the dot-product
// and softmax order differ from the CPU's (tile-wise rescaling instead of position by position), so the
// two agree to fp32 rounding, not bit for bit. NaN/inf scores are handled as the CPU's update would.
// NOTES: not yet run on a GPU, only under the host emulator (tests/test_attention_emu.py); the row-wise
// kernel passed the CUDA tests on an H200 but was latency-bound (~1 us per position). Rows past 16 re-read
// the split's K/V in another block (L2 hits when they run together). Single-buffered: each tile's loads
// are exposed within a block and hidden only by other resident blocks. The tensor-core kernel
// (kernel_mma.cuh: GQA rows in the MMA M dimension, a cp.async pipeline) is meant to replace both SIMT
// kernels once it passes on a GPU.
#pragma once

#if !defined(AV_CUDA_EMULATION)
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "adaptive_verify/attention/merge.cuh"
#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/request_span.cuh"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// Tile shapes of the partials kernel. A block owns kRows query rows (row = i * group + g: query token i,
// q head h * group + g) of one (split, KV head, request) and walks the split in tiles of kTile positions.
template <typename T, int D>
struct TiledConfig {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  // 16 rows: a q_len-1..2 request of group 8 fills a block; more rows take more blocks (grid x), each
  // re-reading the split's K/V (from L2 when they run together) rather than holding more accumulators.
  static constexpr int kRows = 16;
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte word
  // Two positions per lane when a K row is at most 256 bytes (64-position tiles keep smem under 48 KB
  // for bf16/fp16 D <= 128), else one (32-position tiles).
  static constexpr int kPosPerLane = D * int(sizeof(T)) <= 256 ? 2 : 1;
  static constexpr int kTile = 32 * kPosPerLane;
  static constexpr int kWordsPerRow = D / kVec;
  // scores and softmax: warp w owns rows w * kRowsPerWarp + k; lane owns positions lane + 32 * pp
  static constexpr int kRowsPerWarp = kRows / kWarps;
  // P.V: thread t owns the kVec columns (t % kColGroups) * kVec of rows t / kColGroups + kRowGroups * k
  static constexpr int kColGroups = D / kVec;
  static constexpr int kRowGroups = kThreads / kColGroups;
  static constexpr int kRowsPerThread = kRows / kRowGroups;
  // Lanes read K rows at the same column: a 16-byte pad per row puts the 8 lanes of a quarter warp in
  // distinct banks. Lanes read V rows whole (no pad needed); P rows of different rows in one warp: +1.
  static constexpr int kKStride = D + kVec;
  static constexpr int kPStride = kTile + 1;
  // shared memory, in this order (each part a multiple of 16 bytes, so every part stays 16-byte aligned)
  static constexpr int kQBytes = kRows * D * 4;                        // scaled query rows, fp32
  static constexpr int kKBytes = kTile * kKStride * int(sizeof(T));    // K tile, storage type
  static constexpr int kVBytes = kTile * D * int(sizeof(T));           // V tile
  static constexpr int kPBytes = (kRows * kPStride * 4 + 15) / 16 * 16;  // exp(score - m) per row
  static constexpr int kCBytes = kRows * 4;                            // rescale factor per row
  static constexpr int kSlotBytes = kTile * 8;                         // element offset of each row, -1: skip
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kPBytes + kCBytes + kSlotBytes;

  static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128 and 256");
  static_assert(kRows % kWarps == 0, "rows split evenly over the warps");
  static_assert(kThreads % kColGroups == 0 && kRows % kRowGroups == 0, "P.V columns and rows split evenly");
  static_assert(kTile * kWordsPerRow % kThreads == 0, "a tile loads in whole rounds of 16-byte words");
  static_assert(kTile <= kThreads, "one thread per position resolves the tile's block ids");
  static_assert(kCBytes % 16 == 0 && (kQBytes + kKBytes + kVBytes) % 16 == 0, "smem parts stay 16-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM's shared memory");
};

// 16 bytes of T (kVec elements) -> floats, exactly as to_float converts each element.
__device__ __forceinline__ void unpack16(const uint4 w, float* f, float) {
  f[0] = __uint_as_float(w.x), f[1] = __uint_as_float(w.y), f[2] = __uint_as_float(w.z), f[3] = __uint_as_float(w.w);
}
__device__ __forceinline__ void unpack16(const uint4 w, float* f, bf16_t) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = __uint_as_float(u[e] << 16);
    f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack16(const uint4 w, float* f, half_t) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = __half2float(__ushort_as_half(uint16_t(u[e] & 0xffffu)));
    f[2 * e + 1] = __half2float(__ushort_as_half(uint16_t(u[e] >> 16)));
  }
}

// 16 bytes of T from global memory: one vector load, or element loads when the cache's base pointer is
// not 16-byte aligned (rows are 16-byte multiples, so the base decides for every row).
template <typename T>
__device__ __forceinline__ uint4 load_word(const T* src, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const uint4*>(src));
  union {
    uint4 w;
    T e[16 / sizeof(T)];
  } u;
#pragma unroll
  for (int e = 0; e < int(16 / sizeof(T)); ++e) u.e[e] = src[e];
  return u.w;
}

// Partials of one (split s, KV head h, request r, chunk c of kRows query rows). Per tile of kTile
// positions:
//   A. threads < kTile resolve their position's block id into an element offset (-1: past the rows'
//      last visible position, or a bad block id, counted once);
//   B. every thread copies 16-byte words of the tile's K and V rows into smem (zeros for skipped rows);
//   C. warp w computes the scores of its kRowsPerWarp rows against the tile's positions (fp32 dots over
//      D from smem), then the row's online-softmax step with warp shuffles: new max m, rescale factor
//      c = exp(m_old - m), p = exp(score - m) into smem, l = l * c + sum(p);
//   D. every thread rescales its accumulators by c and adds p * V over the positions its rows see.
// A NaN or inf reaches (m, l, acc) exactly when the CPU's position-by-position update would make it NaN:
// a visible score that is NaN or +inf, or a split whose first visible score is -inf.
// __launch_bounds__(kThreads, 1): without the explicit minimum ptxas capped these at 128 registers and
// spilled a few bytes; they use 100-130 on sm_90a, 125-153 on sm_100a (bf16 D=128 on sm_90a: 113,
// so 4 blocks of 128 threads per SM, which its 46 KB of smem also allows).
template <typename T, int D>
__global__ void __launch_bounds__(TiledConfig<T, D>::kThreads, 1)
    attention_partials_tiled_kernel(const AttentionParams p, int32_t num_splits, int32_t num_chunks, bool vec_loads,
                              float* __restrict__ ws_ml, float* __restrict__ ws_acc) {
  using Cfg = TiledConfig<T, D>;
  constexpr int kRows = Cfg::kRows, kTile = Cfg::kTile, kVec = Cfg::kVec, kPosPerLane = Cfg::kPosPerLane;
  constexpr int kRowsPerWarp = Cfg::kRowsPerWarp, kRowsPerThread = Cfg::kRowsPerThread;
  constexpr int kRowGroups = Cfg::kRowGroups, kColGroups = Cfg::kColGroups;
  constexpr int kKStride = Cfg::kKStride, kPStride = Cfg::kPStride;
  AV_DYNAMIC_SMEM(smem);
  float* q_s = reinterpret_cast<float*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + Cfg::kQBytes);
  T* v_s = reinterpret_cast<T*>(smem + Cfg::kQBytes + Cfg::kKBytes);
  float* p_s = reinterpret_cast<float*>(smem + Cfg::kQBytes + Cfg::kKBytes + Cfg::kVBytes);
  float* c_s = reinterpret_cast<float*>(smem + Cfg::kQBytes + Cfg::kKBytes + Cfg::kVBytes + Cfg::kPBytes);
  int64_t* slot_s =
      reinterpret_cast<int64_t*>(smem + Cfg::kQBytes + Cfg::kKBytes + Cfg::kVBytes + Cfg::kPBytes + Cfg::kCBytes);

  const int32_t s = blockIdx.x / num_chunks, chunk = blockIdx.x % num_chunks, h = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const RequestSpan span = request_span(p, r);
  const ChunkWork work = chunk_work(p, span, r, s, chunk, kRows, h, blockIdx.x == 0 && tid == 0);
  if (!work.active) return;
  const int32_t group = work.group, row0 = work.row0, nrows = work.nrows, s0 = work.s0;
  const int32_t last_of_token0 = work.last_of_token0, s_end = work.s_end;
  const bool counts_bad = work.counts_bad;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;

  // Query rows, scaled, fp32; rows past the request are zeros (never visible, never written).
  for (int idx = tid; idx < kRows * D; idx += Cfg::kThreads) {
    const int32_t lr = idx / D, d = idx % D, row = row0 + lr;
    float x = 0.f;
    if (lr < nrows) {
      const int64_t token = span.begin + row / group;
      const int32_t qh = h * group + row % group;
      x = to_float(static_cast<const T*>(p.q)[token * p.q_stride_t + int64_t(qh) * p.q_stride_h + d]) * p.scale;
    }
    q_s[idx] = x;
  }

  // Softmax state of the warp's rows (replicated in every lane: shuffle reductions give all lanes the
  // same bits) and the last visible position of each row (-1 for rows past the request).
  float m[kRowsPerWarp], l[kRowsPerWarp];
  int32_t lim_w[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int32_t lr = warp * kRowsPerWarp + k;
    m[k] = -INFINITY;
    l[k] = 0.f;
    lim_w[k] = lr < nrows ? last_of_token0 + (row0 + lr) / group : -1;
  }
  const bool warp_has_rows = warp * kRowsPerWarp < nrows;
  // P.V accumulators of this thread's rows and columns.
  const int col0 = (tid % kColGroups) * kVec, rg = tid / kColGroups;
  float acc[kRowsPerThread][kVec];
  int32_t lim_t[kRowsPerThread];
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int32_t lr = rg + kRowGroups * k;
    lim_t[k] = lr < nrows ? last_of_token0 + (row0 + lr) / group : -1;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[k][e] = 0.f;
  }

  for (int32_t t0 = s0; t0 <= s_end; t0 += kTile) {
    // A. block ids of the tile's positions (the previous tile's P.V does not read slot_s)
    if (tid < kTile) {
      const int32_t pos = t0 + tid;
      int64_t off = -1;
      if (pos <= s_end) {
        const int32_t block = table[pos / p.block_size];
        if (block < 0 || block >= p.num_blocks) {  // cannot be checked on the host without a sync
          if (counts_bad) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
        } else {
          off = ((int64_t(block) * p.block_size + pos % p.block_size) * p.num_kv_heads + h) * D;
        }
      }
      slot_s[tid] = off;
    }
    __syncthreads();  // slot_s written; the previous tile's P.V is done with k_s / v_s
    // B. K and V rows into smem, 16 bytes per thread and round (zeros for skipped positions); 4 rounds
    // in flight per thread (8 words) rather than all: fewer registers, enough bytes in flight per SM
#pragma unroll 4
    for (int round = 0; round < kTile * Cfg::kWordsPerRow / Cfg::kThreads; ++round) {
      const int idx = round * Cfg::kThreads + tid;
      const int j = idx / Cfg::kWordsPerRow, w = idx % Cfg::kWordsPerRow;
      const int64_t off = slot_s[j];
      uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;
      if (off >= 0) {
        kw = load_word(kc + off + w * kVec, vec_loads);
        vw = load_word(vc + off + w * kVec, vec_loads);
      }
      *reinterpret_cast<uint4*>(k_s + j * kKStride + w * kVec) = kw;
      *reinterpret_cast<uint4*>(v_s + j * D + w * kVec) = vw;
    }
    __syncthreads();  // K/V tile in smem
    // C. scores and the online-softmax step, one warp per kRowsPerWarp rows
    float sc[kRowsPerWarp][kPosPerLane];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
      for (int pp = 0; pp < kPosPerLane; ++pp) sc[k][pp] = 0.f;
    if (warp_has_rows) {  // warp-uniform
#pragma unroll 2
      for (int d0 = 0; d0 < D; d0 += kVec) {
        float kf[kPosPerLane][kVec];
#pragma unroll
        for (int pp = 0; pp < kPosPerLane; ++pp)
          unpack16(*reinterpret_cast<const uint4*>(k_s + (lane + 32 * pp) * kKStride + d0), kf[pp], T{});
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
          const float* qr = q_s + (warp * kRowsPerWarp + k) * D + d0;  // same address in every lane
#pragma unroll
          for (int e4 = 0; e4 < kVec; e4 += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(qr + e4);
#pragma unroll
            for (int pp = 0; pp < kPosPerLane; ++pp) {
              sc[k][pp] = fmaf(qv.x, kf[pp][e4], sc[k][pp]);
              sc[k][pp] = fmaf(qv.y, kf[pp][e4 + 1], sc[k][pp]);
              sc[k][pp] = fmaf(qv.z, kf[pp][e4 + 2], sc[k][pp]);
              sc[k][pp] = fmaf(qv.w, kf[pp][e4 + 3], sc[k][pp]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int lr = warp * kRowsPerWarp + k;
      bool vis[kPosPerLane];
      unsigned ballot[kPosPerLane];
      float tmax = -INFINITY;
#pragma unroll
      for (int pp = 0; pp < kPosPerLane; ++pp) {
        const int j = lane + 32 * pp;
        vis[pp] = slot_s[j] >= 0 && t0 + j <= lim_w[k];
        ballot[pp] = __ballot_sync(0xffffffffu, vis[pp]);
        if (vis[pp]) tmax = fmaxf(tmax, sc[k][pp]);  // fmaxf drops NaN, as the CPU's `s > m` test does
      }
      unsigned any = 0;
#pragma unroll
      for (int pp = 0; pp < kPosPerLane; ++pp) any |= ballot[pp];
      float c = 1.f;  // rows with no visible position in this tile keep their state
      float pr[kPosPerLane];
#pragma unroll
      for (int pp = 0; pp < kPosPerLane; ++pp) pr[pp] = 0.f;
      if (any != 0u) {  // warp-uniform
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
        const float m_new = fmaxf(m[k], tmax);
        // The CPU makes a split NaN when its first visible score is -inf (exp(-inf - -inf)); later -inf
        // scores just add 0. m == -inf with l == 0 means no visible position yet in this split.
        bool poison = false;
        if (m[k] == -INFINITY && l[k] == 0.f) {
          int first_pp = kPosPerLane - 1;
#pragma unroll
          for (int pp = kPosPerLane - 1; pp >= 0; --pp)
            if (ballot[pp] != 0u) first_pp = pp;
          float s_sel = sc[k][0];
#pragma unroll
          for (int pp = 1; pp < kPosPerLane; ++pp)
            if (pp == first_pp) s_sel = sc[k][pp];
          unsigned b = ballot[0];
#pragma unroll
          for (int pp = 1; pp < kPosPerLane; ++pp)
            if (pp == first_pp) b = ballot[pp];
          const float s_first = __shfl_sync(0xffffffffu, s_sel, __ffs(b) - 1);
          poison = s_first == -INFINITY;
        }
        // c = 0 from m = -inf to finite; NaN when poisoned, or when m is +inf already (l is NaN then)
        c = poison ? NAN : expf(m[k] - m_new);
        float psum = 0.f;
#pragma unroll
        for (int pp = 0; pp < kPosPerLane; ++pp) {
          pr[pp] = vis[pp] ? expf(sc[k][pp] - m_new) : 0.f;
          psum += pr[pp];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
        l[k] = l[k] * c + psum;
        m[k] = m_new;
      }
      // Written for every row and tile (zeros where hidden): P.V reads p up to each row's limit, which
      // can include positions skipped for bad block ids.
#pragma unroll
      for (int pp = 0; pp < kPosPerLane; ++pp) p_s[lr * kPStride + lane + 32 * pp] = pr[pp];
      if (lane == 0) c_s[lr] = c;
    }
    __syncthreads();  // p_s, c_s written
    // D. acc = acc * c + P.V over the positions each row sees (p is 0 at skipped positions, whose V rows
    // are zeros; causally hidden positions are not touched, so their V cannot turn a row NaN)
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const float c = c_s[rg + kRowGroups * k];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[k][e] *= c;
    }
    int jlim[kRowsPerThread];
    int jmax = 0;
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int32_t n = lim_t[k] - t0 + 1;
      jlim[k] = n < 0 ? 0 : (n > kTile ? kTile : n);
      jmax = jlim[k] > jmax ? jlim[k] : jmax;
    }
    for (int j = 0; j < jmax; ++j) {
      float vf[kVec];
      unpack16(*reinterpret_cast<const uint4*>(v_s + j * D + col0), vf, T{});
#pragma unroll
      for (int k = 0; k < kRowsPerThread; ++k) {
        if (j < jlim[k]) {
          const float pr = p_s[(rg + kRowGroups * k) * kPStride + j];
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[k][e] = fmaf(pr, vf[e], acc[k][e]);
        }
      }
    }
  }

  // (m, l) from lane 0 of each row's warp; acc from the threads that own it. Rows with no visible
  // position in this split write (-inf, 0, zeros), which the merge skips.
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int32_t lr = warp * kRowsPerWarp + k;
      if (lr < nrows) {
        const int32_t row = row0 + lr;
        const int64_t cell = ((span.begin + row / group) * p.num_q_heads + h * group + row % group) * num_splits + s;
        ws_ml[2 * cell] = m[k];
        ws_ml[2 * cell + 1] = l[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int32_t lr = rg + kRowGroups * k;
    if (lr < nrows) {
      const int32_t row = row0 + lr;
      const int64_t cell = ((span.begin + row / group) * p.num_q_heads + h * group + row % group) * num_splits + s;
#pragma unroll
      for (int e = 0; e < kVec; ++e) ws_acc[cell * D + col0 + e] = acc[k][e];
    }
  }
}

// Row chunks of the partials grid, from the host bound max_query_len, so the grid never depends on device
// lengths.
template <typename T, int D>
inline int64_t tiled_row_chunks(const AttentionParams& p) {
  const int64_t group = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
  return (int64_t(p.max_query_len) * group + TiledConfig<T, D>::kRows - 1) / TiledConfig<T, D>::kRows;
}

#if !defined(AV_CUDA_EMULATION)
// Both launches of the tiled kernel; workspace split as in launch_verify_attention (kernel.cuh).
template <typename T, int D>
inline cudaError_t launch_attention_tiled(const AttentionParams& p, int32_t num_splits, float* ws_ml, float* ws_acc,
                                          bool vec_loads, cudaStream_t stream) {
  using Cfg = TiledConfig<T, D>;
  const int64_t chunks = tiled_row_chunks<T, D>(p);
  const int64_t grid_x = int64_t(num_splits) * (chunks > 0 ? chunks : 1);
  if (p.num_reqs > 0 && chunks > 0) {
    if (grid_x > 0x7fffffff) return cudaErrorInvalidValue;
    auto* kernel = attention_partials_tiled_kernel<T, D>;
    if (Cfg::kSmemBytes > 48 * 1024) {
      const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
      if (err != cudaSuccess) return err;
    }
    const dim3 grid(unsigned(grid_x), unsigned(p.num_kv_heads), unsigned(p.num_reqs));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, num_splits, int32_t(chunks), vec_loads, ws_ml, ws_acc);
  }
  const int64_t items = p.num_tokens * p.num_q_heads;
  const unsigned merge_blocks = unsigned((items + kMergeWarps - 1) / kMergeWarps);
  attention_merge_kernel<T, D><<<merge_blocks, 32 * kMergeWarps, 0, stream>>>(p, num_splits, ws_ml, ws_acc, 0);
  return cudaSuccess;
}

#endif  // !AV_CUDA_EMULATION

}  // namespace attention
}  // namespace adaptive_verify
