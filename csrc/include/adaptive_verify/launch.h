// Kernel launches that the host emulator can run: every launcher calls launch_kernel() instead of writing
// kernel<<<grid, block, smem, stream>>>(args), so under tests/emu (AV_CUDA_EMULATION) the same launcher
// code, with its grid arithmetic, memsets and choice of kernels, runs the kernel's blocks on fibers and the
// CPU suite tests the real launch logic, not a copy of it.
#pragma once

#if !defined(AV_CUDA_EMULATION)
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>
#include <utility>

#include "adaptive_verify/dtype.h"

namespace adaptive_verify {

template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                 cudaStream_t stream, Args&&... args) {
#if defined(AV_CUDA_EMULATION)
  (void)stream;
  ::av_emu::launch(grid, block, smem_bytes, [&] { kernel(args...); });
  return cudaSuccess;
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#endif
}

// Opts `kernel` in to `bytes` of dynamic shared memory once per device (a function attribute, not a stream
// operation, so it is safe during CUDA-graph capture after the first call).
template <typename Kernel>
inline cudaError_t opt_in_smem(Kernel kernel, int bytes, bool (&done)[64]) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 64 && done[device]) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && device < 64) done[device] = true;
  return err;
}

// Launches through fn(T{}) (which returns its launches' cudaError_t) for the storage type of `dtype`.
template <typename Fn>
inline cudaError_t launch_for_dtype(int32_t dtype, Fn&& fn) {
  cudaError_t err = cudaSuccess;
  if (!dispatch_dtype(dtype, [&](auto tag) { err = fn(tag); })) return cudaErrorInvalidValue;
  return err;
}

}  // namespace adaptive_verify
