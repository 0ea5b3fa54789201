// C++ CPU sampler: the shared per-request algorithm (algorithm.h) with sequential row reductions.
#include <cmath>

#include "adaptive_verify/sampling/algorithm.h"
#include "adaptive_verify/sampling/cpu.h"

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

  float max_scaled(const T* row, int64_t V, float temp) const {
    ScaledMax mx;
    for (int64_t v = 0; v < V; ++v) mx.push(fdiv(to_float(row[v]), temp));
    count_nan(mx.nan);
    return mx.m;
  }

  int64_t race(const T* row, int64_t V, float temp, const Rng& rng, int32_t j, uint32_t stream) const {
    RaceBest best{max_scaled(row, V, temp) - kRaceWindow, RaceUniforms{rng, j, stream}};
    for (int64_t v = 0; v < V; ++v) best.push(fdiv(to_float(row[v]), temp), v);
    return best.id < 0 ? 0 : best.id;
  }

  SoftmaxStats softmax_stats(const T* row, int64_t V, float temp) const {
    const float m = max_scaled(row, V, temp);
    float lanes[kLanes] = {};
    for (int64_t v = 0; v < V; ++v)  // lane v % kLanes adds its terms in increasing v: the canonical order
      lanes[v % kLanes] = fadd(lanes[v % kLanes], av_exp(fsub(fdiv(to_float(row[v]), temp), m)));
    for (int s = kLanes / 2; s >= 1; s /= 2)
      for (int l = 0; l < s; ++l) lanes[l] = fadd(lanes[l], lanes[l + s]);
    return SoftmaxStats{m, lanes[0]};
  }

  // argmax_v max(p_v - q_v, 0) / E_v; when every weight is 0, argmax_v p_v / E_v.
  int64_t residual_race(const T* row, const float* q, int64_t V, float temp, const SoftmaxStats& st,
                        const Rng& rng, int32_t j) const {
    if (!(st.max > -INFINITY)) return 0;
    ResidualBest best;
    RaceUniforms u{rng, j, kRace};
    for (int64_t v = 0; v < V; ++v) best.push(to_float(row[v]), q[v], temp, st, u, v);
    return best.id_w >= 0 ? best.id_w : (best.id_p >= 0 ? best.id_p : 0);
  }
};

template <typename Fn>
int dispatch(int32_t dtype, Fn&& fn) {
  return dispatch_dtype(dtype, fn) ? kOk : kErrBadArgument;
}

}  // namespace

int rejection_sample_cpu(const RejectionParams& p) {
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    CpuRows<T> rows{p.error_counts};
    for (int32_t r = 0; r < p.num_reqs; ++r) rejection_request<T>(p, r, rows, true);
  });
}

int sample_cpu(const SampleParams& p) {
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    CpuRows<T> rows{p.error_counts};
    const uint64_t offset = p.offset_ptr != nullptr ? uint64_t(*p.offset_ptr) : p.offset;
    for (int32_t i = 0; i < p.num_rows; ++i) {
      const T* row = static_cast<const T*>(p.logits) + int64_t(i) * p.logits_stride;
      const float temp = p.temperature != nullptr ? p.temperature[i] : 0.f;
      const Rng rng{p.seeds != nullptr ? uint64_t(p.seeds[i]) : 0ull, offset};
      p.tokens[i] = int32_t(temp > 0.f ? rows.race(row, p.vocab, temp, rng, 0, kSample) : rows.argmax(row, p.vocab));
    }
  });
}

}  // namespace sampling
}  // namespace adaptive_verify
