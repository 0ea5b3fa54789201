// The verification plan in FlashInfer's paged-prefill form (flashinfer_plan in python/adaptive_verify/
// attention_metadata.py), built from the planner's per-step tensors on the device, with no host sync: every size is a
// host bound, every length is read where it lives. Shared by the CPU kernel (cpu side below) and the CUDA kernels
// (metadata.cuh).
//
// For request r with q_len = query_start_loc[r + 1] - query_start_loc[r] and kv_len = seq_lens[r]:
//   pages[r]           = ceil(kv_len / page_size) (0 for kv_len 0)
//   kv_indptr          = [0, pages[0], pages[0] + pages[1], ...]                      ([R + 1], exclusive prefix sum)
//   kv_indices         = block_table[r, 0 .. pages[r]) for each r, concatenated; entries past kv_indptr[R] are 0
//   kv_last_page_len[r]= kv_len - (pages[r] - 1) * page_size, in 1 .. page_size (0 for an empty request)
// With a draft-tree mask (tree_mask [T] int64, tree_mask.h), FlashInfer's custom mask: request r's [q_len, kv_len]
// boolean block row-major (query i may see key j: the context j < kv_len - q_len always, block offset k = j -
// context when k <= i and bit k of the token's mask is set), its q_len * kv_len bits packed little-endian (bit b in
// byte b / 8 at bit b % 8) and padded to whole bytes; mask_indptr the requests' byte offsets (exclusive prefix sum of
// ceil(q_len * kv_len / 8)), as flashinfer.segment_packbits(..., bitorder="little") lays them out.
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace attention {

struct FlashInferParams {
  const int32_t* query_start_loc = nullptr;  // [R + 1]
  const int32_t* seq_lens = nullptr;         // [R]
  const int32_t* block_table = nullptr;      // [R, max_blocks], row stride block_table_stride
  int64_t block_table_stride = 0;
  int32_t max_blocks = 0;
  const int64_t* tree_mask = nullptr;  // [T] or null (no custom mask: FlashInfer's causal mode)
  int32_t num_reqs = 0;
  int64_t num_tokens = 0;  // T
  int32_t page_size = 0;
  int32_t max_query_len = 0;  // host bound of q_len (0: none)
  int64_t mask_capacity = 0;  // bytes of packed_mask (a host bound)
  int32_t* kv_indptr = nullptr;         // [R + 1]
  int32_t* kv_indices = nullptr;        // [R * max_blocks]
  int32_t* kv_last_page_len = nullptr;  // [R]
  uint8_t* packed_mask = nullptr;       // [mask_capacity] or null
  int32_t* mask_indptr = nullptr;       // [R + 1] or null
  int32_t* error_counts = nullptr;
};

// A request's lengths as the metadata takes them: q_len and kv_len clamped to what the host bounds allow (the CUDA
// kernels count and clamp what the CPU kernel rejects: q_len outside [0, T], kv_len outside [q_len, max_blocks *
// page_size], q_len above max_query_len).
struct MetaLens {
  int64_t begin;
  int32_t q_len, kv_len, pages;
  bool valid;
};

AV_HD MetaLens meta_lens(const FlashInferParams& p, int32_t r) {
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  const int64_t kv = p.seq_lens[r];
  const int64_t cap = int64_t(p.max_blocks) * p.page_size;
  const bool valid = begin >= 0 && end >= begin && end <= p.num_tokens && kv >= end - begin && kv <= cap &&
                     (p.max_query_len <= 0 || end - begin <= p.max_query_len);
  MetaLens m{begin, 0, 0, 0, valid};
  if (!valid) return m;  // an empty request: no pages, no mask bits
  m.q_len = int32_t(end - begin);
  m.kv_len = int32_t(kv);
  m.pages = int32_t((kv + p.page_size - 1) / p.page_size);
  return m;
}

// Bytes of a request's packed mask.
AV_HD int64_t mask_bytes(const MetaLens& m) { return (int64_t(m.q_len) * m.kv_len + 7) / 8; }

// Byte `byte` of a request's packed mask: bits b = 8 byte .. 8 byte + 7 of its row-major [q_len, kv_len] block.
AV_HD uint8_t mask_byte(const FlashInferParams& p, const MetaLens& m, int64_t byte) {
  const int32_t context = m.kv_len - m.q_len;
  const int64_t total = int64_t(m.q_len) * m.kv_len;
  uint32_t out = 0;
  for (int bit = 0; bit < 8; ++bit) {
    const int64_t b = byte * 8 + bit;
    if (b >= total) break;
    const int32_t i = int32_t(b / m.kv_len), j = int32_t(b % m.kv_len);
    bool v = j < context;
    if (!v) {
      const int32_t k = j - context;
      v = k <= i && ((uint64_t(p.tree_mask[m.begin + i]) >> k) & 1u) != 0;
    }
    out |= uint32_t(v) << bit;
  }
  return uint8_t(out);
}

int flashinfer_plan_cpu(const FlashInferParams& p);

}  // namespace attention
}  // namespace adaptive_verify
