// Whether verify_attention's kernels can run a problem, decided on the host from sizes alone (no device
// data): the bindings call it before any launch and raise its message as a ValueError naming the argument.
// The Python layer checks the same things first with its own messages; this is the kernels' own statement
// of what they support, so a caller that reaches _C directly cannot launch a grid that does not fit.
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {

// nullptr when supported, else a message that starts with the offending argument's name.
inline const char* can_implement(const AttentionParams& p, bool on_cuda) {
  if (p.dtype != kBFloat16 && p.dtype != kFloat16) return "q: dtype must be bfloat16 or float16";
  if (p.kv_dtype != p.dtype && p.kv_dtype != kFloat8E4M3)
    return "k_cache: dtype must be q's dtype or float8_e4m3fn";
  const bool mla = p.head_dim == kMlaHeadDim;
  if (mla) {  // verify_attention_mla: one latent row per token, read as K (576) and V (its first 512)
    if (value_dim(p) != kMlaValueDim) return "q: MLA's value dim must be 512";
    if (p.num_kv_heads != 1) return "kv_cache: MLA has one latent row per token (num_kv_heads 1)";
    if (p.num_q_heads < 1 || p.num_q_heads > kMlaMaxHeads) return "q: MLA takes 1 to 128 heads";
    if (p.v_cache != p.k_cache) return "kv_cache: MLA reads V from the latent rows K is read from";
  } else {
    if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return "q: head dim must be 64, 128 or 256";
    if (value_dim(p) != p.head_dim) return "v_cache: V's head dim must equal K's";
  }
  if (p.num_kv_heads < 1 || p.num_q_heads < 1 || p.num_q_heads % p.num_kv_heads != 0)
    return "q / k_cache: Hq must be a positive multiple of Hkv";
  const int32_t group = p.num_q_heads / p.num_kv_heads;
  if (!mla && group != 1 && group != 2 && group != 4 && group != 8 && group != 16)
    return "q / k_cache: Hq / Hkv must be 1, 2, 4, 8 or 16";
  if (p.block_size < 16 || p.block_size > 256 || (p.block_size & (p.block_size - 1)) != 0)
    return "k_cache: block_size must be 16, 32, 64, 128 or 256";
  if (p.max_query_len < 1 || p.max_query_len > kMaxQueryLen) return "max_query_len must be in [1, 64]";
  static_assert(kMaxQueryLen == 64, "keep the message in sync");
  if (p.num_reqs < 0 || p.num_tokens < 0 || p.max_blocks < 0 || p.num_blocks < 0)
    return "block_table / q: negative sizes";
  if (int64_t(p.max_blocks) * p.block_size > 0x7fffffff) return "block_table: positions exceed int32";
  if (p.kernel != kAttentionRowwise && p.kernel != kAttentionMma && p.kernel != kAttentionMmaFused)
    return "cuda_kernel: unknown CUDA implementation";
  if (on_cuda) {
    // Grid limits of the partials kernels: (splits x row chunks, Hkv, R); 16 rows per chunk is the
    // smallest any kernel uses, so this bound covers both.
    if (p.num_reqs > 65535) return "block_table: at most 65535 requests per call on CUDA";
    if (p.kernel == kAttentionMmaFused && p.num_reqs > 65534)  // one more grid slice for the padding
      return "block_table: at most 65534 requests per call with cuda_kernel=\"mma_fused\"";
    if (p.num_kv_heads > 65535) return "k_cache: at most 65535 KV heads on CUDA";
    const int64_t chunks = (int64_t(p.max_query_len) * group + 15) / 16;  // (MLA: 64 rows a chunk, fewer)
    if (attention_splits(p) * chunks > 0x7fffffff) return "block_table: too many KV splits for one grid";
  }
  return nullptr;
}

}  // namespace attention
}  // namespace adaptive_verify
