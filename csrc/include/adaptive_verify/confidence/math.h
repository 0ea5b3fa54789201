// Per-element arithmetic of the confidence ops shared by the CPU and CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace confidence {

AV_HD float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  return 1.f / (1.f + expf(-x));
#else
  return 1.f / (1.f + std::exp(-x));
#endif
}

// Confidence of position j from its head logit z: sigmoid(z / T_j) (no temperature: sigmoid(z)). A temperature
// that is not finite and > 0 means nothing (T <= 0 would flip or saturate the head's ranking silently): the
// confidence is then NaN, which prefix_survival and the planner count ("nan_survival") and never verify. The Python
// layer checks CPU temperatures before any kernel runs; a device tensor's values are left to this rule, since
// checking them would stall the host on a sync.
AV_HD float head_confidence(float z, const float* temperature, int32_t j) {
  if (temperature == nullptr) return sigmoid(z);
  const float t = temperature[j];
  if (!(t > 0.f) || !(t <= 3.402823466e38f)) return NAN;  // NaN, <= 0 or +inf
  return sigmoid(z / t);
}

// Bin of a confidence among num_bins equal-width bins of [0, 1]; values outside are clamped.
// Clamped in float before the conversion: a float-to-int conversion out of range is undefined, and x86
// (INT_MIN) and CUDA (saturating) disagree, which would put c = 1e9 or +inf in opposite bins.
AV_HD int32_t bin_of(float c, int32_t num_bins) {
  const float t = c * float(num_bins);
  return t > 0.f ? (t < float(num_bins) ? int32_t(t) : num_bins - 1) : 0;
}

// Confidence in 32.32 fixed point, clamped to [0, 1], for order-independent (exact) sums.
AV_HD int64_t conf_fixed(float c) {
  c = c > 0.f ? (c < 1.f ? c : 1.f) : 0.f;
  return int64_t(to_fixed(c));
}

// Running top-2 of a stream; NaN never enters.
struct Top2 {
  float first, second;
  AV_HD void push(float x) {
    if (x > first) {
      second = first;
      first = x;
    } else if (x > second) {
      second = x;
    }
  }
  AV_HD void merge(const Top2& o) {
    push(o.first);
    push(o.second);
  }
};

}  // namespace confidence
}  // namespace adaptive_verify
