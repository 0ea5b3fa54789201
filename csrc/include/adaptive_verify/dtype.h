// Element types the kernels read (fp32, fp16, bf16), converted to float the same way on host and device.
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
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

// fp16 -> fp32 with selects instead of a normalisation loop, so the CPU loops that call it vectorise.
AV_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t o = uint32_t(h & 0x7fffu) << 13;  // exponent and mantissa in float position
  const uint32_t exp = o & 0x0f800000u;
  o += 0x38000000u;                           // rebias the exponent: (127 - 15) << 23
  o += exp == 0x0f800000u ? 0x38000000u : 0u;  // inf / NaN: exponent all ones
  float f = bits_float(o);
  // subnormal (and zero): m * 2^-24 = (1 + m / 1024) * 2^-14 - 2^-14, exact by Sterbenz
  f = exp == 0 ? bits_float(o + 0x00800000u) - bits_float(0x38800000u) : f;
  return bits_float(float_bits(f) | sign);
#endif
}

// Calls fn(T{}) with the storage type of a DType code; false for an unknown code.
template <typename Fn>
inline bool dispatch_dtype(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case kFloat32: fn(float{}); return true;
    case kFloat16: fn(half_t{}); return true;
    case kBFloat16: fn(bf16_t{}); return true;
    default: return false;
  }
}


// float -> bf16 / fp16 with round-to-nearest-even (what torch's .to() does), NaN kept quiet.
AV_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

AV_HD uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= (127u + 16u) << 23) {  // >= 2^16 (or inf / NaN): inf, or a quiet NaN
    o = u > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {  // below 2^-14: subnormal half, rounded by one float addition
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    o = uint16_t(float_bits(bits_float(u) + bits_float(magic)) - magic);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (uint32_t(15 - 127) << 23) + 0xfffu + mant_odd;
    o = uint16_t(u >> 13);
  }
  return uint16_t(o | (sign >> 16));
}

AV_HD void from_float(float x, float* out) { *out = x; }
AV_HD void from_float(float x, half_t* out) { out->bits = float_to_half(x); }
AV_HD void from_float(float x, bf16_t* out) { out->bits = float_to_bf16(x); }

AV_HD float to_float(float x) { return x; }
AV_HD float to_float(half_t x) { return half_to_float(x.bits); }
AV_HD float to_float(bf16_t x) { return bf16_to_float(x.bits); }

}  // namespace adaptive_verify
