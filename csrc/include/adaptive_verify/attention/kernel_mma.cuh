// verify_attention on tensor cores: selected by AttentionParams::kernel = kAttentionMma or
// kAttentionMmaFused (bf16/fp16).
//
// kAttentionMma: split-KV in two launches whose grids depend only on host upper bounds (R, Hkv, max_query_len and the
// block table's width), so a captured graph replays any lengths:
//   1. partials: block (split s, row chunk c, KV head h, request r). The request's q_len x group query
//      rows of KV head h are packed into the MMA M dimension (row = i * group + g: query token i, q head
//      h * group + g), 16 rows per warp, up to kMaxWarps warps per block, so one block reads the split's
//      K/V once for up to 128 rows (a q_len-16 request at group 8). The block streams the split through
//      a kStages-deep cp.async pipeline of kTile-position K/V tiles (16 KB per stage) into swizzled shared
//      memory; each warp computes S = Q K^T with mma.sync m16n8k16 (fp32 accumulate), its rows' online
//      softmax in registers (exp2, quad shuffles), and O += P V with P rounded to the input dtype, as
//      FlashAttention-2 does. It writes (max, sum, acc[D]) per (token, head, split);
//   2. merge (merge.cuh): one warp per (token, head) merges the token's splits in order by log-sum-exp.
// Or, kAttentionMmaFused, in one launch: each partials block counts itself in an arrival counter per
// (request, KV head, row chunk) after writing; the last to arrive merges those rows with the merge kernel's
// routine (merge_token_head, so the same bits), reading the other blocks' partials from L2; an extra grid
// slice (z = R) writes the padding tokens. Requests of more than kFusedMergeMaxSplits splits (params.h)
// are left to the merge kernel, launched only when the block table allows such a request. That saves the
// merge launch and its second pass over the partials (T x Hq x splits x (D + 2) floats: about 7% of the
// K/V bytes at group 8 and q_len 4.5, which the 85%-of-copy-bandwidth target cannot afford twice). The
// counters are zeroed by a memset node before each launch, so an interrupted launch never leaves them
// wrong.
// The row-wise kernel writes the same workspace and uses the same split boundaries (kSplitTokens).
//
// Batch invariance: a row's arithmetic depends only on its own request and the call's max_query_len and
// group (which fix the rows sharing its warp), never on other requests. Warps own M tiles, not KV
// ranges, so no cross-warp reduction depends on how many rows a block holds.
//
// Poison: positions past a block's last visible position, and positions whose block id is out of range
// (skipped and counted), are zero-filled by cp.async and masked; query rows past the request are zeros.
// P is 0 at causally hidden positions and at a draft tree's non-ancestors (tree_mask.h), whose K/V are this
// step's own (finite) tokens. Unlike the SIMT kernels, an inf or NaN in a V row that the row cannot see but
// its block can (a later draft token's, or a sibling branch's) reaches the row as 0 * inf = NaN; NaN or +inf
// scores make the row NaN as on the CPU.
//
// NOTES: written without a GPU (2026-11-30) and run only under the host emulator (tests/emu), which
// executes this source with every CUDA thread as a fiber and checks shared-memory bounds, alignment and
// pipeline waits. Not yet run on hardware; "rowwise" stays the default until the CUDA tests pass.
// SM100 builds run the same sm_80-style mma.sync code (no tcgen05/TMA path). fp8 caches (kv_dtype) are decoded
// to T while a tile is stored, by synchronous loads: a cp.async staging of the fp8 bytes and an in-smem decode
// would keep the pipeline's overlap (not written yet).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/merge.cuh"
#include "adaptive_verify/attention/mma_tile.cuh"
#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/request_span.cuh"
#include "adaptive_verify/attention/tensor_core.cuh"
#include "adaptive_verify/attention/tree_mask.h"
#include "adaptive_verify/dtype.h"
#include "adaptive_verify/launch.h"

namespace adaptive_verify {
namespace attention {

template <typename T, int D>
struct MmaConfig {
  static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128 and 256");
  static_assert(sizeof(T) == 2, "tensor-core path: bf16 and fp16 only");
  // 16 rows per warp (the MMA M). 8 warps hold 128 rows: q_len 16 at group 8 in one block; larger
  // problems take more row chunks (blocks re-reading the split's K/V, from L2 when they run together).
  static constexpr int kMaxWarps = kMmaMaxWarps;
  static constexpr int kRowsPerWarp = 16;
  // Positions per pipeline stage: 8 KB of K plus 8 KB of V whatever D, so every head dim keeps the same
  // bytes in flight; S then holds kTile / 8 MMA tiles (64 / 32 / 16 positions: 8 / 4 / 2 tiles).
  static constexpr int kTile = 4096 / D;
  // Three stages: two tiles in flight while the third is computed on.
  static constexpr int kStages = 3;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per K/V/Q row
  static constexpr int kTileElems = kTile * D;
  static constexpr int kKvBytes = kStages * 2 * kTileElems * 2;  // K then V of each stage
  static constexpr int kFlagBytes = kStages * kTile * 4;          // per position: 1 if its block id is valid
  // The split's block ids, read from the block table once per block (block_size >= 16: <= 32 pages).
  static constexpr int kPagesPerSplit = kSplitTokens / 16;
  static constexpr int kPageBytes = kPagesPerSplit * 4;
  static_assert(kTile % 16 == 0, "P V takes the tile 16 positions (one MMA K) at a time");
  static_assert(kChunks % 8 == 0, "the XOR swizzle permutes chunks within groups of 8");
  static_assert(kKvBytes % 16 == 0 && kFlagBytes % 16 == 0 && kPageBytes % 16 == 0, "smem parts stay 16-byte aligned");
  // Dynamic shared memory of a block of `warps` warps: K/V stages, flags, block ids, the block's query rows.
  static constexpr int kFixedBytes = kKvBytes + kFlagBytes + kPageBytes;
  static constexpr int smem_bytes(int warps) { return kFixedBytes + warps * kRowsPerWarp * D * 2; }
  static_assert(kFixedBytes + kMaxWarps * kRowsPerWarp * D * 2 <= 227 * 1024, "fits one SM's smem");
};

// Fused variant's padding writer (grid slice z = R): one warp per (token, q head) of the tokens no valid
// request owns (padding rows, tokens past query_start_loc[R], invalid requests), zeros and lse -inf, as
// the merge kernel writes them; grid-strided over the slice's blocks.
template <typename T, int D>
__device__ void write_padding_mma(const AttentionParams& p, int32_t num_splits, const float* ws_ml,
                                  const float* ws_acc) {
  const int64_t warps = int64_t(blockDim.x) / 32;
  const int64_t first = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * warps + threadIdx.x / 32;
  const int64_t stride = int64_t(gridDim.x) * gridDim.y * warps;
  for (int64_t item = first; item < p.num_tokens * p.num_q_heads; item += stride) {
    const int64_t token = item / p.num_q_heads;
    if (token_splits(p, token, num_splits) != 0) continue;  // a valid request's token: its merge writes it
    merge_token_head<T, D>(p, token, int32_t(item % p.num_q_heads), 0, 0, num_splits, ws_ml, ws_acc,
                           int(threadIdx.x & 31));
  }
}

// Partials of one (split s, row chunk, KV head h, request r); see the file comment. Thread layout: warp w
// owns block rows 16 w .. 16 w + 15; in MMA fragments lane l holds rows l / 4 and l / 4 + 8 of its warp's
// tile and columns 2 (l % 4) + {0, 1} of each 8-column MMA tile.
template <typename T, int D>
__global__ void __launch_bounds__(MmaConfig<T, D>::kMaxWarps * 32, 1)
    attention_partials_mma_kernel(const AttentionParams p, int32_t num_splits, int32_t num_chunks, bool vec_loads,
                                  float* __restrict__ ws_ml, float* __restrict__ ws_acc, int32_t* counters) {
  using Cfg = MmaConfig<T, D>;
  constexpr int kTile = Cfg::kTile, kStages = Cfg::kStages, kChunks = Cfg::kChunks;
  constexpr int kNT = kTile / 8;  // MMA N tiles of S (positions)
  constexpr int kDT = D / 8;      // MMA N tiles of O (head dim)
  AV_DYNAMIC_SMEM(smem);
  T* kv_s = reinterpret_cast<T*>(smem);                                      // [kStages][2][kTile][D]
  int32_t* flag_s = reinterpret_cast<int32_t*>(smem + Cfg::kKvBytes);         // [kStages][kTile]
  int32_t* page_s = reinterpret_cast<int32_t*>(smem + Cfg::kKvBytes + Cfg::kFlagBytes);  // [kPagesPerSplit]
  T* q_s = reinterpret_cast<T*>(smem + Cfg::kFixedBytes);                    // [warps * 16][D]

  const int32_t s = blockIdx.x / num_chunks, chunk = blockIdx.x % num_chunks, h = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid >> 5, lane = tid & 31;
  const int block_rows = nthreads / 32 * Cfg::kRowsPerWarp;
  if (counters != nullptr && r == p.num_reqs) {  // fused: the extra grid slice writes the padding tokens
    write_padding_mma<T, D>(p, num_splits, ws_ml, ws_acc);
    return;
  }
  const bool fp8 = p.kv_dtype == kFloat8E4M3;
  if (blockIdx.x == 0 && r == 0 && tid == 0) {
    if (fp8) count_bad_kv_scales(p, h);
    count_bad_sinks(p, h, p.num_q_heads / p.num_kv_heads);
  }
  const RequestSpan span = request_span(p, r);
  const ChunkWork w = chunk_work(p, span, r, s, chunk, block_rows, h, blockIdx.x == 0 && tid == 0);
  if (!w.active) return;  // no barrier has been reached yet: the whole block leaves together
  const int32_t group = w.group, row0 = w.row0, nrows = w.nrows, s0 = w.s0, s_end = w.s_end;
  const int32_t s_begin = w.s_begin;  // (a sliding window's start: tiles begin at its tile, loads at it)
  const int32_t t_base = s0 + (s_begin - s0) / kTile * kTile;
  const int32_t last_of_token0 = w.last_of_token0;
  const int64_t begin = span.begin;
  const int32_t num_tiles = s_end >= s_begin ? (s_end - t_base) / kTile + 1 : 0;  // 0: the block's rows see none
  const bool counts_bad = w.counts_bad;
  // The split's block ids into smem once, so the pipeline's loads never wait on a table read; block_size
  // is a power of two (can_implement), so pages and offsets are shifts and masks.
  const int page_shift = __ffs(p.block_size) - 1;
  const int32_t page0 = s0 >> page_shift;
  load_split_pages(page_s, p, r, s0, s_begin, s_end, page_shift, tid, nthreads);
  __syncthreads();  // page_s written (every thread of an active block gets here)

  // Tile i's K and V rows into stage i % kStages: one 16-byte chunk per thread and round, zero-filled past
  // s_end and for bad block ids (flag 0: masked in the softmax). Caches whose base is not 16-byte aligned
  // (rows are 16-byte multiples, so the base decides) take plain element copies instead of cp.async. An fp8
  // cache's 8 bytes per chunk are loaded into registers and decoded to T (exact) before the store, so its
  // tiles are synchronous loads, not cp.async: correct, but the pipeline hides less latency (NOTES).
  auto load_tile = [&](int32_t i) {
    const int stage = i % kStages;
    T* k_dst = kv_s + stage * 2 * Cfg::kTileElems;
    T* v_dst = k_dst + Cfg::kTileElems;
    const int32_t t0 = t_base + i * kTile;
    for (int idx = tid; idx < kTile * kChunks; idx += nthreads) {
      const int j = idx / kChunks, c = idx % kChunks;
      const int32_t pos = t0 + j;
      const int64_t off =
          chunk_offset<D>(p, page_s, page0, page_shift, pos, s_begin, s_end, h, c, counts_bad && c == 0);
      if (c == 0) flag_s[stage * kTile + j] = off >= 0 ? 1 : 0;
      load_chunk(k_dst + swizzle<D>(j, c), p.k_cache, off, fp8, vec_loads);
      load_chunk(v_dst + swizzle<D>(j, c), p.v_cache, off, fp8, vec_loads);
    }
  };

  // Prologue: the first kStages - 1 tiles in flight (one commit group per tile slot, empty past the end,
  // so cp_async_wait<kStages - 2> below always means "tile i has landed").
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < num_tiles) load_tile(i);
    tc::cp_async_commit();
  }
  // The block's query rows into smem (swizzled), zeros past the request; made visible by the first
  // barrier of the tile loop.
  load_query_rows<T, D>(q_s, p, begin, row0, nrows, block_rows, group, h, tid, nthreads);
  // This lane's two rows (block rows wr and wr + 8), their limits and tree masks, and the warp's last position.
  int32_t warp_last;
  const FragmentRows frag_rows = fragment_rows(p, begin, row0, nrows, warp * Cfg::kRowsPerWarp, group, last_of_token0,
                                               lane, warp_last);
  const int wr = warp * Cfg::kRowsPerWarp + (lane >> 2);
  // exp(x) = exp2(x log2 e); an fp8 cache's K scale folds in here and its V scale into the written acc.
  const ScoreMap score = score_map(p.scale * (fp8 ? kv_scale(p, h, false) : 1.f), p.softcap);
  const float v_scale = fp8 ? kv_scale(p, h, true) : 1.f;

  // Online-softmax state, in log2 units of the scaled score: m per row (quad-uniform), l per lane (this
  // lane's columns only; summed over the quad at the end), and the O accumulators (C fragments).
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float acc[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;

  for (int32_t i = 0; i < num_tiles; ++i) {
    tc::cp_async_wait<kStages - 2>();  // this thread's copies of tile i have landed
    __syncthreads();  // everyone's have (and the query rows are stored); everyone is done with tile i - 1
    if (i + kStages - 1 < num_tiles) load_tile(i + kStages - 1);  // into tile i - 1's stage
    tc::cp_async_commit();

    const int32_t t0 = t_base + i * kTile;
    if (t0 > warp_last) continue;  // warp-uniform: no row of this warp sees the tile (no barrier below)
    const int stage = i % kStages;
    const T* k_t = kv_s + stage * 2 * Cfg::kTileElems;
    const T* v_t = k_t + Cfg::kTileElems;
    const int32_t* flags = flag_s + stage * kTile;

    // S = Q K^T over the head dim (mma_tile.cuh), masked and folded into the online softmax.
    float sc[kNT][4];
    qk_tile<T, D, kNT>(sc, q_s, warp * Cfg::kRowsPerWarp, k_t, lane);
    online_softmax_tile(sc, acc, m0, m1, l0, l1, frag_rows, t0, s_end, flags, score, lane);

    pv_tile<T, D, kTile, kNT, kDT>(acc, sc, v_t, 0, lane);  // O += P V
  }
  tc::cp_async_wait<0>();  // nothing may be in flight when the block exits (only empty groups remain)

  // (m, l) from lane 0 of each quad after summing l over the quad; acc as float2 per fragment pair.
  quad_sum(l0, l1);
  write_partials<D, kDT>(ws_ml, ws_acc, p, begin, row0, nrows, wr, group, h * group, num_splits, s, m0, m1, l0, l1, acc,
                         v_scale, 0, true, lane);
  if (counters == nullptr) return;  // two launches: attention_merge_kernel merges

  // Fused: the last of the request's split blocks for this (KV head, row chunk) to arrive merges its rows,
  // with the merge kernel's per-(token, head) routine (same bits). Each thread's partials are made visible
  // device-wide before the block counts itself (the classic fence-then-count pattern).
  __shared__ int32_t merges;
  const int32_t used = request_splits(span, num_splits), first = request_first_split(p, span);
  if (used > kFusedMergeMaxSplits) return;  // block-uniform: a long request is the merge kernel's
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    // Fences on both sides of the count in the counting thread too: release of the block's partials
    // (made visible to it by the barrier) and acquire of the others', without leaning on cumulativity.
    __threadfence();
    const int32_t arrived = atomicAdd(counters + (int64_t(r) * p.num_kv_heads + h) * num_chunks + chunk, 1);
    __threadfence();
    merges = arrived == used - first - 1 ? 1 : 0;  // splits below a window's first are never launched work
  }
  __syncthreads();
  if (merges == 0) return;
  __threadfence();  // order the count before the reads of the other blocks' partials
  // Each output has one writer, as in the merge kernel: a token whose owner (token_owner) is not this
  // request (query_start_loc not non-decreasing: unchecked on the device) is left to that owner or to the
  // padding writer.
  for (int lr = warp; lr < nrows; lr += nthreads / 32) {
    const int32_t row = row0 + lr;
    const int64_t token = begin + row / group;
    if (token_owner(p, token) != r) continue;  // warp-uniform
    merge_token_head<T, D>(p, token, h * group + row % group, first, used, num_splits, ws_ml, ws_acc, lane);
  }
}

// The tensor-core kernel: partials then merge (kAttentionMma), or one launch whose last blocks merge
// (kAttentionMmaFused: a memset of the arrival counters, then the partials kernel with an extra grid slice
// for the padding tokens). Workspace split as attention_workspace_floats (params.h) lays it out.
template <typename T, int D>
inline cudaError_t launch_attention_mma(const AttentionParams& p, int32_t num_splits, float* ws_ml, float* ws_acc,
                                        bool vec_loads, cudaStream_t stream) {
  using Cfg = MmaConfig<T, D>;
  const bool fused = p.kernel == kAttentionMmaFused;
  const MmaLaunchShape shape = mma_launch_shape(p);
  const int64_t grid_x = int64_t(num_splits) * shape.chunks;
  if (p.num_reqs > 0 && shape.chunks > 0) {
    if (grid_x > 0x7fffffff || p.num_reqs + (fused ? 1 : 0) > 65535) return cudaErrorInvalidValue;
    auto* kernel = attention_partials_mma_kernel<T, D>;
    const int smem = Cfg::smem_bytes(shape.warps);
    // Opt in to the largest block's dynamic shared memory once per device.
    static bool opted_in[64] = {};
    cudaError_t err = opt_in_smem(kernel, Cfg::smem_bytes(Cfg::kMaxWarps), opted_in);
    if (err != cudaSuccess) return err;
    int32_t* counters = nullptr;
    if (fused) {
      counters = reinterpret_cast<int32_t*>(ws_acc + p.num_tokens * p.num_q_heads * int64_t(num_splits) * D);
      err = cudaMemsetAsync(counters, 0, size_t(p.num_reqs) * p.num_kv_heads * shape.chunks * sizeof(int32_t),
                            stream);
      if (err != cudaSuccess) return err;
    }
    const dim3 grid(unsigned(grid_x), unsigned(p.num_kv_heads), unsigned(p.num_reqs + (fused ? 1 : 0)));
    err = launch_kernel(kernel, grid, dim3(unsigned(32 * shape.warps)), size_t(smem), stream, p, num_splits,
                        shape.chunks, vec_loads, ws_ml, ws_acc, counters);
    if (err != cudaSuccess) return err;
    // Fused: the merge kernel only when a request may have more splits than the partials launch merges.
    if (fused && num_splits <= kFusedMergeMaxSplits) return cudaSuccess;
  }
  const int64_t items = p.num_tokens * p.num_q_heads;
  const unsigned merge_blocks = unsigned((items + kMergeWarps - 1) / kMergeWarps);
  const int32_t after_fused = fused && p.num_reqs > 0 && shape.chunks > 0 ? kFusedMergeMaxSplits : 0;
  return launch_kernel(attention_merge_kernel<T, D>, dim3(merge_blocks), dim3(32 * kMergeWarps), 0, stream, p,
                       num_splits, ws_ml, ws_acc, after_fused);
}


}  // namespace attention
}  // namespace adaptive_verify
