// C++ CPU planner: the same decisions as the CUDA kernel (keys -> canonical order -> budget -> allocation
// -> metadata), computed without sorting every candidate. Integer results equal the CUDA kernel's and the
// torch reference's.
//
// NOTES: where the time goes, and why the phases look the way they do (R=256, K=8: 2048 candidates in
// ~3.5 us on a Zen 4 core; a comparison sort of them alone costs ~25 us):
//  - walk: one vector pass over the survivals writes each slot's 32-bit ranking word (sanitised running
//    minimum, exactly walk_row's), its bucket and survival * 2^32; AVX2 (checked at run time) or SSE2 for
//    K % 4 == 0, scalar otherwise. Then a scalar histogram adds a count and the exact fixed-point survival
//    per bucket (the one loop that cannot be vectorised; two copies halve its store-to-load waits). Bucket
//    boundaries thus give exact ranks and exact P(b) without ordering anything.
//  - Only buckets whose ranks the budget search or the allocation actually has to see are ordered
//    ("materialised"): gathered by a vector scan of the ranking words and sorted by the full 64-bit
//    candidate key (math.h), so ties break exactly as the canonical order says.
//  - Global mode (argmax of Theta) prunes groups of buckets, then buckets, with an upper bound of Theta that
//    needs no division: for a non-decreasing positive cost, Theta(b) <= (base + P(end)) / cost(start), and a
//    range whose bound is below a Theta value actually attained cannot hold the first argmax. The exact
//    Theta (one double division, as math.h's ThetaEval) is evaluated only inside the surviving buckets
//    (~30 ranks of 2048 in the benchmark). Other cost tables (decreasing somewhere, zero, negative, NaN)
//    take the plain exact scan.
//  - Greedy scans ranks in order, materialising buckets in growing chunks; fixed/all need one bucket.
//  - Allocation counts, per request, the words before the threshold key with compares only (PSADBW sums
//    eight slots at once); token runs are written as whole vectors.
//  - All scratch is thread_local and reused: a decode loop plans every step, so steady state allocates
//    nothing.
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(AV_PLANNER_NO_AVX2)
#define AV_PLANNER_AVX2 1
#include <immintrin.h>
#endif

#include "adaptive_verify/planner/cpu.h"
#include "adaptive_verify/planner/math.h"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cpu(const SurvivalParams& p) {
  int32_t nan_count = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t d = p.drafts[r];
    if (d < 0 || d > p.max_drafts) return kErrDraftsOutOfRange;
    const float* row = p.conf + int64_t(r) * p.conf_stride;
    float* out = p.survival + int64_t(r) * p.max_drafts;
    float a = 1.f;
    for (int32_t j = 0; j < p.max_drafts; ++j) {
      if (j < d) {
        if (row[j] != row[j]) ++nan_count;
        a = a * sanitize(row[j]);
        out[j] = a;
      } else {
        out[j] = 0.f;
      }
    }
  }
  if (nan_count && p.error_counts) p.error_counts[kCountNanSurvival] += nan_count;
  return kOk;
}

namespace {

// ---- ranking words ----
// u = IEEE bits of a candidate's sanitised, running-minimum survival s, plus kForcedTag when forced.
// s in [0, 1] has bits <= kOneBits < 2^30, so every forced word exceeds every non-forced one and a larger
// word ranks earlier, exactly as the key's leading fields (math.h candidate_key). Words are non-negative
// int32; kNoSlot marks a slot that holds no candidate. Ties in u are broken by (position, request), which
// only the full key carries: u decides buckets and P(b), the key decides order.
constexpr int32_t kForcedTag = int32_t(1) << 30;
constexpr uint32_t kOneBits = 0x3f800000u;  // bits of 1.0f
constexpr int32_t kNoSlot = -1;
static_assert(kOneBits < uint32_t(kForcedTag), "forced tag must sit above every survival's bits");

inline float word_survival(int32_t u) { return bits_float(uint32_t(u) & uint32_t(kForcedTag - 1)); }
inline uint64_t word_key(int32_t u, int32_t j, int32_t r) {
  return candidate_key(u >= kForcedTag, word_survival(u), j, r);
}

// ---- buckets ----
// Within each half (forced first, then not forced), bucket = (kOneBits - bits(s)) >> shift: logarithmic in
// s (2^(23 - shift) buckets per octave), so survival products, which spread over octaves, fill buckets
// evenly. kOctaves octaves are resolved; smaller survivals share the last bucket of the half. The forced
// half exists only when min_verify > 0.
constexpr int kOctaves = 16;
constexpr int kMinBucketBits = 5;   // 32 buckets: small problems are dominated by the per-call constant
constexpr int kMaxBucketBits = 11;  // 2048: beyond that clearing and scanning counters costs more than it saves
static_assert(23 + 4 - kMaxBucketBits >= 16, "the vector walks compute buckets in 16-bit lanes: shift >= 16");

struct Buckets {
  int shift = 0;          // bits of (kOneBits - bits(s)) dropped
  int32_t per_half = 0;   // buckets per half
  int32_t nf_offset = 0;  // first non-forced bucket (0 without forced candidates)
  int32_t num = 0;        // total buckets

  void init(int64_t n_slots, bool has_forced) {
    // At most a quarter as many buckets per half as slots (measured best at R=256, K=8: fewer buckets make
    // the ordered buckets bigger, more make the prefix pass and the pruning longer).
    int bits = kMinBucketBits;
    while (bits < kMaxBucketBits && (int64_t(1) << (bits + 1)) <= n_slots / 4) ++bits;
    per_half = int32_t(1) << bits;
    shift = 23 + 4 - bits;  // per_half << shift == kOctaves octaves of 2^23 bit patterns
    static_assert((1 << 4) == kOctaves, "shift assumes 16 octaves");
    nf_offset = has_forced ? per_half : 0;
    num = nf_offset + per_half;
  }
  int32_t of(int32_t u) const {
    const uint32_t d = (kOneBits - (uint32_t(u) & uint32_t(kForcedTag - 1))) >> shift;
    const int32_t b = d < uint32_t(per_half - 1) ? int32_t(d) : per_half - 1;
    return (u >= kForcedTag ? 0 : nf_offset) + b;
  }
  // Largest and smallest word a bucket can hold.
  int32_t max_word(int32_t k) const {
    const bool forced = k < nf_offset;
    const uint32_t b = uint32_t(forced ? k : k - nf_offset);
    return int32_t(kOneBits - (b << shift)) + (forced ? kForcedTag : 0);
  }
  int32_t min_word(int32_t k) const {
    const bool forced = k < nf_offset;
    const uint32_t b = uint32_t(forced ? k : k - nf_offset);
    const uint32_t d_hi = b + 1 == uint32_t(per_half) ? kOneBits : ((b + 1) << shift) - 1;
    return int32_t(kOneBits - d_hi) + (forced ? kForcedTag : 0);
  }
};

constexpr int64_t kPackedSlots = int64_t(1) << 16;
constexpr uint64_t kPackedOne = uint64_t(1) << 48;

struct WalkArgs {
  int32_t K;
  int32_t min_verify;
  const Buckets& bk;
};

// One request's slots: ranking word, bucket and survival * 2^32 for j < cap, "no candidate" after. Returns
// the candidate count: cap, or the index of the first NaN survival before cap.
inline int32_t walk_row_scalar(const WalkArgs& a, const float* row, int32_t cap, int32_t* words,
                               uint16_t* slot_bucket, float* slot_fixed) {
  float running = 1.f;
  int32_t j = 0;
  for (; j < cap; ++j) {
    const float raw = row[j];
    if (raw != raw) break;  // NaN: the request's candidates end here
    const float s = sanitize(raw);
    running = s < running ? s : running;
    const int32_t u = int32_t(float_bits(running)) + (j < a.min_verify ? kForcedTag : 0);
    words[j] = u;
    slot_bucket[j] = uint16_t(a.bk.of(u));
    slot_fixed[j] = running * 4294967296.0f;
  }
  const int32_t n = j;
  for (; j < a.K; ++j) {
    words[j] = kNoSlot;
    slot_bucket[j] = uint16_t(a.bk.num);
    slot_fixed[j] = 0.f;
  }
  return n;
}

#if defined(__SSE2__)
// walk_row_scalar for every row at once when K % 4 == 0, four slots per step: MAXPS/MINPS against 0 and 1
// give sanitize() exactly (they return the second operand for NaN and for +-0), and the running minimum is
// a prefix minimum inside each vector (two shuffle steps) carried across vectors. Lanes at or past a row's
// window are masked; the survivals stored there (padding, anything) never reach a word. Rows whose window
// is all K slots (the common case) skip the masking. Returns false at the first drafts[r] out of range.
template <bool kForced>
bool walk_rows_sse2(const WalkArgs& a, const Params& p, bool pre_walked, int32_t* words, uint16_t* slot_bucket,
                    float* slot_fixed, int32_t* caps, int32_t* nan_rows) {
  const int32_t R = p.num_reqs, K = a.K, max_verify = p.max_verify;
  const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.f), scale = _mm_set1_ps(4294967296.0f);
  const __m128i lane = _mm_setr_epi32(0, 1, 2, 3), four = _mm_set1_epi32(4);
  const __m128i one_bits = _mm_set1_epi32(int32_t(kOneBits)), tag = _mm_set1_epi32(kForcedTag);
  const __m128i no_slot = _mm_set1_epi32(kNoSlot), min_verify = _mm_set1_epi32(a.min_verify);
  // Bucket arithmetic in 16-bit lanes: (kOneBits - bits) >> shift < 2^14 because shift >= 16.
  const __m128i last16 = _mm_set1_epi16(int16_t(a.bk.per_half - 1)), nf16 = _mm_set1_epi16(int16_t(a.bk.nf_offset));
  const __m128i dummy16 = _mm_set1_epi16(int16_t(a.bk.num));
  const __m128i shift = _mm_cvtsi32_si128(a.bk.shift);
  int32_t nan = 0;
  for (int32_t r = 0; r < R; ++r) {
    if (pre_walked && caps[r] >= 0) continue;  // done by the AVX2 walk (which checked drafts already)
    const int32_t drafts = p.drafts[r];
    if (drafts < 0 || drafts > K) return false;
    int32_t cap = drafts < max_verify ? drafts : max_verify;
    const float* row = p.survival + int64_t(r) * p.survival_stride;
    const int64_t o = int64_t(r) * K;
    if (!kForced && cap == K && !pre_walked) {
      // Fast path: every slot is a candidate and none is forced; a NaN sends the row to the general path.
      __m128 running = one;
      int32_t v = 0;
      for (; v < K; v += 4) {
        const __m128 raw = _mm_loadu_ps(row + v);
        if (_mm_movemask_ps(_mm_cmpunord_ps(raw, raw))) break;
        __m128 s = _mm_min_ps(_mm_max_ps(raw, zero), one);
        s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(2, 1, 0, 0)));
        s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 0, 0, 0)));
        s = _mm_min_ps(s, running);
        running = _mm_shuffle_ps(s, s, _MM_SHUFFLE(3, 3, 3, 3));
        const __m128i bits = _mm_castps_si128(s);
        __m128i q = _mm_packs_epi32(_mm_srl_epi32(_mm_sub_epi32(one_bits, bits), shift), _mm_setzero_si128());
        q = _mm_add_epi16(_mm_min_epi16(q, last16), nf16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(words + o + v), bits);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(slot_bucket + o + v), q);
        _mm_storeu_ps(slot_fixed + o + v, _mm_mul_ps(s, scale));
      }
      if (v == K) {
        caps[r] = K;
        continue;
      }
    }
    __m128i window = _mm_set1_epi32(cap);
    __m128 running = one;
    __m128i j = lane;
    int32_t v = 0;
    for (; v < K; v += 4, j = _mm_add_epi32(j, four)) {
      const __m128 raw = _mm_loadu_ps(row + v);
      __m128i in = _mm_cmpgt_epi32(window, j);
      const int nan_lanes = _mm_movemask_ps(_mm_and_ps(_mm_cmpunord_ps(raw, raw), _mm_castsi128_ps(in)));
      if (nan_lanes) {  // the window ends at the first NaN
        cap = v + __builtin_ctz(unsigned(nan_lanes));
        ++nan;
        window = _mm_set1_epi32(cap);
        in = _mm_cmpgt_epi32(window, j);
      }
      __m128 s = _mm_min_ps(_mm_max_ps(raw, zero), one);
      s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(2, 1, 0, 0)));
      s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 0, 0, 0)));
      s = _mm_min_ps(s, running);
      running = _mm_shuffle_ps(s, s, _MM_SHUFFLE(3, 3, 3, 3));
      const __m128i bits = _mm_castps_si128(s);
      __m128i u = bits;
      __m128i q = _mm_packs_epi32(_mm_srl_epi32(_mm_sub_epi32(one_bits, bits), shift), _mm_setzero_si128());
      q = _mm_min_epi16(q, last16);
      if (kForced) {
        const __m128i forced = _mm_cmpgt_epi32(min_verify, j);
        u = _mm_add_epi32(u, _mm_and_si128(forced, tag));
        q = _mm_add_epi16(q, _mm_andnot_si128(_mm_packs_epi32(forced, forced), nf16));
      } else {
        q = _mm_add_epi16(q, nf16);
      }
      u = _mm_or_si128(_mm_and_si128(in, u), _mm_andnot_si128(in, no_slot));
      const __m128i in16 = _mm_packs_epi32(in, in);
      q = _mm_or_si128(_mm_and_si128(in16, q), _mm_andnot_si128(in16, dummy16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + o + v), u);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(slot_bucket + o + v), q);
      _mm_storeu_ps(slot_fixed + o + v, _mm_mul_ps(s, scale));  // garbage lanes land in the dummy bucket
      if (nan_lanes) break;
    }
    for (v += 4; v < K; v += 4) {  // after the NaN's vector: no candidate
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + o + v), no_slot);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(slot_bucket + o + v), dummy16);
    }
    caps[r] = cap;
  }
  *nan_rows = nan;
  return true;
}
#endif

#if defined(AV_PLANNER_AVX2)
// The SSE2 fast path eight slots at a time, for machines with AVX2 (checked once at run time; the build
// itself targets baseline x86-64). Rows with K % 8 == 0, every slot a candidate, none forced and no NaN
// are done here; every other row is marked with caps[r] = -1 for the general walk (counted in *left). The
// arithmetic is the same IEEE max/min/multiply, so the words are identical. Returns false at the first
// drafts[r] out of range.
__attribute__((target("avx2"))) bool walk_full_rows_avx2(const Params& p, const Buckets& bk, int32_t* words,
                                                         uint16_t* slot_bucket, float* slot_fixed, int32_t* caps,
                                                         int32_t* left) {
  const int32_t R = p.num_reqs, K = p.max_drafts, max_verify = p.max_verify;
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f), scale = _mm256_set1_ps(4294967296.0f);
  const __m256i one_bits = _mm256_set1_epi32(int32_t(kOneBits)), last = _mm256_set1_epi32(bk.per_half - 1);
  const __m256i nf_offset = _mm256_set1_epi32(bk.nf_offset);
  const __m256i low_to_high = _mm256_setr_epi32(0, 1, 2, 3, 3, 3, 3, 3), top = _mm256_set1_epi32(7);
  const __m128i shift = _mm_cvtsi32_si128(bk.shift);
  int32_t not_done = 0;  // a local: stores through `left` inside the loop would chain every row
  const int32_t* drafts_in = p.drafts;  // locals, so no store in the loop makes the compiler reload them
  const float* survival = p.survival;
  const int64_t stride = p.survival_stride;
  for (int32_t r = 0; r < R; ++r) {
    const int32_t drafts = drafts_in[r];
    if (drafts < 0 || drafts > K) return false;
    if ((drafts < max_verify ? drafts : max_verify) != K) {
      caps[r] = -1;
      ++not_done;
      continue;
    }
    const float* row = survival + int64_t(r) * stride;
    const int64_t o = int64_t(r) * K;
    __m256 running = one;
    int32_t v = 0;
    for (; v < K; v += 8) {
      const __m256 raw = _mm256_loadu_ps(row + v);
      if (_mm256_movemask_ps(_mm256_cmp_ps(raw, raw, _CMP_UNORD_Q))) break;
      __m256 s = _mm256_min_ps(_mm256_max_ps(raw, zero), one);
      s = _mm256_min_ps(s, _mm256_shuffle_ps(s, s, _MM_SHUFFLE(2, 1, 0, 0)));
      s = _mm256_min_ps(s, _mm256_shuffle_ps(s, s, _MM_SHUFFLE(1, 0, 0, 0)));
      s = _mm256_min_ps(s, _mm256_permutevar8x32_ps(s, low_to_high));  // upper half: min with lane 3
      s = _mm256_min_ps(s, running);
      running = _mm256_permutevar8x32_ps(s, top);
      const __m256i bits = _mm256_castps_si256(s);
      __m256i q = _mm256_srl_epi32(_mm256_sub_epi32(one_bits, bits), shift);
      q = _mm256_add_epi32(_mm256_min_epi32(q, last), nf_offset);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + o + v), bits);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot_bucket + o + v),
                       _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
      _mm256_storeu_ps(slot_fixed + o + v, _mm256_mul_ps(s, scale));
    }
    const bool done = v == K;
    caps[r] = done ? K : -1;
    not_done += !done;
  }
  *left = not_done;
  return true;
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// Ascending sort of 64-bit keys. Buckets hold a handful of keys, so insertion sort is the common case;
// big buckets (exact ties, tiny survivals below the resolved octaves) take an LSD radix sort over the key
// bits that actually vary, so no input degrades to a comparison sort of thousands of keys.
void sort_keys(uint64_t* a, int64_t n, std::vector<uint64_t>& scratch) {
  if (n <= 32) {
    for (int64_t i = 1; i < n; ++i) {
      const uint64_t v = a[i];
      int64_t j = i;
      for (; j > 0 && a[j - 1] > v; --j) a[j] = a[j - 1];
      a[j] = v;
    }
    return;
  }
  if (n <= 256) {
    std::sort(a, a + n);
    return;
  }
  uint64_t all_or = 0, all_and = ~uint64_t(0);
  for (int64_t i = 0; i < n; ++i) {
    all_or |= a[i];
    all_and &= a[i];
  }
  const uint64_t varying = all_or ^ all_and;
  if (varying == 0) return;
  const int lo = __builtin_ctzll(varying), hi = 64 - __builtin_clzll(varying);
  if (scratch.size() < size_t(n)) scratch.resize(size_t(n));
  uint64_t* src = a;
  uint64_t* dst = scratch.data();
  for (int shift = lo; shift < hi; shift += 8) {
    if (((varying >> shift) & 255u) == 0) continue;  // e.g. request bits above the largest request
    uint32_t count[257] = {};
    for (int64_t i = 0; i < n; ++i) ++count[((src[i] >> shift) & 255u) + 1];
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (int64_t i = 0; i < n; ++i) dst[count[(src[i] >> shift) & 255u]++] = src[i];
    std::swap(src, dst);
  }
  if (src != a) std::memcpy(a, src, size_t(n) * sizeof(uint64_t));
}

struct Workspace {
  std::vector<int32_t> words;    // [R * K, padded] ranking word of every slot, kNoSlot where no candidate
  std::vector<int32_t> caps;     // [R] candidates per row
  std::vector<uint16_t> slot_bucket;  // [R * K] bucket of every slot (buckets + 1: no candidate)
  std::vector<float> slot_fixed;      // [R * K] survival * 2^32, the argument of to_fixed
  std::vector<uint64_t> hist;    // [2, buckets + 1] count << 48 | survival sum, below kPackedSlots slots
  std::vector<uint32_t> count;   // [buckets + 1] candidates per bucket
  std::vector<uint64_t> sum;     // [buckets + 1] fixed-point survival sum per bucket
  std::vector<uint64_t> packed;  // [buckets + 1] below kPackedSlots: start << 48 | psum
  std::vector<int64_t> start;    // [buckets + 1] rank of each bucket's first candidate
  std::vector<uint64_t> psum;    // [buckets + 1] P(start[k])
  std::vector<uint8_t> ready;    // [buckets] 1 once the bucket's keys are in `sorted`, ordered
  std::vector<int32_t> kept;     // global search: buckets that may hold the first argmax, ascending
  std::vector<int32_t> groups;   // global search: first bucket of each group that may hold it
  std::vector<int64_t> fill;     // [buckets] scatter cursor while materialising
  std::vector<uint64_t> sorted;  // [n] keys by rank; valid inside materialised buckets only
  std::vector<uint64_t> scratch;
  std::vector<int32_t> lens;     // [R + 1] verified drafts per request
  std::vector<int32_t> group_counts;  // [R * K / 8 + 1] words above the threshold per 8 slots
};

template <typename T>
void grow(std::vector<T>& v, size_t n) {  // never shrinks, so steady state neither allocates nor clears
  if (v.size() < n) v.resize(n);
}

// Reused across calls. Fetched through a non-inlined call: in a shared library every thread_local access
// is a __tls_get_addr call, and once inlined GCC re-derives the address inside the hot loops.
__attribute__((noinline)) Workspace* thread_workspace() {
  thread_local Workspace ws;
  return &ws;
}

// Bit t set when w[t] lies in [lo, hi], for 16 words (0 <= lo <= hi < INT32_MAX).
inline uint32_t block_hits(const int32_t* w, int32_t lo, int32_t hi) {
#if defined(__SSE2__)
  const __m128i below = _mm_set1_epi32(lo - 1), above = _mm_set1_epi32(hi + 1);
  uint32_t mask = 0;
  for (int t = 0; t < 16; t += 4) {
    const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + t));
    const __m128i in = _mm_and_si128(_mm_cmpgt_epi32(u, below), _mm_cmpgt_epi32(above, u));
    mask |= uint32_t(_mm_movemask_ps(_mm_castsi128_ps(in))) << t;
  }
  return mask;
#else
  uint32_t mask = 0;
  for (int t = 0; t < 16; ++t) mask |= uint32_t(w[t] >= lo && w[t] <= hi) << t;
  return mask;
#endif
}

// Calls f(i) for every i < n (a multiple of 16) with words[i] in [lo, hi], in ascending order.
template <typename F>
inline void for_each_hit(const int32_t* words, int64_t n, int32_t lo, int32_t hi, F&& f) {
  for (int64_t i0 = 0; i0 < n; i0 += 16)
    for (uint32_t hits = block_hits(words + i0, lo, hi); hits; hits &= hits - 1) f(i0 + __builtin_ctz(hits));
}
#if defined(AV_PLANNER_AVX2)
template <typename F>
__attribute__((target("avx2"))) void for_each_hit_avx2(const int32_t* words, int64_t n, int32_t lo, int32_t hi,
                                                        F&& f) {
  const __m256i below = _mm256_set1_epi32(lo - 1), above = _mm256_set1_epi32(hi + 1);
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i0));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i0 + 8));
    const __m256i in_a = _mm256_and_si256(_mm256_cmpgt_epi32(a, below), _mm256_cmpgt_epi32(above, a));
    const __m256i in_b = _mm256_and_si256(_mm256_cmpgt_epi32(b, below), _mm256_cmpgt_epi32(above, b));
    uint32_t hits = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(in_a))) |
                    (uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(in_b))) << 8);
    for (; hits; hits &= hits - 1) f(i0 + __builtin_ctz(hits));
  }
}
#endif

// The canonical order, materialised lazily by bucket.
class Order {
 public:
  Order(Workspace& ws, const Buckets& bk, int32_t K, int64_t n_slots, bool packed)
      : ws_(ws), bk_(bk), K_(K), n_slots_(n_slots), packed_(packed) {}

  // Rank of bucket k's first candidate, and P there. Below kPackedSlots slots both live in one running
  // word, count << 48 | sum, which halves the prefix pass's stores.
  int64_t start(int32_t k) const { return packed_ ? int64_t(ws_.packed[size_t(k)] >> 48) : ws_.start[size_t(k)]; }
  uint64_t psum(int32_t k) const {
    return packed_ ? ws_.packed[size_t(k)] & (kPackedOne - 1) : ws_.psum[size_t(k)];
  }

  // Bucket holding rank i (i < n): the last bucket whose start is <= i. `hint` must be <= the answer.
  int32_t bucket_of_rank(int64_t i, int32_t hint = 0) const {
    int32_t lo = hint, hi = bk_.num - 1;  // answer in [lo, hi]
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      if (start(mid) <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // Orders buckets [k0, k1): one scan of the ranking words gathers every candidate whose word lies in the
  // buckets' word range into its bucket's ranks, then each bucket is sorted by key. Ready buckets at
  // either end are skipped; ready ones inside are simply redone (same result).
  void materialise(int32_t k0, int32_t k1) {
    while (k0 < k1 && (ws_.ready[size_t(k0)] || start(k0) == start(k0 + 1))) ++k0;
    while (k1 > k0 && (ws_.ready[size_t(k1 - 1)] || start(k1 - 1) == start(k1))) --k1;
    if (k0 >= k1) return;
    const uint32_t lo = uint32_t(bk_.min_word(k1 - 1));
    const uint32_t width = uint32_t(bk_.max_word(k0)) - lo;
    int64_t* fill = ws_.fill.data();
    for (int32_t k = k0; k < k1; ++k) fill[k] = start(k);
    const int32_t* words = ws_.words.data();
    uint64_t* sorted = ws_.sorted.data();
    // Blocks of 16 words are tested without branches (SSE2, or a loop the compiler vectorises); only
    // blocks that hold a hit are looked at one by one. kNoSlot (-1) is below every bucket's words.
    // Request of slot i as a multiply-shift when exact: ceil(2^32 / K) * i >> 32 == i / K for i * K < 2^32.
    const uint64_t magic = ((uint64_t(1) << 32) + uint64_t(K_) - 1) / uint64_t(K_);
    const bool exact = uint64_t(n_slots_) * uint64_t(K_) < (uint64_t(1) << 32);
    auto gather = [&](int64_t i) {
      const int32_t u = words[i];
      const int32_t r = exact ? int32_t((uint64_t(i) * magic) >> 32) : int32_t(i / K_);
      sorted[fill[bk_.of(u)]++] = word_key(u, int32_t(i - int64_t(r) * K_), r);
    };
#if defined(AV_PLANNER_AVX2)
    if (cpu_has_avx2()) {
      for_each_hit_avx2(words, n_slots_, int32_t(lo), int32_t(lo + width), gather);
    } else
#endif
    {
      for_each_hit(words, n_slots_, int32_t(lo), int32_t(lo + width), gather);
    }
    for (int32_t k = k0; k < k1; ++k) {
      const int64_t b = start(k), e = start(k + 1);
      if (e - b > 1) sort_keys(sorted + b, e - b, ws_.scratch);
      ws_.ready[size_t(k)] = 1;
    }
  }

  // Key of rank i (i < n), ordering the bucket that holds it (and, for scans, the next `ahead` ranks).
  uint64_t key_at(int64_t i, int32_t k, int64_t ahead = 0) {
    if (!ws_.ready[size_t(k)]) {
      int32_t k1 = k + 1;
      while (k1 < bk_.num && start(k1) < i + ahead) ++k1;
      materialise(k, k1);
    }
    return ws_.sorted[size_t(i)];
  }

  // P(b) for any b in [0, n].
  uint64_t prefix(int64_t b) {
    if (b <= 0) return 0;
    const int32_t k = bucket_of_rank(b - 1);  // holds rank b - 1
    if (start(k + 1) == b) return psum(k + 1);
    materialise(k, k + 1);
    uint64_t total = psum(k);
    for (int64_t i = start(k); i < b; ++i) total += to_fixed(key_survival(ws_.sorted[size_t(i)]));
    return total;
  }

  // The key at rank b, or (when b starts a bucket) any key that sorts after every earlier rank and no
  // later than rank b: "key < threshold" then selects exactly ranks [0, b). kNoCandidate when b == n.
  uint64_t threshold(int64_t b, int64_t n) {
    if (b >= n) return kNoCandidate;
    const int32_t k = bucket_of_rank(b);
    if (start(k) == b) {
      // Every earlier rank lies in a bucket < k, whose words exceed max_word(k); position 0, request 0
      // puts this key at or before every key of bucket k.
      const int32_t u = bk_.max_word(k);
      return word_key(u, 0, 0);
    }
    return key_at(b, k);
  }

  // Whether a candidate ranked before b shares rank b's ranking word (it can only be rank b - 1 of the
  // same bucket, keys being ordered by word first). Only then do position and request decide the allocation.
  bool tie_before(int64_t b) {
    if (b <= 0 || b >= start(bk_.num)) return false;
    const int32_t k = bucket_of_rank(b);
    if (start(k) == b) return false;
    return (key_at(b - 1, k) >> 31) == (key_at(b, k) >> 31);
  }

  static constexpr int kBlock = 16;

 private:
  Workspace& ws_;
  const Buckets& bk_;
  int32_t K_;
  int64_t n_slots_;
  bool packed_;
};

// The threshold key split into its fields: key(u, j, r) < key(tu, tj, tr) exactly when u > tu, or u == tu
// and (j, r) < (tj, tr). Slots without a candidate hold -1 < tu, so a row's verified drafts are counted
// over all K slots without branches (a row's words descend, so the count is the prefix length).
struct Threshold {
  int32_t u = 0, j = 0, r = 0;
  bool none = true;  // no threshold: every candidate is verified
  bool tie = false;  // some candidate ranked before it has word u (else the count is just words > u)

  Threshold(uint64_t key, bool tie_before) : tie(tie_before) {
    if (key == kNoCandidate) return;
    none = false;
    const bool forced = (key >> 63) == 0;
    u = int32_t(~uint32_t(key >> 31)) + (forced ? kForcedTag : 0);
    j = int32_t((key >> kReqBits) & uint64_t(kMaxDrafts - 1));
    r = int32_t(key & ((uint64_t(1) << kReqBits) - 1));
  }

  int32_t count_before(const int32_t* row, int32_t K, int32_t req) const {
    int32_t n = 0;
    bool tie = false;
#if defined(__SSE2__)
    if (K % 4 == 0) {
      const __m128i tu = _mm_set1_epi32(u);
      __m128i gt = _mm_setzero_si128(), eq = _mm_setzero_si128();
      for (int32_t v = 0; v < K; v += 4) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + v));
        gt = _mm_sub_epi32(gt, _mm_cmpgt_epi32(w, tu));
        eq = _mm_or_si128(eq, _mm_cmpeq_epi32(w, tu));
      }
      gt = _mm_add_epi32(gt, _mm_shuffle_epi32(gt, _MM_SHUFFLE(1, 0, 3, 2)));
      gt = _mm_add_epi32(gt, _mm_shuffle_epi32(gt, _MM_SHUFFLE(2, 3, 0, 1)));
      n = _mm_cvtsi128_si32(gt);
      tie = _mm_movemask_epi8(eq) != 0;
    } else
#endif
    {
      for (int32_t q = 0; q < K; ++q) {
        n += row[q] > u;
        tie |= row[q] == u;
      }
    }
    if (tie)  // equal words: the key's position and request fields decide
      for (int32_t q = 0; q < K; ++q) n += row[q] == u && (q < j || (q == j && req < r));
    return n;
  }
};

// Per request, the words above u, for K % 8 == 0 (no ties to break). Rows are cut into groups of 8 slots:
// 16 slots are compared at once, the masks packed to bytes and summed per 8 bytes by PSADBW.
void count_above(const int32_t* words, int64_t n_padded, int32_t K, int32_t u, int32_t* lens,
                 std::vector<int32_t>& group_counts) {
  const int32_t per_row = K / 8;
  grow(group_counts, size_t(n_padded / 8));
  int32_t* g = per_row == 1 ? lens : group_counts.data();  // lens has room for the padding group
#if defined(__SSE2__)
  const __m128i tu = _mm_set1_epi32(u), zero = _mm_setzero_si128();
  for (int64_t i = 0; i < n_padded; i += 16, g += 2) {
    const __m128i* w = reinterpret_cast<const __m128i*>(words + i);
    auto above = [&](int q) { return _mm_cmpgt_epi32(_mm_loadu_si128(w + q), tu); };
    const __m128i m01 = _mm_packs_epi32(above(0), above(1)), m23 = _mm_packs_epi32(above(2), above(3));
    const __m128i sums = _mm_sad_epu8(_mm_sub_epi8(zero, _mm_packs_epi16(m01, m23)), zero);  // -1 -> 1 per slot
    g[0] = _mm_cvtsi128_si32(sums);
    g[1] = _mm_extract_epi16(sums, 4);
  }
#else
  for (int64_t i = 0; i < n_padded; i += 8, ++g) {
    int32_t n = 0;
    for (int t = 0; t < 8; ++t) n += words[i + t] > u;
    *g = n;
  }
#endif
  if (per_row > 1) {
    const int64_t R = n_padded / K;  // rows whose groups were all counted (padding groups hold 0)
    const int32_t* c = group_counts.data();
    for (int64_t r = 0; r < R; ++r) {
      int32_t n = 0;
      for (int32_t q = 0; q < per_row; ++q) n += c[r * per_row + q];
      lens[r] = n;
    }
  }
}

// query_start_loc[r] and the run of request r in token_req, for every request; returns the tokens written.
// The run of 1 + lens[r] <= K + 1 entries is stored as kVec whole vectors (a compile-time count, so the
// stores are unrolled) while the buffer has room; the next request overwrites the excess.
template <int kVec>
int64_t write_token_runs_n(int32_t* qsl, int32_t* token_req, const int32_t* lens, int32_t R, int64_t offset,
                           int64_t T_pad) {
  int64_t tok = 0;
  int32_t r = 0;
#if defined(__SSE2__)
  for (; r < R && tok + 4 * kVec <= T_pad; ++r) {
    qsl[r] = int32_t(offset + tok);
    const __m128i v = _mm_set1_epi32(r);
    for (int q = 0; q < kVec; ++q) _mm_storeu_si128(reinterpret_cast<__m128i*>(token_req + tok + 4 * q), v);
    tok += 1 + lens[r];
  }
#endif
  for (; r < R; ++r) {
    qsl[r] = int32_t(offset + tok);
    for (int32_t i = 0; i <= lens[r]; ++i) token_req[tok + i] = r;
    tok += 1 + lens[r];
  }
  return tok;
}

int64_t write_token_runs(int32_t* qsl, int32_t* token_req, const int32_t* lens, int32_t R, int32_t K,
                         int64_t offset, int64_t T_pad) {
  switch ((K + 4) / 4) {  // vectors covering K + 1 entries
    case 1: return write_token_runs_n<1>(qsl, token_req, lens, R, offset, T_pad);
    case 2: return write_token_runs_n<2>(qsl, token_req, lens, R, offset, T_pad);
    case 3: return write_token_runs_n<3>(qsl, token_req, lens, R, offset, T_pad);
    case 4: return write_token_runs_n<4>(qsl, token_req, lens, R, offset, T_pad);
    case 5: return write_token_runs_n<5>(qsl, token_req, lens, R, offset, T_pad);
    case 6: return write_token_runs_n<6>(qsl, token_req, lens, R, offset, T_pad);
    case 7: return write_token_runs_n<7>(qsl, token_req, lens, R, offset, T_pad);
    case 8: return write_token_runs_n<8>(qsl, token_req, lens, R, offset, T_pad);
    default: return write_token_runs_n<9>(qsl, token_req, lens, R, offset, T_pad);
  }
}

// dst[i] = value + step * i for i < count (count <= span, step 0 or 1). When `room` allows, whole vectors
// covering `span` entries are stored instead (the next request overwrites the excess), so no trip count
// depends on data.
inline void write_run(int32_t* dst, int64_t room, int32_t count, int32_t span, int32_t value, int32_t step) {
#if defined(__SSE2__)
  if (room >= (span + 3) / 4 * 4) {
    __m128i v = _mm_add_epi32(_mm_set1_epi32(value), _mm_and_si128(_mm_set1_epi32(-step), _mm_setr_epi32(0, 1, 2, 3)));
    const __m128i inc = _mm_set1_epi32(4 * step);
    for (int32_t i = 0; i < span; i += 4, v = _mm_add_epi32(v, inc))
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), v);
    return;
  }
#endif
  (void)room;
  (void)span;
  for (int32_t i = 0; i < count; ++i) dst[i] = value + step * i;
}

// Theta's cost as ThetaEval computes it (same float sum, same clamp of the table index).
inline float step_cost(const ThetaEval& theta, int64_t budget) {
  int64_t n = theta.base_tokens + budget;
  if (n > theta.verify_cost_len - 1) n = theta.verify_cost_len - 1;
  return theta.draft_cost + theta.verify_cost[n];
}

// Whether v[n + 1] >= v[n] fails (a decrease or a NaN) for some n in [lo, hi). Accumulated rather than
// breaking out, so the loop vectorises; the AVX2 clone is the same loop compiled for eight lanes.
inline bool cost_decreases(const float* v, int64_t lo, int64_t hi) {
  uint32_t bad = 0;
  for (int64_t n = lo; n < hi; ++n) bad |= uint32_t(!(v[n + 1] >= v[n]));
  return bad != 0;
}
#if defined(AV_PLANNER_AVX2)
__attribute__((target("avx2"))) bool cost_decreases_avx2(const float* v, int64_t lo, int64_t hi) {
  uint32_t bad = 0;
  for (int64_t n = lo; n < hi; ++n) bad |= uint32_t(!(v[n + 1] >= v[n]));
  return bad != 0;
}
#endif

// True when cost(b) is positive and non-decreasing for b in [b_lo, b_hi]: the condition under which the
// pruning bound of the global search holds. Also false for any NaN in the range.
bool cost_monotone_positive(const ThetaEval& theta, int64_t b_lo, int64_t b_hi) {
  if (!(step_cost(theta, b_lo) > 0.f)) return false;
  const int64_t last = theta.verify_cost_len - 1;
  const int64_t n_lo = std::min(theta.base_tokens + b_lo, last), n_hi = std::min(theta.base_tokens + b_hi, last);
#if defined(AV_PLANNER_AVX2)
  if (cpu_has_avx2()) return !cost_decreases_avx2(theta.verify_cost, n_lo, n_hi);
#endif
  return !cost_decreases(theta.verify_cost, n_lo, n_hi);
}

// First argmax of Theta over [b_min, b_max] for a positive non-decreasing cost; same result as the plain
// scan `best = Theta(b_min); for b: if Theta(b) > best ...` (ties: smallest b).
// Why pruning is exact: let L be a Theta value attained at some b. For b in (lo, hi] of one bucket,
// Theta(b) = fl(x_b / c_b) <= fl(x_hi / c_lo+1) because x is non-decreasing in b, c is non-decreasing and
// positive, and correctly rounded division is monotone. If that bound is < L, no b there attains the
// maximum M >= L, so none is the first argmax; the scan over the remaining b in ascending order, with
// strict improvement, still stops at the first b attaining M. The bound is tested as x_hi < L' * c with
// L' = L (1 - 2^-48): both products round by at most 2^-53 relatively, so the test passing implies
// x_hi / c < L (1 - 2^-49), whose rounding is below L. No division is spent on a pruned bucket.
constexpr int64_t kBridge = 64;
constexpr int32_t kGroup = 8;  // buckets per group of the global search's first, coarse pruning pass

int64_t global_argmax(Order& order, const Buckets& bk, const ThetaEval& theta, int64_t b_min, int64_t b_max,
                      int32_t* kept, int32_t* groups) {
  const uint64_t base = theta.base_fixed;
  const int32_t k_first = bk.nf_offset;  // b_min is a boundary: the forced candidates fill the forced half
  double best = theta(b_min, order.psum(k_first));
  int64_t best_b = b_min;
  // Buckets [k_first, k_end) hold the ranks b - 1 for b in (b_min, b_max].
  int32_t k_end = k_first;
  while (k_end < bk.num && order.start(k_end) < b_max) k_end += kGroup;
  k_end = std::min(k_end, bk.num);
  // L, a Theta value attained at some b (the larger, the more pruning), is refined in two levels: first
  // over group ends, which prunes whole groups, then over the bucket ends inside the groups left. Each
  // level picks its best end by cross multiplication (only a heuristic choice) and evaluates it exactly.
  int64_t l_b = b_min;
  uint64_t l_p = order.psum(k_first);
  double l_x = double(base + l_p), l_c = double(step_cost(theta, b_min));
  auto consider = [&](int32_t k) {  // the end of the buckets before k
    const int64_t b = order.start(k);
    if (b > b_max) return;
    const double x = double(base + order.psum(k)), c = double(step_cost(theta, b));
    if (x * l_c > l_x * c) {
      l_x = x;
      l_c = c;
      l_b = b;
      l_p = order.psum(k);
    }
  };
  for (int32_t k = k_first + kGroup; k < k_end + kGroup; k += kGroup) consider(std::min(k, k_end));
  double L = std::max(best, theta(l_b, l_p));
  double L_margin = L * (1.0 - 1.0 / 281474976710656.0);  // L (1 - 2^-48)
  // Bound test for ranks (lo, hi]: false when every Theta there is certainly below L.
  auto may_hold = [&](int64_t lo, int64_t hi, uint64_t p_hi) {
    return hi > lo && !(double(base + p_hi) < L_margin * double(step_cost(theta, lo + 1)));
  };
  int32_t n_groups = 0;  // first bucket of every kept group
  for (int32_t g = k_first; g < k_end; g += kGroup) {
    const int32_t g_end = std::min(g + kGroup, k_end);
    if (may_hold(order.start(g), order.start(g_end), order.psum(g_end))) groups[n_groups++] = g;
  }
  for (int32_t i = 0; i < n_groups; ++i)
    for (int32_t k = groups[i] + 1; k <= std::min(groups[i] + kGroup, k_end); ++k) consider(k);
  L = std::max(L, theta(l_b, l_p));
  L_margin = L * (1.0 - 1.0 / 281474976710656.0);
  int32_t n_kept = 0;
  for (int32_t i = 0; i < n_groups; ++i) {
    const int32_t g = groups[i];
    for (int32_t k = g; k < std::min(g + kGroup, k_end); ++k)
      if (may_hold(order.start(k), order.start(k + 1), order.psum(k + 1))) kept[n_kept++] = k;
  }
  for (int32_t i = 0; i < n_kept;) {
    // A run of kept buckets, bridging gaps of few candidates (one scan gathers the whole run; a wide gap
    // is cheaper to skip with a second scan than to order).
    int32_t e = i + 1;
    while (e < n_kept && order.start(kept[e]) - order.start(kept[e - 1] + 1) <= kBridge) ++e;
    order.materialise(kept[i], kept[e - 1] + 1);
    i = e;
  }
  for (int32_t i = 0; i < n_kept; ++i) {
    const int32_t k = kept[i];
    uint64_t prefix = order.psum(k);
    const int64_t hi = std::min(order.start(k + 1), b_max);
    for (int64_t r = order.start(k); r < hi; ++r) {
      prefix += to_fixed(key_survival(order.key_at(r, k)));
      const double t = theta(r + 1, prefix);
      if (t > best) {
        best = t;
        best_b = r + 1;
      }
    }
  }
  return best_b;
}

}  // namespace

int plan_cpu(const Params& p) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  Workspace& ws = *thread_workspace();
  const int64_t n_slots = int64_t(R) * K;
  const int64_t n_padded = (n_slots + Order::kBlock - 1) / Order::kBlock * Order::kBlock;
  grow(ws.words, size_t(n_padded));
  grow(ws.caps, size_t(R));
  Buckets bk;
  bk.init(n_slots, p.min_verify > 0);
  grow(ws.count, size_t(bk.num) + 1);
  grow(ws.sum, size_t(bk.num) + 1);
  grow(ws.start, size_t(bk.num) + 1);
  grow(ws.psum, size_t(bk.num) + 1);
  grow(ws.ready, size_t(bk.num));
  grow(ws.fill, size_t(bk.num));
  grow(ws.kept, size_t(bk.num));
  grow(ws.groups, size_t(bk.num / kGroup + 1));
  grow(ws.hist, 2 * (size_t(bk.num) + 1));
  grow(ws.slot_bucket, size_t(n_slots));
  grow(ws.slot_fixed, size_t(n_slots));
  uint32_t* count = ws.count.data();
  uint64_t* sum = ws.sum.data();
  uint64_t* hist = ws.hist.data();
  if (n_slots < kPackedSlots) {
    std::memset(hist, 0, 2 * (size_t(bk.num) + 1) * sizeof(uint64_t));
  } else {
    std::memset(count, 0, (size_t(bk.num) + 1) * sizeof(uint32_t));
    std::memset(sum, 0, (size_t(bk.num) + 1) * sizeof(uint64_t));
  }

  // ---- walk: ranking words, then histogram (same window, sanitising and running minimum as walk_row) ----
  int32_t* words = ws.words.data();
  int32_t* caps = ws.caps.data();
  uint16_t* slot_bucket = ws.slot_bucket.data();
  float* slot_fixed = ws.slot_fixed.data();
  int64_t n_cand = 0, n_forced = 0;
  int32_t nan_count = 0;
  const WalkArgs wa{K, p.min_verify, bk};
  bool simd = false;
  bool pre_walked = false;  // rows with caps[r] >= 0 are done
  int32_t left = R;         // rows not done yet
#if defined(AV_PLANNER_AVX2)
  if (K % 8 == 0 && p.min_verify <= 0 && cpu_has_avx2()) {
    left = 0;
    if (!walk_full_rows_avx2(p, bk, words, slot_bucket, slot_fixed, caps, &left)) return kErrDraftsOutOfRange;
    pre_walked = true;
  }
#endif
#if defined(__SSE2__)
  if (K % 4 == 0 && left > 0) {
    simd = true;
    const bool ok = p.min_verify > 0
                        ? walk_rows_sse2<true>(wa, p, pre_walked, words, slot_bucket, slot_fixed, caps, &nan_count)
                        : walk_rows_sse2<false>(wa, p, pre_walked, words, slot_bucket, slot_fixed, caps, &nan_count);
    if (!ok) return kErrDraftsOutOfRange;
  }
#endif
  if (!simd && left > 0) {
    for (int32_t r = 0; r < R; ++r) {
      const int32_t drafts = p.drafts[r];
      if (drafts < 0 || drafts > K) return kErrDraftsOutOfRange;
      const int32_t cap = drafts < p.max_verify ? drafts : p.max_verify;
      const int64_t o = int64_t(r) * K;
      caps[r] = walk_row_scalar(wa, p.survival + int64_t(r) * p.survival_stride, cap, words + o, slot_bucket + o,
                                slot_fixed + o);
      nan_count += caps[r] < cap;
    }
  }
  for (int32_t r = 0; r < R; ++r) n_cand += caps[r];
  if (p.min_verify > 0)
    for (int32_t r = 0; r < R; ++r) n_forced += p.min_verify < caps[r] ? p.min_verify : caps[r];
  for (int64_t i = n_slots; i < n_padded; ++i) words[i] = kNoSlot;
  if (nan_count && p.error_counts) p.error_counts[kCountNanSurvival] += nan_count;
  // Slots without a candidate carry bucket bk.num (a dummy counter) so this loop has no branch. Below 2^16
  // slots a bucket's count and survival sum share one word (count << 48: sums stay below 2^16 * 2^32).
  const bool packed = n_slots < kPackedSlots;
  if (packed) {
    uint64_t* hist2 = hist + bk.num + 1;  // a second copy: consecutive slots never wait on each other's add
    int64_t i = 0;
    for (; i + 1 < n_slots; i += 2) {
      hist[slot_bucket[i]] += kPackedOne + uint64_t(static_cast<int64_t>(slot_fixed[i]));
      hist2[slot_bucket[i + 1]] += kPackedOne + uint64_t(static_cast<int64_t>(slot_fixed[i + 1]));
    }
    if (i < n_slots) hist[slot_bucket[i]] += kPackedOne + uint64_t(static_cast<int64_t>(slot_fixed[i]));
    grow(ws.packed, size_t(bk.num) + 1);
    uint64_t* prefix = ws.packed.data();
    uint64_t running = 0;  // count << 48 | sum: neither field overflows below 2^16 slots
    for (int32_t k = 0; k < bk.num; ++k) {
      prefix[k] = running;
      running += hist[k] + hist2[k];
    }
    prefix[bk.num] = running;
  } else {
    for (int64_t i = 0; i < n_slots; ++i) {
      ++count[slot_bucket[i]];
      sum[slot_bucket[i]] += uint64_t(static_cast<int64_t>(slot_fixed[i]));
    }
    int64_t* start = ws.start.data();
    uint64_t* psum = ws.psum.data();
    int64_t rank = 0;
    uint64_t total = 0;
    for (int32_t k = 0; k < bk.num; ++k) {
      start[k] = rank;
      psum[k] = total;
      rank += count[k];
      total += sum[k];
    }
    start[bk.num] = rank;
    psum[bk.num] = total;
  }
  std::memset(ws.ready.data(), 0, size_t(bk.num));
  grow(ws.sorted, size_t(n_cand));
  Order order(ws, bk, K, n_padded, packed);

  // ---- budget ----
  const int64_t b_max = std::min(n_cand, p.budget_cap);
  const int64_t b_min = std::min(n_forced, b_max);
  const ThetaEval theta{uint64_t(R + p.extra_emitting) << 32, R + p.extra_tokens, p.verify_cost,
                        p.verify_cost_len, p.draft_cost};
  int64_t budget = b_max;
  if (p.mode == kGlobal && b_min < b_max && cost_monotone_positive(theta, b_min, b_max)) {
    budget = global_argmax(order, bk, theta, b_min, b_max, ws.kept.data(), ws.groups.data());
  } else if (p.mode == kGreedy || p.mode == kGlobal) {
    // The plain scan of Algorithm 1 / the argmax, ranks ordered as they are reached (in chunks that grow
    // with the scan, so a long scan costs a few gathers, a short one a single small one).
    uint64_t prefix = order.prefix(b_min);
    budget = b_min;
    double best = theta(b_min, prefix);
    int32_t k = b_min < b_max ? order.bucket_of_rank(b_min) : 0;
    int64_t ahead = 8;
    for (int64_t b = b_min; b < b_max; ++b) {
      while (order.start(k + 1) <= b) ++k;
      if (!ws.ready[size_t(k)]) ahead *= 2;
      prefix += to_fixed(key_survival(order.key_at(b, k, ahead)));
      const double t = theta(b + 1, prefix);
      if (t > best) {
        best = t;
        budget = b + 1;
      } else if (p.mode == kGreedy) {
        break;  // Algorithm 1 stops at the first candidate that does not improve Theta
      }
    }
  } else if (p.mode == kFixed) {
    const int64_t want = p.budget_in ? int64_t(*p.budget_in) : p.fixed_budget;
    budget = std::max(b_min, std::min(want, b_max));
  } else if (p.mode != kAll) {
    return kErrBadArgument;
  }
  const uint64_t prefix = order.prefix(budget);

  *p.budget_out = int32_t(budget);
  if (p.expected_tokens)
    *p.expected_tokens = float(double((uint64_t(R) << 32) + prefix) / kFixedOne);
  if (!p.write_plan) return kOk;  // choose_budget: budget only

  // ---- allocation: a request's verified drafts are its candidates ranked before the threshold key ----
  const Threshold threshold(order.threshold(budget, n_cand), order.tie_before(budget));
  grow(ws.lens, size_t(R) + 1);
  int32_t* lens = ws.lens.data();
  const int64_t T_pad = p.num_tokens_padded;
  int64_t tok = 0;  // local token index (global index - token_offset)
  // Counts first, offsets second: the running offset depends on every count, and computing both in one
  // loop would chain each request's vector count into the next request's stores.
  if (threshold.none) {
    for (int32_t r = 0; r < R; ++r) lens[r] = caps[r];
  } else if (!threshold.tie && K % 8 == 0) {
    count_above(words, n_padded, K, threshold.u, lens, ws.group_counts);
  } else {
    for (int32_t r = 0; r < R; ++r) lens[r] = threshold.count_before(words + int64_t(r) * K, K, r);
  }
  std::memcpy(p.verify_lens, lens, size_t(R) * sizeof(int32_t));
  if (p.query_start_loc && p.token_req) {
    tok = write_token_runs(p.query_start_loc, p.token_req, lens, R, K, p.token_offset, T_pad);
  } else {
    for (int32_t r = 0; r < R; ++r) {
      if (p.query_start_loc) p.query_start_loc[r] = int32_t(p.token_offset + tok);
      if (p.token_req) write_run(p.token_req + tok, T_pad - tok, 1 + lens[r], K + 1, r, 0);
      tok += 1 + lens[r];
    }
  }
  if (p.token_req)
    for (int64_t t = tok; t < T_pad; ++t) p.token_req[t] = -1;
  const int32_t end = int32_t(p.token_offset + tok);
  for (int32_t r = R; r < p.num_reqs_padded; ++r) {
    p.verify_lens[r] = 0;
    if (p.query_start_loc) p.query_start_loc[r] = end;
    if (p.seq_lens) p.seq_lens[r] = 0;
  }
  if (p.query_start_loc) p.query_start_loc[p.num_reqs_padded] = end;
  if (p.num_tokens) *p.num_tokens = end;

  // ---- metadata: one loop per output; runs of a request's tokens are written as whole vectors ----
  if (p.seq_lens)
    for (int32_t r = 0; r < R; ++r) p.seq_lens[r] = (p.context_lens ? p.context_lens[r] : 0) + 1 + lens[r];
  if (p.positions) {
    int64_t t = 0;
    for (int32_t r = 0; r < R; t += 1 + lens[r], ++r)
      write_run(p.positions + t, T_pad - t, 1 + lens[r], K + 1, p.context_lens ? p.context_lens[r] : 0, 1);
    for (; t < T_pad; ++t) p.positions[t] = 0;
  }
  bool slot_error = false;
  if (p.slot_mapping) {
    int64_t t = 0;
    for (int32_t r = 0; r < R; ++r) {
      const int32_t ctx = p.context_lens ? p.context_lens[r] : 0;
      for (int32_t i = 0; i <= lens[r]; ++i, ++t) {
        const int64_t slot = slot_of(p.block_table + int64_t(r) * p.block_table_stride, p.max_blocks,
                                     p.block_size, int64_t(ctx) + i);
        slot_error |= slot < 0;
        p.slot_mapping[t] = slot;
      }
    }
    for (; t < p.num_tokens_padded; ++t) p.slot_mapping[t] = -1;
  }
  if (p.input_ids) {
    int64_t t = 0;
    for (int32_t r = 0; r < R; ++r) {
      p.input_ids[t++] = p.anchor_tokens[r];
      const int32_t* drafts = p.draft_tokens + int64_t(r) * p.draft_tokens_stride;
      for (int32_t i = 0; i < lens[r]; ++i) p.input_ids[t++] = drafts[i];
    }
    for (; t < p.num_tokens_padded; ++t) p.input_ids[t] = 0;
  }
  return slot_error ? kErrBlockTableTooShort : kOk;
}

}  // namespace planner
}  // namespace adaptive_verify
