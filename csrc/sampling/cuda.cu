// Entry points of the sampler's CUDA kernels: v1 (kernel.cuh) or split-vocabulary (kernel_splitv.cuh), as the
// params' `kernel` says (launch_rejection_sample / launch_sample_rows, which the host emulator runs too); the tree
// sampler (kernel_tree.cuh, launch_tree_sample) on v1's block reductions.
#include "adaptive_verify/cuda_api.h"
#include "adaptive_verify/sampling/kernel_splitv.cuh"
#include "adaptive_verify/sampling/kernel_tree.cuh"

namespace adaptive_verify {
namespace sampling {

int rejection_sample_cuda(const RejectionParams& p, void* s) { return int(launch_rejection_sample(p, cudaStream_t(s))); }

int sample_cuda(const SampleParams& p, void* s) { return int(launch_sample_rows(p, cudaStream_t(s))); }

int tree_rejection_sample_cuda(const TreeSampleParams& p, void* s) { return int(launch_tree_sample(p, cudaStream_t(s))); }

}  // namespace sampling
}  // namespace adaptive_verify
