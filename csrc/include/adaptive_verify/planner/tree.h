// The per-request pieces of the planner that differ for draft trees (docs/design.md, "Draft trees"): the walk
// that turns a request's nodes into ranking words, the verified set below a threshold, and one token of the
// tree layout. The rest of the plan (buckets, fixed-point sums, the budget search, the threshold) is the chain's,
// in algorithm.h, which calls these when Params::parents is set.
//
// NOTES: a tree row is walked in node order, which is topological (parents[j] < j), so a node's parent is done
// when the node is reached:
//  - survival is clamped to [0, 1] and made no larger than the parent's: the tree form of the chain's running
//    minimum (identical on a chain), so every prefix of the canonical order is ancestor-closed for any input;
//  - a node is a candidate only if its parent is (the anchor always is), so whatever removes a node (a NaN
//    survival, an invalidated draft id, a duplicate sibling, a bad parent) removes its subtree, as a chain's
//    NaN ends the row.
#pragma once

#include <cstdint>

#include "adaptive_verify/planner/math.h"
#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

// Key of a tree candidate from its ranking word.
AV_HD uint64_t tree_word_key(int32_t u, int32_t depth, int32_t r, int32_t node) {
  return tree_candidate_key(u >= kForcedTag, word_survival(u), depth, r, node);
}

struct TreeWalk {
  int32_t cand = 0;         // candidates
  int32_t forced = 0;       // candidates with node < min_verify
  int32_t bad_parents = 0;  // nodes whose parent is outside [-1, j)
  int32_t duplicates = 0;   // nodes whose draft id repeats an earlier sibling's
  bool nan = false;         // a NaN survival removed a node (counted once per request, as a chain's cut)
  bool bad_size = false;    // drafts[r] (the tree size) outside [0, N] (clamped)
};

// Request r's N slot words (kNoSlot where no candidate) and the depth of each candidate (0 elsewhere). Nodes
// j < min(tree size, max_verify) are looked at, in node order; node j is a candidate iff its parent is valid, its
// draft id (when draft_tokens is given) is not negative and not an earlier sibling's, its parent is a candidate
// (or the anchor) and its survival is not NaN, checked in that order (a malformed parent or a duplicate is reported
// whatever its ancestors). wr: the request's scaled weight (1 without weights): the word ranks wr * survival,
// capped by the parent's word (rounding is monotone, so that is wr times the unweighted capped survival, as a
// chain's walk_row ranks wr times its running minimum).
AV_HD TreeWalk walk_tree_row(const Params& p, int32_t r, int32_t* words, uint8_t* depth, float wr) {
  const int32_t N = p.max_drafts;
  int32_t size = p.drafts[r];
  TreeWalk w;
  w.bad_size = size < 0 || size > N;
  size = size < 0 ? 0 : (size > N ? N : size);
  const int32_t window = size < p.max_verify ? size : p.max_verify;
  const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
  const float* row = p.survival + int64_t(r) * p.survival_stride;
  const int32_t* ids = p.draft_tokens != nullptr ? p.draft_tokens + int64_t(r) * p.draft_tokens_stride : nullptr;
  // Siblings through linked lists (the last child seen of each parent, index parent + 1, and each node's previous
  // sibling), so a node is compared with its own earlier siblings only: a few compares for real trees' branching.
  int8_t last_child[kMaxTreeNodes + 1];
  int8_t prev_sibling[kMaxTreeNodes];
  if (ids != nullptr)
    for (int32_t q = 0; q <= window; ++q) last_child[q] = -1;
  uint64_t is_cand = 0;
  for (int32_t j = 0; j < N; ++j) {
    words[j] = kNoSlot;
    depth[j] = 0;
    if (j >= window) continue;
    const int32_t pj = par[j];
    if (pj < -1 || pj >= j) {
      ++w.bad_parents;
      continue;
    }
    if (ids != nullptr) {
      const int32_t id = ids[j];
      if (id < 0) continue;  // an invalidated draft (never a duplicate: it is not verified)
      bool dup = false;
      for (int32_t q = last_child[pj + 1]; q >= 0; q = prev_sibling[q]) dup |= ids[q] == id;
      prev_sibling[j] = last_child[pj + 1];
      last_child[pj + 1] = int8_t(j);
      if (dup) {
        ++w.duplicates;
        continue;
      }
    }
    if (pj >= 0 && !((is_cand >> pj) & 1u)) continue;
    const float raw = row[j];
    if (raw != raw) {
      w.nan = true;
      continue;
    }
    float u = mul_rn(wr, sanitize(raw));
    if (pj >= 0) {
      const float cap = word_survival(words[pj]);
      u = u < cap ? u : cap;
    }
    const bool forced = j < p.min_verify;
    words[j] = int32_t(float_bits(u)) + (forced ? kForcedTag : 0);
    depth[j] = uint8_t(pj >= 0 ? depth[pj] + 1 : 1);
    is_cand |= uint64_t(1) << j;
    ++w.cand;
    w.forced += forced;
  }
  return w;
}

// Offset within the request's verified block of verified node a (the anchor is offset 0; verified nodes follow
// in node order).
AV_HD int32_t tree_offset_of(uint64_t verified, int32_t a) {
  return 1 + popcount64(verified & ((uint64_t(1) << a) - 1));
}

// Writes the outputs of token `tok` (local index) of request r at offset i of its verified block, whose node (-1:
// the anchor), depth, parent offset and mask are given. Positions follow the depth (RoPE), the slot the KV index
// context_len + i (siblings never share a slot). Returns false when the block table cannot hold that KV index (the
// slot is then -1).
AV_HD bool write_tree_token_fields(const Params& p, int32_t r, int32_t i, int64_t tok, int32_t node, int32_t d,
                                   int32_t parent_offset, uint64_t mask) {
  const int32_t ctx = p.context_lens != nullptr ? p.context_lens[r] : 0;
  if (p.token_req != nullptr) p.token_req[tok] = r;
  if (p.positions != nullptr) p.positions[tok] = ctx + d;
  bool slot_ok = true;
  if (p.slot_mapping != nullptr) {
    const int64_t slot = slot_of(p.block_table + int64_t(r) * p.block_table_stride, p.max_blocks, p.block_size,
                                 int64_t(ctx) + i);
    slot_ok = slot >= 0;
    p.slot_mapping[tok] = slot;
  }
  if (p.input_ids != nullptr)
    p.input_ids[tok] = i == 0 ? p.anchor_tokens[r] : p.draft_tokens[int64_t(r) * p.draft_tokens_stride + node];
  if (p.tree_mask != nullptr) p.tree_mask[tok] = int64_t(mask);
  if (p.token_parent != nullptr) p.token_parent[tok] = parent_offset;
  if (p.token_node != nullptr) p.token_node[tok] = node;
  if (p.token_depth != nullptr) p.token_depth[tok] = d;
  return slot_ok;
}

// Token `tok` of request r, offset i of its verified block: 0 the anchor, i >= 1 the i-th verified node in node order
// (`verified`: the request's verified nodes; `depth_row`: their depths), each token on its own (the block's threads
// take tokens in parallel): the node by clearing i - 1 set bits, the mask by climbing the parents. The CPU kernel
// walks each request's tokens in order instead, keeping every node's offset and mask (the same values).
AV_HD bool write_tree_token(const Params& p, int32_t r, uint64_t verified, const uint8_t* depth_row, int32_t i,
                            int64_t tok) {
  int32_t node = -1, d = 0, parent_offset = -1;
  uint64_t mask = 1;  // the anchor is visible to every token of its request
  if (i > 0) {
    uint64_t rest = verified;
    for (int32_t k = 1; k < i; ++k) rest &= rest - 1;
    node = lowest_bit64(rest);
    d = depth_row[node];
    const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
    mask |= uint64_t(1) << i;
    // The verified set is ancestor-closed and parents were checked by the walk, so this climbs verified nodes.
    for (int32_t a = par[node]; a >= 0; a = par[a]) mask |= uint64_t(1) << tree_offset_of(verified, a);
    parent_offset = par[node] < 0 ? 0 : tree_offset_of(verified, par[node]);
  }
  return write_tree_token_fields(p, r, i, tok, node, d, parent_offset, mask);
}

// Padding lane t of the tree outputs.
AV_HD void write_tree_padding(const Params& p, int64_t t) {
  if (p.tree_mask != nullptr) p.tree_mask[t] = 0;
  if (p.token_parent != nullptr) p.token_parent[t] = -1;
  if (p.token_node != nullptr) p.token_node[t] = -1;
  if (p.token_depth != nullptr) p.token_depth[t] = 0;
}

}  // namespace planner
}  // namespace adaptive_verify
