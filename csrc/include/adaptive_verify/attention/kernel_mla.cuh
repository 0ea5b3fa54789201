// verify_attention_mla on tensor cores (AttentionParams::kernel = kAttentionMma or kAttentionMmaFused with head_dim
// kMlaHeadDim; bf16/fp16 q, a 16-bit or fp8 latent cache).
//
// MLA in its absorbed form: every query head of a request reads the same latent row per position (576 values: 512
// latent then 64 RoPE), scores over all 576, values the first 512. Where GQA shares a K/V row among at most 16 heads,
// here up to 128 heads x q_len tokens share it, so the work is compute-heavy: the request's rows (row = i * H + h:
// query token i, head h) go in the MMA M dimension, and one block reads each latent tile once for up to 64 rows.
//
// Split-KV in two launches whose grids depend only on host bounds, as the GQA kernel (kernel_mma.cuh):
//   1. partials: block (split s, row chunk c, request r) of 2 x M warps: M row tiles of 16 rows, each owned by a pair
//      of warps (warp w and w + M). The split streams through a kStages-deep cp.async pipeline of kTile-position
//      latent tiles (36 KB each; K and V are the same rows, so one tile serves both) into swizzled shared memory.
//      Both warps of a pair compute the same S = Q K^T for their 16 rows over the tile (mma.sync m16n8k16 over the
//      576 dims) and the same online softmax, so they agree on every max and sum without talking; then each
//      computes O += P V for its half of the 512 value columns (256: 32 MMA N tiles, 128 accumulator registers per
//      thread; the whole 512 would not fit one thread's registers). The half-0 warp writes (max, sum), each warp its
//      256 accumulator columns, per (token, head, split).
//   2. merge: merge.cuh's kernel with 512 columns, one warp per (token, head), splits in order.
// "mma_fused" takes the same path (the MLA kernel has no fused merge).
// Same split boundaries (kSplitTokens) and workspace layout as every other kernel; a row's arithmetic depends only
// on its request and the call's max_query_len and H, never on the rest of the batch.
//
// NOTES: written without a GPU (2026-12-06); runs under the host emulator (tests/test_attention_mla.py), not yet on
// hardware. Known costs, by design for now: S is computed twice (once per warp of a pair: 1.5x the tensor work of
// splitting positions between them and exchanging row maxima through shared memory); a request with more than 64
// rows re-reads each latent tile per 64-row chunk (from L2 when the chunks run together); fp8 tiles are decoded by
// synchronous loads (no cp.async overlap). mma.sync on SM100 as on SM90 (no tcgen05).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/kernel_mma.cuh"  // swizzle, MmaLaunchShape
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

struct MlaConfig {
  static constexpr int D = kMlaHeadDim, Dv = kMlaValueDim;
  static constexpr int kMaxRowTiles = 4;              // 64 rows per block at most
  static constexpr int kRowsPerTile = 16;             // the MMA M
  static constexpr int kHalfCols = Dv / 2;             // value columns per warp of a pair: 256
  static constexpr int kTile = 32;                     // positions per pipeline stage: 36 KB of latent rows
  static constexpr int kStages = 3;
  static constexpr int kChunks = D / 8;                // 16-byte chunks per latent row: 72
  static constexpr int kTileElems = kTile * D;
  static constexpr int kKvBytes = kStages * kTileElems * 2;
  static constexpr int kFlagBytes = kStages * kTile * 4;
  static constexpr int kPagesPerSplit = kSplitTokens / 16;
  static constexpr int kPageBytes = kPagesPerSplit * 4;
  static constexpr int kFixedBytes = kKvBytes + kFlagBytes + kPageBytes;
  static_assert(kChunks % 8 == 0, "the XOR swizzle permutes chunks within groups of 8");
  static_assert(kTile % 16 == 0, "P V takes the tile 16 positions (one MMA K) at a time");
  static_assert(kKvBytes % 16 == 0 && kFlagBytes % 16 == 0 && kPageBytes % 16 == 0, "smem parts stay 16-byte aligned");
  static constexpr int smem_bytes(int row_tiles) { return kFixedBytes + row_tiles * kRowsPerTile * D * 2; }
  static_assert(kFixedBytes + kMaxRowTiles * kRowsPerTile * D * 2 <= 227 * 1024, "fits one SM's smem");
};

// Row tiles per block and row chunks per request for a call: its max_query_len x H rows in tiles of 16, at most
// kMaxRowTiles per block.
inline MmaLaunchShape mla_launch_shape(const AttentionParams& p) {
  const int64_t rows = int64_t(p.max_query_len) * p.num_q_heads;
  int64_t tiles = (rows + 15) / 16;
  tiles = tiles < 1 ? 1 : (tiles > MlaConfig::kMaxRowTiles ? MlaConfig::kMaxRowTiles : tiles);
  return MmaLaunchShape{int32_t(tiles), int32_t((rows + tiles * 16 - 1) / (tiles * 16))};
}

// Partials of one (split s, row chunk, request r); see the file comment. Warp w: row tile w % M, value half w / M.
// In MMA fragments lane l holds rows l / 4 and l / 4 + 8 of its tile and columns 2 (l % 4) + {0, 1} of each
// 8-column N tile.
template <typename T>
__global__ void __launch_bounds__(2 * MlaConfig::kMaxRowTiles * 32, 1)
    attention_partials_mla_kernel(const AttentionParams p, int32_t num_splits, int32_t num_chunks, bool vec_loads,
                                  float* __restrict__ ws_ml, float* __restrict__ ws_acc) {
  using Cfg = MlaConfig;
  constexpr int D = Cfg::D, Dv = Cfg::Dv, kTile = Cfg::kTile, kStages = Cfg::kStages, kChunks = Cfg::kChunks;
  constexpr int kNT = kTile / 8;            // MMA N tiles of S (positions)
  constexpr int kDT = Cfg::kHalfCols / 8;   // MMA N tiles of this warp's O columns
  AV_DYNAMIC_SMEM(smem);
  T* kv_s = reinterpret_cast<T*>(smem);                                                  // [kStages][kTile][D]
  int32_t* flag_s = reinterpret_cast<int32_t*>(smem + Cfg::kKvBytes);                    // [kStages][kTile]
  int32_t* page_s = reinterpret_cast<int32_t*>(smem + Cfg::kKvBytes + Cfg::kFlagBytes);  // [kPagesPerSplit]
  T* q_s = reinterpret_cast<T*>(smem + Cfg::kFixedBytes);                                // [tiles * 16][D]

  const int32_t s = blockIdx.x / num_chunks, chunk = blockIdx.x % num_chunks, r = blockIdx.z;
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid >> 5, lane = tid & 31;
  const int row_tiles = nthreads / 64;  // M: two warps per row tile
  const int tile = warp % row_tiles, half = warp / row_tiles;
  const int block_rows = row_tiles * Cfg::kRowsPerTile;
  const bool fp8 = p.kv_dtype == kFloat8E4M3;
  if (fp8 && blockIdx.x == 0 && r == 0 && tid == 0) count_bad_kv_scales(p, 0);
  const RequestSpan span = request_span(p, r);
  const ChunkWork w = chunk_work(p, span, r, s, chunk, block_rows, 0, blockIdx.x == 0 && tid == 0);
  if (!w.active) return;  // no barrier has been reached yet: the whole block leaves together
  const int32_t H = w.group, row0 = w.row0, nrows = w.nrows, s0 = w.s0, s_end = w.s_end;
  const int32_t s_begin = w.s_begin;  // (a sliding window's start: tiles begin at its tile, loads at it)
  const int32_t t_base = s0 + (s_begin - s0) / kTile * kTile;
  const int32_t last_of_token0 = w.last_of_token0;
  const int64_t begin = span.begin;
  const int32_t num_tiles = s_end >= s_begin ? (s_end - t_base) / kTile + 1 : 0;
  const bool counts_bad = w.counts_bad;
  const int page_shift = __ffs(p.block_size) - 1;
  const int32_t page0 = s0 >> page_shift;
  load_split_pages(page_s, p, r, s0, s_begin, s_end, page_shift, tid, nthreads);
  __syncthreads();  // page_s written

  // Tile i's latent rows into stage i % kStages, 16-byte chunks, zero-filled past s_end and for bad block ids (flag
  // 0: masked). Unaligned caches take element copies; fp8 caches decode 8 bytes per chunk to T (exact) in registers.
  auto load_tile = [&](int32_t i) {
    const int stage = i % kStages;
    T* dst_tile = kv_s + stage * Cfg::kTileElems;
    const int32_t t0 = t_base + i * kTile;
    for (int idx = tid; idx < kTile * kChunks; idx += nthreads) {
      const int j = idx / kChunks, c = idx % kChunks;
      const int32_t pos = t0 + j;
      const int64_t off =
          chunk_offset<D>(p, page_s, page0, page_shift, pos, s_begin, s_end, 0, c, counts_bad && c == 0);
      if (c == 0) flag_s[stage * kTile + j] = off >= 0 ? 1 : 0;
      load_chunk(dst_tile + swizzle<D>(j, c), p.k_cache, off, fp8, vec_loads);
    }
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < num_tiles) load_tile(i);
    tc::cp_async_commit();
  }
  load_query_rows<T, D>(q_s, p, begin, row0, nrows, block_rows, H, 0, tid, nthreads);
  int32_t warp_last;
  const FragmentRows frag_rows = fragment_rows(p, begin, row0, nrows, tile * Cfg::kRowsPerTile, H, last_of_token0, lane,
                                               warp_last);
  const int wr = tile * Cfg::kRowsPerTile + (lane >> 2);  // this lane's first row
  // K's scale folds into the score scale, V's into the written accumulators (one latent row: the same scale)
  const ScoreMap score = score_map(p.scale * (fp8 ? kv_scale(p, 0, false) : 1.f), p.softcap);
  const float v_scale = fp8 ? kv_scale(p, 0, true) : 1.f;

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float acc[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;

  for (int32_t i = 0; i < num_tiles; ++i) {
    tc::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i landed for everyone (and the query rows are stored); tile i - 1 is done with
    if (i + kStages - 1 < num_tiles) load_tile(i + kStages - 1);
    tc::cp_async_commit();

    const int32_t t0 = t_base + i * kTile;
    if (t0 > warp_last) continue;  // warp-uniform: no row of this tile sees the positions (no barrier below)
    const int stage = i % kStages;
    const T* kv_t = kv_s + stage * Cfg::kTileElems;
    const int32_t* flags = flag_s + stage * kTile;

    // S = Q K^T over the 576 dims, 16 at a time (both warps of the pair: the same values).
    float sc[kNT][4];
    qk_tile<T, D, kNT, 4>(sc, q_s, tile * Cfg::kRowsPerTile, kv_t, lane);

    online_softmax_tile(sc, acc, m0, m1, l0, l1, frag_rows, t0, s_end, flags, score, lane);

    // O += P V over this warp's 256 value columns of the latent rows
    pv_tile<T, D, kTile, kNT, kDT>(acc, sc, kv_t, half * (kDT / 2), lane);
  }
  tc::cp_async_wait<0>();

  quad_sum(l0, l1);
  // the half-0 warp writes (max, sum); each warp its 256 accumulator columns
  write_partials<Dv, kDT>(ws_ml, ws_acc, p, begin, row0, nrows, wr, H, 0, num_splits, s, m0, m1, l0, l1, acc, v_scale,
                          half * Cfg::kHalfCols, half == 0, lane);
}

// The MLA tensor-core kernel: partials, then merge.cuh's merge over 512 columns.
template <typename T>
inline cudaError_t launch_attention_mla_mma(const AttentionParams& p, int32_t num_splits, float* ws_ml, float* ws_acc,
                                            cudaStream_t stream) {
  using Cfg = MlaConfig;
  const MmaLaunchShape shape = mla_launch_shape(p);  // warps field: row tiles
  const int64_t grid_x = int64_t(num_splits) * shape.chunks;
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  if (p.num_reqs > 0) {
    if (grid_x > 0x7fffffff || p.num_reqs > 65535) return cudaErrorInvalidValue;
    auto* kernel = attention_partials_mla_kernel<T>;
    static bool opted_in[64] = {};
    cudaError_t err = opt_in_smem(kernel, Cfg::smem_bytes(Cfg::kMaxRowTiles), opted_in);
    if (err != cudaSuccess) return err;
    err = launch_kernel(kernel, dim3(unsigned(grid_x), 1u, unsigned(p.num_reqs)), dim3(unsigned(64 * shape.warps)),
                        size_t(Cfg::smem_bytes(shape.warps)), stream, p, num_splits, shape.chunks,
                        aligned(p.k_cache), ws_ml, ws_acc);
    if (err != cudaSuccess) return err;
  }
  const int64_t items = p.num_tokens * p.num_q_heads;
  const unsigned merge_blocks = unsigned((items + kMergeWarps - 1) / kMergeWarps);
  return launch_kernel(attention_merge_kernel<T, Cfg::Dv>, dim3(merge_blocks), dim3(32 * kMergeWarps), 0, stream, p,
                       num_splits, ws_ml, ws_acc, 0);
}

}  // namespace attention
}  // namespace adaptive_verify
