// The CUDA planner's launch shape from host-known sizes: threads, workspace layout and whether it fits
// shared memory. Host-only C++ (no CUDA headers), so the bindings size the global workspace with the very
// arithmetic the launcher uses.
#pragma once

#include <cstdint>

#include "adaptive_verify/planner/algorithm.h"

namespace adaptive_verify {
namespace planner {

struct KernelConfig {
  static constexpr int kMaxThreads = 1024;
  static constexpr int kMaxDepthThreads = 512;  // choose_draft_depth's kernel (kernel.cuh)
  static constexpr int kMinThreads = 128;
  static constexpr int kSlotsPerThread = 4;  // threads ~ slots / 4: enough parallelism for the walk and sort
  // Dynamic shared memory a plan may use before its workspace moves to global memory (within the 227 KiB a
  // Hopper or Blackwell block can opt into, leaving room for the reduction scratch).
  static constexpr int64_t kMaxSmemBytes = 200 * 1024;
  static_assert(kMaxThreads % 32 == 0 && kMinThreads % 32 == 0, "block reductions work per full warp");
};

AV_HD int plan_threads(int64_t n_slots, int64_t num_reqs) {
  int64_t want = n_slots / KernelConfig::kSlotsPerThread;
  if (want < num_reqs) want = num_reqs;
  want = (want + 31) / 32 * 32;
  if (want < KernelConfig::kMinThreads) want = KernelConfig::kMinThreads;
  if (want > KernelConfig::kMaxThreads) want = KernelConfig::kMaxThreads;
  return int(want);
}

// tree: a draft-tree plan (Params::parents set), whose workspace also holds depths and verified-node sets.
AV_HD WorkspaceLayout plan_layout(int64_t num_reqs, int64_t max_drafts, bool has_forced, bool tree) {
  const int64_t n_slots = num_reqs * max_drafts;
  return workspace_layout(n_slots, Buckets::make(n_slots, has_forced).num, int32_t(num_reqs),
                          plan_threads(n_slots, num_reqs), true, tree);
}

// Bytes of global workspace a plan needs: 0 when it fits shared memory.
inline int64_t plan_workspace_bytes(int64_t num_reqs, int64_t max_drafts, bool has_forced, bool tree) {
  const int64_t bytes = plan_layout(num_reqs, max_drafts, has_forced, tree).bytes;
  return bytes <= KernelConfig::kMaxSmemBytes ? 0 : bytes;
}

}  // namespace planner
}  // namespace adaptive_verify
