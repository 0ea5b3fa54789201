// Tree rejection sampling ("sample and match", docs/design.md "Draft trees"), shared by the CPU kernel and the CUDA
// kernel exactly as rejection_request is (algorithm.h): the Backend supplies argmax / sampled over a row, every
// other step runs identically on both.
//
// Request r's tokens start at query_start_loc[r]: the anchor at offset 0, then the verified nodes with parents
// before children. From the anchor: draw y from the current token's row (argmax when greedy, else a race on
// stream kRace at position = the token's depth); if a child of the current token carries y, move to it and repeat;
// else emit y and stop. Emitted tokens = the accepted nodes' ids, then the last draw. The position of a draw is its
// depth, so a chain (token_parent = offset - 1) draws exactly rejection_request's numbers with draft_probs = null
// and emits the same tokens. Only the rows of the accepted path are read: the cost grows with the accepted depth,
// not with the tree.
#pragma once

#include <cstdint>

#include "adaptive_verify/sampling/algorithm.h"

namespace adaptive_verify {
namespace sampling {

// Most tokens of one request's tree: the anchor and planner::kMaxTreeNodes = 63 nodes (a 64-bit attention mask).
constexpr int32_t kMaxTreeTokens = 64;

AV_HD int64_t tree_input_id(const TreeSampleParams& p, int64_t t) {
  return p.input_ids_int64 ? static_cast<const int64_t*>(p.input_ids)[t]
                           : int64_t(static_cast<const int32_t*>(p.input_ids)[t]);
}

// Runs request r. `writer` is true on exactly one thread (the one that stores results and counts errors).
template <typename T, typename Backend>
AV_HD void tree_request(const TreeSampleParams& p, int32_t r, Backend& be, bool writer) {
  // Output rows are re-derived from p where written rather than kept in registers across the row passes (keeping
  // three pointers live made ptxas spill in the CUDA kernel).
  const int32_t W = p.max_query_len;
  const int64_t row0 = int64_t(r) * W;
  if (writer)
    for (int32_t i = 0; i < W; ++i) {
      p.output_tokens[row0 + i] = -1;
      p.accepted_offsets[row0 + i] = -1;
      if (p.logprobs != nullptr) p.logprobs[row0 + i] = -INFINITY;
    }
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  if (padding_request(p, r, begin, end, writer)) return;
  // Tokens past the outputs' width (or past 64) do not exist for the walk: the path fits the outputs.
  const int32_t cap = W < kMaxTreeTokens ? W : kMaxTreeTokens;
  int32_t n = int32_t(end - begin < cap ? end - begin : cap);
  if (end - begin > cap && writer) atomic_count(p.error_counts, kCountQueryLenOutOfRange);
  const int64_t V = p.vocab;
  // Bad values, counted once per token whatever the path (so the counts do not depend on the draws). The walk needs
  // no mask of them: it enters token i only when token_parent == cur, which lies in [0, i), and input id == y,
  // which lies in [0, V), so a bad parent or id never matches.
  if (writer)
    for (int32_t i = 1; i < n; ++i) {
      const int32_t parent = p.token_parent[begin + i];
      const int64_t id = tree_input_id(p, begin + i);
      if (!(parent >= 0 && parent < i)) atomic_count(p.error_counts, kCountTokenParent);
      if (!(id >= 0 && id < V)) atomic_count(p.error_counts, kCountDraftIdOutOfRange);
    }
  const float temp = p.temperature != nullptr ? p.temperature[r] : 0.f;
  const bool greedy = !(temp > 0.f);  // 0, negative or NaN (the host rejects negatives on CPU)
  const Rng rng{p.seeds != nullptr ? uint64_t(p.seeds[r]) : 0ull,
                p.offset_ptr != nullptr ? uint64_t(*p.offset_ptr) : p.offset};
  const T* logits = static_cast<const T*>(p.logits);
  const Truncation trunc = truncation_of(p.top_k, p.top_p, p.min_p, r, V);
  if (trunc.bad && writer) atomic_count(p.error_counts, kCountSamplingParamOutOfRange);
  int32_t cur = 0, depth = 0;
  for (;;) {
    const T* row = logits + (begin + cur) * p.logits_stride;
    const int64_t y = greedy ? be.argmax(row, V) : be.sampled(row, V, temp, trunc, rng, depth, kRace);
    if (p.logprobs != nullptr) {  // every thread: a block-wide pass over the row
      const float logprob = token_logprob<T>(be, row, V, greedy ? 1.f : temp, y);
      if (writer) p.logprobs[int64_t(r) * W + depth] = logprob;
    }
    if (writer) {
      p.output_tokens[int64_t(r) * W + depth] = int32_t(y);
      p.accepted_offsets[int64_t(r) * W + depth] = cur;
    }
    ++depth;
    // Children sit after their parent; the first one carrying y (siblings are distinct in a planned tree).
    int32_t next = -1;
    for (int32_t i = cur + 1; i < n && next < 0; ++i)
      if (p.token_parent[begin + i] == cur && tree_input_id(p, begin + i) == y) next = i;
    if (next < 0) break;  // y matches no child: it is the recovered (or, at a leaf, the bonus) token
    cur = next;  // strictly increasing, so depth <= n <= W
  }
  if (writer) p.num_emitted[r] = depth;
}

}  // namespace sampling
}  // namespace adaptive_verify
