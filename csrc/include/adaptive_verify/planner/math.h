// Arithmetic of the planner that must be bit-identical on the CPU and the GPU. The one algorithm
// (algorithm.h) calls these functions on both, so the CPU tests exercise the operations the GPU runs.
//
// NOTES: determinism across devices rests on three choices:
//  - Candidates are ranked by a 64-bit integer key, so sorting has no float comparisons and ties
//    are broken by (position, request) exactly as the design's canonical order says.
//  - P(B), the sum of survivals of the first B candidates, is accumulated in 32.32 fixed point
//    (uint64): integer addition is associative, so a parallel scan gives the same bits as a loop.
//  - Theta compares in double after exact int64->double conversion and one IEEE division, which
//    CUDA and x86-64 both round correctly; no multiply-add is left for a compiler to contract.
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace planner {

constexpr uint64_t kNoCandidate = ~uint64_t(0);
constexpr int kPosBits = 5;   // K <= 32
constexpr int kReqBits = 26;  // R < 2^26 - 1
constexpr int64_t kMaxReqs = (int64_t(1) << kReqBits) - 2;
constexpr int kMaxDrafts = 1 << kPosBits;
constexpr double kFixedOne = 4294967296.0;  // 2^32: survival 1.0 in 32.32 fixed point
// Largest context length: positions (context_lens[r] + offset) and seq_lens (context_lens[r] + q_len) are int32,
// and a request feeds at most 64 tokens (a chain's 33, a tree's 64), so every sum fits without wrapping.
constexpr int32_t kMaxContextLen = 2147483647 - 64;

AV_HD bool context_len_ok(int32_t ctx) { return ctx >= 0 && ctx <= kMaxContextLen; }

// Clamp to [0, 1]; NaN, negatives and -0 become +0 so the float's bit pattern orders like its value.
AV_HD float sanitize(float s) { return s > 0.f ? (s < 1.f ? s : 1.f) : 0.f; }

// a * b rounded to nearest, never contracted into a fused multiply-add: the survival product's bits are the
// same on the host and the device.
AV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// a / b rounded to nearest (the device's division is otherwise approximate).
AV_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// A usable priority weight: finite and >= 0 (NaN fails). Others count as 1 on the device (counted) and are an
// error on the CPU.
AV_HD bool weight_ok(float w) { return w >= 0.f && w <= 3.40282347e+38f; }

// One request's prefix survival: out[j] = prod_{i <= j} sanitize(conf[i]) for j < drafts, 0 for j in
// [drafts, K), a left-to-right product. The prefix_survival op and plan's confidence prologue both call this.
// drafts must already lie in [0, K]. Returns the NaN confidences among the drafted positions (each counts as 0).
AV_HD int32_t survival_row(const float* conf, int32_t drafts, int32_t K, float* out) {
  float a = 1.f;
  int32_t nan_count = 0;
  for (int32_t j = 0; j < K; ++j) {
    if (j < drafts) {
      const float c = conf[j];
      nan_count += c != c;
      a = mul_rn(a, sanitize(c));
      out[j] = a;
    } else {
      out[j] = 0.f;
    }
  }
  return nan_count;
}

// Canonical order as an ascending uint64: forced candidates first, then survival descending,
// position ascending, request ascending. Layout: [63] not forced | [62:31] ~bits(s) | [30:26] pos |
// [25:0] request. s must be sanitized (non-negative), whose IEEE bits are monotone in its value.
AV_HD uint64_t candidate_key(bool forced, float s, int32_t pos, int32_t req) {
  return (uint64_t(forced ? 0u : 1u) << 63) | (uint64_t(~float_bits(s)) << 31) |
         (uint64_t(uint32_t(pos)) << kReqBits) | uint64_t(uint32_t(req));
}

AV_HD float key_survival(uint64_t key) { return bits_float(~uint32_t(key >> 31)); }

// ---- draft trees (docs/design.md, "Draft trees") ----
// Candidates are nodes; canonical order: forced first (node < min_verify), then survival descending, depth
// ascending, request ascending, node ascending. Layout: [63] not forced | [62:33] 2^30 - 1 - bits(s) | [32:27]
// depth (1..63) | [26:6] request | [5:0] node. s in [0, 1] has bits below 2^30, so 30 bits order it; the
// depth (6 bits) and the node (6 bits) leave 21 request bits. For a chain (depth = position + 1, node =
// position) this orders exactly as candidate_key: a chain given as a tree plans the chain's integers.
constexpr int kTreeNodeBits = 6;
constexpr int kTreeReqBits = 21;
constexpr int32_t kMaxTreeNodes = 63;  // the anchor and every node fit a 64-bit attention mask
constexpr int64_t kMaxTreeReqs = (int64_t(1) << kTreeReqBits) - 1;
constexpr uint32_t kTreeSurvivalMask = (uint32_t(1) << 30) - 1;
static_assert(kMaxTreeNodes < (1 << kTreeNodeBits), "node and depth fields hold 1..63");

AV_HD uint64_t tree_candidate_key(bool forced, float s, int32_t depth, int32_t req, int32_t node) {
  return (uint64_t(forced ? 0u : 1u) << 63) | (uint64_t(kTreeSurvivalMask - float_bits(s)) << 33) |
         (uint64_t(uint32_t(depth)) << 27) | (uint64_t(uint32_t(req)) << kTreeNodeBits) | uint64_t(uint32_t(node));
}
AV_HD float tree_key_survival(uint64_t key) { return bits_float(kTreeSurvivalMask - uint32_t((key >> 33) & kTreeSurvivalMask)); }
AV_HD int32_t tree_key_node(uint64_t key) { return int32_t(key & ((uint64_t(1) << kTreeNodeBits) - 1)); }
AV_HD int32_t tree_key_req(uint64_t key) {
  return int32_t((key >> kTreeNodeBits) & ((uint64_t(1) << kTreeReqBits) - 1));
}

// Index of the lowest set bit (x != 0).
AV_HD int lowest_bit64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

// One request's tree survival: out[j] = out[parents[j]] * sanitize(conf[j]) for j < size (the anchor,
// parent -1, survives with 1), 0 for j in [size, N). Products are taken parent first, so a chain
// (parents[j] = j - 1) gives survival_row's bits. A node whose parent is outside [-1, j) gets 0 (and so do its
// descendants) and is added to *bad_parents. size must already lie in [0, N]. Returns the NaN confidences among
// the drafted nodes (each counts as 0).
AV_HD int32_t tree_survival_row(const float* conf, const int32_t* parents, int32_t size, int32_t N, float* out,
                                int32_t* bad_parents) {
  int32_t nan_count = 0;
  for (int32_t j = 0; j < N; ++j) {
    if (j >= size) {
      out[j] = 0.f;
      continue;
    }
    const int32_t pj = parents[j];
    const bool ok = pj >= -1 && pj < j;
    *bad_parents += !ok;
    const float base = !ok ? 0.f : (pj < 0 ? 1.f : out[pj]);
    const float c = conf[j];
    nan_count += c != c;
    out[j] = mul_rn(base, sanitize(c));
  }
  return nan_count;
}

// Survival in 32.32 fixed point: to_fixed (common.h).

// ---- ranking words (algorithm.h): survival bits, plus kForcedTag for a forced candidate ----
constexpr int32_t kForcedTag = int32_t(1) << 30;  // above the bits of every s in [0, 1]
constexpr uint32_t kOneBits = 0x3f800000u;          // bits of 1.0f
constexpr int32_t kNoSlot = -1;                     // a slot that holds no candidate (below every word)
static_assert(kOneBits < uint32_t(kForcedTag), "the forced tag must sit above every survival's bits");

AV_HD float word_survival(int32_t u) { return bits_float(uint32_t(u) & uint32_t(kForcedTag - 1)); }
AV_HD uint64_t word_fixed(int32_t u) { return to_fixed(word_survival(u)); }

// Theta(B) = (R + extra_emitting + P(B)) / step_cost(R, R + extra_tokens + B), the first factor in
// fixed point (the common 2^32 scale does not change comparisons).
struct ThetaEval {
  uint64_t base_fixed;       // (R + extra_emitting) << 32
  int64_t base_tokens;       // R + extra_tokens
  const float* verify_cost;  // indexed by total tokens
  int64_t verify_cost_len;
  float draft_cost;

  AV_HD double operator()(int64_t budget, uint64_t prefix_fixed) const {
    int64_t n = base_tokens + budget;
    if (n > verify_cost_len - 1) n = verify_cost_len - 1;  // the host sizes the table; never read past it
    const float cost = draft_cost + verify_cost[n];
    return double(base_fixed + prefix_fixed) / double(cost);
  }
};

// Theta's cost term as ThetaEval computes it (same float sum, same clamp of the table index).
AV_HD float step_cost(const ThetaEval& theta, int64_t budget) {
  int64_t n = theta.base_tokens + budget;
  if (n > theta.verify_cost_len - 1) n = theta.verify_cost_len - 1;
  return theta.draft_cost + theta.verify_cost[n];
}

// Slot of KV position `pos` of a request, or -1 when the block table cannot hold it.
AV_HD int64_t slot_of(const int32_t* block_row, int32_t max_blocks, int32_t block_size, int64_t pos) {
  if (pos < 0) return -1;
  const int64_t blk = pos / block_size;
  if (blk >= max_blocks) return -1;
  return int64_t(block_row[blk]) * block_size + pos % block_size;
}

}  // namespace planner
}  // namespace adaptive_verify
