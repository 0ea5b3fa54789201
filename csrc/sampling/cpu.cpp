// C++ CPU sampler: the shared per-request algorithm (algorithm.h) with sequential row reductions.
#include <cmath>

#include "adaptive_verify/sampling/algorithm.h"
#include "adaptive_verify/sampling/cpu.h"
#include "adaptive_verify/sampling/tree.h"

namespace adaptive_verify {
namespace sampling {
namespace {

template <typename T>
struct CpuRows {
  int32_t* error_counts;

  void count_nan(int32_t n) const {
    if (n && error_counts) error_counts[kCountNanLogits] += n;
  }

  // Largest logit, ties to the smallest id, NaN ignored (and counted); 0 when no logit is a number.
  int64_t argmax(const T* row, int64_t V) const {
    ArgmaxBest best;
    for (int64_t v = 0; v < V; ++v) best.push(to_float(row[v]), v);
    count_nan(best.nan);
    return best.id < 0 ? 0 : best.id;
  }

  float max_scaled(const T* row, int64_t V, float temp, bool count) const {
    ScaledMax mx;
    for (int64_t v = 0; v < V; ++v) mx.push(fdiv(to_float(row[v]), temp));
    if (count) count_nan(mx.nan);
    return mx.m;
  }

  int64_t race(const T* row, int64_t V, float temp, float m, const Rng& rng, int32_t j, uint32_t stream,
               uint64_t limit) const {
    RaceBest best{softmax_max(m) - kRaceWindow, RaceUniforms{rng, j, stream}, limit};
    for (int64_t v = 0; v < V; ++v) best.push(scaled_logit(to_float(row[v]), temp, m), v);
    return best.id < 0 ? 0 : best.id;
  }

  int64_t sampled(const T* row, int64_t V, float temp, const Truncation& t, const Rng& rng, int32_t j,
                  uint32_t stream) {
    return truncated_race<T>(*this, row, V, temp, t, rng, j, stream);
  }

  // One level of a selection (algorithm.h, RankHist).
  const RankHist& rank_histogram(const T* row, int64_t V, float temp, float m, uint64_t limit, uint64_t prefix,
                                 int shift, bool with_mass) {
    for (int b = 0; b < 256; ++b) {
      hist.count[b] = 0;
      hist.mass[b] = 0;
      hist.lo[b] = ~0ull;
      hist.hi[b] = 0;
    }
    for (int64_t v = 0; v < V; ++v) {
      uint64_t key, mass;
      const int b = rank_bucket(scaled_logit(to_float(row[v]), temp, m), v, m, limit, prefix, shift, with_mass, &key, &mass);
      if (b < 0) continue;
      hist.count[b] += 1;
      hist.mass[b] += mass;
      hist.lo[b] = key < hist.lo[b] ? key : hist.lo[b];
      hist.hi[b] = key > hist.hi[b] ? key : hist.hi[b];
    }
    return hist;
  }

  // Softmax max (given) and the canonical sum over the kept tokens.
  SoftmaxStats softmax_stats(const T* row, int64_t V, float temp, float m, uint64_t limit) const {
    float lanes[kLanes] = {};
    for (int64_t v = 0; v < V; ++v) {  // lane v % kLanes adds its terms in increasing v: the canonical order
      const float z = scaled_logit(to_float(row[v]), temp, m);
      if (kept(z, v, limit)) lanes[v % kLanes] = fadd(lanes[v % kLanes], av_exp(fsub(z, softmax_max(m))));
    }
    for (int s = kLanes / 2; s >= 1; s /= 2)
      for (int l = 0; l < s; ++l) lanes[l] = fadd(lanes[l], lanes[l + s]);
    return SoftmaxStats{m, lanes[0]};
  }

  // argmax_v max(p_v - q_v, 0) / E_v over the kept tokens; when every weight is 0, argmax_v p_v / E_v.
  int64_t residual_race(const T* row, const float* q, int64_t V, float temp, const SoftmaxStats& st,
                        const Rng& rng, int32_t j, uint64_t limit) const {
    if (!(st.max > -INFINITY)) return 0;
    ResidualBest best;
    RaceUniforms u{rng, j, kRace};
    for (int64_t v = 0; v < V; ++v) best.push(to_float(row[v]), q[v], temp, st, u, v, limit);
    return best.id_w >= 0 ? best.id_w : (best.id_p >= 0 ? best.id_p : 0);
  }

  RankHist hist;
};

template <typename Fn>
int dispatch(int32_t dtype, Fn&& fn) {
  return dispatch_dtype(dtype, fn) ? kOk : kErrBadArgument;
}

// The CPU sampler refuses values the CUDA kernels handle safely and count (it can read them for free, and an
// error names the argument): the first bad one, before any output is written.
int check_row_params(const float* temperature, const int32_t* top_k, const float* top_p, const float* min_p,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (temperature != nullptr && !(temperature[i] >= 0.f)) return kErrTemperature;
    if (top_k != nullptr && top_k[i] < 0) return kErrTopK;
    if (top_p != nullptr && !(top_p[i] > 0.f && top_p[i] <= 1.f)) return kErrTopP;
    if (min_p != nullptr && !(min_p[i] >= 0.f && min_p[i] <= 1.f)) return kErrMinP;
  }
  return kOk;
}

// query_start_loc non-decreasing within [0, T], at most K + 1 rows per request.
int check_query_start_loc(const RejectionParams& p) {
  if (p.num_reqs == 0) return kOk;
  if (p.query_start_loc[0] < 0 || p.query_start_loc[p.num_reqs] > p.num_tokens) return kErrQueryLen;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int64_t q_len = int64_t(p.query_start_loc[r + 1]) - p.query_start_loc[r];
    if (q_len < 0 || q_len > p.max_drafts + 1) return kErrQueryLen;
  }
  return kOk;
}

// Tree tokens: query_start_loc non-decreasing within [0, T] with at most max_query_len tokens per request (kErrQueryLen),
// and every token at offset i >= 1 with its parent at an offset in [0, i) (kErrTokenParent).
int check_tree(const TreeSampleParams& p) {
  if (p.num_reqs == 0) return kOk;
  if (p.query_start_loc[0] < 0 || p.query_start_loc[p.num_reqs] > p.num_tokens) return kErrQueryLen;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int64_t begin = p.query_start_loc[r], q_len = int64_t(p.query_start_loc[r + 1]) - begin;
    if (q_len < 0 || q_len > p.max_query_len) return kErrQueryLen;
    for (int64_t i = 1; i < q_len; ++i)
      if (p.token_parent[begin + i] < 0 || p.token_parent[begin + i] >= i) return kErrTokenParent;
  }
  return kOk;
}

}  // namespace

int rejection_sample_cpu(const RejectionParams& p) {
  if (const int bad = check_query_start_loc(p)) return bad;
  if (const int bad = check_row_params(p.temperature, p.top_k, p.top_p, p.min_p, p.num_reqs)) return bad;
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    CpuRows<T> rows{p.error_counts, {}};
    for (int32_t r = 0; r < p.num_reqs; ++r) rejection_request<T>(p, r, rows, true);
  });
}

int tree_rejection_sample_cpu(const TreeSampleParams& p) {
  if (p.max_query_len < 1 || p.max_query_len > kMaxTreeTokens) return kErrBadArgument;
  if (const int bad = check_tree(p)) return bad;
  if (const int bad = check_row_params(p.temperature, p.top_k, p.top_p, p.min_p, p.num_reqs)) return bad;
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    CpuRows<T> rows{p.error_counts, {}};
    for (int32_t r = 0; r < p.num_reqs; ++r) tree_request<T>(p, r, rows, true);
  });
}

int sample_cpu(const SampleParams& p) {
  if (const int bad = check_row_params(p.temperature, p.top_k, p.top_p, p.min_p, p.num_rows)) return bad;
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    CpuRows<T> rows{p.error_counts, {}};
    for (int32_t i = 0; i < p.num_rows; ++i) sample_row<T>(p, i, rows, true);
  });
}

}  // namespace sampling
}  // namespace adaptive_verify
