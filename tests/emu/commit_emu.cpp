// commit_tree_kv's CUDA kernel (attention/commit.cuh), launched by its real launcher (launch_commit_tree_kv), run on
// the host by the fiber emulator (cuda_emu.h), behind a C entry point that takes the same parameter struct as
// adaptive_verify._C.commit_tree_kv (tests/test_commit_tree_kv.py swaps it in). Built by the tests with the host
// compiler; not part of the package.
#include "cuda_emu.h"

#include "adaptive_verify/attention/commit.cuh"

namespace attn = adaptive_verify::attention;

extern "C" {

// params: a CommitTreeKvParams filled by the Python layer for CPU tensors. Returns 0, or 1 with the emulator's
// message in err (a launch that returns an error is a failure too).
int av_emu_commit_tree_kv(const attn::CommitTreeKvParams* params, char* err, int err_len) {
  return av_emu::run_entry(av_emu::kLateCopies, {}, err, err_len, [&] {
    if (attn::launch_commit_tree_kv(*params, nullptr) != cudaSuccess)
      throw av_emu::Failure("launch_commit_tree_kv returned an error");
  });
}

}  // extern "C"
