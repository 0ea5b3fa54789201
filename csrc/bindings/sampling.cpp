// adaptive_verify._C's sampling ops: rejection_sample, sample and tree_rejection_sample
// (python/adaptive_verify/sampling.py).
#include <cmath>  // before sampling/tree.h: its math (sampling/math.h) takes floorf and INFINITY from here

#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/sampling/cpu.h"
#include "adaptive_verify/sampling/tree.h"
#include "bindings/common.h"

namespace adaptive_verify {
namespace bindings {

void register_sampling(py::module_& m) {
  using J = sampling::RejectionParams;
  using S = sampling::SampleParams;
  def_op<J>(m, "rejection_sample", sampling::rejection_sample_cpu, AV_CUDA_FN(sampling::rejection_sample_cuda));
  def_op<S>(m, "sample", sampling::sample_cpu, AV_CUDA_FN(sampling::sample_cuda));
  using TS = sampling::TreeSampleParams;
  def_op<TS>(m, "tree_rejection_sample", sampling::tree_rejection_sample_cpu,
             AV_CUDA_FN(sampling::tree_rejection_sample_cuda));
  // Bytes of workspace the split-vocabulary sampler needs: rejection_sample (slots = R * (K + 1), num_reqs = R,
  // zero-filled) or sample (slots = N, num_reqs = 0).
  m.def("sampler_splitv_workspace_bytes", [](int32_t dtype, int64_t V, int64_t slots, int64_t num_reqs) {
    return sampling::splitv_shape(dtype, V, slots, num_reqs).workspace_bytes;
  });
  py::dict kernels;
  kernels["v1"] = int(sampling::kSamplerV1);
  kernels["splitv"] = int(sampling::kSamplerSplitV);
  m.attr("SAMPLER_KERNELS") = kernels;
  m.attr("SAMPLER_MAX_TREE_TOKENS") = int(sampling::kMaxTreeTokens);
  m.attr("REJECTION_PARAMS") = struct_layout<J>({
      AV_FIELD(J, logits), AV_FIELD(J, logits_stride), AV_FIELD(J, dtype), AV_FIELD(J, num_tokens), AV_FIELD(J, vocab),
      AV_FIELD(J, query_start_loc), AV_FIELD(J, draft_tokens), AV_FIELD(J, draft_tokens_stride),
      AV_FIELD(J, draft_tokens_int64), AV_FIELD(J, draft_probs), AV_FIELD(J, draft_probs_stride_r),
      AV_FIELD(J, draft_probs_stride_k), AV_FIELD(J, temperature), AV_FIELD(J, seeds), AV_FIELD(J, offset),
      AV_FIELD(J, offset_ptr), AV_FIELD(J, num_reqs), AV_FIELD(J, max_drafts), AV_FIELD(J, top_k),
      AV_FIELD(J, top_p), AV_FIELD(J, min_p), AV_FIELD(J, output_tokens), AV_FIELD(J, num_emitted),
      AV_FIELD(J, logprobs), AV_FIELD(J, error_counts), AV_FIELD(J, kernel), AV_FIELD(J, workspace),
      AV_FIELD(J, workspace_bytes)});
  m.attr("SAMPLE_PARAMS") = struct_layout<S>({
      AV_FIELD(S, logits), AV_FIELD(S, logits_stride), AV_FIELD(S, dtype), AV_FIELD(S, vocab), AV_FIELD(S, num_rows),
      AV_FIELD(S, temperature), AV_FIELD(S, seeds), AV_FIELD(S, offset), AV_FIELD(S, offset_ptr), AV_FIELD(S, top_k),
      AV_FIELD(S, top_p), AV_FIELD(S, min_p), AV_FIELD(S, tokens), AV_FIELD(S, logprobs), AV_FIELD(S, error_counts),
      AV_FIELD(S, kernel), AV_FIELD(S, workspace), AV_FIELD(S, workspace_bytes)});
  m.attr("TREE_SAMPLE_PARAMS") = struct_layout<TS>({
      AV_FIELD(TS, logits), AV_FIELD(TS, logits_stride), AV_FIELD(TS, dtype), AV_FIELD(TS, num_tokens),
      AV_FIELD(TS, vocab), AV_FIELD(TS, query_start_loc), AV_FIELD(TS, token_parent), AV_FIELD(TS, input_ids),
      AV_FIELD(TS, input_ids_int64), AV_FIELD(TS, temperature), AV_FIELD(TS, seeds), AV_FIELD(TS, offset),
      AV_FIELD(TS, offset_ptr), AV_FIELD(TS, num_reqs), AV_FIELD(TS, max_query_len), AV_FIELD(TS, top_k),
      AV_FIELD(TS, top_p), AV_FIELD(TS, min_p), AV_FIELD(TS, output_tokens), AV_FIELD(TS, num_emitted),
      AV_FIELD(TS, accepted_offsets), AV_FIELD(TS, logprobs), AV_FIELD(TS, error_counts)});
}

}  // namespace bindings
}  // namespace adaptive_verify
