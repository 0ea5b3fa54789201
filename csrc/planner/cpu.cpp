// C++ CPU planner: the same phases as the CUDA kernel (keys -> sort -> budget -> allocation ->
// metadata), run sequentially. Integer results equal the CUDA kernel's and the torch reference's.
#include <algorithm>
#include <cstring>
#include <vector>

#include "adaptive_verify/planner/cpu.h"
#include "adaptive_verify/planner/math.h"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cpu(const SurvivalParams& p) {
  int32_t nan_count = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t d = p.drafts[r];
    if (d < 0 || d > p.max_drafts) return kErrDraftsOutOfRange;
    const float* row = p.conf + int64_t(r) * p.conf_stride;
    float* out = p.survival + int64_t(r) * p.max_drafts;
    float a = 1.f;
    for (int32_t j = 0; j < p.max_drafts; ++j) {
      if (j < d) {
        if (row[j] != row[j]) ++nan_count;
        a = a * sanitize(row[j]);
        out[j] = a;
      } else {
        out[j] = 0.f;
      }
    }
  }
  if (nan_count && p.error_counts) p.error_counts[kCountNanSurvival] += nan_count;
  return kOk;
}

namespace {

// Canonical order without a full comparison sort. Sorting a few thousand keys by comparison is
// branch-mispredict bound (~25 us for 2048 keys here), and most modes need only a prefix of the order:
// greedy stops after its last admitted candidate, fixed/all need only the B-th key and P(B).
// So: one counting pass scatters the keys into buckets that are monotone in the key (forced flag, then
// survival quantised to 1/kBuckets, descending), and buckets are sorted exactly only when reached.
constexpr int kBucketBits = 10;
constexpr int kBuckets = 1 << kBucketBits;  // per forced / non-forced half
constexpr int kNumBuckets = 2 * kBuckets;
static_assert(kNumBuckets <= 65536, "bucket ids are stored as uint16");

inline uint32_t bucket_of(uint64_t key) {
  const uint64_t q = to_fixed(key_survival(key)) >> (32 - kBucketBits);  // in [0, kBuckets]
  const uint32_t desc = uint32_t(kBuckets - 1) - uint32_t(q < uint64_t(kBuckets - 1) ? q : uint64_t(kBuckets - 1));
  return uint32_t(key >> 63) * kBuckets + desc;
}

// Exact sort of one bucket. Keys in a bucket share the top bits of their fixed-point survival; big buckets
// (skewed survivals pile up near 0 when K is large) are split further by the next 8 bits of it, most
// significant first, so no distribution degrades to a comparison sort of thousands of keys. What is left
// after the survival bits (exact ties) is ordered by the full key, i.e. position then request.
void sort_range(uint64_t* lo, uint64_t* hi, int shift, uint64_t* scratch) {
  const int64_t n = hi - lo;
  if (n <= 24) {
    for (uint64_t* i = lo + 1; i < hi; ++i) {  // insertion sort: buckets usually hold a handful of keys
      const uint64_t v = *i;
      uint64_t* j = i;
      for (; j > lo && *(j - 1) > v; --j) *j = *(j - 1);
      *j = v;
    }
    return;
  }
  if (shift < 0 || n <= 512) {  // below ~512 keys a comparison sort beats clearing 256 counters
    std::sort(lo, hi);
    return;
  }
  // Survival 1.0 is 2^32 in fixed point: clamp to 2^32 - 1 so its low bits sort above every s < 1
  // (whose fixed point is at most 2^32 - 256).
  auto digit = [shift](uint64_t key) {
    const uint64_t q = to_fixed(key_survival(key));
    return 255u - uint32_t(((q < 0xffffffffull ? q : 0xffffffffull) >> shift) & 255u);  // descending survival
  };
  uint32_t start[257] = {};
  for (const uint64_t* k = lo; k < hi; ++k) ++start[digit(*k) + 1];
  for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
  uint32_t fill[256];
  std::memcpy(fill, start, sizeof(fill));
  for (const uint64_t* k = lo; k < hi; ++k) scratch[fill[digit(*k)]++] = *k;
  std::memcpy(lo, scratch, size_t(n) * sizeof(uint64_t));
  for (int d = 0; d < 256; ++d)
    if (start[d + 1] - start[d] > 1) sort_range(lo + start[d], lo + start[d + 1], shift - 8, scratch);
}

class LazyOrder {
 public:
  // row_keys [R, K] with caps[r] candidates per row.
  void build(const uint64_t* row_keys, const int32_t* caps, int32_t R, int32_t K, int64_t n) {
    small_ = n <= kSmall;
    if (small_) {  // a few hundred keys: clearing and scanning 2048 buckets would cost more than sorting
      keys_.clear();
      for (int32_t r = 0; r < R; ++r) keys_.insert(keys_.end(), row_keys + size_t(r) * K, row_keys + size_t(r) * K + caps[r]);
      std::sort(keys_.begin(), keys_.end());
      return;
    }
    std::memset(start_, 0, sizeof(start_));
    std::memset(sum_, 0, sizeof(sum_));
    keys_.resize(size_t(n));
    bucket_.resize(size_t(n));
    scratch_.resize(size_t(n));
    int64_t i = 0;
    for (int32_t r = 0; r < R; ++r)
      for (int32_t j = 0; j < caps[r]; ++j, ++i) {
        const uint64_t k = row_keys[size_t(r) * K + j];
        const uint32_t b = bucket_of(k);
        bucket_[size_t(i)] = uint16_t(b);
        ++start_[b + 1];
        sum_[b] += to_fixed(key_survival(k));
      }
    for (int b = 0; b < kNumBuckets; ++b) start_[b + 1] += start_[b];
    uint32_t fill[kNumBuckets];
    std::memcpy(fill, start_, sizeof(fill));
    i = 0;
    for (int32_t r = 0; r < R; ++r)
      for (int32_t j = 0; j < caps[r]; ++j, ++i) keys_[fill[bucket_[size_t(i)]]++] = row_keys[size_t(r) * K + j];
    sorted_buckets_ = 0;
  }

  // Key of rank i (i < n) in canonical order.
  uint64_t at(int64_t i) {
    if (small_) return keys_[size_t(i)];
    while (int64_t(start_[sorted_buckets_]) <= i) {
      sort_range(keys_.data() + start_[sorted_buckets_], keys_.data() + start_[sorted_buckets_ + 1],
                 32 - kBucketBits - 8, scratch_.data());
      ++sorted_buckets_;
    }
    return keys_[size_t(i)];
  }

  // P(b): fixed-point survival sum of ranks [0, b), sorting only the bucket that holds rank b.
  uint64_t prefix(int64_t b) {
    uint64_t total = 0;
    if (small_) {
      for (int64_t i = 0; i < b; ++i) total += to_fixed(key_survival(keys_[size_t(i)]));
      return total;
    }
    int bucket = 0;
    for (; bucket < kNumBuckets && int64_t(start_[bucket + 1]) <= b; ++bucket) total += sum_[bucket];
    if (bucket < kNumBuckets && int64_t(start_[bucket]) < b) {
      at(b - 1);  // sorts buckets up to the one holding rank b - 1
      for (int64_t i = start_[bucket]; i < b; ++i) total += to_fixed(key_survival(keys_[size_t(i)]));
    }
    return total;
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint16_t> bucket_;   // bucket of each candidate, in row order
  std::vector<uint64_t> scratch_;  // for splitting big buckets
  uint32_t start_[kNumBuckets + 1];
  uint64_t sum_[kNumBuckets];
  int sorted_buckets_ = 0;
  bool small_ = false;
  static constexpr int64_t kSmall = 256;
};

struct Workspace {
  std::vector<uint64_t> row_keys;  // [R, K] candidate keys, ascending along each row
  std::vector<int32_t> caps;       // [R] candidates per row
  LazyOrder order;
};

// Reused across calls: a decode loop plans every step, so steady state allocates nothing. Fetched
// through a non-inlined call: in a shared library every thread_local access is a __tls_get_addr call,
// and once inlined GCC re-derives the address inside the hot loops (it cost 5x the planning itself).
__attribute__((noinline)) Workspace* thread_workspace() {
  thread_local Workspace ws;
  return &ws;
}

}  // namespace

int plan_cpu(const Params& p) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  Workspace& ws = *thread_workspace();
  std::vector<uint64_t>& row_keys = ws.row_keys;
  std::vector<int32_t>& caps = ws.caps;
  LazyOrder& order = ws.order;
  row_keys.resize(size_t(R) * K);
  caps.resize(size_t(R));

  int64_t n_cand = 0, n_forced = 0;
  int32_t nan_count = 0;
  for (int32_t r = 0; r < R; ++r) {
    uint64_t* out = row_keys.data() + size_t(r) * K;
    const RowWindow w = walk_row(p.survival + int64_t(r) * p.survival_stride, p.drafts[r], K, p.min_verify,
                                 p.max_verify, r, [&](int32_t j, uint64_t key) { out[j] = key; });
    if (w.drafts_out_of_range) return kErrDraftsOutOfRange;
    caps[r] = w.cap;
    n_cand += w.cap;
    n_forced += w.forced;
    nan_count += w.nan_count;
  }
  if (nan_count && p.error_counts) p.error_counts[kCountNanSurvival] += nan_count;
  order.build(row_keys.data(), caps.data(), R, K, n_cand);

  // ---- budget ----
  const int64_t b_max = std::min(n_cand, p.budget_cap);
  const int64_t b_min = std::min(n_forced, b_max);
  const ThetaEval theta{uint64_t(R + p.extra_emitting) << 32, R + p.extra_tokens, p.verify_cost,
                        p.verify_cost_len, p.draft_cost};
  int64_t budget = b_max;
  if (p.mode == kGreedy || p.mode == kGlobal) {
    uint64_t prefix = order.prefix(b_min);
    budget = b_min;
    double best = theta(b_min, prefix);
    for (int64_t b = b_min; b < b_max; ++b) {
      prefix += to_fixed(key_survival(order.at(b)));
      const double t = theta(b + 1, prefix);
      if (t > best) {
        best = t;
        budget = b + 1;
      } else if (p.mode == kGreedy) {
        break;  // Algorithm 1 stops at the first candidate that does not improve Theta
      }
    }
  } else if (p.mode == kFixed) {
    const int64_t want = p.budget_in ? int64_t(*p.budget_in) : p.fixed_budget;
    budget = std::max(b_min, std::min(want, b_max));
  } else if (p.mode != kAll) {
    return kErrBadArgument;
  }
  const uint64_t prefix = order.prefix(budget);

  *p.budget_out = int32_t(budget);
  if (p.expected_tokens)
    *p.expected_tokens = float(double((uint64_t(R) << 32) + prefix) / kFixedOne);
  if (!p.write_plan) return kOk;  // choose_budget: budget only

  // A request's verified drafts are its candidates ranked before the threshold key.
  const uint64_t threshold = budget < n_cand ? order.at(budget) : kNoCandidate;
  int64_t tok = 0;  // local token index (global index - token_offset)
  bool slot_error = false;
  for (int32_t r = 0; r < R; ++r) {
    const uint64_t* keys = row_keys.data() + size_t(r) * K;
    int32_t L = 0;
    while (L < caps[r] && keys[L] < threshold) ++L;  // a row's keys ascend
    const int32_t q = 1 + L;
    p.verify_lens[r] = L;
    if (p.query_start_loc) p.query_start_loc[r] = int32_t(p.token_offset + tok);
    const int32_t ctx = p.context_lens ? p.context_lens[r] : 0;
    if (p.seq_lens) p.seq_lens[r] = ctx + q;
    for (int32_t i = 0; i < q; ++i, ++tok) {
      if (p.token_req) p.token_req[tok] = r;
      if (p.positions) p.positions[tok] = ctx + i;
      if (p.slot_mapping) {
        const int64_t slot = slot_of(p.block_table + int64_t(r) * p.block_table_stride, p.max_blocks,
                                     p.block_size, int64_t(ctx) + i);
        slot_error |= slot < 0;
        p.slot_mapping[tok] = slot;
      }
      if (p.input_ids)
        p.input_ids[tok] = i == 0 ? p.anchor_tokens[r] : p.draft_tokens[int64_t(r) * p.draft_tokens_stride + i - 1];
    }
  }
  const int32_t end = int32_t(p.token_offset + tok);
  for (int32_t r = R; r < p.num_reqs_padded; ++r) {
    p.verify_lens[r] = 0;
    if (p.query_start_loc) p.query_start_loc[r] = end;
    if (p.seq_lens) p.seq_lens[r] = 0;
  }
  if (p.query_start_loc) p.query_start_loc[p.num_reqs_padded] = end;
  if (p.num_tokens) *p.num_tokens = end;
  for (int64_t t = tok; t < p.num_tokens_padded; ++t) {
    if (p.token_req) p.token_req[t] = -1;
    if (p.positions) p.positions[t] = 0;
    if (p.slot_mapping) p.slot_mapping[t] = -1;
    if (p.input_ids) p.input_ids[t] = 0;
  }
  return slot_error ? kErrBlockTableTooShort : kOk;
}

}  // namespace planner
}  // namespace adaptive_verify
