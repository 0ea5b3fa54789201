// AdaptiveVerifier's host bookkeeping (adaptive_verify/verifier/slots.h): one pass over the step's requests.
#include <algorithm>
#include <cstring>

#include "adaptive_verify/common.h"
#include "adaptive_verify/verifier/slots.h"

namespace adaptive_verify {
namespace verifier {

int slot_inputs_cpu(const SlotParams& p) {
  const int64_t R = p.num_reqs;
  if (R < 0 || p.max_drafts < 1 || p.max_reqs < R || (p.conf_out != nullptr && p.drafts_out == nullptr))
    return kErrBadArgument;
  int64_t sum = 0, forced = 0;
  // Unsigned compares: a negative value is huge, so one compare checks both ends.
  for (int64_t r = 0; r < R; ++r) {
    const int64_t d = p.drafts[r];
    if (uint64_t(d) > uint64_t(p.draft_limit)) return kSlotDraftsOutOfRange;
    sum += d;
    forced += std::min<int64_t>(d, p.min_verify);
  }
  p.sums[0] = sum;
  p.sums[1] = forced;
  if (p.req_indices != nullptr) {
    // Distinct slots through stamps: O(R) per step, no clearing, no sort.
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = p.req_indices[r];
      if (uint64_t(i) >= uint64_t(p.max_reqs)) return kSlotIndexOutOfRange;
      if (p.marks[i] == p.stamp) return kSlotIndexRepeated;
      p.marks[i] = p.stamp;
    }
  }
  if (p.conf_out == nullptr) return kOk;
  const int32_t K = p.max_drafts;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = p.req_indices != nullptr ? p.req_indices[r] : r;
    float* row = p.conf_out + r * K;
    const bool fresh = p.snapshot == nullptr || (p.snapshot_gen != nullptr && p.snapshot_gen[i] != p.gen[i]);
    if (fresh) {
      std::fill(row, row + K, p.prior);
    } else {
      std::memcpy(row, p.snapshot + i * K, sizeof(float) * size_t(K));
    }
    p.drafts_out[r] = int32_t(p.drafts[r]);
  }
  return kOk;
}

void shifted_costs_cpu(const double* base, int64_t shift, double at_shift, double at_zero, int64_t count, float* out) {
  const double* src = base + shift;
  for (int64_t n = 0; n < count; ++n) out[n] = float((src[n] - at_shift) + at_zero);
}

int record_rows_cpu(float* table, float* snapshot, int64_t max_reqs, int32_t K, const int64_t* idx, int64_t R,
                    const float* conf, int64_t stride0, int64_t stride1, int32_t Kc) {
  if (K < 1 || Kc < 0 || Kc > K || R < 0 || R > max_reqs) return kErrBadArgument;
  for (int64_t r = 0; r < R; ++r)
    if (uint64_t(idx[r]) >= uint64_t(max_reqs)) return kSlotIndexOutOfRange;
  for (int64_t r = 0; r < R; ++r) {
    float* row = table + idx[r] * K;
    const float* src = conf + r * stride0;
    if (stride1 == 1) {
      if (Kc > 0) std::memcpy(row, src, sizeof(float) * size_t(Kc));
    } else {
      for (int32_t j = 0; j < Kc; ++j) row[j] = src[j * stride1];
    }
    std::fill(row + Kc, row + K, 0.f);
  }
  if (snapshot != nullptr && max_reqs > 0 && K > 0) std::memcpy(snapshot, table, sizeof(float) * size_t(max_reqs) * size_t(K));
  return kOk;
}

}  // namespace verifier
}  // namespace adaptive_verify
