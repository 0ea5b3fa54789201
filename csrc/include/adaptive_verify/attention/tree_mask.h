// Which KV positions a query token of verify_attention sees, with or without a draft-tree mask: the one rule
// every kernel (cpu.cpp, kernel_rowwise.cuh, kernel_mma.cuh) applies, written once for host and device.
//
// Query token i (its offset in the request's verified block, i < q_len <= kMaxQueryLen = 64) of a request
// with context_len = seq_len - q_len sees KV position pos iff
//   pos <= context_len + i                      (the causal bound: never a later token of the block), and
//   pos < context_len or bit (pos - context_len) of its mask is set.
// A chain has no mask (every bit set), which leaves the causal bound alone: the same positions, hence the
// same bits, as before masks existed. Bits above i (and so every bit >= q_len) are ignored: a tree laid out in
// topological order (docs/design.md, "Draft trees") only ever has ancestor bits, which precede the token, and
// keeping the causal bound as the outer limit lets every kernel keep its tile and split bounds unchanged.
#pragma once

#include <climits>
#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace attention {

static_assert(kMaxQueryLen <= 64, "a query token's in-block mask is one 64-bit word");

// The in-block mask of query token `token` ([T] tree_mask, or null for causal chains: every bit).
AV_HD uint64_t token_tree_mask(const int64_t* tree_mask, int64_t token) {
  return tree_mask == nullptr ? ~uint64_t(0) : uint64_t(tree_mask[token]);
}

// Sliding windows (AttentionParams::window_left = W >= 0) compare positions, not KV indices: a context key's position
// is its KV index, a block token's is context_len plus its depth in the tree, which its mask gives as the number of
// set bits at offsets <= its own, minus one (a chain: its offset). Token i sees a key only if the key's position is
// >= its own position - W. For the ancestors of i (the only block keys it sees) the depth of ancestor k is the
// number of i's mask bits at offsets <= k, minus one, so one mask serves both.
// Depth of the block token at offset k (< 64) on the path that `mask` describes (-1 for k < 0: no block token).
AV_HD int32_t depth_in_mask(uint64_t mask, int32_t k) {
  if (k < 0) return -1;
  const uint64_t low = k >= 63 ? ~uint64_t(0) : (uint64_t(2) << k) - 1;
  return popcount64(mask & low) - 1;
}

// The lowest key position a query token sees under a window of W positions to its left (W < 0: no window, the
// smallest int32). `last` is the token's causal bound, context_len + its offset; its position is context_len plus
// its depth, taken as 0 for a mask without the token's own bit (not a tree: the planner's trees always have it).
AV_HD int32_t window_low(uint64_t mask, int32_t context_len, int32_t last, int32_t window_left) {
  if (window_left < 0) return INT32_MIN;
  const int32_t depth = depth_in_mask(mask, last - context_len);
  return context_len + (depth > 0 ? depth : 0) - window_left;
}

// Whether KV position `pos` is visible to a query token whose causal bound is `last` (context_len + its
// offset), whose in-block mask is `mask` and whose window starts at key position `low` (window_low). pos -
// context_len <= last - context_len < 64 when the first test passes, so the shifts are always defined.
AV_HD bool position_visible(uint64_t mask, int32_t pos, int32_t context_len, int32_t last, int32_t low = INT32_MIN) {
  if (pos > last) return false;
  if (pos < context_len) return pos >= low;
  const int32_t k = pos - context_len;
  if (((mask >> k) & 1u) == 0) return false;
  return low <= context_len || context_len + depth_in_mask(mask, k) >= low;
}

// First KV position any token of a request can see under a window (0 without one): its anchor's window start
// (every token's position is at least context_len). No kernel reads a block id or a K/V row below it, so an engine
// may leave the pages wholly outside the window unmapped; splits wholly below it are skipped by the partials
// kernels and by the merges alike.
AV_HD int32_t request_window_start(int32_t context_len, int32_t window_left) {
  if (window_left < 0) return 0;
  const int32_t start = context_len - window_left;
  return start > 0 ? start : 0;
}

}  // namespace attention
}  // namespace adaptive_verify
