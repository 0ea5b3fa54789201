// AdaptiveVerifier's per-step host bookkeeping (python/adaptive_verify/verifier.py): plan_budget's checks of the
// engine's host arrays, its draft sums, and the lagged budget's inputs gathered from the confidence snapshot. One
// pass over R requests instead of a numpy call per check: at R = 256 each numpy call costs microseconds of host
// time, which an engine pays every decode step. Host code only (the arrays are the engine's host memory).
#pragma once

#include <cstdint>

namespace adaptive_verify {
namespace verifier {

// Statuses of slot_inputs (verifier.py names the argument): kOk, or one of these.
enum SlotStatus : int {
  kSlotDraftsOutOfRange = 1,   // drafts[r] outside [0, draft_limit]
  kSlotIndexOutOfRange = 2,    // req_indices[r] outside [0, max_reqs)
  kSlotIndexRepeated = 3,      // two rows name one slot
};

struct SlotParams {
  const int64_t* drafts;         // [R] drafts (or tree sizes) per request this step
  const int64_t* req_indices;    // [R] persistent slots, distinct, in [0, max_reqs); null: row r is slot r
  int64_t num_reqs;              // R
  int64_t max_reqs;
  int32_t max_drafts;            // K: the columns of snapshot and conf_out
  int32_t draft_limit;           // drafts[r] must lie in [0, draft_limit]
  int32_t min_verify;            // forced drafts per request (sums[1] counts min(drafts[r], min_verify))
  const float* snapshot;         // [max_reqs, K] each slot's last recorded confidences; null: all have the prior
  const int64_t* snapshot_gen;   // [max_reqs] the generations the snapshot saw; null: no slot changed hands since
  const int64_t* gen;            // [max_reqs] each slot's current generation (add_request counts)
  float prior;                   // the confidence of each draft of a slot with no history
  uint32_t* marks;               // [max_reqs] scratch: marks[i] == stamp once slot i was seen in this call
  uint32_t stamp;                // nonzero and unlike every earlier call's (on wrap the caller zeroes marks)
  float* conf_out;               // [R, K] the lagged budget's confidences; null: checks and sums only
  int32_t* drafts_out;           // [R] drafts as int32 (with conf_out)
  int64_t* sums;                 // [2] out: sum of drafts, sum of min(drafts, min_verify)
};

// Checks drafts (and req_indices: in range, distinct), writes the sums, and with conf_out gathers each request's
// stale confidences (the prior for a slot whose generation differs from the snapshot's). Returns a SlotStatus or 0;
// on an error nothing but sums and marks may have been written.
int slot_inputs_cpu(const SlotParams& p);

// out[n] = float(base[shift + n] - at_shift + at_zero) for n < count, in double and rounded once (what
// ShiftedCurve.dense32 computes with numpy, bit for bit; this build has no FMA contraction): the verify costs of a
// shifted cost table (CostTable.shifted, one per prompt chunk) written into a remembered planner call's own array.
// base holds shift + count doubles.
void shifted_costs_cpu(const double* base, int64_t shift, double at_shift, double at_zero, int64_t count, float* out);

// record_confidence on CPU tables: table[idx[r], j] = conf[r * stride0 + j * stride1] for j < Kc, 0 for j in [Kc, K),
// for the R rows, then (snapshot non-null) the whole [max_reqs, K] table copied into snapshot. Returns
// kSlotIndexOutOfRange (before writing anything) when an index lies outside [0, max_reqs), else 0.
int record_rows_cpu(float* table, float* snapshot, int64_t max_reqs, int32_t K, const int64_t* idx, int64_t R,
                    const float* conf, int64_t stride0, int64_t stride1, int32_t Kc);

}  // namespace verifier
}  // namespace adaptive_verify
