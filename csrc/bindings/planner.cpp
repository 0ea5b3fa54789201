// adaptive_verify._C's planner ops: prefix_survival and plan (python/adaptive_verify/planner/).
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/planner/cpu.h"
#include "adaptive_verify/planner/cuda_shape.h"
#include "bindings/common.h"

namespace adaptive_verify {
namespace bindings {

void register_planner(py::module_& m) {
  using P = planner::Params;
  using S = planner::SurvivalParams;
  def_op<S>(m, "prefix_survival", planner::prefix_survival_cpu, AV_CUDA_FN(planner::prefix_survival_cuda));
  def_op<P>(m, "plan", planner::plan_cpu, AV_CUDA_FN(planner::plan_cuda));
  // Bytes of global workspace the CUDA plan needs (0: it fits shared memory), from host-known sizes.
  m.def("plan_workspace_bytes", [](int64_t R, int64_t K, bool has_forced, bool tree) {
    return planner::plan_workspace_bytes(R, K, has_forced, tree);
  });
  m.attr("SURVIVAL_PARAMS") = struct_layout<S>({
      AV_FIELD(S, conf), AV_FIELD(S, conf_stride), AV_FIELD(S, parents), AV_FIELD(S, parents_stride),
      AV_FIELD(S, drafts), AV_FIELD(S, num_reqs),
      AV_FIELD(S, max_drafts), AV_FIELD(S, survival), AV_FIELD(S, error_counts)});
  m.attr("PLANNER_PARAMS") = struct_layout<P>({
      AV_FIELD(P, survival), AV_FIELD(P, survival_stride), AV_FIELD(P, drafts), AV_FIELD(P, num_reqs),
      AV_FIELD(P, conf), AV_FIELD(P, conf_stride), AV_FIELD(P, survival_out), AV_FIELD(P, weights),
      AV_FIELD(P, step_cap), AV_FIELD(P, parents), AV_FIELD(P, parents_stride),
      AV_FIELD(P, max_drafts), AV_FIELD(P, mode), AV_FIELD(P, fixed_budget), AV_FIELD(P, budget_in),
      AV_FIELD(P, min_verify), AV_FIELD(P, max_verify), AV_FIELD(P, extra_tokens), AV_FIELD(P, extra_emitting),
      AV_FIELD(P, budget_cap), AV_FIELD(P, verify_cost), AV_FIELD(P, verify_cost_len), AV_FIELD(P, draft_cost),
      AV_FIELD(P, context_lens), AV_FIELD(P, block_table), AV_FIELD(P, block_table_stride),
      AV_FIELD(P, max_blocks), AV_FIELD(P, block_size), AV_FIELD(P, anchor_tokens), AV_FIELD(P, draft_tokens),
      AV_FIELD(P, draft_tokens_stride), AV_FIELD(P, token_offset), AV_FIELD(P, num_reqs_padded),
      AV_FIELD(P, num_tokens_padded), AV_FIELD(P, write_plan), AV_FIELD(P, verify_lens), AV_FIELD(P, budget_out),
      AV_FIELD(P, expected_tokens), AV_FIELD(P, num_tokens), AV_FIELD(P, query_start_loc), AV_FIELD(P, seq_lens),
      AV_FIELD(P, token_req), AV_FIELD(P, positions), AV_FIELD(P, slot_mapping), AV_FIELD(P, input_ids),
      AV_FIELD(P, tree_mask), AV_FIELD(P, token_parent), AV_FIELD(P, token_node), AV_FIELD(P, token_depth),
      AV_FIELD(P, error_counts), AV_FIELD(P, workspace), AV_FIELD(P, choose_depth), AV_FIELD(P, min_depth),
      AV_FIELD(P, max_depth), AV_FIELD(P, num_widths), AV_FIELD(P, depth_cost), AV_FIELD(P, depth_step_cap),
      AV_FIELD(P, shape_width), AV_FIELD(P, depth_out), AV_FIELD(P, width_out),
      AV_FIELD(P, level_widths_out)});
  m.attr("PLANNER_MAX_DRAFTS") = int(planner::kMaxDrafts);
  m.attr("PLANNER_MAX_REQS") = int64_t(planner::kMaxReqs);
  m.attr("PLANNER_MAX_TREE_NODES") = int(planner::kMaxTreeNodes);
  m.attr("PLANNER_MAX_SHAPES") = int(planner::kMaxShapes);
  m.attr("PLANNER_MAX_TREE_REQS") = int64_t(planner::kMaxTreeReqs);
  m.attr("PLANNER_MAX_CONTEXT_LEN") = int(planner::kMaxContextLen);
  m.attr("PLANNER_MODES") = py::make_tuple(int(planner::kGreedy), int(planner::kGlobal), int(planner::kFixed),
                                           int(planner::kAll));
}

}  // namespace bindings
}  // namespace adaptive_verify
