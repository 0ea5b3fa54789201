// verify_attention's and write_kv's CUDA kernels (the row-wise kernel_rowwise.cuh, the tensor-core kernel_mma.cuh in two launches
// and fused, and their merge kernels), launched by their real launcher (launch_verify_attention), run on the
// host by the fiber emulator (cuda_emu.h), behind a C entry point that takes the same parameter struct as
// adaptive_verify._C.verify_attention (tests/test_attention_emu.py). Built by the tests with the host compiler;
// not part of the package.
#include "cuda_emu.h"

#include <limits>
#include <vector>

#include "adaptive_verify/attention/kernel.cuh"
#include "adaptive_verify/attention/metadata.cuh"

namespace attn = adaptive_verify::attention;

extern "C" {

// params: the struct adaptive_verify._C.verify_attention takes (its kernel field chooses the kernel), for host
// tensors. copy_mode: 0 cp.async data lands at the wait, 1 at issue. plain_loads: 1 forces the unaligned-cache
// path (the caches are copied to a buffer offset by 2 bytes). cache_bytes: size of each cache, for the
// emulator's bounds check. The workspace is allocated here NaN-filled: the merge must read only what the
// partials wrote. Returns 0, or 1 with the emulator's message.
int av_emu_verify_attention(const attn::AttentionParams* params, int copy_mode, int plain_loads, int64_t cache_bytes,
                            char* err, int err_len) {
  attn::AttentionParams p = *params;
  std::vector<float> ws(size_t(attn::attention_workspace_floats(p)) + 4, std::numeric_limits<float>::quiet_NaN());
  p.workspace = ws.data();
  // The unaligned path: the caches moved 2 bytes off 16-byte alignment (rows stay 2-byte aligned).
  std::vector<unsigned char> shifted_k, shifted_v;
  if (plain_loads) {
    shifted_k.assign(size_t(cache_bytes) + 16, 0);
    shifted_v.assign(size_t(cache_bytes) + 16, 0);
    auto* k = shifted_k.data() + (16 - (reinterpret_cast<uintptr_t>(shifted_k.data()) & 15u)) % 16 + 2;
    auto* v = shifted_v.data() + (16 - (reinterpret_cast<uintptr_t>(shifted_v.data()) & 15u)) % 16 + 2;
    std::memcpy(k, p.k_cache, size_t(cache_bytes));
    std::memcpy(v, p.v_cache, size_t(cache_bytes));
    p.k_cache = k;
    p.v_cache = v;
  }
  const auto* k_bytes = static_cast<const unsigned char*>(p.k_cache);
  const auto* v_bytes = static_cast<const unsigned char*>(p.v_cache);
  return av_emu::run_entry(copy_mode == 1 ? av_emu::kEarlyCopies : av_emu::kLateCopies,
                           {{k_bytes, k_bytes + cache_bytes}, {v_bytes, v_bytes + cache_bytes}}, err, err_len, [&] {
    if (attn::launch_verify_attention(p, nullptr) != cudaSuccess) throw av_emu::Failure("launch returned an error");
  });
}

// write_kv's CUDA kernels (copy and fp8 quantisation) through launch_write_kv: params a WriteKvParams the Python layer
// filled for CPU tensors. Returns 0, or 1 with the emulator's message.
int av_emu_write_kv(const attn::WriteKvParams* params, char* err, int err_len) {
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (attn::launch_write_kv(*params, nullptr) != cudaSuccess) throw av_emu::Failure("launch_write_kv returned an error");
  });
}

// flashinfer_plan's CUDA kernels through launch_flashinfer_plan, for a FlashInferParams filled for CPU tensors.
int av_emu_flashinfer_plan(const attn::FlashInferParams* params, char* err, int err_len) {
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (attn::launch_flashinfer_plan(*params, nullptr) != cudaSuccess)
      throw av_emu::Failure("launch_flashinfer_plan returned an error");
  });
}

}  // extern "C"
