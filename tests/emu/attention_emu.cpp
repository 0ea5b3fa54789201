// verify_attention's tensor-core (two launches and fused) and tiled CUDA kernels (kernel_mma.cuh,
// kernel_tiled.cuh) and their merge kernel (merge.cuh), run on the host by the fiber emulator
// (cuda_emu.h), behind a C entry point the tests load with ctypes (tests/test_attention_emu.py). Built by
// the tests with the host compiler; not part of the package.
#include "cuda_emu.h"

#include <algorithm>
#include <limits>

#include "adaptive_verify/attention/kernel_mma.cuh"
#include "adaptive_verify/attention/kernel_tiled.cuh"

namespace attn = adaptive_verify::attention;

namespace {

template <typename T, int D>
void run(const attn::AttentionParams& p, bool vec_loads) {
  const int32_t S = attn::attention_splits(p);
  // NaN-filled: the merge must read only cells the partials kernel wrote.
  std::vector<float> ws(size_t(attn::attention_workspace_floats(p)), std::numeric_limits<float>::quiet_NaN());
  float* ws_ml = ws.data();
  float* ws_acc = ws.data() + 2 * p.num_tokens * p.num_q_heads * S;
  const bool fused = p.kernel == attn::kAttentionMmaFused;
  int32_t after_fused = 0;  // as launch_attention_mma: requests the fused launch left to the merge kernel
  if (p.kernel == attn::kAttentionMma || fused) {  // as launch_attention_mma (kernel_mma.cuh)
    using Cfg = attn::MmaConfig<T, D>;
    const attn::MmaLaunchShape shape = attn::mma_launch_shape(p);
    if (p.num_reqs > 0 && shape.chunks > 0) {
      int32_t* counters = nullptr;
      if (fused) {  // the launcher's memset
        counters = reinterpret_cast<int32_t*>(ws_acc + p.num_tokens * p.num_q_heads * int64_t(S) * D);
        std::fill(counters, counters + int64_t(p.num_reqs) * p.num_kv_heads * shape.chunks, 0);
      }
      const av_emu::Dim3 grid{unsigned(S * shape.chunks), unsigned(p.num_kv_heads),
                              unsigned(p.num_reqs + (fused ? 1 : 0))};
      av_emu::launch(grid, av_emu::Dim3{unsigned(32 * shape.warps), 1, 1}, size_t(Cfg::smem_bytes(shape.warps)), [&] {
        attn::attention_partials_mma_kernel<T, D>(p, S, shape.chunks, vec_loads, ws_ml, ws_acc, counters);
      });
      if (fused && S <= attn::kFusedMergeMaxSplits) return;
      after_fused = fused ? attn::kFusedMergeMaxSplits : 0;
    }
  } else {  // as launch_attention_tiled (kernel_tiled.cuh)
    using Cfg = attn::TiledConfig<T, D>;
    const int32_t chunks = int32_t(attn::tiled_row_chunks<T, D>(p));
    if (p.num_reqs > 0 && chunks > 0) {
      const av_emu::Dim3 grid{unsigned(S * chunks), unsigned(p.num_kv_heads), unsigned(p.num_reqs)};
      av_emu::launch(grid, av_emu::Dim3{unsigned(Cfg::kThreads), 1, 1}, size_t(Cfg::kSmemBytes),
                     [&] { attn::attention_partials_tiled_kernel<T, D>(p, S, chunks, vec_loads, ws_ml, ws_acc); });
    }
  }
  const int64_t items = p.num_tokens * p.num_q_heads;
  if (items > 0) {
    const av_emu::Dim3 grid{unsigned((items + attn::kMergeWarps - 1) / attn::kMergeWarps), 1, 1};
    av_emu::launch(grid, av_emu::Dim3{unsigned(32 * attn::kMergeWarps), 1, 1}, 0,
                   [&] { attn::attention_merge_kernel<T, D>(p, S, ws_ml, ws_acc, after_fused); });
  }
}

}  // namespace

extern "C" {

// Same arguments as adaptive_verify._C.verify_attention (host pointers), plus: kernel (kAttentionMma,
// kAttentionMmaFused or kAttentionTiled), copy_mode (0: cp.async data lands at the wait, 1: at issue),
// plain_loads (1: the unaligned-cache path), cache_bytes (size of each cache, for the emulator's bounds
// check) and an error buffer. Returns 0, or 1 with the emulator's message.
int av_emu_verify_attention(int kernel, int copy_mode, int plain_loads, const void* q, int64_t q_stride_t,
                                int64_t q_stride_h, const void* k_cache, const void* v_cache, int64_t cache_bytes,
                                const int32_t* block_table, int64_t block_table_stride, int32_t max_blocks,
                                const int32_t* seq_lens, const int32_t* query_start_loc, int32_t dtype,
                                int32_t num_reqs, int64_t num_tokens, int32_t num_q_heads, int32_t num_kv_heads,
                                int32_t head_dim, int32_t block_size, int64_t num_blocks, int32_t max_query_len,
                                float scale, void* out, float* lse, int32_t* error_counts, char* err, int err_len) {
  attn::AttentionParams p;
  p.q = q;
  p.q_stride_t = q_stride_t;
  p.q_stride_h = q_stride_h;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_table = block_table;
  p.block_table_stride = block_table_stride;
  p.max_blocks = max_blocks;
  p.seq_lens = seq_lens;
  p.query_start_loc = query_start_loc;
  p.dtype = dtype;
  p.num_reqs = num_reqs;
  p.num_tokens = num_tokens;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.block_size = block_size;
  p.num_blocks = num_blocks;
  p.max_query_len = max_query_len;
  p.scale = scale;
  p.out = out;
  p.lse = lse;
  p.error_counts = error_counts;
  p.kernel = kernel;

  const auto* k_bytes = static_cast<const unsigned char*>(k_cache);
  const auto* v_bytes = static_cast<const unsigned char*>(v_cache);
  const bool vec_loads = plain_loads == 0;
  return av_emu::run_entry(copy_mode == 1 ? av_emu::kEarlyCopies : av_emu::kLateCopies,
                           {{k_bytes, k_bytes + cache_bytes}, {v_bytes, v_bytes + cache_bytes}}, err, err_len, [&] {
    if (kernel != attn::kAttentionMma && kernel != attn::kAttentionMmaFused && kernel != attn::kAttentionTiled)
      throw av_emu::Failure("unknown kernel");
    bool known = true;
    auto by_dim = [&](auto tag) {
      using T = decltype(tag);
      switch (head_dim) {
        case 64: run<T, 64>(p, vec_loads); break;
        case 128: run<T, 128>(p, vec_loads); break;
        case 256: run<T, 256>(p, vec_loads); break;
        default: known = false;
      }
    };
    if (dtype == adaptive_verify::kBFloat16) by_dim(adaptive_verify::bf16_t{});
    else if (dtype == adaptive_verify::kFloat16) by_dim(adaptive_verify::half_t{});
    else known = false;
    if (!known) throw av_emu::Failure("unsupported dtype or head dim");
  });
}

}  // extern "C"
