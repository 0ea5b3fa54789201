// C++ CPU kernels of the confidence area: fused confidence head, confidence from logits, draft margin
// and binned acceptance statistics. Dot products use 8 independent fp32 accumulators (a fixed order, so
// results are deterministic, and wide enough for the compiler to vectorise without -ffast-math).
#include <algorithm>
#include <cmath>
#include <vector>

#include "adaptive_verify/confidence/cpu.h"
#include "adaptive_verify/confidence/math.h"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace confidence {
namespace {

template <typename T>
float dot(const T* x, const float* w, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += to_float(x[i + l]) * w[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += to_float(x[i]) * w[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename T>
void confidence_impl(const ConfidenceParams& p) {
  const T* hidden = static_cast<const T*>(p.hidden);
  const T* markov = static_cast<const T*>(p.markov);
  const float bias = p.bias_ptr ? *p.bias_ptr : p.bias;
  const int32_t K = p.max_drafts;
  // Single-threaded on purpose: torch's intra-op threads keep spinning after torch ops, and our own
  // threads competing with them made this 10x slower on 2 cores (measured), not faster.
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    float* out = p.out + int64_t(r) * K;
    float a = 1.f;
    for (int32_t j = 0; j < K; ++j) {
      float z = dot(hidden + r * p.hidden_stride_r + j * p.hidden_stride_k, p.weight, p.hidden_size);
      if (markov)
        z += dot(markov + r * p.markov_stride_r + j * p.markov_stride_k, p.weight + p.hidden_size, p.markov_size);
      const float c = head_confidence(z + bias, p.temperature, j);
      a = p.survival ? a * c : c;
      out[j] = a;
    }
  }
}

template <typename T>
void from_logits_impl(const LogitParams& p) {
  const T* logits = static_cast<const T*>(p.logits);
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    float* out = p.out + int64_t(r) * p.max_drafts;
    float a = 1.f;
    for (int32_t j = 0; j < p.max_drafts; ++j) {
      const float c = head_confidence(to_float(logits[r * p.logits_stride + j]), p.temperature, j);
      a = p.survival ? a * c : c;
      out[j] = a;
    }
  }
}

template <typename T>
int32_t margin_impl(const MarginParams& p) {
  const T* logits = static_cast<const T*>(p.logits);
  int32_t nan_count = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r)
    for (int32_t j = 0; j < p.max_drafts; ++j) {
      const T* row = logits + r * p.stride_r + j * p.stride_k;
      Top2 t{-INFINITY, -INFINITY};
      for (int64_t v = 0; v < p.vocab; ++v) {
        const float x = to_float(row[v]);
        if (x != x) {
          ++nan_count;
          continue;
        }
        t.push(x);
      }
      p.out[int64_t(r) * p.max_drafts + j] = t.first - t.second;
    }
  return nan_count;
}

template <typename Fn>
int dispatch(int32_t dtype, Fn&& fn) {
  return dispatch_dtype(dtype, fn) ? kOk : kErrBadArgument;
}

}  // namespace

int confidence_cpu(const ConfidenceParams& p) {
  return dispatch(p.dtype, [&](auto tag) { confidence_impl<decltype(tag)>(p); });
}

int confidence_from_logits_cpu(const LogitParams& p) {
  return dispatch(p.dtype, [&](auto tag) { from_logits_impl<decltype(tag)>(p); });
}

int draft_margin_cpu(const MarginParams& p) {
  int32_t nan_count = 0;
  const int status = dispatch(p.dtype, [&](auto tag) { nan_count = margin_impl<decltype(tag)>(p); });
  if (nan_count && p.error_counts) p.error_counts[kCountNanLogits] += nan_count;
  return status;
}

int stats_update_cpu(const StatsParams& p) {
  // Positions first, so a bad one changes nothing (the Python layer raises, naming positions).
  if (p.row_position != nullptr) {
    for (int32_t r = 0; r < p.num_reqs; ++r) {
      const int64_t n = std::min<int64_t>(std::min(p.max_drafts, p.verify_lens[r]),
                                          int64_t(p.num_accepted[r]) + 1);  // trials in row r
      const int64_t first = p.row_position[r];
      if (n > 0 && (first < 0 || first + n > p.num_positions)) return kErrStatsPosition;
    }
  }
  int32_t nan_count = 0;
  int64_t verified_sum = 0, accepted_sum = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t verified = p.verify_lens[r], accepted = p.num_accepted[r];
    const int64_t first = p.row_position != nullptr ? p.row_position[r] : 0;
    verified_sum += verified;
    accepted_sum += accepted < verified ? accepted : verified;
    for (int32_t j = 0; j < p.max_drafts && j < verified && j <= accepted; ++j) {
      const float c = p.conf[r * p.conf_stride + j];
      if (c != c) {
        ++nan_count;
        continue;
      }
      const int64_t cell = (first + j) * p.num_bins + bin_of(c, p.num_bins);
      p.trials[cell] += 1;
      p.survivals[cell] += j < accepted;
      p.conf_sum[cell] += conf_fixed(c);
    }
  }
  if (nan_count && p.error_counts) p.error_counts[kCountNanConfidence] += nan_count;
  if (p.totals != nullptr && p.max_drafts > 0) {  // as on CUDA, where a conf without columns launches nothing
    p.totals[0] += verified_sum;
    p.totals[1] += accepted_sum;
  }
  return kOk;
}

}  // namespace confidence
}  // namespace adaptive_verify
