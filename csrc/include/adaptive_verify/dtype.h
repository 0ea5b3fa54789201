// Element types the kernels read (fp32, fp16, bf16), converted to float the same way on host and device.
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace adaptive_verify {

// Codes shared with the Python layer (python/adaptive_verify/_dtypes.py).
enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Storage types: 16-bit payloads, converted explicitly (exact: every fp16/bf16 value is a float).
struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

AV_HD float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

AV_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_float(sign | uint32_t(127 - 15 - e) << 23 | (man << 13));
  }
  return bits_float(sign | (exp + 127 - 15) << 23 | (man << 13));
#endif
}

AV_HD float to_float(float x) { return x; }
AV_HD float to_float(half_t x) { return half_to_float(x.bits); }
AV_HD float to_float(bf16_t x) { return bf16_to_float(x.bits); }

}  // namespace adaptive_verify
