// The only file that knows Python. Every function takes raw pointers (as integers), sizes and a
// stream, so the module never links libtorch: the Python layer validates tensors and passes
// tensor.data_ptr(). Device dispatch: `on_cuda` selects the CUDA launcher, else the C++ CPU kernel.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "adaptive_verify/attention/can_implement.h"
#include "adaptive_verify/attention/cpu.h"
#include "adaptive_verify/confidence/cpu.h"
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/sampling/cpu.h"
#include "adaptive_verify/planner/cpu.h"
#include "adaptive_verify/planner/packed.h"

namespace py = pybind11;
using namespace adaptive_verify;

#ifndef AV_CUDA_ARCHS
#define AV_CUDA_ARCHS ""
#endif
#ifndef AV_CUDA_COMPILER_VERSION
#define AV_CUDA_COMPILER_VERSION ""
#endif
#ifndef AV_CPU_ONLY_REASON
#define AV_CPU_ONLY_REASON ""
#endif

namespace {

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

constexpr int kNoCuda = -1;  // status when a CUDA call reaches a CPU-only build

py::dict build_info() {
  py::dict d;
#ifdef AV_WITH_CUDA
  d["with_cuda"] = true;
  d["cuda_archs"] = std::string(AV_CUDA_ARCHS);
  d["cuda_compiler_version"] = std::string(AV_CUDA_COMPILER_VERSION);
  d["cuda_runtime_version"] = cuda_runtime_version();
#else
  d["with_cuda"] = false;
  d["cuda_archs"] = std::string();
  d["cuda_compiler_version"] = std::string();
  d["cuda_runtime_version"] = 0;
#endif
  d["cpu_only_reason"] = std::string(AV_CPU_ONLY_REASON);
  d["compiler"] = std::string(__VERSION__);
  return d;
}

py::tuple device_count() {
#ifdef AV_WITH_CUDA
  int err = 0;
  const int n = cuda_device_count(&err);
  return py::make_tuple(n, err == 0 ? std::string() : std::string(cuda_error_string(err)));
#else
  return py::make_tuple(0, std::string("built without CUDA"));
#endif
}

std::string error_string(int status) {
#ifdef AV_WITH_CUDA
  return cuda_error_string(status);
#else
  return status == kNoCuda ? "adaptive_verify was built without CUDA" : "unknown error";
#endif
}

int prefix_survival(bool on_cuda, uintptr_t stream, uintptr_t conf, int64_t conf_stride, uintptr_t drafts,
                    int32_t R, int32_t K, uintptr_t survival, uintptr_t error_counts) {
  planner::SurvivalParams p;
  p.conf = ptr<const float>(conf);
  p.conf_stride = conf_stride;
  p.drafts = ptr<const int32_t>(drafts);
  p.num_reqs = R;
  p.max_drafts = K;
  p.survival = ptr<float>(survival);
  p.error_counts = ptr<int32_t>(error_counts);
  if (!on_cuda) return planner::prefix_survival_cpu(p);
#ifdef AV_WITH_CUDA
  return planner::prefix_survival_cuda(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  return kNoCuda;
#endif
}

// The planner's ~40 scalars arrive packed in one bytes object (planner/packed.h says why and in what order).
int plan(py::bytes packed) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(packed.ptr(), &data, &size) != 0 || size != planner::kPlanWords * 8)
    throw std::invalid_argument("adaptive_verify._C.plan: packed arguments have the wrong size");
  const planner::PackedPlan args = planner::unpack_plan(data);
  const planner::Params& p = args.params;
  const bool on_cuda = args.on_cuda;
  const uintptr_t stream = args.stream;
  if (!on_cuda) return planner::plan_cpu(p);
#ifdef AV_WITH_CUDA
  return planner::plan_cuda(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  return kNoCuda;
#endif
}

// ---- confidence area ----

template <typename P, typename Cpu, typename Cuda>
int run_on(bool on_cuda, uintptr_t stream, const P& p, Cpu cpu, Cuda cuda) {
  if (!on_cuda) return cpu(p);
#ifdef AV_WITH_CUDA
  return cuda(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  (void)cuda;
  return kNoCuda;
#endif
}

#ifdef AV_WITH_CUDA
#define AV_CUDA_FN(fn) fn
#else
#define AV_CUDA_FN(fn) nullptr
#endif

int confidence_op(bool on_cuda, uintptr_t stream, uintptr_t hidden, int64_t hidden_stride_r, int64_t hidden_stride_k,
                  uintptr_t markov, int64_t markov_stride_r, int64_t markov_stride_k, int32_t dtype, uintptr_t weight,
                  double bias, uintptr_t bias_ptr, uintptr_t temperature, int32_t R, int32_t K, int64_t H, int64_t Q,
                  bool survival, uintptr_t out) {
  confidence::ConfidenceParams p;
  p.hidden = ptr<const void>(hidden);
  p.hidden_stride_r = hidden_stride_r;
  p.hidden_stride_k = hidden_stride_k;
  p.markov = ptr<const void>(markov);
  p.markov_stride_r = markov_stride_r;
  p.markov_stride_k = markov_stride_k;
  p.dtype = dtype;
  p.weight = ptr<const float>(weight);
  p.bias = float(bias);
  p.bias_ptr = ptr<const float>(bias_ptr);
  p.temperature = ptr<const float>(temperature);
  p.num_reqs = R;
  p.max_drafts = K;
  p.hidden_size = H;
  p.markov_size = Q;
  p.survival = survival;
  p.out = ptr<float>(out);
  return run_on(on_cuda, stream, p, confidence::confidence_cpu, AV_CUDA_FN(confidence::confidence_cuda));
}

int confidence_from_logits_op(bool on_cuda, uintptr_t stream, uintptr_t logits, int64_t stride, int32_t dtype,
                              uintptr_t temperature, int32_t R, int32_t K, bool survival, uintptr_t out) {
  confidence::LogitParams p;
  p.logits = ptr<const void>(logits);
  p.logits_stride = stride;
  p.dtype = dtype;
  p.temperature = ptr<const float>(temperature);
  p.num_reqs = R;
  p.max_drafts = K;
  p.survival = survival;
  p.out = ptr<float>(out);
  return run_on(on_cuda, stream, p, confidence::confidence_from_logits_cpu,
                AV_CUDA_FN(confidence::confidence_from_logits_cuda));
}

int draft_margin_op(bool on_cuda, uintptr_t stream, uintptr_t logits, int64_t stride_r, int64_t stride_k,
                    int32_t dtype, int32_t R, int32_t K, int64_t V, uintptr_t out, uintptr_t error_counts) {
  confidence::MarginParams p;
  p.logits = ptr<const void>(logits);
  p.stride_r = stride_r;
  p.stride_k = stride_k;
  p.dtype = dtype;
  p.num_reqs = R;
  p.max_drafts = K;
  p.vocab = V;
  p.out = ptr<float>(out);
  p.error_counts = ptr<int32_t>(error_counts);
  return run_on(on_cuda, stream, p, confidence::draft_margin_cpu, AV_CUDA_FN(confidence::draft_margin_cuda));
}

int stats_update_op(bool on_cuda, uintptr_t stream, uintptr_t conf, int64_t conf_stride, uintptr_t verify_lens,
                    uintptr_t num_accepted, int32_t R, int32_t K, int32_t num_positions, int32_t num_bins,
                    uintptr_t trials, uintptr_t survivals, uintptr_t conf_sum, uintptr_t error_counts) {
  confidence::StatsParams p;
  p.conf = ptr<const float>(conf);
  p.conf_stride = conf_stride;
  p.verify_lens = ptr<const int32_t>(verify_lens);
  p.num_accepted = ptr<const int32_t>(num_accepted);
  p.num_reqs = R;
  p.max_drafts = K;
  p.num_positions = num_positions;
  p.num_bins = num_bins;
  p.trials = ptr<int64_t>(trials);
  p.survivals = ptr<int64_t>(survivals);
  p.conf_sum = ptr<int64_t>(conf_sum);
  p.error_counts = ptr<int32_t>(error_counts);
  return run_on(on_cuda, stream, p, confidence::stats_update_cpu, AV_CUDA_FN(confidence::stats_update_cuda));
}

// ---- sampling area ----

int rejection_sample_op(bool on_cuda, uintptr_t stream, uintptr_t logits, int64_t logits_stride, int32_t dtype,
                        int64_t T, int64_t V, uintptr_t qsl, uintptr_t draft_tokens, int64_t draft_tokens_stride,
                        bool draft_int64, uintptr_t draft_probs, int64_t probs_stride_r, int64_t probs_stride_k,
                        uintptr_t temperature, uintptr_t seeds, uint64_t offset, uintptr_t offset_ptr, int32_t R,
                        int32_t K, uintptr_t output_tokens, uintptr_t num_emitted, uintptr_t error_counts,
                        int32_t kernel, uintptr_t workspace, int64_t workspace_bytes) {
  sampling::RejectionParams p;
  p.logits = ptr<const void>(logits);
  p.logits_stride = logits_stride;
  p.dtype = dtype;
  p.num_tokens = T;
  p.vocab = V;
  p.query_start_loc = ptr<const int32_t>(qsl);
  p.draft_tokens = ptr<const void>(draft_tokens);
  p.draft_tokens_stride = draft_tokens_stride;
  p.draft_tokens_int64 = draft_int64;
  p.draft_probs = ptr<const float>(draft_probs);
  p.draft_probs_stride_r = probs_stride_r;
  p.draft_probs_stride_k = probs_stride_k;
  p.temperature = ptr<const float>(temperature);
  p.seeds = ptr<const int64_t>(seeds);
  p.offset = offset;
  p.offset_ptr = ptr<const int64_t>(offset_ptr);
  p.num_reqs = R;
  p.max_drafts = K;
  p.output_tokens = ptr<int32_t>(output_tokens);
  p.num_emitted = ptr<int32_t>(num_emitted);
  p.error_counts = ptr<int32_t>(error_counts);
  p.kernel = kernel;
  p.workspace = ptr<void>(workspace);
  p.workspace_bytes = workspace_bytes;
  return run_on(on_cuda, stream, p, sampling::rejection_sample_cpu, AV_CUDA_FN(sampling::rejection_sample_cuda));
}

int sample_op(bool on_cuda, uintptr_t stream, uintptr_t logits, int64_t logits_stride, int32_t dtype, int64_t V,
              int32_t N, uintptr_t temperature, uintptr_t seeds, uint64_t offset, uintptr_t offset_ptr,
              uintptr_t tokens, uintptr_t error_counts, int32_t kernel, uintptr_t workspace,
              int64_t workspace_bytes) {
  sampling::SampleParams p;
  p.logits = ptr<const void>(logits);
  p.logits_stride = logits_stride;
  p.dtype = dtype;
  p.vocab = V;
  p.num_rows = N;
  p.temperature = ptr<const float>(temperature);
  p.seeds = ptr<const int64_t>(seeds);
  p.offset = offset;
  p.offset_ptr = ptr<const int64_t>(offset_ptr);
  p.tokens = ptr<int32_t>(tokens);
  p.error_counts = ptr<int32_t>(error_counts);
  p.kernel = kernel;
  p.workspace = ptr<void>(workspace);
  p.workspace_bytes = workspace_bytes;
  return run_on(on_cuda, stream, p, sampling::sample_cpu, AV_CUDA_FN(sampling::sample_cuda));
}

// Bytes of workspace the split-vocabulary sampler needs: rejection_sample (slots = R * (K + 1), num_reqs = R,
// zero-filled) or sample (slots = N, num_reqs = 0).
int64_t sampler_splitv_workspace_bytes(int32_t dtype, int64_t V, int64_t slots, int64_t num_reqs) {
  return sampling::splitv_shape(dtype, V, slots, num_reqs).workspace_bytes;
}

// ---- attention area ----

// The sizes of a verify_attention call (no pointers yet).
attention::AttentionParams attention_sizes(int32_t R, int64_t T, int32_t Hq, int32_t Hkv, int32_t D,
                                           int32_t block_size, int32_t max_blocks, int32_t max_query_len,
                                           int32_t kernel) {
  attention::AttentionParams p;
  p.num_reqs = R;
  p.num_tokens = T;
  p.num_q_heads = Hq;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.block_size = block_size;
  p.max_blocks = max_blocks;
  p.max_query_len = max_query_len;
  p.kernel = kernel;  // CUDA implementation (ignored on CPU)
  return p;
}

// Floats of CUDA workspace verify_attention needs (attention::attention_workspace_floats).
int64_t attention_workspace_floats(int32_t R, int64_t T, int32_t Hq, int32_t Hkv, int32_t D, int32_t block_size,
                                   int32_t max_blocks, int32_t max_query_len, int32_t kernel) {
  return attention::attention_workspace_floats(
      attention_sizes(R, T, Hq, Hkv, D, block_size, max_blocks, max_query_len, kernel));
}

int verify_attention_op(bool on_cuda, uintptr_t stream, uintptr_t q, int64_t q_stride_t, int64_t q_stride_h,
                        uintptr_t k_cache, uintptr_t v_cache, uintptr_t block_table, int64_t block_table_stride,
                        int32_t max_blocks, uintptr_t seq_lens, uintptr_t qsl, int32_t dtype, int32_t R, int64_t T,
                        int32_t Hq, int32_t Hkv, int32_t D, int32_t block_size, int64_t num_blocks,
                        int32_t max_query_len, double scale, uintptr_t out, uintptr_t lse, uintptr_t error_counts,
                        uintptr_t workspace, int32_t kernel) {
  attention::AttentionParams p = attention_sizes(R, T, Hq, Hkv, D, block_size, max_blocks, max_query_len, kernel);
  p.q = ptr<const void>(q);
  p.q_stride_t = q_stride_t;
  p.q_stride_h = q_stride_h;
  p.k_cache = ptr<const void>(k_cache);
  p.v_cache = ptr<const void>(v_cache);
  p.block_table = ptr<const int32_t>(block_table);
  p.block_table_stride = block_table_stride;
  p.seq_lens = ptr<const int32_t>(seq_lens);
  p.query_start_loc = ptr<const int32_t>(qsl);
  p.dtype = dtype;
  p.num_blocks = num_blocks;
  p.scale = float(scale);
  p.out = ptr<void>(out);
  p.lse = ptr<float>(lse);
  p.error_counts = ptr<int32_t>(error_counts);
  if (const char* why = attention::can_implement(p, on_cuda))
    throw pybind11::value_error(std::string("adaptive_verify.verify_attention: ") + why);
  if (!on_cuda) return attention::verify_attention_cpu(p);
#ifdef AV_WITH_CUDA
  return attention::verify_attention_cuda(p, ptr<float>(workspace), reinterpret_cast<void*>(stream));
#else
  (void)stream;
  (void)workspace;
  return kNoCuda;
#endif
}

int write_kv_op(bool on_cuda, uintptr_t stream, uintptr_t k, uintptr_t v, int64_t k_stride_t, int64_t k_stride_h,
                int64_t v_stride_t, int64_t v_stride_h, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping,
                int64_t T, int32_t Hkv, int32_t D, int32_t block_size, int64_t num_blocks, int32_t elem_size,
                uintptr_t error_counts) {
  attention::WriteKvParams p;
  p.k = ptr<const void>(k);
  p.v = ptr<const void>(v);
  p.k_stride_t = k_stride_t;
  p.k_stride_h = k_stride_h;
  p.v_stride_t = v_stride_t;
  p.v_stride_h = v_stride_h;
  p.k_cache = ptr<void>(k_cache);
  p.v_cache = ptr<void>(v_cache);
  p.slot_mapping = ptr<const int64_t>(slot_mapping);
  p.num_tokens = T;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.block_size = block_size;
  p.num_blocks = num_blocks;
  p.elem_size = elem_size;
  p.error_counts = ptr<int32_t>(error_counts);
  return run_on(on_cuda, stream, p, attention::write_kv_cpu, AV_CUDA_FN(attention::write_kv_cuda));
}

int64_t plan_workspace_keys(int64_t R, int64_t K) {
#ifdef AV_WITH_CUDA
  return planner::cuda_workspace_keys(R, K);
#else
  (void)R;
  (void)K;
  return 0;
#endif
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "adaptive_verify kernels (torch-free; pointers in, status codes out)";
  m.def("build_info", &build_info);
  m.def("device_count", &device_count);
  m.def("error_string", &error_string);
  m.def("prefix_survival", &prefix_survival);
  m.def("plan", &plan);
  m.attr("PLAN_FIELDS") = planner::kPlanFields;
  m.def("plan_workspace_keys", &plan_workspace_keys);
  m.def("confidence", &confidence_op);
  m.def("confidence_from_logits", &confidence_from_logits_op);
  m.def("draft_margin", &draft_margin_op);
  m.def("stats_update", &stats_update_op);
  m.def("rejection_sample", &rejection_sample_op);
  m.def("sample", &sample_op);
  m.def("sampler_splitv_workspace_bytes", &sampler_splitv_workspace_bytes);
  m.attr("SAMPLER_KERNEL_V1") = int(sampling::kSamplerV1);
  m.attr("SAMPLER_KERNEL_SPLITV") = int(sampling::kSamplerSplitV);
  m.def("verify_attention", &verify_attention_op);
  m.def("write_kv", &write_kv_op);
  m.attr("ATTENTION_SPLIT_TOKENS") = int(attention::kSplitTokens);
  m.attr("ATTENTION_KERNEL_ROWWISE") = int(attention::kAttentionRowwise);
  m.attr("ATTENTION_KERNEL_TILED") = int(attention::kAttentionTiled);
  m.attr("ATTENTION_KERNEL_MMA") = int(attention::kAttentionMma);
  m.attr("ATTENTION_KERNEL_MMA_FUSED") = int(attention::kAttentionMmaFused);
  m.def("attention_workspace_floats", &attention_workspace_floats);
  m.attr("STATUS_QUERY_LEN") = int(kErrQueryLen);
  m.attr("STATUS_SEQ_LENS") = int(kErrSeqLens);
  m.attr("STATUS_BLOCK_ID_OUT_OF_RANGE") = int(kErrBlockIdOutOfRange);
  m.attr("STATUS_SLOT_OUT_OF_RANGE") = int(kErrSlotOutOfRange);
  m.attr("STATUS_OK") = int(kOk);
  m.attr("STATUS_DRAFTS_OUT_OF_RANGE") = int(kErrDraftsOutOfRange);
  m.attr("STATUS_BLOCK_TABLE_TOO_SHORT") = int(kErrBlockTableTooShort);
  m.attr("STATUS_BAD_ARGUMENT") = int(kErrBadArgument);
  m.attr("NUM_ERROR_COUNTERS") = int(kNumErrorCounters);
}
