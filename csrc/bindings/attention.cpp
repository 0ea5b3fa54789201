// adaptive_verify._C's attention ops: verify_attention, write_kv and commit_tree_kv
// (python/adaptive_verify/attention.py).
#include <string>

#include "adaptive_verify/attention/can_implement.h"
#include "adaptive_verify/attention/cpu.h"
#include "adaptive_verify/attention/metadata.h"
#include "adaptive_verify/cuda_api.h"
#include "bindings/common.h"

namespace adaptive_verify {
namespace bindings {

namespace {

int verify_attention(uintptr_t params, bool on_cuda, uintptr_t stream) {
  const attention::AttentionParams& p = params_at<attention::AttentionParams>(params);
  // The kernels' own statement of what they support, before anything is read or launched.
  if (const char* why = attention::can_implement(p, on_cuda))
    throw py::value_error(std::string("adaptive_verify.verify_attention: ") + why);
  if (on_cuda && p.workspace == nullptr && p.num_tokens > 0)
    throw py::value_error("adaptive_verify.verify_attention: workspace is required on CUDA");
  return run_on<attention::AttentionParams>(params, on_cuda, stream, attention::verify_attention_cpu,
                                            AV_CUDA_FN(attention::verify_attention_cuda));
}

}  // namespace

void register_attention(py::module_& m) {
  using A = attention::AttentionParams;
  using W = attention::WriteKvParams;
  using C = attention::CommitTreeKvParams;
  m.def("verify_attention", &verify_attention);
  def_op<W>(m, "write_kv", attention::write_kv_cpu, AV_CUDA_FN(attention::write_kv_cuda));
  def_op<C>(m, "commit_tree_kv", attention::commit_tree_kv_cpu, AV_CUDA_FN(attention::commit_tree_kv_cuda));
  using F = attention::FlashInferParams;
  def_op<F>(m, "flashinfer_plan", attention::flashinfer_plan_cpu, AV_CUDA_FN(attention::flashinfer_plan_cuda));
  m.attr("FLASHINFER_PARAMS") = struct_layout<F>({
      AV_FIELD(F, query_start_loc), AV_FIELD(F, seq_lens), AV_FIELD(F, block_table), AV_FIELD(F, block_table_stride),
      AV_FIELD(F, max_blocks), AV_FIELD(F, tree_mask), AV_FIELD(F, num_reqs), AV_FIELD(F, num_tokens),
      AV_FIELD(F, page_size), AV_FIELD(F, max_query_len), AV_FIELD(F, mask_capacity), AV_FIELD(F, kv_indptr), AV_FIELD(F, kv_indices),
      AV_FIELD(F, kv_last_page_len), AV_FIELD(F, packed_mask), AV_FIELD(F, mask_indptr), AV_FIELD(F, error_counts)});
  // Floats of CUDA workspace a call needs, from the sizes already in its parameter struct.
  m.def("attention_workspace_floats",
        [](uintptr_t params) { return attention::attention_workspace_floats(params_at<A>(params)); });
  py::dict kernels;
  kernels["rowwise"] = int(attention::kAttentionRowwise);
  kernels["mma"] = int(attention::kAttentionMma);
  kernels["mma_fused"] = int(attention::kAttentionMmaFused);
  m.attr("ATTENTION_KERNELS") = kernels;
  m.attr("ATTENTION_SPLIT_TOKENS") = int(attention::kSplitTokens);
  m.attr("ATTENTION_MAX_QUERY_LEN") = int(attention::kMaxQueryLen);
  m.attr("MLA_VALUE_DIM") = int(attention::kMlaValueDim);
  m.attr("MLA_ROPE_DIM") = int(attention::kMlaRopeDim);
  m.attr("MLA_MAX_HEADS") = int(attention::kMlaMaxHeads);
  m.attr("ATTENTION_PARAMS") = struct_layout<A>({
      AV_FIELD(A, q), AV_FIELD(A, q_stride_t), AV_FIELD(A, q_stride_h), AV_FIELD(A, k_cache), AV_FIELD(A, v_cache),
      AV_FIELD(A, block_table), AV_FIELD(A, block_table_stride), AV_FIELD(A, max_blocks), AV_FIELD(A, seq_lens),
      AV_FIELD(A, query_start_loc), AV_FIELD(A, tree_mask), AV_FIELD(A, dtype), AV_FIELD(A, num_reqs),
      AV_FIELD(A, num_tokens), AV_FIELD(A, num_q_heads), AV_FIELD(A, num_kv_heads), AV_FIELD(A, head_dim),
      AV_FIELD(A, block_size), AV_FIELD(A, num_blocks), AV_FIELD(A, max_query_len), AV_FIELD(A, scale),
      AV_FIELD(A, out), AV_FIELD(A, lse), AV_FIELD(A, error_counts), AV_FIELD(A, kernel), AV_FIELD(A, workspace),
      AV_FIELD(A, kv_dtype), AV_FIELD(A, k_scale), AV_FIELD(A, v_scale), AV_FIELD(A, k_scales), AV_FIELD(A, v_scales),
      AV_FIELD(A, k_scale_stride), AV_FIELD(A, v_scale_stride), AV_FIELD(A, v_head_dim), AV_FIELD(A, sinks),
      AV_FIELD(A, window_left), AV_FIELD(A, softcap)});
  m.attr("WRITE_KV_PARAMS") = struct_layout<W>({
      AV_FIELD(W, k), AV_FIELD(W, v), AV_FIELD(W, k_stride_t), AV_FIELD(W, k_stride_h), AV_FIELD(W, v_stride_t),
      AV_FIELD(W, v_stride_h), AV_FIELD(W, k_cache), AV_FIELD(W, v_cache), AV_FIELD(W, slot_mapping),
      AV_FIELD(W, num_tokens), AV_FIELD(W, num_kv_heads), AV_FIELD(W, head_dim), AV_FIELD(W, block_size),
      AV_FIELD(W, num_blocks), AV_FIELD(W, elem_size), AV_FIELD(W, error_counts), AV_FIELD(W, cache_dtype),
      AV_FIELD(W, dtype), AV_FIELD(W, k_scale), AV_FIELD(W, v_scale), AV_FIELD(W, k_scales), AV_FIELD(W, v_scales),
      AV_FIELD(W, k_scale_stride), AV_FIELD(W, v_scale_stride), AV_FIELD(W, cache_row), AV_FIELD(W, cache_offset)});
  m.attr("COMMIT_TREE_KV_PARAMS") = struct_layout<C>({
      AV_FIELD(C, k_cache), AV_FIELD(C, v_cache), AV_FIELD(C, num_blocks), AV_FIELD(C, block_size),
      AV_FIELD(C, row_bytes), AV_FIELD(C, block_table), AV_FIELD(C, block_table_stride), AV_FIELD(C, max_blocks),
      AV_FIELD(C, context_lens), AV_FIELD(C, accepted_offsets), AV_FIELD(C, accepted_offsets_stride),
      AV_FIELD(C, width), AV_FIELD(C, num_accepted), AV_FIELD(C, num_reqs), AV_FIELD(C, error_counts)});
}

}  // namespace bindings
}  // namespace adaptive_verify
