// Arguments of the verification planner, as raw pointers and sizes (no torch types), shared by the
// C++ CPU kernel and the CUDA kernel. The Python layer (python/adaptive_verify/planner/) validates every
// tensor and fills this struct by field name (bindings export its layout); nullable pointers mark
// optional inputs/outputs.
//
// Chains and draft trees share the struct: with `parents` set, request r's K slots are the nodes of its tree
// (K = N, the most nodes per request, <= kMaxTreeNodes), drafts[r] is its tree size, and the tree outputs
// are written (docs/design.md, "Draft trees").
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace planner {

enum Mode : int32_t {
  kGreedy = 0,  // paper Algorithm 1: admit while Theta strictly improves
  kGlobal = 1,  // argmax of Theta over [B_min, B_max] (ties: smallest B). Not lossless when live.
  kFixed = 2,   // budget given by the caller (host int or device 0-d tensor), clamped to [B_min, B_max]
  kAll = 3,     // B = B_max: verify every candidate (fixed-k baseline)
};

constexpr int64_t kNoStepCap = int64_t(1) << 62;
constexpr int kMaxDepths = 33;  // draft depths 0..K, K <= kMaxDrafts (math.h checks it)
// Entries of the (width profile, depth) arrays: num_widths * (max_depth + 1) <= kMaxShapes (a chain has one
// profile). 256: every non-increasing per-level profile of a top-3 drafter 6 levels deep (147 shapes) or a top-4
// one 5 levels deep (210) fits; Params stays within a kernel's 4 KB of parameters.
constexpr int kMaxShapes = 256;

struct Params {
  // ---- candidates ----
  const float* survival = nullptr;  // [R, K] float32, row stride survival_stride, last dim contiguous
  int64_t survival_stride = 0;
  const int32_t* drafts = nullptr;  // [R] int32, drafts[r] in [0, K]
  int32_t num_reqs = 0;             // R
  int32_t max_drafts = 0;           // K (1..32)

  // ---- or confidences: the kernel first writes survival_out = prefix_survival(conf, drafts), then plans on it
  // (one call for the common step). With conf set, survival must point at survival_out, stride K. ----
  const float* conf = nullptr;     // [R, K] float32, row stride conf_stride, last dim contiguous
  int64_t conf_stride = 0;
  float* survival_out = nullptr;   // [R, K] float32, contiguous

  // ---- draft trees (null: chains). parents[r, j] is node j's parent node, -1 for the anchor; topological
  // (parents[r, j] < j). The walk reads nodes j < min(drafts[r], max_verify) (the conf= prologue j < drafts[r]),
  // and only what it reads is validated. ----
  const int32_t* parents = nullptr;  // [R, N] int32, row stride parents_stride, last dim contiguous
  int64_t parents_stride = 0;

  // ---- budget ----
  int32_t mode = kGreedy;
  int64_t fixed_budget = 0;            // kFixed with budget_in == nullptr
  const int32_t* budget_in = nullptr;  // kFixed: 0-d int32 tensor on the kernel's device
  int32_t min_verify = 0;              // forced drafts per request
  int32_t max_verify = 0;              // cap per request (<= K)
  int64_t extra_tokens = 0;            // non-draft tokens in the same step (prefill chunks)
  int64_t extra_emitting = 0;          // prefill requests that sample this step
  int64_t budget_cap = 0;              // capacity - R - extra_tokens (>= 0): most drafts that fit

  // ---- priorities and a latency target ----
  // Weights [R] float32 (finite, >= 0), or null (all 1): candidates rank by w_r * a[r, j] and Theta's numerator
  // is sum_r w_r (1 + its verified survivals); expected_tokens stays unweighted. The kernel scales them by
  // c = max(1, max_r w_r) so every weighted survival stays in [0, 1] (Theta's argmax does not change).
  const float* weights = nullptr;
  // Most drafts the step's latency target allows (the host derives it from max_step_ms and the cost curve);
  // B_min wins over it. kNoStepCap when there is no target.
  int64_t step_cap = kNoStepCap;

  // ---- draft depth (choose_draft_depth, choose_tree_shape; write_plan 0). With choose_depth set the kernel chooses
  // the shape (P, D) and budget B maximising Theta = (base + P_{P,D}(B)) / (depth_cost[s] + verify_cost[R +
  // extra_tokens + B]), s = (P - 1) * (max_depth + 1) + D, over D in [min_depth, max_depth] and width profiles P in
  // [1, num_widths], B in that shape's [B_min, B_max] with B_max capped by depth_step_cap[s] (mode, draft_cost and
  // step_cap are not read). Chains (num_widths 0): one profile, and the candidates of shape D are positions < D,
  // max_depth <= min(K, max_verify). Trees: profile P expands shape_width[(P - 1) * (max_depth + 1) + l] nodes of
  // each level l in [1, max_depth); the candidates of (P, D) are the nodes of depth <= D whose every ancestor at
  // depth l >= 1 ranks among the shape_width(P, l) best of its depth (by the walk's capped survival, ties to the
  // lower index): what an EAGLE-2 drafter drafts when it expands the best nodes of each level, D levels deep.
  // Ties: the smallest P, then the smallest D, then the smallest B. Arrays by value: host-known per step, nothing
  // to copy to a device, and a captured CUDA graph keeps them as it keeps draft_cost. ----
  int32_t choose_depth = 0;
  int32_t min_depth = 0;
  int32_t max_depth = 0;
  int32_t num_widths = 0;  // choose_tree_shape: width profiles 1..num_widths (>= 1, the tree decision); 0: chains
  float depth_cost[kMaxShapes] = {};        // the step's fixed cost of shape s: drafter(R, P, D) + request_ms * R
  int64_t depth_step_cap[kMaxShapes] = {};  // most drafts the latency target allows at shape s (kNoStepCap: none)
  uint8_t shape_width[kMaxShapes] = {};     // trees: profile P's width at level l, at s = (P - 1) * (max_depth + 1) + l
  int32_t* depth_out = nullptr;             // 0-d int32: the chosen D
  int32_t* width_out = nullptr;             // 0-d int32 or null: the chosen profile P (trees)
  int32_t* level_widths_out = nullptr;      // [max_depth] int32 or null: P's width at levels 1..max_depth, 0 from D on
  // ---- cost: step_cost(R, n) = draft_cost + verify_cost[n] ----
  const float* verify_cost = nullptr;  // [verify_cost_len] float32 ms, indexed by total tokens n
  int64_t verify_cost_len = 0;
  float draft_cost = 0.f;              // draft_ms(R), a host scalar because R is a shape

  // ---- metadata inputs (nullable) ----
  const int32_t* context_lens = nullptr;  // [R]
  const int32_t* block_table = nullptr;   // [R, max_blocks], row stride block_table_stride
  int64_t block_table_stride = 0;
  int32_t max_blocks = 0;
  int32_t block_size = 0;
  const int32_t* anchor_tokens = nullptr;  // [R]
  const int32_t* draft_tokens = nullptr;   // [R, >= max_verify], row stride draft_tokens_stride; a negative id
                                           // (an invalidated draft) ends its request's candidates
  int64_t draft_tokens_stride = 0;
  int64_t token_offset = 0;
  int32_t num_reqs_padded = 0;    // R_pad >= R
  int64_t num_tokens_padded = 0;  // T_pad >= R + budget_cap

  // ---- outputs (nullable except budget_out) ----
  // 0: budget (and expected_tokens) only, as choose_budget; 1: also allocation and metadata. A flag rather
  // than a null verify_lens, because an empty tensor's data pointer is null too.
  int32_t write_plan = 0;
  int32_t* verify_lens = nullptr;      // [R_pad]
  int32_t* budget_out = nullptr;       // 0-d
  float* expected_tokens = nullptr;    // 0-d
  int32_t* num_tokens = nullptr;       // 0-d
  int32_t* query_start_loc = nullptr;  // [R_pad + 1]
  int32_t* seq_lens = nullptr;         // [R_pad]       (needs context_lens)
  int32_t* token_req = nullptr;        // [T_pad]
  int32_t* positions = nullptr;        // [T_pad]       (needs context_lens)
  int64_t* slot_mapping = nullptr;     // [T_pad]       (needs context_lens, block_table)
  int32_t* input_ids = nullptr;        // [T_pad]       (needs anchor_tokens, draft_tokens)
  // trees only (nullable): bit i of tree_mask[t] set iff token t attends to its request's query token at offset
  // i; the parent's offset within the request (-1: the anchor), the node index (-1: the anchor), the depth.
  int64_t* tree_mask = nullptr;        // [T_pad]       padding 0
  int32_t* token_parent = nullptr;     // [T_pad]       padding -1
  int32_t* token_node = nullptr;       // [T_pad]       padding -1
  int32_t* token_depth = nullptr;      // [T_pad]       padding 0
  int32_t* error_counts = nullptr;     // [kNumErrorCounters] on the kernel's device

  // CUDA only: global scratch of plan_workspace_bytes() bytes when the workspace does not fit shared memory
  // (null otherwise); the CPU kernel uses thread-local scratch.
  void* workspace = nullptr;
};

// The kernels take Params by value: 4 KB is the parameter space every CUDA driver and architecture allows.
static_assert(sizeof(Params) <= 4096, "Params travels by value as a kernel parameter");

// prefix_survival: a[r, j] = prod_{i<=j} clamp(conf[r, i], 0, 1) for j < drafts[r], else 0.
// tree_survival (parents set): a[r, j] = a[r, parents[r, j]] * clamp(conf[r, j], 0, 1), a[r, -1] = 1, for
// j < drafts[r] (the tree size), else 0.
struct SurvivalParams {
  const float* conf = nullptr;  // [R, K], row stride conf_stride
  int64_t conf_stride = 0;
  const int32_t* parents = nullptr;  // [R, N], row stride parents_stride; null: chains
  int64_t parents_stride = 0;
  const int32_t* drafts = nullptr;  // [R]
  int32_t num_reqs = 0;
  int32_t max_drafts = 0;
  float* survival = nullptr;  // [R, K] contiguous
  int32_t* error_counts = nullptr;
};

}  // namespace planner
}  // namespace adaptive_verify
