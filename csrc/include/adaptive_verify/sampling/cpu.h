// C++ CPU kernels of the sampler. Each returns a Status.
#pragma once

#include "adaptive_verify/sampling/params.h"

namespace adaptive_verify {
namespace sampling {

int rejection_sample_cpu(const RejectionParams& p);
int sample_cpu(const SampleParams& p);
int tree_rejection_sample_cpu(const TreeSampleParams& p);

}  // namespace sampling
}  // namespace adaptive_verify
