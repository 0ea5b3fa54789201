// C++ CPU kernel of flashinfer_plan (metadata.h): lengths are checked (the CPU reads them for free), then the prefix
// sums, the page list (block ids copied as they are: they are the engine's) and the packed mask are written in
// request order.
#include <cstring>

#include "adaptive_verify/attention/metadata.h"

namespace adaptive_verify {
namespace attention {

int flashinfer_plan_cpu(const FlashInferParams& p) {
  int64_t pages_total = 0, mask_total = 0;
  int64_t prev_end = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const MetaLens m = meta_lens(p, r);
    if (!m.valid || p.query_start_loc[r] < prev_end) {
      const int64_t q_len = int64_t(p.query_start_loc[r + 1]) - p.query_start_loc[r];
      if (p.seq_lens[r] > int64_t(p.max_blocks) * p.page_size) return kErrBlockTableTooShort;
      return q_len >= 0 && p.seq_lens[r] < q_len ? kErrSeqLens : kErrQueryLen;
    }
    prev_end = p.query_start_loc[r + 1];
    pages_total += m.pages;
    mask_total += mask_bytes(m);
  }
  // more mask bytes than the host bound (max_query_len x max_seq_len per request) allows: a q_len above its bound
  if (p.packed_mask != nullptr && mask_total > p.mask_capacity) return kErrQueryLen;
  int32_t pages = 0, bytes = 0;
  p.kv_indptr[0] = 0;
  if (p.mask_indptr != nullptr) p.mask_indptr[0] = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const MetaLens m = meta_lens(p, r);
    const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
    for (int32_t b = 0; b < m.pages; ++b) p.kv_indices[pages + b] = table[b];
    pages += m.pages;
    p.kv_indptr[r + 1] = pages;
    p.kv_last_page_len[r] = m.pages > 0 ? m.kv_len - (m.pages - 1) * p.page_size : 0;
    if (p.packed_mask != nullptr) {
      const int64_t n = mask_bytes(m);
      for (int64_t byte = 0; byte < n; ++byte) p.packed_mask[bytes + byte] = mask_byte(p, m, byte);
      bytes += int32_t(n);
      p.mask_indptr[r + 1] = bytes;
    }
  }
  const int64_t tail = int64_t(p.num_reqs) * p.max_blocks - pages_total;
  if (tail > 0) std::memset(p.kv_indices + pages_total, 0, size_t(tail) * sizeof(int32_t));
  return kOk;
}

}  // namespace attention
}  // namespace adaptive_verify
