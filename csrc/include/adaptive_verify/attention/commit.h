// commit_tree_kv's rule, shared by the C++ CPU kernel and the CUDA kernel (commit.cuh): which accepted paths are
// moved and where each entry goes (docs/design.md, "Draft trees", KV commit).
//
// NOTES: the move of entry i reads KV index ctx + off_i and writes ctx + i. A valid path has offsets that
// increase from 1 (off_i >= i), so a write at ctx + i never lands on an entry a later i still has to read
// (off_j >= j > i): moving entries one after another in increasing i is correct without a copy, and the CUDA
// kernel gives each thread one column of the rows and walks i in order. Entries whose offset equals their depth
// stay (a chain's path, or a tree path down first children).
#pragma once

#include <cstdint>

#include "adaptive_verify/attention/params.h"

namespace adaptive_verify {
namespace attention {

// Slot of KV index `pos` of request r, or -1 when its block is outside the table or the cache.
AV_HD int64_t commit_slot(const CommitTreeKvParams& p, int32_t r, int64_t pos) {
  const int64_t blk = pos / p.block_size;
  if (pos < 0 || blk >= p.max_blocks) return -1;
  const int64_t id = p.block_table[int64_t(r) * p.block_table_stride + blk];
  if (id < 0 || id >= p.num_blocks) return -1;
  return id * p.block_size + pos % p.block_size;
}

// Whether request r's accepted path is a valid move: num_accepted[r] in [0, min(width - 1, kMaxQueryLen - 1)], a
// context length >= 0, offsets 1..n strictly increasing from >= 1 and below kMaxQueryLen (a request feeds at
// most 64 tokens), every source and destination slot inside the request's blocks and the cache.
AV_HD bool accepted_path_ok(const CommitTreeKvParams& p, int32_t r) {
  const int32_t n = p.num_accepted[r], ctx = p.context_lens[r];
  if (n < 0 || n > p.width - 1 || n > kMaxQueryLen - 1 || ctx < 0) return false;
  const int32_t* off = p.accepted_offsets + int64_t(r) * p.accepted_offsets_stride;
  int32_t prev = 0;
  for (int32_t i = 1; i <= n; ++i) {
    if (off[i] <= prev || off[i] >= kMaxQueryLen) return false;
    prev = off[i];
    if (commit_slot(p, r, int64_t(ctx) + off[i]) < 0 || commit_slot(p, r, int64_t(ctx) + i) < 0) return false;
  }
  return true;
}

}  // namespace attention
}  // namespace adaptive_verify
