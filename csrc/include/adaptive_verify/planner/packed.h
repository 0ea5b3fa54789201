// The planner's arguments packed into 64-bit words (little-endian), as python/adaptive_verify/planner.py
// (_PLAN_STRUCT) writes them, and their decoding into Params: shared by the bindings and the host
// emulator's planner driver (tests/emu/planner_emu.cpp).
//
// The planner takes ~40 scalars. pybind11 converts each positional argument separately (~15 us for 41
// of them, more than the kernel itself), so Python packs them into one buffer with
// struct.Struct(PLAN_FORMAT) and C++ decodes it here: ~1 us per call in total.
#pragma once

#include <cstdint>
#include <cstring>

#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

// Word order (keep in sync with planner.py _PLAN_STRUCT).
constexpr const char* kPlanFields =
    "on_cuda stream survival survival_stride drafts num_reqs max_drafts mode fixed_budget budget_in "
    "min_verify max_verify extra_tokens extra_emitting budget_cap verify_cost verify_cost_len draft_cost "
    "context_lens block_table block_table_stride max_blocks block_size anchor_tokens draft_tokens "
    "draft_tokens_stride token_offset num_reqs_padded num_tokens_padded verify_lens budget_out "
    "expected_tokens num_tokens query_start_loc seq_lens token_req positions slot_mapping input_ids "
    "error_counts workspace write_plan kernel";
constexpr int kPlanWords = 43;
constexpr int kDraftCostWord = 17;  // the one float64 word

struct PackedPlan {
  Params params;
  bool on_cuda = false;
  uintptr_t stream = 0;
};

// `data` holds kPlanWords * 8 bytes.
inline PackedPlan unpack_plan(const char* data) {
  int64_t w[kPlanWords];
  std::memcpy(w, data, sizeof(w));
  double draft_cost;
  std::memcpy(&draft_cost, &w[kDraftCostWord], sizeof(draft_cost));
  auto u = [&](int i) { return uintptr_t(w[i]); };
  auto ptr = [&](int i) { return reinterpret_cast<void*>(u(i)); };
  PackedPlan out;
  Params& p = out.params;
  out.on_cuda = w[0] != 0;
  out.stream = u(1);
  p.survival = static_cast<const float*>(ptr(2));
  p.survival_stride = w[3];
  p.drafts = static_cast<const int32_t*>(ptr(4));
  p.num_reqs = int32_t(w[5]);
  p.max_drafts = int32_t(w[6]);
  p.mode = int32_t(w[7]);
  p.fixed_budget = w[8];
  p.budget_in = static_cast<const int32_t*>(ptr(9));
  p.min_verify = int32_t(w[10]);
  p.max_verify = int32_t(w[11]);
  p.extra_tokens = w[12];
  p.extra_emitting = w[13];
  p.budget_cap = w[14];
  p.verify_cost = static_cast<const float*>(ptr(15));
  p.verify_cost_len = w[16];
  p.draft_cost = float(draft_cost);  // rounded to float32 exactly as the torch reference does
  p.context_lens = static_cast<const int32_t*>(ptr(18));
  p.block_table = static_cast<const int32_t*>(ptr(19));
  p.block_table_stride = w[20];
  p.max_blocks = int32_t(w[21]);
  p.block_size = int32_t(w[22]);
  p.anchor_tokens = static_cast<const int32_t*>(ptr(23));
  p.draft_tokens = static_cast<const int32_t*>(ptr(24));
  p.draft_tokens_stride = w[25];
  p.token_offset = w[26];
  p.num_reqs_padded = int32_t(w[27]);
  p.num_tokens_padded = w[28];
  p.verify_lens = static_cast<int32_t*>(ptr(29));
  p.budget_out = static_cast<int32_t*>(ptr(30));
  p.expected_tokens = static_cast<float*>(ptr(31));
  p.num_tokens = static_cast<int32_t*>(ptr(32));
  p.query_start_loc = static_cast<int32_t*>(ptr(33));
  p.seq_lens = static_cast<int32_t*>(ptr(34));
  p.token_req = static_cast<int32_t*>(ptr(35));
  p.positions = static_cast<int32_t*>(ptr(36));
  p.slot_mapping = static_cast<int64_t*>(ptr(37));
  p.input_ids = static_cast<int32_t*>(ptr(38));
  p.error_counts = static_cast<int32_t*>(ptr(39));
  p.workspace = static_cast<uint64_t*>(ptr(40));
  p.write_plan = int32_t(w[41]);
  p.kernel = int32_t(w[42]);  // CUDA kernel choice (AV_PLANNER_KERNEL); the CPU kernel ignores it
  return out;
}

}  // namespace planner
}  // namespace adaptive_verify
