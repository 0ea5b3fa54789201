// The sampler's CUDA kernels (sampling/kernel.cuh "v1", sampling/kernel_splitv.cuh "splitv"), launched by their
// real launchers, run on the host by the fiber emulator (cuda_emu.h), behind C entry points that take the same
// parameter structs as adaptive_verify._C's rejection_sample / sample / tree_rejection_sample (tests/test_sampling_emu.py
// and tests/test_sampling_tree.py swap them
// in). The split-vocabulary workspace is allocated here, zero-filled, as the Python layer does on CUDA. Built by
// the tests with the host compiler; not part of the package.
#include "cuda_emu.h"

#include <vector>

#include "adaptive_verify/sampling/kernel_splitv.cuh"
#include "adaptive_verify/sampling/kernel_tree.cuh"

namespace sm = adaptive_verify::sampling;

namespace {

// The bytes of `rows` logits rows (the emulator's __ldg bounds check): the last row ends at its V-th element.
av_emu::Ranges logits_range(const void* logits, int64_t rows, int64_t stride, int64_t V, int32_t dtype) {
  if (rows <= 0 || V <= 0) return {};
  const int64_t elem = dtype == adaptive_verify::kFloat32 ? 4 : 2;
  const auto* begin = static_cast<const unsigned char*>(logits);
  return {{begin, begin + ((rows - 1) * stride + V) * elem}};
}

// 16-byte aligned, zero-filled storage for the split-vocabulary workspace.
template <typename Params>
void attach_workspace(Params& p, std::vector<uint4>& ws, int64_t slots, int64_t num_reqs) {
  if (p.kernel != sm::kSamplerSplitV) return;
  const sm::SplitVShape s = sm::splitv_shape(p.dtype, p.vocab, slots, num_reqs);
  ws.assign(size_t((s.workspace_bytes + 15) / 16) + 1, uint4{0, 0, 0, 0});
  p.workspace = ws.data();
  p.workspace_bytes = s.workspace_bytes;
}

}  // namespace

extern "C" {

// params: the struct adaptive_verify._C.rejection_sample takes. Returns 0, or 1 with the emulator's message.
int av_emu_rejection_sample(const sm::RejectionParams* params, char* err, int err_len) {
  sm::RejectionParams p = *params;
  std::vector<uint4> ws;
  attach_workspace(p, ws, int64_t(p.num_reqs) * (p.max_drafts + 1), p.num_reqs);
  return av_emu::run_entry(av_emu::kLateCopies, logits_range(p.logits, p.num_tokens, p.logits_stride, p.vocab, p.dtype),
                           err, err_len, [&] {
    if (sm::launch_rejection_sample(p, nullptr) != cudaSuccess) throw av_emu::Failure("launch returned an error");
  });
}

// params: the struct adaptive_verify._C.sample takes.
int av_emu_sample(const sm::SampleParams* params, char* err, int err_len) {
  sm::SampleParams p = *params;
  std::vector<uint4> ws;
  attach_workspace(p, ws, p.num_rows, 0);
  return av_emu::run_entry(av_emu::kLateCopies, logits_range(p.logits, p.num_rows, p.logits_stride, p.vocab, p.dtype),
                           err, err_len, [&] {
    if (sm::launch_sample_rows(p, nullptr) != cudaSuccess) throw av_emu::Failure("launch returned an error");
  });
}

// params: the struct adaptive_verify._C.tree_rejection_sample takes.
int av_emu_tree_rejection_sample(const sm::TreeSampleParams* params, char* err, int err_len) {
  const sm::TreeSampleParams p = *params;
  return av_emu::run_entry(av_emu::kLateCopies, logits_range(p.logits, p.num_tokens, p.logits_stride, p.vocab, p.dtype),
                           err, err_len, [&] {
    if (sm::launch_tree_sample(p, nullptr) != cudaSuccess) throw av_emu::Failure("launch returned an error");
  });
}

}  // extern "C"
