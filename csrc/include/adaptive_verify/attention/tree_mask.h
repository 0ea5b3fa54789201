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

// Whether KV position `pos` is visible to a query token whose causal bound is `last` (context_len + its
// offset) and whose in-block mask is `mask`. pos - context_len <= last - context_len < 64 when the first test
// passes, so the shift is always defined.
AV_HD bool position_visible(uint64_t mask, int32_t pos, int32_t context_len, int32_t last) {
  return pos <= last && (pos < context_len || ((mask >> (pos - context_len)) & 1u) != 0);
}

}  // namespace attention
}  // namespace adaptive_verify
