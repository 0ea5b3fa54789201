// Runtime queries used by adaptive_verify.cuda_available() and build_info().
#include <cuda_runtime.h>

#include "adaptive_verify/cuda_api.h"

namespace adaptive_verify {

int cuda_device_count(int* error) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  *error = int(err);
  return err == cudaSuccess ? n : 0;
}

const char* cuda_error_string(int error) { return cudaGetErrorString(cudaError_t(error)); }

int cuda_runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

}  // namespace adaptive_verify
