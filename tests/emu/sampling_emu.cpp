// The sampler's CUDA kernels (sampling/kernel.cuh "v1", sampling/kernel_splitv.cuh "v2") run on the host by
// the fiber emulator (cuda_emu.h), behind C entry points with the arguments of adaptive_verify._C's
// rejection_sample / sample after (on_cuda, stream) (tests/test_sampling_emu.py swaps them in). The
// split-vocabulary workspace is allocated here, zero-filled, as the Python layer does on CUDA. Built by the
// tests with the host compiler; not part of the package.
#include "cuda_emu.h"

#include <vector>

#include "adaptive_verify/sampling/kernel_splitv.cuh"

namespace sm = adaptive_verify::sampling;

namespace {

constexpr unsigned kThreads = sm::SamplerConfig::kThreads;

// 16-byte aligned, zero-filled storage for the split-vocabulary workspace.
// The bytes of `rows` logits rows (the emulator's __ldg bounds check): the last row ends at its V-th element.
av_emu::Ranges logits_range(uintptr_t logits, int64_t rows, int64_t stride, int64_t V, int32_t dtype) {
  if (rows <= 0 || V <= 0) return {};
  const int64_t elem = dtype == adaptive_verify::kFloat32 ? 4 : 2;
  const auto* begin = reinterpret_cast<const unsigned char*>(logits);
  return {{begin, begin + ((rows - 1) * stride + V) * elem}};
}

struct Workspace {
  std::vector<uint4> words;
  void* data() { return words.empty() ? nullptr : words.data(); }
};

template <typename Params>
void attach_workspace(Params& p, Workspace& ws, int64_t slots, int64_t num_reqs) {
  if (p.kernel != sm::kSamplerSplitV) return;
  const sm::SplitVShape s = sm::splitv_shape(p.dtype, p.vocab, slots, num_reqs);
  ws.words.assign(size_t((s.workspace_bytes + 15) / 16) + 1, uint4{0, 0, 0, 0});
  p.workspace = ws.data();
  p.workspace_bytes = s.workspace_bytes;
  if (!sm::splitv_can_implement(p.workspace, p.workspace_bytes, s, slots))
    throw av_emu::Failure("split-vocabulary sampler: cannot implement this problem");
}

}  // namespace

extern "C" {

// As rejection_sample_op (csrc/bindings.cpp) without on_cuda, stream and the workspace; plus an error buffer.
int av_emu_rejection_sample(uintptr_t logits, int64_t logits_stride, int32_t dtype, int64_t T, int64_t V,
                            uintptr_t qsl, uintptr_t draft_tokens, int64_t draft_tokens_stride, bool draft_int64,
                            uintptr_t draft_probs, int64_t probs_stride_r, int64_t probs_stride_k,
                            uintptr_t temperature, uintptr_t seeds, uint64_t offset, uintptr_t offset_ptr, int32_t R,
                            int32_t K, uintptr_t output_tokens, uintptr_t num_emitted, uintptr_t error_counts,
                            int32_t kernel, char* err, int err_len) {
  sm::RejectionParams p;
  p.logits = reinterpret_cast<const void*>(logits);
  p.logits_stride = logits_stride;
  p.dtype = dtype;
  p.num_tokens = T;
  p.vocab = V;
  p.query_start_loc = reinterpret_cast<const int32_t*>(qsl);
  p.draft_tokens = reinterpret_cast<const void*>(draft_tokens);
  p.draft_tokens_stride = draft_tokens_stride;
  p.draft_tokens_int64 = draft_int64;
  p.draft_probs = reinterpret_cast<const float*>(draft_probs);
  p.draft_probs_stride_r = probs_stride_r;
  p.draft_probs_stride_k = probs_stride_k;
  p.temperature = reinterpret_cast<const float*>(temperature);
  p.seeds = reinterpret_cast<const int64_t*>(seeds);
  p.offset = offset;
  p.offset_ptr = reinterpret_cast<const int64_t*>(offset_ptr);
  p.num_reqs = R;
  p.max_drafts = K;
  p.output_tokens = reinterpret_cast<int32_t*>(output_tokens);
  p.num_emitted = reinterpret_cast<int32_t*>(num_emitted);
  p.error_counts = reinterpret_cast<int32_t*>(error_counts);
  p.kernel = kernel;
  Workspace ws;
  return av_emu::run_entry(av_emu::kLateCopies, logits_range(logits, T, logits_stride, V, dtype), err, err_len, [&] {
    if (p.num_reqs == 0) return;
    const int64_t slots = int64_t(R) * (K + 1);
    attach_workspace(p, ws, slots, R);
    const bool known = adaptive_verify::dispatch_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (p.kernel == sm::kSamplerV1) {  // as launch_rejection
        av_emu::launch(av_emu::Dim3{unsigned(R), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::rejection_kernel<T>(p); });
      } else if (p.kernel == sm::kSamplerSplitV) {  // as launch_rejection_splitv
        const sm::SplitVShape s = sm::splitv_shape(p.dtype, p.vocab, slots, R);
        av_emu::launch(av_emu::Dim3{unsigned(slots * s.num_chunks), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::splitv_partial_kernel<T>(p, slots, int32_t(s.num_chunks), s.tiles_per_chunk); });
        av_emu::launch(av_emu::Dim3{unsigned(R), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::splitv_rejection_merge_kernel<T>(p, int32_t(s.num_chunks)); });
      } else {
        throw av_emu::Failure("unknown sampler kernel");
      }
    });
    if (!known) throw av_emu::Failure("unknown dtype");
  });
}

// As sample_op (csrc/bindings.cpp) without on_cuda, stream and the workspace; plus an error buffer.
int av_emu_sample(uintptr_t logits, int64_t logits_stride, int32_t dtype, int64_t V, int32_t N,
                  uintptr_t temperature, uintptr_t seeds, uint64_t offset, uintptr_t offset_ptr, uintptr_t tokens,
                  uintptr_t error_counts, int32_t kernel, char* err, int err_len) {
  sm::SampleParams p;
  p.logits = reinterpret_cast<const void*>(logits);
  p.logits_stride = logits_stride;
  p.dtype = dtype;
  p.vocab = V;
  p.num_rows = N;
  p.temperature = reinterpret_cast<const float*>(temperature);
  p.seeds = reinterpret_cast<const int64_t*>(seeds);
  p.offset = offset;
  p.offset_ptr = reinterpret_cast<const int64_t*>(offset_ptr);
  p.tokens = reinterpret_cast<int32_t*>(tokens);
  p.error_counts = reinterpret_cast<int32_t*>(error_counts);
  p.kernel = kernel;
  Workspace ws;
  return av_emu::run_entry(av_emu::kLateCopies, logits_range(logits, N, logits_stride, V, dtype), err, err_len, [&] {
    if (p.num_rows == 0) return;
    attach_workspace(p, ws, N, 0);
    const bool known = adaptive_verify::dispatch_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (p.kernel == sm::kSamplerV1) {  // as launch_sample
        av_emu::launch(av_emu::Dim3{unsigned(N), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::sample_kernel<T>(p); });
      } else if (p.kernel == sm::kSamplerSplitV) {  // as launch_sample_splitv
        const sm::SplitVShape s = sm::splitv_shape(p.dtype, p.vocab, N, 0);
        const int32_t chunks = int32_t(s.num_chunks);
        av_emu::launch(av_emu::Dim3{unsigned(int64_t(N) * chunks), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::splitv_partial_kernel<T>(p, int64_t(N), chunks, s.tiles_per_chunk); });
        av_emu::launch(av_emu::Dim3{unsigned(N), 1, 1}, av_emu::Dim3{kThreads, 1, 1}, 0,
                       [&] { sm::splitv_sample_merge_kernel<T>(p, int32_t(s.num_chunks)); });
      } else {
        throw av_emu::Failure("unknown sampler kernel");
      }
    });
    if (!known) throw av_emu::Failure("unknown dtype");
  });
}

}  // extern "C"
