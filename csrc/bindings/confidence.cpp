// adaptive_verify._C's confidence-area ops: the fused head, from logits, draft margins and the acceptance
// statistics (python/adaptive_verify/confidence.py, margin.py, stats.py).
#include "adaptive_verify/confidence/cpu.h"
#include "adaptive_verify/cuda_api.h"
#include "bindings/common.h"

namespace adaptive_verify {
namespace bindings {

void register_confidence(py::module_& m) {
  using C = confidence::ConfidenceParams;
  using L = confidence::LogitParams;
  using M = confidence::MarginParams;
  using S = confidence::StatsParams;
  def_op<C>(m, "confidence", confidence::confidence_cpu, AV_CUDA_FN(confidence::confidence_cuda));
  def_op<L>(m, "confidence_from_logits", confidence::confidence_from_logits_cpu, AV_CUDA_FN(confidence::confidence_from_logits_cuda));
  def_op<M>(m, "draft_margin", confidence::draft_margin_cpu, AV_CUDA_FN(confidence::draft_margin_cuda));
  def_op<S>(m, "stats_update", confidence::stats_update_cpu, AV_CUDA_FN(confidence::stats_update_cuda));
  m.attr("CONFIDENCE_PARAMS") = struct_layout<C>({
      AV_FIELD(C, hidden), AV_FIELD(C, hidden_stride_r), AV_FIELD(C, hidden_stride_k), AV_FIELD(C, markov),
      AV_FIELD(C, markov_stride_r), AV_FIELD(C, markov_stride_k), AV_FIELD(C, dtype), AV_FIELD(C, weight),
      AV_FIELD(C, bias), AV_FIELD(C, bias_ptr), AV_FIELD(C, temperature), AV_FIELD(C, num_reqs),
      AV_FIELD(C, max_drafts), AV_FIELD(C, hidden_size), AV_FIELD(C, markov_size), AV_FIELD(C, survival),
      AV_FIELD(C, out)});
  m.attr("LOGIT_PARAMS") = struct_layout<L>({
      AV_FIELD(L, logits), AV_FIELD(L, logits_stride), AV_FIELD(L, dtype), AV_FIELD(L, temperature),
      AV_FIELD(L, num_reqs), AV_FIELD(L, max_drafts), AV_FIELD(L, survival), AV_FIELD(L, out)});
  m.attr("MARGIN_PARAMS") = struct_layout<M>({
      AV_FIELD(M, logits), AV_FIELD(M, stride_r), AV_FIELD(M, stride_k), AV_FIELD(M, dtype), AV_FIELD(M, num_reqs),
      AV_FIELD(M, max_drafts), AV_FIELD(M, vocab), AV_FIELD(M, out), AV_FIELD(M, error_counts)});
  m.attr("STATS_PARAMS") = struct_layout<S>({
      AV_FIELD(S, conf), AV_FIELD(S, conf_stride), AV_FIELD(S, verify_lens), AV_FIELD(S, num_accepted),
      AV_FIELD(S, num_reqs), AV_FIELD(S, max_drafts), AV_FIELD(S, num_positions), AV_FIELD(S, num_bins),
      AV_FIELD(S, trials), AV_FIELD(S, survivals), AV_FIELD(S, conf_sum), AV_FIELD(S, error_counts),
      AV_FIELD(S, totals), AV_FIELD(S, row_position)});
}

}  // namespace bindings
}  // namespace adaptive_verify
