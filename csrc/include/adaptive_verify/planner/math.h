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

// Survival in 32.32 fixed point; s * 2^32 is exact in float (power-of-two scale), the conversion
// truncates identically on host and device.
// s <= 1 so s * 2^32 <= 2^32 fits int64: the signed conversion is one instruction on x86-64.
AV_HD uint64_t to_fixed(float s) {
#if defined(__CUDA_ARCH__)
  return uint64_t(__float2ll_rz(s * 4294967296.0f));
#else
  return uint64_t(static_cast<int64_t>(s * 4294967296.0f));
#endif
}

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
