// The verification planner, written once: walk -> buckets -> budget -> threshold -> allocation -> metadata.
// The C++ CPU kernel (planner/cpu.cpp) and the CUDA kernel (planner/kernel.cuh) are thin instantiations of
// plan<Backend>(): a Backend supplies this thread's index and the thread count (1 and 0 on the CPU, the
// block's on CUDA), barriers, reductions that return the same value to every thread, atomics and the
// in-bucket sort. Every loop below is strided over the threads, so on the CPU it is a plain loop and on
// CUDA the whole block shares it; every decision is computed from shared data after a barrier, so all
// threads take the same branches (required around barriers, and what makes the integers identical).
//
// The semantics (docs/design.md, "Planner") in terms of this file:
//  - A request's candidates are positions j < cap(r) = min(drafts[r], max_verify, first negative draft
//    token (an engine's invalidated draft), first NaN survival). Their survival is sanitised (clamped to
//    [0, 1]) and made non-increasing by a running minimum (walk_row).
//  - The canonical order is the ascending 64-bit candidate key (math.h candidate_key): forced first, then
//    survival descending, position ascending, request ascending. The first B candidates are verified.
//  - Ranking word u = bits(s) + kForcedTag if forced: a larger word ranks earlier, ties in u are broken by
//    (position, request), which only the full key carries. u decides a candidate's bucket and its share of
//    P(b); the key decides order inside a bucket.
//  - Buckets are logarithmic in s (Buckets below): their counts and exact fixed-point survival sums give
//    the rank of every bucket boundary and P there without ordering anything. Only buckets whose ranks a
//    decision has to see are ordered ("materialised"): the global argmax prunes buckets whose Theta bound
//    is below a Theta value attained at a boundary; greedy orders buckets as its scan reaches them.
//  - P(b) is 32.32 fixed point (integer, associative: a parallel sum gives the loop's bits) and Theta is
//    compared in double (math.h ThetaEval), so every backend chooses the same budget.
//  - Verified drafts of request r: its candidates whose key is below the key at rank `budget` (count_before).
//  - Draft trees (Params::parents set) change three per-request pieces and nothing else (tree.h): the walk (a
//    candidate per node, survival capped by the parent's), the key (tree_candidate_key: depth and node where a
//    chain has its position; Workspace::depth holds each node's depth for it), and the metadata (the verified
//    nodes of each request as a bit set, Workspace::verified, and the tree layout's tokens).
#pragma once

#include <cstdint>

#include "adaptive_verify/planner/math.h"
#include "adaptive_verify/planner/params.h"
#include "adaptive_verify/planner/tree.h"

static_assert(adaptive_verify::planner::kMaxDepths == adaptive_verify::planner::kMaxDrafts + 1 &&
                  adaptive_verify::planner::kMaxShapes >= adaptive_verify::planner::kMaxDepths,
              "Params' per-shape arrays hold a chain's depths 0..kMaxDrafts");

namespace adaptive_verify {
namespace planner {

AV_HD uint64_t word_key(int32_t u, int32_t j, int32_t r) {
  return candidate_key(u >= kForcedTag, word_survival(u), j, r);
}
// Key of the candidate in slot i = r * K + j.
AV_HD uint64_t slot_key(int32_t u, int64_t slot, int32_t K) {
  const int32_t r = int32_t(slot / K);
  return word_key(u, int32_t(slot - int64_t(r) * K), r);
}

// ---- buckets ----
// Within each half (forced first, then not forced), bucket = (kOneBits - bits(s)) >> shift: logarithmic in
// s (2^(23 - shift) buckets per octave), so survival products, which spread over octaves, fill buckets
// evenly. kOctaves octaves are resolved; smaller survivals share the last bucket of the half. The forced
// half exists only when min_verify > 0.
constexpr int kOctaves = 16;
constexpr int kMinBucketBits = 5;   // 32 buckets per half: small problems are dominated by per-call constants
constexpr int kMaxBucketBits = 11;  // 2048: beyond that clearing and scanning counters costs more than it saves
constexpr int32_t kMaxBuckets = 2 << kMaxBucketBits;

struct Buckets {
  int shift = 0;          // bits of (kOneBits - bits(s)) dropped
  int32_t per_half = 0;   // buckets per half
  int32_t nf_offset = 0;  // first non-forced bucket (0 without forced candidates)
  int32_t num = 0;        // total buckets

  // At most a quarter as many buckets per half as slots (measured best at R=256, K=8 on the CPU: fewer
  // buckets make the ordered buckets bigger, more make the prefix pass and the pruning longer).
  AV_HD static Buckets make(int64_t n_slots, bool has_forced) {
    Buckets b;
    int bits = kMinBucketBits;
    while (bits < kMaxBucketBits && (int64_t(1) << (bits + 1)) <= n_slots / 4) ++bits;
    b.per_half = int32_t(1) << bits;
    b.shift = 23 + 4 - bits;  // per_half << shift == kOctaves octaves of 2^23 bit patterns
    b.nf_offset = has_forced ? b.per_half : 0;
    b.num = b.nf_offset + b.per_half;
    return b;
  }
  AV_HD int32_t of(int32_t u) const {
    const uint32_t d = (kOneBits - (uint32_t(u) & uint32_t(kForcedTag - 1))) >> shift;
    const int32_t b = d < uint32_t(per_half - 1) ? int32_t(d) : per_half - 1;
    return (u >= kForcedTag ? 0 : nf_offset) + b;
  }
  // Largest and smallest word bucket k can hold.
  AV_HD int32_t max_word(int32_t k) const {
    const bool forced = k < nf_offset;
    const uint32_t b = uint32_t(forced ? k : k - nf_offset);
    return int32_t(kOneBits - (b << shift)) + (forced ? kForcedTag : 0);
  }
  AV_HD int32_t min_word(int32_t k) const {
    const bool forced = k < nf_offset;
    const uint32_t b = uint32_t(forced ? k : k - nf_offset);
    const uint32_t d_hi = b + 1 == uint32_t(per_half) ? kOneBits : ((b + 1) << shift) - 1;
    return int32_t(kOneBits - d_hi) + (forced ? kForcedTag : 0);
  }
};
static_assert((1 << 4) == kOctaves, "Buckets::make's shift assumes 16 octaves");

// ---- the workspace every backend gives the algorithm (shared memory / global memory on CUDA) ----
struct Workspace {
  int32_t* words;    // [n_slots rounded up to 16] ranking word of every slot, kNoSlot where no candidate (and in
                     // the padding, so a backend may scan 16 words at a time)
  int32_t* sorted;   // [n_slots] slot indices by rank; valid inside materialised buckets only
  int32_t* tmp;      // [n_slots] scratch of the backend's sort (CUDA: rank-by-counting target)
  int32_t* count;    // [num + 1] candidates per bucket, then the first rank of each bucket ("start")
  uint64_t* sum;     // [num + 1] fixed-point survival sum per bucket, then P at each bucket's start
  int32_t* fill;     // [num] gather cursors while materialising
  uint8_t* ready;    // [num] 1 once the bucket's slots are in `sorted`, ordered
  uint8_t* keep;     // [num] global search: 1 where a bucket may hold the first argmax
  int32_t* lens;     // [R] verified drafts per request
  int32_t* tile;     // [threads + 1] token offsets of a tile of requests
  uint8_t* depth;      // trees: [n_slots] depth of each candidate node (null for chains)
  uint64_t* verified;  // trees: [R] verified nodes of each request, bit j for node j (null for chains)
  uint8_t* rank;       // trees: [n_slots] a parent node's rank within its depth (choose_tree_shape; null for chains)
  float wscale = 1.f;  // weights' scale c = max(1, max w) (plan() sets it; 1 without weights)
};

// Bytes of a Workspace for n_slots slots, num buckets, R requests and `threads` threads, and its carving.
// Trees add a depth and a rank per slot and a verified-node set per request (-1 offsets for chains).
struct WorkspaceLayout {
  int64_t words, sorted, tmp, count, sum, fill, ready, keep, lens, tile, depth, verified, rank, bytes;
};
AV_HD int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }
AV_HD WorkspaceLayout workspace_layout(int64_t n_slots, int32_t num, int32_t R, int32_t threads, bool with_tmp,
                                       bool tree = false) {
  WorkspaceLayout l{};
  int64_t at = 0;
  l.sum = at;    at = align16(at + int64_t(num + 1) * 8);
  l.verified = tree ? at : -1;  at = align16(at + (tree ? int64_t(R) * 8 : 0));
  l.words = at;  at = align16(at + (n_slots + 15) / 16 * 16 * 4);
  l.sorted = at; at = align16(at + n_slots * 4);
  l.tmp = at;    at = align16(at + (with_tmp ? n_slots * 4 : 0));
  l.count = at;  at = align16(at + int64_t(num + 1) * 4);
  l.fill = at;   at = align16(at + int64_t(num) * 4);
  l.lens = at;   at = align16(at + int64_t(R) * 4);
  l.tile = at;   at = align16(at + int64_t(threads + 1) * 4);
  l.ready = at;  at = align16(at + num);
  l.keep = at;   at = align16(at + num);
  l.depth = tree ? at : -1;  at = align16(at + (tree ? n_slots : 0));
  l.rank = tree ? at : -1;   at = align16(at + (tree ? n_slots : 0));
  l.bytes = at;
  return l;
}
AV_HD Workspace carve_workspace(unsigned char* base, const WorkspaceLayout& l) {
  return Workspace{reinterpret_cast<int32_t*>(base + l.words), reinterpret_cast<int32_t*>(base + l.sorted),
                   reinterpret_cast<int32_t*>(base + l.tmp), reinterpret_cast<int32_t*>(base + l.count),
                   reinterpret_cast<uint64_t*>(base + l.sum), reinterpret_cast<int32_t*>(base + l.fill),
                   base + l.ready, base + l.keep, reinterpret_cast<int32_t*>(base + l.lens),
                   reinterpret_cast<int32_t*>(base + l.tile), l.depth >= 0 ? base + l.depth : nullptr,
                   l.verified >= 0 ? reinterpret_cast<uint64_t*>(base + l.verified) : nullptr,
                   l.rank >= 0 ? base + l.rank : nullptr};
}

// Key of the candidate in slot i = r * K + j of either kind (chains: j is the position; trees: the node).
AV_HD uint64_t slot_key(const Workspace& ws, int32_t u, int64_t slot, int32_t K) {
  if (ws.depth == nullptr) return slot_key(u, slot, K);
  const int32_t r = int32_t(slot / K);
  return tree_word_key(u, ws.depth[slot], r, int32_t(slot - int64_t(r) * K));
}

// ---- per-request pieces ----

// Candidates of request r: writes its K slot words (kNoSlot past the window) and returns the window.
struct RowWalk {
  int32_t cap;      // candidates (the window)
  bool nan;         // the window was cut by a NaN survival
  bool bad_drafts;  // drafts[r] outside [0, K] (clamped)
};
AV_HD float request_weight(const Params& p, int32_t r, float wscale) {
  const float w = p.weights[r];
  return div_rn(weight_ok(w) ? w : 1.f, wscale);
}

AV_HD RowWalk walk_row(const Params& p, int32_t r, int32_t* words, float wscale) {
  const int32_t K = p.max_drafts;
  const float wr = p.weights != nullptr ? request_weight(p, r, wscale) : 1.f;
  int32_t drafts = p.drafts[r];
  RowWalk w{0, false, drafts < 0 || drafts > K};
  drafts = drafts < 0 ? 0 : (drafts > K ? K : drafts);
  int32_t cap = drafts < p.max_verify ? drafts : p.max_verify;
  if (p.draft_tokens != nullptr) {  // a draft the engine invalidated (id -1) ends its request's candidates
    const int32_t* ids = p.draft_tokens + int64_t(r) * p.draft_tokens_stride;
    for (int32_t j = 0; j < cap; ++j)
      if (ids[j] < 0) {
        cap = j;
        break;
      }
  }
  const float* row = p.survival + int64_t(r) * p.survival_stride;
  float running = 1.f;
  int32_t j = 0;
  for (; j < cap; ++j) {
    const float raw = row[j];
    if (raw != raw) {  // NaN: the request's candidates end here
      w.nan = true;
      break;
    }
    const float s = sanitize(raw);
    running = s < running ? s : running;
    // Weighted rank value w_r * a[r, j]: non-increasing along the row like a (rounding is monotone).
    const float u = p.weights != nullptr ? mul_rn(wr, running) : running;
    words[j] = int32_t(float_bits(u)) + (j < p.min_verify ? kForcedTag : 0);
  }
  w.cap = j;
  for (; j < K; ++j) words[j] = kNoSlot;
  return w;
}

// The candidate at rank `budget` as the fields of its key: a request's verified drafts are its candidates
// whose key is below it. none: every candidate is verified. tie: some candidate ranked before it has the
// same word (only then do position and request decide).
// Trees compare whole keys (tree_verified).
struct Threshold {
  int32_t u = 0, j = 0, r = 0;
  bool none = true, tie = false;
  uint64_t key = kNoCandidate;
};
AV_HD Threshold threshold_of(uint64_t key, bool tie, bool tree = false) {
  Threshold t;
  t.tie = tie;
  t.key = key;
  if (key == kNoCandidate) return t;
  t.none = false;
  const int32_t forced = (key >> 63) == 0 ? kForcedTag : 0;
  if (tree) {
    t.u = int32_t(float_bits(tree_key_survival(key))) + forced;
    t.j = tree_key_node(key);
    t.r = tree_key_req(key);
    return t;
  }
  t.u = int32_t(~uint32_t(key >> 31)) + forced;
  t.j = int32_t((key >> kReqBits) & uint64_t(kMaxDrafts - 1));
  t.r = int32_t(key & ((uint64_t(1) << kReqBits) - 1));
  return t;
}
// Candidates of request r (its K slot words) ranked before the threshold: a row's words never increase, so
// this is the length of a prefix.
AV_HD int32_t count_before(const Threshold& t, const int32_t* row, int32_t K, int32_t r, int32_t cap) {
  if (t.none) return cap;
  int32_t n = 0;
  for (int32_t q = 0; q < K; ++q) n += row[q] > t.u || (t.tie && row[q] == t.u && (q < t.j || (q == t.j && r < t.r)));
  return n;
}
// Tree request r's verified nodes (its N slot words and depths): candidates whose key is below the threshold.
// Not a prefix of the row, so the set is a bit mask (a tree's nodes fit 63 bits).
AV_HD uint64_t tree_verified(const Threshold& t, const int32_t* row, const uint8_t* depth, int32_t N, int32_t r) {
  uint64_t set = 0;
  for (int32_t q = 0; q < N; ++q) {
    const int32_t u = row[q];
    const bool in = u >= 0 && (t.none || u > t.u || (t.tie && u == t.u && tree_word_key(u, depth[q], r, q) < t.key));
    set |= uint64_t(in) << q;
  }
  return set;
}

// Writes token `tok` (local index) of request r, offset i within the request (0: the anchor).
// A context length outside [0, kMaxContextLen] (counted once per request by plan()) gives position 0 and slot -1
// (never a wrapped position or another request's slot); its slot is not counted again as a slot error.
AV_HD bool write_token(const Params& p, int32_t r, int32_t i, int64_t tok) {
  const int32_t ctx = p.context_lens != nullptr ? p.context_lens[r] : 0;
  const bool ctx_ok = context_len_ok(ctx);
  if (p.token_req != nullptr) p.token_req[tok] = r;
  if (p.positions != nullptr) p.positions[tok] = ctx_ok ? ctx + i : 0;
  bool slot_ok = true;
  if (p.slot_mapping != nullptr) {
    const int64_t slot = ctx_ok ? slot_of(p.block_table + int64_t(r) * p.block_table_stride, p.max_blocks,
                                          p.block_size, int64_t(ctx) + i) : -1;
    slot_ok = slot >= 0 || !ctx_ok;
    p.slot_mapping[tok] = slot;
  }
  if (p.input_ids != nullptr)
    p.input_ids[tok] = i == 0 ? p.anchor_tokens[r] : p.draft_tokens[int64_t(r) * p.draft_tokens_stride + i - 1];
  return slot_ok;
}

// ---- the phases a backend may specialise (the CPU's SIMD versions compute exactly these) ----

struct WalkTotals {
  int64_t cand, forced, nan_rows, bad_drafts, bad_parents, duplicates;  // the last two: trees only
};

// Each slot's candidate counted into its bucket (count) with its fixed-point survival (sum); returns this thread's
// forced candidates (the caller's reduction publishes the histogram).
template <typename Backend>
AV_HD uint64_t histogram(Backend& be, const Workspace& ws, const Buckets& bk, int64_t n_slots) {
  uint64_t forced = 0;
  for (int64_t i = be.tid(); i < n_slots; i += be.threads()) {
    const int32_t u = ws.words[i];
    if (u < 0) continue;
    const int32_t k = bk.of(u);
    be.add(&ws.count[k], int32_t(1));
    be.add(&ws.sum[k], word_fixed(u));
    forced += u >= kForcedTag;
  }
  return forced;
}

// Phases 1-2: every request's slot words (walk_row), then per bucket the candidates (count) and their fixed-point
// survival sum (sum); the order's ready and keep flags cleared. Returns the totals (the same on every thread).
template <typename Backend>
AV_HD WalkTotals generic_walk_and_count(const Params& p, Backend& be, const Workspace& ws, const Buckets& bk) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const int64_t n_slots = int64_t(R) * K;
  for (int32_t k = be.tid(); k <= bk.num; k += be.threads()) {
    ws.count[k] = 0;
    ws.sum[k] = 0;
    if (k < bk.num) ws.ready[k] = ws.keep[k] = 0;
  }
  uint64_t cand = 0, forced = 0, nan_rows = 0, bad = 0, bad_parents = 0, duplicates = 0;
  for (int32_t r = be.tid(); r < R; r += be.threads()) {
    if (p.parents != nullptr) {
      const TreeWalk w = walk_tree_row(p, r, ws.words + int64_t(r) * K, ws.depth + int64_t(r) * K,
                                        p.weights != nullptr ? request_weight(p, r, ws.wscale) : 1.f);
      cand += uint64_t(w.cand);
      forced += uint64_t(w.forced);
      nan_rows += w.nan;
      bad += w.bad_size;
      bad_parents += uint64_t(w.bad_parents);
      duplicates += uint64_t(w.duplicates);
      continue;
    }
    const RowWalk w = walk_row(p, r, ws.words + int64_t(r) * K, ws.wscale);
    cand += uint64_t(w.cap);
    forced += uint64_t(p.min_verify < w.cap ? p.min_verify : w.cap);
    nan_rows += w.nan;
    bad += w.bad_drafts;
  }
  for (int64_t i = n_slots + be.tid(); i < (n_slots + 15) / 16 * 16; i += be.threads()) ws.words[i] = kNoSlot;
  be.sync();
  histogram(be, ws, bk, n_slots);
  WalkTotals t;
  t.cand = int64_t(be.sum(cand));
  t.forced = int64_t(be.sum(forced));
  t.nan_rows = int64_t(be.sum(nan_rows));
  t.bad_drafts = int64_t(be.sum(bad));  // the reductions' barriers also publish the histogram
  t.bad_parents = p.parents != nullptr ? int64_t(be.sum(bad_parents)) : 0;  // uniform branches: the block agrees
  t.duplicates = p.parents != nullptr ? int64_t(be.sum(duplicates)) : 0;
  return t;
}

// Inside materialise: every slot whose word lies in [lo, hi] goes to the next rank of its bucket (fill cursors).
template <typename Backend>
AV_HD void generic_gather(Backend& be, const Workspace& ws, const Buckets& bk, int64_t n_slots, int32_t lo, int32_t hi) {
  for (int64_t i = be.tid(); i < n_slots; i += be.threads()) {
    const int32_t u = ws.words[i];
    if (u >= lo && u <= hi) ws.sorted[be.fetch_add(&ws.fill[bk.of(u)], 1)] = int32_t(i);
  }
}

// Phase 4: verified drafts per request (lens and verify_lens; trees also their verified nodes).
template <typename Backend>
AV_HD void generic_count_verified(const Params& p, Backend& be, const Workspace& ws, const Threshold& th) {
  const int32_t K = p.max_drafts;
  for (int32_t r = be.tid(); r < p.num_reqs; r += be.threads()) {
    const int32_t* row = ws.words + int64_t(r) * K;
    if (p.parents != nullptr) {
      const uint64_t set = tree_verified(th, row, ws.depth + int64_t(r) * K, K, r);
      ws.verified[r] = set;
      ws.lens[r] = p.verify_lens[r] = popcount64(set);
      continue;
    }
    int32_t cap = 0;
    while (cap < K && row[cap] >= 0) ++cap;
    const int32_t L = count_before(th, row, K, r, cap);
    ws.lens[r] = L;
    p.verify_lens[r] = L;
  }
}

// Phase 5: query_start_loc, seq_lens and every token's outputs, requests in tiles of `threads` (one scan gives a
// tile's token offsets). Returns (decode tokens written, positions the block table could not hold).
struct MetadataTotals {
  int64_t tokens, slot_errors;
};
template <typename Backend>
AV_HD MetadataTotals generic_write_metadata(const Params& p, Backend& be, const Workspace& ws) {
  const int32_t R = p.num_reqs;
  int64_t tok_base = 0;  // local token index of the tile's first token
  uint64_t slot_errors = 0;
  for (int32_t r0 = 0; r0 < R; r0 += be.threads()) {
    const int32_t r = r0 + be.tid();
    const uint64_t q = r < R ? uint64_t(1 + ws.lens[r]) : 0;
    uint64_t total;
    const uint64_t ex = be.exclusive_scan(q, &total);
    ws.tile[be.tid()] = int32_t(ex);
    if (r < R) {
      if (p.query_start_loc != nullptr) p.query_start_loc[r] = int32_t(p.token_offset + tok_base + int64_t(ex));
      if (p.seq_lens != nullptr) {
        const int32_t ctx = p.context_lens != nullptr ? p.context_lens[r] : 0;
        p.seq_lens[r] = context_len_ok(ctx) ? ctx + int32_t(q) : 0;  // 0: the attention makes the row padding
      }
    }
    be.sync();
    const int32_t rows = R - r0 < be.threads() ? R - r0 : be.threads();
    for (int64_t t = be.tid(); t < int64_t(total); t += be.threads()) {
      int32_t lo = 0, hi = rows - 1;  // last request of the tile whose first token is <= t
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (ws.tile[mid] <= t) lo = mid; else hi = mid - 1;
      }
      const int32_t r = r0 + lo, i = int32_t(t - ws.tile[lo]);
      slot_errors += !(p.parents != nullptr
                           ? write_tree_token(p, r, ws.verified[r], ws.depth + int64_t(r) * p.max_drafts, i, tok_base + t)
                           : write_token(p, r, i, tok_base + t));
    }
    tok_base += int64_t(total);
    be.sync();  // the tile offsets are rewritten by the next tile
  }
  for (int64_t t = tok_base + be.tid(); t < p.num_tokens_padded; t += be.threads()) {
    if (p.token_req != nullptr) p.token_req[t] = -1;
    if (p.positions != nullptr) p.positions[t] = 0;
    if (p.slot_mapping != nullptr) p.slot_mapping[t] = -1;
    if (p.input_ids != nullptr) p.input_ids[t] = 0;
    write_tree_padding(p, t);
  }
  return MetadataTotals{tok_base, int64_t(be.sum(slot_errors))};
}

// ---- the canonical order, materialised lazily by bucket ----
template <typename Backend>
struct Order {
  Backend& be;
  const Workspace& ws;
  const Buckets& bk;
  int32_t K;
  int64_t n_slots;

  AV_HD int64_t start(int32_t k) const { return ws.count[k]; }
  AV_HD uint64_t psum(int32_t k) const { return ws.sum[k]; }
  AV_HD int32_t word_at(int64_t rank) const { return ws.words[ws.sorted[rank]]; }

  // Bucket holding rank i (i < n_cand): the last bucket whose start is <= i, at or after `hint`.
  AV_HD int32_t bucket_of_rank(int64_t i, int32_t hint = 0) const {
    int32_t lo = hint, hi = bk.num - 1;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      if (start(mid) <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // Orders buckets [k0, k1): gathers every slot whose word lies in their word range into its bucket's
  // ranks, then sorts each bucket by key. Ready or empty buckets at either end are skipped; ready ones
  // inside are simply redone (same result). Uniform: every thread calls it with the same arguments.
  AV_HD void materialise(int32_t k0, int32_t k1) {
    while (k0 < k1 && (ws.ready[k0] || start(k0) == start(k0 + 1))) ++k0;
    while (k1 > k0 && (ws.ready[k1 - 1] || start(k1 - 1) == start(k1))) --k1;
    if (k0 >= k1) return;
    const int32_t lo = bk.min_word(k1 - 1), hi = bk.max_word(k0);
    for (int32_t k = k0 + be.tid(); k < k1; k += be.threads()) ws.fill[k] = int32_t(start(k));
    be.sync();
    be.gather(ws, bk, n_slots, lo, hi);
    be.sync();
    be.sort_buckets(ws, bk, K, k0, k1);
    for (int32_t k = k0 + be.tid(); k < k1; k += be.threads()) ws.ready[k] = 1;
    be.sync();
  }

  // P(b) for b in [0, n_cand].
  AV_HD uint64_t prefix(int64_t b) {
    if (b <= 0) return 0;
    const int32_t k = bucket_of_rank(b - 1);
    if (start(k + 1) == b) return psum(k + 1);
    materialise(k, k + 1);
    uint64_t part = 0;
    for (int64_t i = start(k) + be.tid(); i < b; i += be.threads()) part += word_fixed(word_at(i));
    return psum(k) + be.sum(part);
  }

  // The threshold at rank b (n_cand: none): the key at rank b, or when b starts a bucket any key that sorts
  // after every earlier rank and no later than rank b (so "key < threshold" selects exactly ranks [0, b)).
  AV_HD Threshold threshold(int64_t b, int64_t n_cand) {
    if (b >= n_cand) return Threshold{};
    const int32_t k = bucket_of_rank(b);
    // Every earlier rank lies in a bucket < k, whose words exceed max_word(k); position (depth, node) 0 and
    // request 0 put this key at or before every key of bucket k.
    const bool tree = ws.depth != nullptr;
    if (start(k) == b) {
      const int32_t u = bk.max_word(k);
      return threshold_of(tree ? tree_word_key(u, 0, 0, 0) : word_key(u, 0, 0), false, tree);
    }
    materialise(k, k + 1);
    const int32_t u = word_at(b);
    return threshold_of(slot_key(ws, u, ws.sorted[b], K), word_at(b - 1) == u, tree);
  }
};

// Runs `f(rank, P(rank + 1))` for every rank in [lo, hi) (ranks already ordered), P(lo) = p_lo; each thread
// takes a contiguous run of ranks, its P from one block scan.
template <typename Backend, typename F>
AV_HD void for_ranks(Backend& be, Order<Backend>& order, int64_t lo, int64_t hi, uint64_t p_lo, F&& f) {
  const int64_t n = hi > lo ? hi - lo : 0;
  const int64_t per = (n + be.threads() - 1) / be.threads();
  const int64_t r_lo = lo + (int64_t(be.tid()) * per < n ? int64_t(be.tid()) * per : n);
  const int64_t r_hi = r_lo + per < hi ? r_lo + per : hi;
  uint64_t local = 0;
  for (int64_t i = r_lo; i < r_hi; ++i) local += word_fixed(order.word_at(i));
  uint64_t total;
  uint64_t p = p_lo + be.exclusive_scan(local, &total);
  for (int64_t i = r_lo; i < r_hi; ++i) {
    p += word_fixed(order.word_at(i));
    f(i, p);
  }
}

// (t, b) better than (best_t, best_b): larger Theta, ties to the smaller budget; NaN never wins.
AV_HD void consider(double& best_t, int64_t& best_b, double t, int64_t b) {
  if (t == t && (best_b < 0 || t > best_t || (t == best_t && b < best_b))) {
    best_t = t;
    best_b = b;
  }
}

// Whether cost(b) is positive and non-decreasing on [b_lo, b_hi] (NaN fails): the condition under which the
// global search may prune. Uniform (a block-wide "any").
template <typename Backend>
AV_HD bool cost_monotone_positive(Backend& be, const ThetaEval& theta, int64_t b_lo, int64_t b_hi) {
  const int64_t last = theta.verify_cost_len - 1;
  const int64_t n_lo = theta.base_tokens + b_lo < last ? theta.base_tokens + b_lo : last;
  const int64_t n_hi = theta.base_tokens + b_hi < last ? theta.base_tokens + b_hi : last;
  uint32_t bad = be.tid() == 0 && !(theta.draft_cost + theta.verify_cost[n_lo] > 0.f);
  // A contiguous range per thread, accumulated rather than broken out of, so the loop vectorises on the CPU.
  const int64_t per = (n_hi - n_lo + be.threads() - 1) / be.threads();
  const int64_t lo = n_lo + int64_t(be.tid()) * per, hi = lo + per < n_hi ? lo + per : n_hi;
  const float* v = theta.verify_cost;
  for (int64_t n = lo; n < hi; ++n) bad |= uint32_t(!(v[n + 1] >= v[n]));
  return be.sum(uint64_t(bad)) == 0;
}

// Candidates within this many ranks of each other are gathered by one scan of the words (a wide gap is
// cheaper to skip with a second scan than to order).
constexpr int64_t kBridge = 64;

// First argmax of Theta over [b_min, b_max] for a positive non-decreasing cost (b_min < b_max, b_min the
// start of the first non-forced bucket): the plain scan's answer, ties to the smallest b.
// Correctness of the two-level L: any L attained at some b is a valid pruning bound; a pruned group or bucket
// holds no b whose Theta reaches L, so the first argmax lies in a kept bucket, at a boundary (L's) or at b_min.
// Why pruning is exact: let L be a Theta value attained at some b. For b in (lo, hi] of one bucket,
// Theta(b) = fl(x_b / c_b) <= fl(x_hi / c_lo+1) because x is non-decreasing in b, c is non-decreasing and
// positive, and correctly rounded division is monotone. If that bound is < L, no b there attains the
// maximum M >= L, so none is the first argmax. The bound is tested as x_hi < L' * c with L' = L (1 - 2^-48):
// both products round by at most 2^-53 relatively, so the test passing implies x_hi / c < L (1 - 2^-49),
// whose rounding is below L. Every b in a kept bucket, every boundary and b_min are evaluated exactly.
constexpr int32_t kGroup = 8;  // buckets per group of the global search's first, coarse pruning level
constexpr uint8_t kKeepGroup = 2, kKeepBucket = 1;  // Workspace::keep bits

template <typename Backend>
AV_HD int64_t global_argmax(Backend& be, Order<Backend>& order, const ThetaEval& theta, int64_t b_min,
                            int64_t b_max) {
  const Buckets& bk = order.bk;
  uint8_t* keep = order.ws.keep;
  const uint64_t base = theta.base_fixed;
  const int32_t k_first = bk.nf_offset;  // b_min is a boundary: the forced candidates fill the forced half
  int32_t k_end;                         // buckets [k_first, k_end) hold the ranks r in [b_min, b_max)
  {
    int32_t lo = k_first, hi = bk.num;  // the first bucket whose start is >= b_max
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (order.start(mid) >= b_max) hi = mid; else lo = mid + 1;
    }
    k_end = lo;
  }
  // L, a Theta value attained at some boundary (the larger, the more pruning), in two levels: the ends of
  // groups of kGroup buckets, which prune whole groups; then the bucket ends inside the groups left.
  double t = 0.0, L;
  int64_t b = -1, L_b;
  if (be.tid() == 0) consider(t, b, theta(b_min, order.psum(k_first)), b_min);
  for (int32_t g = k_first + kGroup * (1 + be.tid()); g < k_end + kGroup; g += kGroup * be.threads()) {
    const int32_t e = g < k_end ? g : k_end;
    const int64_t at = order.start(e) < b_max ? order.start(e) : b_max;
    if (at == order.start(e)) consider(t, b, theta(at, order.psum(e)), at);
  }
  be.argmax(t, b, &L, &L_b);
  // Bound test for the ranks [lo, hi) of buckets whose P at the end is p_hi: false when every Theta of a b in
  // (lo, hi] is certainly below L.
  auto may_hold = [&](int64_t lo, int64_t hi, uint64_t p_hi, double L_margin) {
    return hi > lo && !(double(base + p_hi) < L_margin * double(step_cost(theta, lo + 1)));
  };
  double L_margin = L * (1.0 - 1.0 / 281474976710656.0);  // L (1 - 2^-48)
  for (int32_t g = k_first + kGroup * be.tid(); g < k_end; g += kGroup * be.threads()) {
    const int32_t e = g + kGroup < k_end ? g + kGroup : k_end;
    const int64_t hi = order.start(e) < b_max ? order.start(e) : b_max;
    keep[g] = may_hold(order.start(g), hi, order.psum(e), L_margin) ? kKeepGroup : 0;
  }
  be.sync();
  t = L;
  b = L_b;
  for (int32_t g = k_first + kGroup * be.tid(); g < k_end; g += kGroup * be.threads()) {
    if (!(keep[g] & kKeepGroup)) continue;
    for (int32_t k = g + 1; k <= g + kGroup && k <= k_end; ++k) {  // the ends of the group's buckets
      const int64_t at = order.start(k);
      if (at > b_min && at <= b_max) consider(t, b, theta(at, order.psum(k)), at);
    }
  }
  be.argmax(t, b, &L, &L_b);
  L_margin = L * (1.0 - 1.0 / 281474976710656.0);
  for (int32_t g = k_first + kGroup * be.tid(); g < k_end; g += kGroup * be.threads()) {
    if (!(keep[g] & kKeepGroup)) continue;
    for (int32_t k = g; k < g + kGroup && k < k_end; ++k) {
      const int64_t hi = order.start(k + 1) < b_max ? order.start(k + 1) : b_max;
      if (may_hold(order.start(k), hi, order.psum(k + 1), L_margin)) keep[k] = uint8_t(keep[k] | kKeepBucket);
    }
  }
  be.sync();
  for (int32_t k = k_first; k < k_end;) {  // runs of kept buckets, bridging small gaps: one gather each
    if (!(keep[k] & kKeepBucket)) {
      ++k;
      continue;
    }
    int32_t e = k + 1, last = k;
    for (; e < k_end; ++e) {
      if (keep[e] & kKeepBucket) {
        last = e;
      } else if (order.start(e + 1) - order.start(last + 1) > kBridge) {
        break;
      }
    }
    order.materialise(k, last + 1);
    k = last + 1;
  }
  // Exact Theta at every b of a kept bucket; L (a boundary's) and b_min are candidates too.
  t = 0.0;
  b = -1;
  if (be.tid() == 0) {
    consider(t, b, L, L_b);
    consider(t, b, theta(b_min, order.psum(k_first)), b_min);
  }
  for (int32_t k = k_first; k < k_end; ++k) {
    if (!(keep[k] & kKeepBucket)) continue;
    const int64_t hi = order.start(k + 1) < b_max ? order.start(k + 1) : b_max;
    for_ranks(be, order, order.start(k), hi, order.psum(k),
              [&](int64_t r, uint64_t pr) { consider(t, b, theta(r + 1, pr), r + 1); });
  }
  double t_out;
  int64_t b_out;
  be.argmax(t, b, &t_out, &b_out);
  return b_out;
}

// The plain scan over [b_min, b_max], ranks ordered as it reaches them (chunks that grow with the scan, so a
// long scan costs a few gathers and a short one a single small one). greedy: Algorithm 1, the first b where
// admitting rank b does not raise Theta (NaN stops it); else the first argmax, where a NaN Theta at b_min
// keeps b_min (a sequential "if t > best" scan never leaves a NaN start).
template <typename Backend>
AV_HD int64_t scan_budget(Backend& be, Order<Backend>& order, const ThetaEval& theta, int64_t b_min, int64_t b_max,
                          bool greedy) {
  const Buckets& bk = order.bk;
  uint64_t p = order.prefix(b_min);
  const double t0 = theta(b_min, p);
  double best_t = 0.0;
  int64_t best_b = -1;
  if (be.tid() == 0) consider(best_t, best_b, t0, b_min);
  int64_t rank = b_min, ahead = Backend::kFirstScanChunk;
  int32_t k = b_min < b_max ? order.bucket_of_rank(b_min) : 0;
  while (rank < b_max) {
    int32_t k1 = k + 1;
    while (k1 < bk.num && order.start(k1) < rank + ahead) ++k1;
    order.materialise(k, k1);
    const int64_t hi = order.start(k1) < b_max ? order.start(k1) : b_max;
    if (greedy) {
      int64_t stop = INT64_MAX;
      double prev = 0.0;
      bool have_prev = false;
      for_ranks(be, order, rank, hi, p, [&](int64_t r, uint64_t pr) {
        if (stop != INT64_MAX) return;
        // Theta(r) from the previous rank of this thread's run, else recomputed from P(r).
        const double before = have_prev ? prev : theta(r, pr - word_fixed(order.word_at(r)));
        const double after = theta(r + 1, pr);
        if (!(after > before)) stop = r;
        prev = after;
        have_prev = true;
      });
      stop = be.min(stop);
      if (stop != INT64_MAX) return stop;
    } else {
      for_ranks(be, order, rank, hi, p, [&](int64_t r, uint64_t pr) { consider(best_t, best_b, theta(r + 1, pr), r + 1); });
    }
    p = order.psum(k1) < p ? p : (hi == order.start(k1) ? order.psum(k1) : order.prefix(hi));
    rank = hi;
    k = k1;
    ahead *= 2;
  }
  if (greedy) return b_max;
  if (t0 != t0) return b_min;
  double t_out;
  int64_t b_out;
  be.argmax(best_t, best_b, &t_out, &b_out);
  return b_out;
}

// Unweighted expected tokens of the allocation, R + the survival sum of the verified drafts (with weights the
// budget search sums weighted survivals): recomputed from the rows, the same running minimum as walk_row (a tree:
// the same cap by the parent as walk_tree_row, over its verified nodes).
template <typename Backend>
AV_HD uint64_t unweighted_verified_fixed(const Params& p, Backend& be, const Workspace& ws) {
  uint64_t part = 0;
  for (int32_t r = be.tid(); r < p.num_reqs; r += be.threads()) {
    const float* row = p.survival + int64_t(r) * p.survival_stride;
    if (p.parents != nullptr) {  // verified nodes are ancestor-closed: each one's parent is capped before it
      const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
      float capped[kMaxTreeNodes];
      for (uint64_t rest = ws.verified[r]; rest; rest &= rest - 1) {
        const int32_t j = lowest_bit64(rest), pj = par[j];
        const float s = sanitize(row[j]), cap = pj >= 0 ? capped[pj] : 1.f;
        capped[j] = s < cap ? s : cap;
        part += to_fixed(capped[j]);
      }
      continue;
    }
    float running = 1.f;
    for (int32_t j = 0; j < ws.lens[r]; ++j) {
      const float s = sanitize(row[j]);
      running = s < running ? s : running;
      part += to_fixed(running);
    }
  }
  return be.sum(part);
}

// Exclusive scan over buckets: ws.count[k] becomes the first rank of bucket k and ws.sum[k] P there (index num: the
// candidates and their sum in all).
template <typename Backend>
AV_HD void bucket_starts(Backend& be, const Workspace& ws, const Buckets& bk) {
  const int32_t per = (bk.num + 1 + be.threads() - 1) / be.threads();
  const int32_t k_lo = be.tid() * per < bk.num + 1 ? be.tid() * per : bk.num + 1;
  const int32_t k_hi = k_lo + per < bk.num + 1 ? k_lo + per : bk.num + 1;
  uint64_t c = 0, s = 0, c_total, s_total;
  for (int32_t k = k_lo; k < k_hi; ++k) {
    c += uint64_t(ws.count[k]);
    s += ws.sum[k];
  }
  uint64_t rank = be.exclusive_scan(c, &c_total), psum = be.exclusive_scan(s, &s_total);
  for (int32_t k = k_lo; k < k_hi; ++k) {
    const uint64_t ck = uint64_t(ws.count[k]), sk = ws.sum[k];
    ws.count[k] = int32_t(rank);
    ws.sum[k] = psum;
    rank += ck;
    psum += sk;
  }
  be.sync();
}

// bucket_starts undone: ws.count[k] and ws.sum[k] back to bucket k's candidates and their sum (index num: 0), so
// that a shape with fewer candidates can subtract the ones that leave instead of counting every slot again.
template <typename Backend>
AV_HD void bucket_counts(Backend& be, const Workspace& ws, const Buckets& bk) {
  const int32_t per = (bk.num + 1 + be.threads() - 1) / be.threads();
  const int32_t k_lo = be.tid() * per < bk.num + 1 ? be.tid() * per : bk.num + 1;
  const int32_t k_hi = k_lo + per < bk.num + 1 ? k_lo + per : bk.num + 1;
  const int32_t k_next = k_hi < bk.num + 1 ? k_hi : bk.num;  // the start after this range (num: its own, so 0)
  int32_t c_next = ws.count[k_next];
  uint64_t s_next = ws.sum[k_next];
  be.sync();  // every thread has read the start after its range before any is rewritten
  for (int32_t k = k_hi - 1; k >= k_lo; --k) {
    const int32_t c = ws.count[k];
    const uint64_t sk = ws.sum[k];
    ws.count[k] = c_next - c;
    ws.sum[k] = s_next - sk;
    c_next = c;
    s_next = sk;
  }
  be.sync();
}

// [B_min, B_max] of n_cand candidates, n_forced of them forced: capacity (budget_cap) wins over min_verify, and
// min_verify over the latency target (step_cap).
struct BudgetRange {
  int64_t b_min, b_max;
};
AV_HD BudgetRange budget_range(int64_t n_cand, int64_t n_forced, int64_t budget_cap, int64_t step_cap) {
  const int64_t b_room = n_cand < budget_cap ? n_cand : budget_cap;
  const int64_t b_min = n_forced < b_room ? n_forced : b_room;
  int64_t b_max = b_room < step_cap ? b_room : step_cap;
  return BudgetRange{b_min, b_max < b_min ? b_min : b_max};
}

// greedy (Algorithm 1) or the first argmax of Theta over [b_min, b_max] (b_min < b_max): the pruned search where the
// cost is positive and non-decreasing, else the plain scan.
template <typename Backend>
AV_HD int64_t search_budget(Backend& be, Order<Backend>& order, const ThetaEval& theta, int64_t b_min, int64_t b_max,
                            bool greedy) {
  if (!greedy && cost_monotone_positive(be, theta, b_min, b_max)) return global_argmax(be, order, theta, b_min, b_max);
  return scan_budget(be, order, theta, b_min, b_max, greedy);
}

// ---- the draft depth and a tree's width (choose_draft_depth, choose_tree_shape; docs/design.md "Drafting from
// the budget") ----

// Trees: each parent node's rank among the candidates of its depth, by the walk's capped survival (ties to the
// lower index), what a width profile compares with (tree_keep). Independent of the profile: computed once. Ranked
// over a list of the nodes of each depth: O(parents x nodes of a depth) per request, N <= 63. Nodes without children
// are not ranked (nothing reads them).
template <typename Backend>
AV_HD void tree_rank(const Params& p, Backend& be, const Workspace& ws) {
  const int32_t K = p.max_drafts;
  for (int32_t r = be.tid(); r < p.num_reqs; r += be.threads()) {
    const int32_t* words = ws.words + int64_t(r) * K;
    const uint8_t* dep = ws.depth + int64_t(r) * K;
    uint8_t* rank = ws.rank + int64_t(r) * K;
    const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
    int8_t next[kMaxTreeNodes];      // the next candidate of the same depth (-1: none), by index
    int8_t head[kMaxTreeNodes + 1];  // the first candidate of each depth (depths 1..K)
    uint64_t has_child = 0;          // bit j: node j is a candidate's parent
    for (int32_t d = 0; d <= K; ++d) head[d] = -1;
    for (int32_t j = K - 1; j >= 0; --j) {
      rank[j] = 0xff;
      if (words[j] == kNoSlot) continue;
      if (par[j] >= 0) has_child |= uint64_t(1) << par[j];
      next[j] = head[dep[j]];
      head[dep[j]] = int8_t(j);
    }
    for (uint64_t rest = has_child; rest; rest &= rest - 1) {  // ranked among its depth only
      const int32_t j = lowest_bit64(rest);
      const float sj = word_survival(words[j]);
      int32_t rk = 0;
      for (int32_t q = head[dep[j]]; q >= 0; q = next[q]) {
        const float sq = word_survival(words[q]);
        rk += q != j && (sq > sj || (sq == sj && q < j));
      }
      rank[j] = uint8_t(rk);
    }
  }
}

// Width profile P's beam at level l (1 <= l < max_depth): how many nodes of depth l it expands (params.h).
AV_HD int32_t profile_width(const Params& p, int32_t P, int32_t l) {
  return int32_t(p.shape_width[(P - 1) * (p.max_depth + 1) + l]);
}

// Profile P's nodes: the walk's words less the nodes P does not draft (a node is drafted when its parent is the
// anchor, or is drafted and ranks among the profile_width(P, its depth) best of its depth: the candidates stay
// ancestor-closed). Returns the smallest depth of a node that P and P - 1 do not both draft (kMaxDepths: none;
// always none for P = 1): below it (P, D) drafts (P - 1, D)'s nodes. Parents precede their children (the walk
// checked parents[j] < j); a parent deeper than max_depth - 1 expands nothing (its children leave at every D).
template <typename Backend>
AV_HD int64_t tree_keep(const Params& p, Backend& be, const Workspace& ws, int32_t P) {
  const int32_t K = p.max_drafts;
  int64_t first = kMaxDepths;
  uint8_t wp[kMaxDepths + 1], wq[kMaxDepths + 1];  // P's and P - 1's widths by level (0: expands nothing)
  for (int32_t l = 0; l <= kMaxDepths; ++l) {
    const bool in = l >= 1 && l < p.max_depth;
    wp[l] = in ? uint8_t(profile_width(p, P, l)) : 0;
    wq[l] = in && P > 1 ? uint8_t(profile_width(p, P - 1, l)) : 0;
  }
  for (int32_t r = be.tid(); r < p.num_reqs; r += be.threads()) {
    int32_t* words = ws.words + int64_t(r) * K;
    const uint8_t* dep = ws.depth + int64_t(r) * K;
    const uint8_t* rank = ws.rank + int64_t(r) * K;
    const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
    uint64_t in_p = 0, in_q = 0;  // nodes profile P / P - 1 drafts
    for (int32_t j = 0; j < K; ++j) {  // (few branches: the kept / dropped pattern is data)
      const bool cand = words[j] != kNoSlot;
      const int32_t pj = par[j];
      const bool top = pj < 0;  // a child of the anchor: every profile drafts it
      const int32_t q = top || !cand ? 0 : pj;  // (a non-candidate's parent is not read: it may be invalid)
      const int32_t l = dep[q] < kMaxDepths ? dep[q] : kMaxDepths, rk = rank[q];  // (deeper: expands nothing)
      const bool a = cand && (top || ((in_p >> q & 1) && rk < wp[l]));
      const bool b = cand && P > 1 && (top || ((in_q >> q & 1) && rk < wq[l]));
      in_p |= uint64_t(a) << j;
      in_q |= uint64_t(b) << j;
      if (cand && !a) words[j] = kNoSlot;
      if (a != b && dep[j] < first) first = dep[j];
    }
  }
  return first;
}

// The least verify cost Theta can divide by, min over n in [n_lo, n_hi] of verify_cost[n] (the same on every thread),
// and whether any of those is NaN. Floats compared through their order as integers (common.h float_order).
struct CostFloor {
  float v_min;
  bool nan;
};
template <typename Backend>
AV_HD CostFloor verify_cost_floor(Backend& be, const float* v, int64_t n_lo, int64_t n_hi) {
  int64_t lo = INT64_MAX;
  uint64_t nan = 0;
  for (int64_t n = n_lo + be.tid(); n <= n_hi; n += be.threads()) {
    const float x = v[n];
    if (x != x) {
      nan = 1;
    } else {
      const int64_t o = float_order(x);
      lo = o < lo ? o : lo;
    }
  }
  lo = be.min(lo);
  const bool any_nan = be.sum(nan) != 0;
  return CostFloor{lo == INT64_MAX ? 0.f : float_of_order(lo), any_nan};
}

// For each width profile P from num_widths down to 1 (trees: the walk's words again, kept or walked again by the
// backend, less the nodes P does not draft; chains: one pass) and each depth D from max_depth down to min_depth: the
// candidates deeper than D leave (chains: the columns >= D, a column per depth; trees: the nodes of depth > D), the
// buckets are counted (a profile's first shape) or the leaving candidates subtracted from the last shape's counts,
// and the budget search runs with the shape's fixed cost. The best (P, D, B): the largest Theta, ties to the smaller
// P, then the smaller D (both visited later, so an equal Theta replaces), and within a shape the search's first
// argmax (the smallest B). NaN never wins; when no shape gives a number, (1, min_depth)'s budget stands. Writes
// budget_out, depth_out, width_out (P), level_widths_out and (without weights) expected_tokens.
// Skipped, exactly: a tree shape (P, D) that drafts (P - 1, D)'s nodes (no node of depth <= D tells the two
// profiles apart: every D <= 1, every D whose levels above the two profiles share, every D when the trees are
// narrower than both) has the same P at each budget; when it also costs no less, its latency cap is no looser and
// (P - 1, D)'s every cost is positive, or it costs the same with the same cap, its Theta at each B is no larger, so
// (P - 1, D), visited later, ties or beats it (ties go to the smaller P).
template <typename Backend>
AV_HD int choose_depth(const Params& p, Backend& be, const Workspace& ws, const Buckets& bk, uint64_t base_fixed) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const int64_t n_slots = int64_t(R) * K;
  // The tree decision is num_widths >= 1 (not parents != null: an empty batch's parents may be a null pointer).
  const bool tree = p.num_widths > 0;
  const int32_t widths = tree ? p.num_widths : 1;
  if (p.min_depth < 0 || p.min_depth > p.max_depth || p.max_depth > (tree ? kMaxDepths - 1 : K) ||
      (tree && R > 0 && p.parents == nullptr) || int64_t(widths) * (p.max_depth + 1) > kMaxShapes)
    return kErrBadArgument;
  double best_t = 0.0;
  int64_t best_b = -1;
  int32_t best_d = -1, best_w = 1;
  uint64_t best_p = 0;
  if (tree && R > 0) tree_rank(p, be, ws);
  CostFloor floor{0.f, true};  // (P - 1, D)'s costs are positive when depth_cost + v_min > 0 and no NaN
  if (tree && widths > 1) {
    const int64_t last = p.verify_cost_len - 1, base = int64_t(R) + p.extra_tokens;
    const int64_t top = base + n_slots < last ? base + n_slots : last;  // the largest step the budgets reach
    floor = verify_cost_floor(be, p.verify_cost, base < last ? base : last, top);
  }
  if (tree && widths > 1) be.keep_words(ws, n_slots);  // (after tree_rank, which read them)
  for (int32_t W = widths; W >= 1; --W) {  // (W: the profile)
    bool counted = false;  // ws.count / ws.sum hold the last evaluated shape's buckets (as starts)
    int64_t n_forced = 0;
    int64_t same_below = kMaxDepths;  // (W, D) drafts (W - 1, D)'s nodes for D < same_below (trees, W > 1)
    if (tree) {
      be.sync();  // every thread is done with the last profile's words and buckets (and tree_rank with the words)
      if (W < widths) be.restore_words(p, ws, bk, n_slots);  // the walk's words again (the last profile removed
                                                              // some): kept (CPU) or walked again (CUDA)
      be.sync();
      const int64_t first = tree_keep(p, be, ws, W);
      if (W > 1) same_below = be.min(first);
    }
    for (int32_t D = p.max_depth; D >= p.min_depth; --D) {
      const int32_t s = (W - 1) * (p.max_depth + 1) + D;
      if (W > 1 && D < same_below) {  // (W, D) drafts (W - 1, D)'s nodes: skipped when dominated
        const int32_t s1 = s - (p.max_depth + 1);
        const bool no_looser = p.depth_step_cap[s] <= p.depth_step_cap[s1];
        if ((p.depth_cost[s] == p.depth_cost[s1] && p.depth_step_cap[s] == p.depth_step_cap[s1]) ||
            (!floor.nan && p.depth_cost[s] >= p.depth_cost[s1] && no_looser && p.depth_cost[s1] + floor.v_min > 0.f))
          continue;  // (uniform: every thread skips; the next shape removes the deeper nodes too)
      }
      be.sync();  // every thread is done reading the last shape's words and buckets before they change
      // The first shape of a width counts every slot; a later one (fewer candidates: deeper ones left) subtracts
      // those that leave from the last shape's counts. Forced candidates (positions / nodes j < min_verify, of
      // depth <= min_verify) never leave while D >= min_verify (depth.py keeps min_depth there; choose_tree_shape
      // takes no min_verify); below it the shape counts again, so its n_forced stays exact.
      const bool recount = !counted || D < p.min_verify;
      if (!recount) bucket_counts(be, ws, bk);
      auto leave = [&](int64_t i) {
        const int32_t u = ws.words[i];
        if (u == kNoSlot) return;
        ws.words[i] = kNoSlot;
        if (recount) return;
        const int32_t k = bk.of(u);
        be.add(&ws.count[k], int32_t(-1));
        be.add(&ws.sum[k], uint64_t(0) - word_fixed(u));
      };
      if (tree) {
        for (int64_t i = be.tid(); i < n_slots; i += be.threads())
          if (ws.depth[i] > D) leave(i);
      } else {
        const int32_t j_end = D == p.max_depth ? K : D + 1;  // the columns that leave at this depth (chains never
                                                              // skip a depth: only trees' wider widths do)
        for (int32_t r = be.tid(); r < R; r += be.threads())
          for (int32_t j = D; j < j_end; ++j) leave(int64_t(r) * K + j);
      }
      for (int32_t k = be.tid(); k <= bk.num; k += be.threads()) {
        if (recount) {
          ws.count[k] = 0;
          ws.sum[k] = 0;
        }
        if (k < bk.num) ws.ready[k] = ws.keep[k] = 0;
      }
      be.sync();  // (also publishes the subtractions)
      if (recount) n_forced = int64_t(be.sum(histogram(be, ws, bk, n_slots)));  // (its barrier publishes counts)
      counted = true;
      bucket_starts(be, ws, bk);
      const int64_t n_cand = ws.count[bk.num];
      Order<Backend> order{be, ws, bk, K, n_slots};
      const BudgetRange range = budget_range(n_cand, n_forced, p.budget_cap, p.depth_step_cap[s]);
      const ThetaEval theta{base_fixed, R + p.extra_tokens, p.verify_cost, p.verify_cost_len, p.depth_cost[s]};
      const int64_t b = range.b_min < range.b_max ? search_budget(be, order, theta, range.b_min, range.b_max, false)
                                                  : range.b_max;
      const uint64_t prefix = order.prefix(b);
      const double t = theta(b, prefix);
      if (best_d < 0 ? (t == t || (W == 1 && D == p.min_depth)) : (t == t && t >= best_t)) {
        best_t = t;
        best_b = b;
        best_d = D;
        best_w = W;
        best_p = prefix;
      }
    }
  }
  if (be.tid() == 0) {
    *p.budget_out = int32_t(best_b);
    if (p.depth_out != nullptr) *p.depth_out = best_d;
    if (p.width_out != nullptr) *p.width_out = best_w;
    if (p.level_widths_out != nullptr)
      for (int32_t l = 1; l <= p.max_depth; ++l)
        p.level_widths_out[l - 1] = l < best_d ? profile_width(p, best_w, l) : 0;
    if (p.expected_tokens != nullptr && p.weights == nullptr)
      *p.expected_tokens = float(double((uint64_t(R) << 32) + best_p) / kFixedOne);
  }
  return kOk;
}

// ---- the whole plan ----
// Returns kOk, or on a strict backend (the CPU's) the first invalid input: context lengths, drafts (tree sizes)
// out of range, a tree's bad parent or duplicate sibling before any output is written, a block table too short
// after writing (the slot is -1 there, as on CUDA, which counts all of them instead).
// kDepth: choose_draft_depth's instantiation (Params::choose_depth set), a kernel of its own on CUDA, so that the
// depth loop never weighs on the plan kernel's registers.
template <typename Backend, bool kDepth = false>
AV_HD int plan(const Params& p, Backend& be, const Workspace& ws_in) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const int64_t n_slots = int64_t(R) * K;
  const Buckets bk = Buckets::make(n_slots, p.min_verify > 0);
  Workspace ws = ws_in;

  if (p.write_plan && p.context_lens != nullptr) {  // only metadata reads them: their int32 sums must not wrap
    int32_t bad_ctx = 0;
    for (int32_t r = be.tid(); r < R; r += be.threads()) bad_ctx += !context_len_ok(p.context_lens[r]);
    if (bad_ctx && Backend::kStrict) return kErrContextLen;
    if (bad_ctx) be.count_error(p.error_counts, kCountContextLenOutOfRange, bad_ctx);
  }

  // ---- 0. survival from confidences (plan's conf= path), exactly as the prefix_survival / tree_survival ops
  // compute it ----
  if (p.conf != nullptr) {
    int32_t nan_count = 0, bad_parents = 0;
    bool bad = false;
    for (int32_t r = be.tid(); r < R; r += be.threads()) {
      int32_t d = p.drafts[r];
      bad |= d < 0 || d > K;  // the walk counts these (clamped) once; a strict backend stops here
      d = d < 0 ? 0 : (d > K ? K : d);
      const float* conf = p.conf + int64_t(r) * p.conf_stride;
      float* out = p.survival_out + int64_t(r) * K;
      nan_count += p.parents != nullptr
                       ? tree_survival_row(conf, p.parents + int64_t(r) * p.parents_stride, d, K, out, &bad_parents)
                       : survival_row(conf, d, K, out);
    }
    if (bad && Backend::kStrict) return kErrDraftsOutOfRange;
    if (bad_parents && Backend::kStrict) return kErrBadParent;  // else the walk counts those it looks at
    if (nan_count) be.count_error(p.error_counts, kCountNanSurvival, nan_count);
    be.sync();
  }

  // ---- 0b. priorities: the weights' scale c = max(1, max w), and Theta's weighted constant sum_r w_r / c ----
  uint64_t base_fixed = uint64_t(R + p.extra_emitting) << 32;
  if (p.weights != nullptr) {
    int64_t neg_max = 0;  // -bits of the largest usable weight (non-negative floats order like their bits)
    uint64_t bad = 0;
    for (int32_t r = be.tid(); r < R; r += be.threads()) {
      const float w = p.weights[r];
      if (!weight_ok(w)) {
        ++bad;
        continue;
      }
      const int64_t nb = -int64_t(float_bits(w));
      neg_max = nb < neg_max ? nb : neg_max;
    }
    neg_max = be.min(neg_max);
    bad = be.sum(bad);
    if (bad && Backend::kStrict) return kErrWeights;
    if (bad && be.tid() == 0) be.count_error(p.error_counts, kCountWeightOutOfRange, int32_t(bad));
    const float wmax = bits_float(uint32_t(-neg_max));
    ws.wscale = wmax > 1.f ? wmax : 1.f;
    uint64_t part = 0;
    for (int32_t r = be.tid(); r < R; r += be.threads()) part += to_fixed(request_weight(p, r, ws.wscale));
    base_fixed = be.sum(part) + uint64_t(p.extra_emitting) * to_fixed(div_rn(1.f, ws.wscale));
  }

  // ---- 1-2. walk: a word per slot, then per bucket its candidates and their fixed-point survival sum ----
  const WalkTotals totals = be.walk_and_count(p, ws, bk);
  const int64_t n_cand = totals.cand, n_forced = totals.forced;
  if (totals.bad_drafts && Backend::kStrict) return kErrDraftsOutOfRange;
  if (totals.bad_parents && Backend::kStrict) return kErrBadParent;
  if (totals.duplicates && Backend::kStrict) return kErrDuplicateSibling;
  if (be.tid() == 0) {
    if (totals.nan_rows) be.count_error(p.error_counts, kCountNanSurvival, int32_t(totals.nan_rows));
    if (totals.bad_drafts) be.count_error(p.error_counts, kCountDraftsOutOfRange, int32_t(totals.bad_drafts));
    if (totals.bad_parents) be.count_error(p.error_counts, kCountBadParent, int32_t(totals.bad_parents));
    if (totals.duplicates) be.count_error(p.error_counts, kCountDuplicateSibling, int32_t(totals.duplicates));
  }
  if constexpr (kDepth) {
    return choose_depth(p, be, ws, bk, base_fixed);  // choose_draft_depth: (D, B) only
  } else if (p.choose_depth) {
    return kErrBadArgument;  // the host launches the depth instantiation for these
  }
  bucket_starts(be, ws, bk);
  Order<Backend> order{be, ws, bk, K, n_slots};

  // ---- 3. budget ----
  const BudgetRange range = budget_range(n_cand, n_forced, p.budget_cap, p.step_cap);
  const int64_t b_min = range.b_min, b_max = range.b_max;
  const ThetaEval theta{base_fixed, R + p.extra_tokens, p.verify_cost, p.verify_cost_len, p.draft_cost};
  int64_t budget = b_max;
  if ((p.mode == kGreedy || p.mode == kGlobal) && b_min < b_max) {
    budget = search_budget(be, order, theta, b_min, b_max, p.mode == kGreedy);
  } else if (p.mode == kFixed) {
    const int64_t want = p.budget_in != nullptr ? int64_t(*p.budget_in) : p.fixed_budget;
    budget = want < b_min ? b_min : (want > b_max ? b_max : want);
  } else if (p.mode != kAll && p.mode != kGreedy && p.mode != kGlobal) {
    return kErrBadArgument;
  }
  const uint64_t prefix = order.prefix(budget);
  if (be.tid() == 0) {
    *p.budget_out = int32_t(budget);
    if (p.expected_tokens != nullptr && p.weights == nullptr)
      *p.expected_tokens = float(double((uint64_t(R) << 32) + prefix) / kFixedOne);
  }
  if (!p.write_plan) return kOk;  // choose_budget: budget only

  // ---- 4. allocation: a request's verified drafts are its candidates ranked before the threshold ----
  be.count_verified(p, ws, order.threshold(budget, n_cand));
  be.sync();
  if (p.weights != nullptr) {  // expected tokens stay unweighted
    const uint64_t verified = unweighted_verified_fixed(p, be, ws);
    if (be.tid() == 0 && p.expected_tokens != nullptr)
      *p.expected_tokens = float(double((uint64_t(R) << 32) + verified) / kFixedOne);
  }

  // ---- 5. metadata, then the padding lanes: every element of every padded buffer is written ----
  const MetadataTotals meta = be.write_metadata(p, ws);
  const int32_t end_tok = int32_t(p.token_offset + meta.tokens);
  for (int32_t r = R + be.tid(); r < p.num_reqs_padded; r += be.threads()) {
    p.verify_lens[r] = 0;
    if (p.query_start_loc != nullptr) p.query_start_loc[r] = end_tok;
    if (p.seq_lens != nullptr) p.seq_lens[r] = 0;
  }
  if (be.tid() == 0) {
    if (p.query_start_loc != nullptr) p.query_start_loc[p.num_reqs_padded] = end_tok;
    if (p.num_tokens != nullptr) *p.num_tokens = end_tok;
    if (meta.slot_errors) be.count_error(p.error_counts, kCountSlotOutOfRange, int32_t(meta.slot_errors));
  }
  return meta.slot_errors && Backend::kStrict ? kErrBlockTableTooShort : kOk;
}

}  // namespace planner
}  // namespace adaptive_verify
