// Arithmetic of the planner that must be bit-identical on the CPU and the GPU. Both kernels call
// these functions, so the CPU tests exercise the same integer/float operations the GPU runs.
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

// Clamp to [0, 1]; NaN, negatives and -0 become +0 so the float's bit pattern orders like its value.
AV_HD float sanitize(float s) { return s > 0.f ? (s < 1.f ? s : 1.f) : 0.f; }

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

// Per-request candidate window: the first `cap` positions are candidates, the first `forced` of
// them (<= cap) are forced. A NaN survival ends the window (never verified in any mode).
struct RowWindow {
  int32_t cap;
  int32_t forced;
  int32_t nan_count;
  bool drafts_out_of_range;
};

// Walks request r's survivals once: emits (key) for every candidate via `emit(j, key)` and returns
// the window. Survival is made non-increasing by a running minimum, so a row's keys ascend with j
// and any first-B set is prefix-closed, even if the caller's survivals are not monotone.
template <typename Emit>
AV_HD RowWindow walk_row(const float* row, int32_t drafts, int32_t K, int32_t min_verify,
                         int32_t max_verify, int32_t r, Emit&& emit) {
  RowWindow w{0, 0, 0, false};
  if (drafts < 0 || drafts > K) {
    w.drafts_out_of_range = true;
    drafts = drafts < 0 ? 0 : K;
  }
  const int32_t cap = drafts < max_verify ? drafts : max_verify;
  float running = 1.f;
  int32_t j = 0;
  for (; j < cap; ++j) {
    const float raw = row[j];
    if (raw != raw) {  // NaN: stop here
      w.nan_count = 1;
      break;
    }
    const float s = sanitize(raw);
    running = s < running ? s : running;
    emit(j, candidate_key(j < min_verify, running, j, r));
  }
  w.cap = j;
  w.forced = min_verify < j ? min_verify : j;
  return w;
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
