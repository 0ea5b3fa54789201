// Warp-level steps of one pipeline tile in the tensor-core attention kernels (kernel_mma.cuh for GQA, kernel_mla.cuh
// for MLA): S = Q K^T from swizzled shared memory, the online softmax, and P as an A operand. S is held in mma.sync C
// fragments: lane l holds rows l / 4 and l / 4 + 8 of its warp's 16
// rows and columns 2 (l % 4) + {0, 1} of each 8-position N tile. State in log2 units of the scaled score: m per row
// (quad-uniform), l per lane (its own columns; summed over the quad at the end), the O accumulators.
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/attention/tensor_core.cuh"
#include "adaptive_verify/attention/tree_mask.h"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] tile: chunks are XORed
// with row % 8, so the 8 rows an ldmatrix reads at one logical chunk fall in 8 distinct bank groups.
template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// S = Q K^T for the warp's 16 query rows (rows q_row0 .. q_row0 + 15 of q_s) against the tile's first 8 kNT
// positions, over the D dims 16 at a time. ldmatrix row addresses: for Q (A operand) lane l gives row l % 16, chunk
// 2 ks + l / 16; for K (B operand, K rows are its columns) position 16 np + 8 (l / 16) + l % 8, chunk 2 ks + (l / 8)
// % 2, so r[0..1] and r[2..3] are two N tiles.
// kUnroll: how many of the D / 16 steps to unroll (MLA's 36 in full would spill).
template <typename T, int D, int kNT, int kUnroll = D / 16>
__device__ __forceinline__ void qk_tile(float (&sc)[kNT][4], const T* q_s, int q_row0, const T* k_t, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll kUnroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t qa[4];
    tc::ldmatrix_x4(qa, q_s + swizzle<D>(q_row0 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t kb[4];
      tc::ldmatrix_x4(kb, k_t + swizzle<D>(16 * np + ((lane >> 4) << 3) + (lane & 7), 2 * ks + ((lane >> 3) & 1)));
      tc::mma_16816(sc[2 * np], qa, kb[0], kb[1], T{});
      tc::mma_16816(sc[2 * np + 1], qa, kb[2], kb[3], T{});
    }
  }
}

// P for positions 16 kk .. 16 kk + 15 as an A operand: the C fragments of S tiles 2 kk and 2 kk + 1, rounded to T.
template <typename T, int kNT>
__device__ __forceinline__ void p_operand(uint32_t (&pa)[4], const float (&sc)[kNT][4], int kk) {
  pa[0] = tc::pack2(sc[2 * kk][0], sc[2 * kk][1], T{});
  pa[1] = tc::pack2(sc[2 * kk][2], sc[2 * kk][3], T{});
  pa[2] = tc::pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], T{});
  pa[3] = tc::pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], T{});
}

// What hides positions from this lane's two rows.
struct FragmentRows {
  int32_t lim0, lim1;      // the last position each row sees (causal bound; -1: a row past the request)
  uint64_t mask0, mask1;   // their draft-tree masks (tree_mask.h; every bit for a chain)
  int32_t low0, low1;      // the lowest key position each sees (a sliding window; INT32_MIN without)
  int32_t last_of_token0;  // the request's context length: where its verified block starts
};

// Raw q . k -> the score in log2 units: times scale log2(e), or with soft-capping cap * tanh(scale q . k / cap) in
// natural units first (scale includes an fp8 cache's K scale).
struct ScoreMap {
  float scale_log2, pre, post;  // pre = scale / cap, post = cap log2(e)
  bool capped;
};
__host__ __device__ inline ScoreMap score_map(float scale, float softcap) {
  constexpr float kLog2e = 1.4426950408889634f;
  return ScoreMap{scale * kLog2e, softcap > 0.f ? scale / softcap : 0.f, softcap * kLog2e, softcap > 0.f};
}

// O += P V over the tile's kTile positions, 16 (one MMA K) at a time, into kDT 8-column N tiles of O starting at
// V column 16 col_pair0. The C fragments of S tiles 2 kk and 2 kk + 1 are exactly the A fragment of P for positions
// 16 kk .. 16 kk + 15 (p_operand). V rows are positions, so the B operand comes from ldmatrix.trans: lane l gives
// position 16 kk + l % 16, chunk 2 (col_pair0 + dp) + l / 16, and r[0..1] / r[2..3] are N tiles 2 dp / 2 dp + 1.
template <typename T, int D, int kTile, int kNT, int kDT>
__device__ __forceinline__ void pv_tile(float (&acc)[kDT][4], const float (&sc)[kNT][4], const T* v_t, int col_pair0,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t pa[4];
    p_operand<T, kNT>(pa, sc, kk);
#pragma unroll
    for (int dp = 0; dp < kDT / 2; ++dp) {
      uint32_t vb[4];
      tc::ldmatrix_x4_trans(vb, v_t + swizzle<D>(16 * kk + (lane & 15), 2 * (col_pair0 + dp) + (lane >> 4)));
      tc::mma_16816(acc[2 * dp], pa, vb[0], vb[1], T{});
      tc::mma_16816(acc[2 * dp + 1], pa, vb[2], vb[3], T{});
    }
  }
}

// This lane's two rows of a warp whose 16 rows start at block row `tile_row0`: rows tile_row0 + l / 4 (+ 8) of the
// block's nrows, which start at request row row0 (row = i * group + g: query token i). Also the warp's last visible
// position (warp-uniform: its last real row's limit; -1 when the warp has no row).
__device__ __forceinline__ FragmentRows fragment_rows(const AttentionParams& p, int64_t begin, int32_t row0,
                                                      int32_t nrows, int tile_row0, int32_t group,
                                                      int32_t last_of_token0, int lane, int32_t& warp_last) {
  const int wr = tile_row0 + (lane >> 2);
  FragmentRows f;
  f.lim0 = wr < nrows ? last_of_token0 + (row0 + wr) / group : -1;
  f.lim1 = wr + 8 < nrows ? last_of_token0 + (row0 + wr + 8) / group : -1;
  // a tree hides positions inside the causal bound, so the block's and warps' bounds stay the causal ones
  f.mask0 = wr < nrows ? token_tree_mask(p.tree_mask, begin + (row0 + wr) / group) : 0;
  f.mask1 = wr + 8 < nrows ? token_tree_mask(p.tree_mask, begin + (row0 + wr + 8) / group) : 0;
  // (rows past the request have no position: nothing is visible to them anyway)
  f.low0 = wr < nrows ? window_low(f.mask0, last_of_token0, f.lim0, p.window_left) : INT32_MIN;
  f.low1 = wr + 8 < nrows ? window_low(f.mask1, last_of_token0, f.lim1, p.window_left) : INT32_MIN;
  f.last_of_token0 = last_of_token0;
  const int end = tile_row0 + 16 < nrows ? tile_row0 + 16 : nrows;
  warp_last = tile_row0 < nrows ? last_of_token0 + (row0 + end - 1) / group : -1;
  return f;
}

// The block's query rows into shared memory [block_rows][D] (swizzled), zeros past the request's nrows: block row lr
// is request row row0 + lr, query token (row0 + lr) / group, head kv_head * group + (row0 + lr) % group.
template <typename T, int D>
__device__ __forceinline__ void load_query_rows(T* q_s, const AttentionParams& p, int64_t begin, int32_t row0,
                                                int32_t nrows, int block_rows, int32_t group, int32_t kv_head, int tid,
                                                int nthreads) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < block_rows * kChunks; idx += nthreads) {
    const int lr = idx / kChunks, c = idx % kChunks;
    T* dst = q_s + swizzle<D>(lr, c);
    if (lr < nrows) {
      const int32_t row = row0 + lr;
      const T* src = static_cast<const T*>(p.q) + (begin + row / group) * p.q_stride_t +
                     int64_t(kv_head * group + row % group) * p.q_stride_h + c * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = src[e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = T{0};
    }
  }
}

// The split's block ids (positions s0 .. s_end of request r) into shared memory once, so the pipeline's loads never
// wait on a table read; block_size is a power of two (can_implement), so pages are shifts: page_s[i] is page page0 + i.
__device__ __forceinline__ void load_split_pages(int32_t* page_s, const AttentionParams& p, int32_t r, int32_t s0,
                                                 int32_t s_begin, int32_t s_end, int page_shift, int tid,
                                                 int nthreads) {
  if (s_end < s_begin) return;
  const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
  const int32_t page0 = s0 >> page_shift;
  // pages below s_begin (a sliding window's) stay unread: their entries may be unmapped
  for (int32_t i = (s_begin >> page_shift) - page0 + tid; i <= (s_end >> page_shift) - page0; i += nthreads)
    page_s[i] = table[page0 + i];
}

// Element offset of 16-byte chunk c of KV head h's row at position pos (rows of D values, Hkv per slot), or -1 when
// the position is outside s_begin .. s_end (past the block's rows, or below a sliding window: never read) or its
// block id is out of range (then counted once, by `counter`: no host sync can check ids).
template <int D>
__device__ __forceinline__ int64_t chunk_offset(const AttentionParams& p, const int32_t* page_s, int32_t page0,
                                                int page_shift, int32_t pos, int32_t s_begin, int32_t s_end,
                                                int32_t h, int c, bool counter) {
  if (pos > s_end || pos < s_begin) return -1;
  const int32_t block = page_s[(pos >> page_shift) - page0];
  if (block < 0 || block >= p.num_blocks) {
    if (counter) atomicAdd(p.error_counts + kCountSlotOutOfRange, 1);
    return -1;
  }
  return ((int64_t(block) * p.block_size + (pos & (p.block_size - 1))) * p.num_kv_heads + h) * D + c * 8;
}

// A warp's split partials for this lane's two rows (block rows wr and wr + 8 of nrows, request row row0 + lr: token
// (row0 + lr) / group, head head0 + (row0 + lr) % group): (max in natural-log units, sum) when write_ml, and the
// accumulators times v_scale as kDT 8-column tiles from column col0 of the token's Dv. Rows with no visible position
// write (-inf, 0, zeros), which the merge skips. float2 stores: even offsets in a workspace whose acc part starts even.
template <int Dv, int kDT>
__device__ __forceinline__ void write_partials(float* ws_ml, float* ws_acc, const AttentionParams& p, int64_t begin,
                                               int32_t row0, int32_t nrows, int wr, int32_t group, int32_t head0,
                                               int32_t num_splits, int32_t s, float m0, float m1, float l0, float l1,
                                               const float (&acc)[kDT][4], float v_scale, int col0, bool write_ml,
                                               int lane) {
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int lr = wr + 8 * hr;
    if (lr >= nrows) continue;
    const int32_t row = row0 + lr;
    const int64_t cell = ((begin + row / group) * p.num_q_heads + head0 + row % group) * num_splits + s;
    if (write_ml && (lane & 3) == 0) {
      const float m = hr == 0 ? m0 : m1;
      ws_ml[2 * cell] = m == -INFINITY ? -INFINITY : m * kLn2;
      ws_ml[2 * cell + 1] = hr == 0 ? l0 : l1;
    }
    float* dst = ws_acc + cell * Dv + col0 + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(dst + 8 * dt) = make_float2(acc[dt][2 * hr] * v_scale, acc[dt][2 * hr + 1] * v_scale);
  }
}

// One 16-byte chunk of a cached row into shared memory: 8 elements from element offset `off` of `cache` (T, or fp8
// decoded exactly to T in registers), or zeros when off < 0 (a position past the split or in a skipped block). 16-bit
// caches use cp.async when their base is 16-byte aligned (vec_loads), else element copies.
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const void* cache, int64_t off, bool fp8, bool vec_loads) {
  if (fp8) {
    const fp8e4m3_t* c8 = static_cast<const fp8e4m3_t*>(cache);
#pragma unroll
    for (int e = 0; e < 8; ++e) from_float(off >= 0 ? to_float(c8[off + e]) : 0.f, dst + e);
    return;
  }
  const T* c = static_cast<const T*>(cache);
  if (vec_loads) {
    tc::cp_async16(dst, off >= 0 ? c + off : c, off >= 0);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = off >= 0 ? c[off + e] : T{0};
  }
}

// Masks and maps S for the tile starting at position t0 (hidden: past s_end, a skipped block (flag 0), past the
// row's limit, not in its tree mask or below its window; ScoreMap: scale and soft-capping), then folds it into (m, l, acc) and leaves P = exp2(S - m) in sc.
template <int kNT, int kDT>
__device__ __forceinline__ void online_softmax_tile(float (&sc)[kNT][4], float (&acc)[kDT][4], float& m0, float& m1,
                                                    float& l0, float& l1, const FragmentRows& rows, int32_t t0,
                                                    int32_t s_end, const int32_t* flags, const ScoreMap& map,
                                                    int lane) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 8 * nt + 2 * (lane & 3) + (e & 1);
      const int32_t pos = t0 + j;
      const bool vis = pos <= s_end && flags[j] != 0 &&
                       position_visible(e < 2 ? rows.mask0 : rows.mask1, pos, rows.last_of_token0,
                                        e < 2 ? rows.lim0 : rows.lim1, e < 2 ? rows.low0 : rows.low1);
      const float x = map.capped ? map.post * tanhf(sc[nt][e] * map.pre) : sc[nt][e] * map.scale_log2;
      sc[nt][e] = vis ? x : -INFINITY;
    }
    mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));  // fmaxf drops NaN; exp2 below carries it to l and acc
    mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {  // the 4 lanes of a quad share a row
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  const float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
  // Reference point of the exponentials: 0 while a row has seen nothing (m = -inf), so that hidden positions give
  // exp2(-inf) = 0 and never exp2(-inf - -inf) = NaN.
  const float ref0 = new0 == -INFINITY ? 0.f : new0, ref1 = new1 == -INFINITY ? 0.f : new1;
  const float c0 = exp2f(m0 - ref0), c1 = exp2f(m1 - ref1);
  m0 = new0;
  m1 = new1;
  float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    sc[nt][0] = exp2f(sc[nt][0] - ref0);
    sc[nt][1] = exp2f(sc[nt][1] - ref0);
    sc[nt][2] = exp2f(sc[nt][2] - ref1);
    sc[nt][3] = exp2f(sc[nt][3] - ref1);
    ps0 += sc[nt][0] + sc[nt][1];
    ps1 += sc[nt][2] + sc[nt][3];
  }
  l0 = l0 * c0 + ps0;
  l1 = l1 * c1 + ps1;
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    acc[dt][0] *= c0;
    acc[dt][1] *= c0;
    acc[dt][2] *= c1;
    acc[dt][3] *= c1;
  }
}

// l over the quad's columns, at the end of the split.
__device__ __forceinline__ void quad_sum(float& l0, float& l1) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
}

}  // namespace attention
}  // namespace adaptive_verify
