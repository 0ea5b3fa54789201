// C++ CPU kernels of the confidence area. Each returns a Status.
#pragma once

#include "adaptive_verify/confidence/params.h"

namespace adaptive_verify {
namespace confidence {

int confidence_cpu(const ConfidenceParams& p);
int confidence_from_logits_cpu(const LogitParams& p);
int draft_margin_cpu(const MarginParams& p);
int stats_update_cpu(const StatsParams& p);

}  // namespace confidence
}  // namespace adaptive_verify
