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

// Codes shared with the Python layer (python/adaptive_verify/attention.py). kFloat8E4M3 is a KV cache element
// type only (AttentionParams::kv_dtype): dispatch_dtype never yields it.
enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat8E4M3 = 3 };

// Storage types: 16-bit payloads, converted explicitly (exact: every fp16/bf16 value is a float).
struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
struct fp8e4m3_t {  // float8_e4m3fn, a KV cache element (below)
  uint8_t bits;
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

// float8_e4m3fn (OCP FP8 E4M3 without infinities, torch.float8_e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa
// bits; 0x7f / 0xff are NaN, the largest finite value is 448, subnormals are m * 2^-9. Decoding is exact in float
// (and in bf16 / fp16: 3 mantissa bits, exponents -9 .. 8), which is why the attention kernels can convert a cached
// fp8 row to q's dtype and apply the scale to the score or the output instead of to every element.
AV_HD float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 7u;
  if (exp == 0xfu && mant == 7u) return bits_float(sign | 0x7fc00000u);          // NaN
  if (exp == 0) return bits_float(float_bits(float(mant) * 0.001953125f) | sign);  // m * 2^-9, exact
  return bits_float(sign | ((exp + 120u) << 23) | (mant << 20));                   // rebias 7 -> 127
}

// float -> float8_e4m3fn, round to nearest even, saturating: |x| >= 448 (and +-inf) give +-448, NaN gives NaN
// (0x7f with x's sign), as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does; the same bits on host
// and device since it is integer arithmetic on the float's bits.
AV_HD uint8_t float_to_fp8_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);   // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (and inf): saturate
  if (a < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9, round to nearest even
    // |x| * 2^9 < 8, so its integer part and the rounding are exact in float: q in 0 .. 8 (8 is the smallest
    // normal's encoding, 0x08)
    const float scaled = bits_float(a) * 512.f;
    uint32_t q = uint32_t(scaled);
    const float frac = scaled - float(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return uint8_t(sign | q);
  }
  // normal: keep 3 of 23 mantissa bits, round to nearest even (a carry moves into the exponent correctly)
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const uint32_t e = (r >> 23) - 120u, m = (r >> 20) & 7u;
  const uint32_t code = (e << 3) | m;
  return uint8_t(sign | (code > 0x7eu ? 0x7eu : code));
}

AV_HD float to_float(float x) { return x; }
AV_HD float to_float(half_t x) { return half_to_float(x.bits); }
AV_HD float to_float(bf16_t x) { return bf16_to_float(x.bits); }
AV_HD float to_float(fp8e4m3_t x) { return fp8_e4m3_to_float(x.bits); }

}  // namespace adaptive_verify
