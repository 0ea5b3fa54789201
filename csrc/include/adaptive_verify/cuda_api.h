// Host-compiler view of the CUDA launchers: plain C++ signatures (no CUDA headers), so csrc/bindings/
// builds the same way with or without nvcc. Each returns a cudaError_t as int (0 = success).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/metadata.h"
#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/confidence/params.h"
#include "adaptive_verify/planner/params.h"
#include "adaptive_verify/sampling/params.h"

namespace adaptive_verify {

int cuda_device_count(int* error);  // number of usable devices; *error = cudaError_t of the query
const char* cuda_error_string(int error);
int cuda_runtime_version();

namespace planner {
int prefix_survival_cuda(const SurvivalParams& p, void* stream);
int plan_cuda(const Params& p, void* stream);
}  // namespace planner

namespace confidence {
int confidence_cuda(const ConfidenceParams& p, void* stream);
int confidence_from_logits_cuda(const LogitParams& p, void* stream);
int draft_margin_cuda(const MarginParams& p, void* stream);
int stats_update_cuda(const StatsParams& p, void* stream);
}  // namespace confidence

namespace attention {
int write_kv_cuda(const WriteKvParams& p, void* stream);
int commit_tree_kv_cuda(const CommitTreeKvParams& p, void* stream);
int verify_attention_cuda(const AttentionParams& p, void* stream);
int flashinfer_plan_cuda(const FlashInferParams& p, void* stream);
}  // namespace attention

namespace sampling {
int rejection_sample_cuda(const RejectionParams& p, void* stream);
int sample_cuda(const SampleParams& p, void* stream);
int tree_rejection_sample_cuda(const TreeSampleParams& p, void* stream);
}  // namespace sampling

}  // namespace adaptive_verify
