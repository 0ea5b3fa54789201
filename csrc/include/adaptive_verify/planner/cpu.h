// C++ CPU kernels of the planner. Each returns a Status (kOk or the first invalid input found).
#pragma once

#include "adaptive_verify/planner/params.h"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cpu(const SurvivalParams& p);
int plan_cpu(const Params& p);

}  // namespace planner
}  // namespace adaptive_verify
