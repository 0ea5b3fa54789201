// Randomness and transcendental arithmetic of the rejection sampler, bit-identical on CPU and GPU.
//
// NOTES: lossless sampling needs exp/log, and libm's expf/logf differ from CUDA's in the last bits, which
// would let the CPU and the GPU emit different tokens from the same seed. So the sampler uses its own
// av_exp/av_log built from + - * / only, each rounded to float explicitly (the __f*_rn intrinsics on the
// device, and -ffp-contract=off on the host so no multiply-add is fused). The torch reference
// (python/adaptive_verify/reference/sampling.py) repeats the same operations in the same order.
//
// Algorithm (per request r, drafts j < L[r] judged by rows qsl[r] + j, T = temperature[r]):
//   greedy (T == 0): accept draft x iff x == argmax(row) (ties: smallest id); else emit the argmax, stop.
//   one-hot drafts (no draft_probs): y = race(row, j) samples softmax(row / T); accept iff y == x, else
//     emit y and stop. (P(accept) = p(x) and y | y != x ~ normalise(max(p - onehot(x), 0)): exactly the
//     design's rule, realised by one race over the row.)
//   draft_probs q: S = sum_v av_exp(z_v - m) in the canonical order (z_v = row[v] / T, m = max z),
//     p_v = av_exp(z_v - m) / S; accept iff u * q(x) < p(x) (q(x) == 0 or x outside [0, V): reject);
//     on rejection emit argmax_v w_v / E_v with w_v = max(p_v - q_v, 0) (all zero: w = p), E_v = -av_log(u_v).
//   all L drafts accepted: bonus = argmax (greedy) or race(row L, L).
//   race(row, j) = argmax_v z_v - av_log(E_v), E_v = -av_log(u_v) (Gumbel-max), ties: smallest id.
//   NaN logits never win and are counted (once per row pass that takes the row's max, i.e. once per row
//   read for a decision); ids outside [0, V) are never used as an index.
// Random numbers: Philox4x32-10 keyed by the request's seed, counter (index, j << 8 | stream, offset):
//   stream 0: the acceptance uniform (index 0); stream 1: race uniforms, index v >> 2, word v & 3;
//   stream 2: adaptive_verify.sample() (rows without drafts). The request's index in the batch is not part
//   of the key, so a request's tokens do not depend on the rest of the batch.
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace sampling {

// ---- Philox4x32-10 (Salmon et al., SC'11) ----
struct U32x4 {
  uint32_t x[4];
};

AV_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  return uint32_t(p);
}

AV_HD U32x4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

enum Stream : uint32_t { kAccept = 0, kRace = 1, kSample = 2 };

// 23 random bits k to a float in (0, 1): (k + 0.5) * 2^-23, exact (k + 0.5 < 2^23 fits a float's 24-bit
// significand; 24 bits would round k = 2^24 - 1 up to exactly 1.0). u lies in [2^-24, 1 - 2^-24].
AV_HD float to_uniform(uint32_t bits) { return (float(bits >> 9) + 0.5f) * 1.1920928955078125e-07f; }

struct Rng {
  uint64_t seed;
  uint64_t offset;
  // Uniform number `index` of (position j, stream): word index & 3 of block index >> 2.
  AV_HD float uniform(int32_t j, uint32_t stream, uint64_t index) const {
    const U32x4 r = philox(uint32_t(index >> 2), (uint32_t(j) << 8) | stream, uint32_t(offset), uint32_t(offset >> 32),
                           uint32_t(seed), uint32_t(seed >> 32));
    return to_uniform(r.x[index & 3]);
  }
};

// One Philox call yields the race uniforms of 4 consecutive ids: keep the last block and reuse it.
struct RaceUniforms {
  const Rng& rng;
  int32_t j;
  uint32_t stream;
  uint64_t block = ~uint64_t(0);
  U32x4 words{};
  AV_HD float at(uint64_t v) {
    if ((v >> 2) != block) {
      block = v >> 2;
      words = philox(uint32_t(block), (uint32_t(j) << 8) | stream, uint32_t(rng.offset), uint32_t(rng.offset >> 32),
                     uint32_t(rng.seed), uint32_t(rng.seed >> 32));
    }
    return to_uniform(words.x[v & 3]);
  }
};

// ---- explicitly rounded float operations ----
#if defined(__CUDA_ARCH__)
AV_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
AV_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
AV_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
AV_HD float fdiv(float a, float b) { return __fdiv_rn(a, b); }
#else
AV_HD float fadd(float a, float b) { return a + b; }
AV_HD float fsub(float a, float b) { return a - b; }
AV_HD float fmul(float a, float b) { return a * b; }
AV_HD float fdiv(float a, float b) { return a / b; }
#endif

// Natural log of a positive normal float: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1), by its odd series to s^9 (|s| < 0.172: error < 1e-9).
AV_HD float av_log(float x) {
  const uint32_t bits = float_bits(x);
  int32_t e = int32_t((bits >> 23) & 0xffu) - 127;
  float m = bits_float((bits & 0x007fffffu) | 0x3f800000u);
  if (m > 1.41421356f) {
    m = fmul(m, 0.5f);
    e += 1;
  }
  const float s = fdiv(fsub(m, 1.f), fadd(m, 1.f));
  const float s2 = fmul(s, s);
  float poly = 0.11111111f;                    // 1/9
  poly = fadd(fmul(poly, s2), 0.14285715f);    // 1/7
  poly = fadd(fmul(poly, s2), 0.2f);           // 1/5
  poly = fadd(fmul(poly, s2), 0.33333334f);    // 1/3
  const float t = fadd(s, fmul(fmul(s, s2), poly));  // atanh(s)
  const float log_m = fadd(t, t);
  const float ef = float(e);
  return fadd(fmul(ef, 0.693145751953125f), fadd(fmul(ef, 1.42860677e-06f), log_m));  // ln2 = hi + lo
}

// e^x for x <= 0 (what softmax needs after subtracting the max): x = k ln2 + r, |r| <= ln2 / 2,
// e^r by its Taylor series to r^7, times 2^k built from bits. Below -103 the result is 0 (< 2^-149).
AV_HD float av_exp(float x) {
  if (!(x > -103.f)) return 0.f;  // also NaN -> 0
  const float kf = floorf(fadd(fmul(x, 1.44269504f), 0.5f));
  const float r = fsub(fsub(x, fmul(kf, 0.693145751953125f)), fmul(kf, 1.42860677e-06f));
  float p = 1.98412698e-04f;              // 1/5040
  p = fadd(fmul(p, r), 1.38888889e-03f);  // 1/720
  p = fadd(fmul(p, r), 8.33333377e-03f);  // 1/120
  p = fadd(fmul(p, r), 4.16666679e-02f);  // 1/24
  p = fadd(fmul(p, r), 0.166666672f);     // 1/6
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.f);
  p = fadd(fmul(p, r), 1.f);
  int32_t k = int32_t(kf);
  if (k > 0) k = 0;  // x <= 0 up to rounding of kf
  if (k >= -126) return fmul(p, bits_float(uint32_t(k + 127) << 23));
  return fmul(fmul(p, bits_float(uint32_t(k + 127 + 64) << 23)), bits_float(0x1f800000u));  // * 2^-64: subnormal
}

// Canonical summation of softmax terms: kLanes partial sums, lane l adding v = l, l + kLanes, ... in order,
// then a pairwise tree (l += l + s for s = kLanes/2 .. 1). The CUDA kernel's 256 threads do exactly this.
constexpr int kLanes = 256;

}  // namespace sampling
}  // namespace adaptive_verify
