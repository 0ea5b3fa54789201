// C++ CPU kernels of the attention area. Each returns a Status.
#pragma once

#include "adaptive_verify/attention/params.h"

namespace adaptive_verify {
namespace attention {

// Checks the device-resident lengths and block ids (the CPU can read them for free); kOk or the first
// problem found. The CUDA path cannot check without a sync: it masks and counts instead.
int validate_attention_cpu(const AttentionParams& p);
int verify_attention_cpu(const AttentionParams& p);
int write_kv_cpu(const WriteKvParams& p);
int commit_tree_kv_cpu(const CommitTreeKvParams& p);

}  // namespace attention
}  // namespace adaptive_verify
