// C++ CPU planner: the one planner algorithm (algorithm.h) with a sequential backend, and prefix_survival.
//
// NOTES: the backend is one thread, so the algorithm's strided loops are plain loops, its reductions are the
// values themselves and its barriers nothing. Where a phase is hot, the backend computes it with SIMD
// ("where it pays"), producing exactly the generic phase's result (the tests compare both against the torch
// reference, and the CUDA kernel, which runs the generic phases, against this one):
//  - walk: rows whose every slot is a candidate and none forced (the common case; draft tokens may be given if
//    none is invalidated) take an AVX2 (checked at run time) or SSE2 vector walk: MAXPS/MINPS against 0 and 1
//    give sanitize() exactly (they return the second operand for NaN and for +-0), the running minimum is a
//    prefix minimum inside each vector carried across
//    vectors; the same pass stores each slot's bucket and survival * 2^32, so the histogram that follows is
//    one scalar loop (two copies of the counters, so consecutive slots never wait on each other's add; below
//    2^16 slots a bucket's count and sum share one word). Other rows, and rows with a NaN, take walk_row.
//  - gather (materialise): blocks of 16 words tested with vector compares, only blocks with a hit looked at.
//  - allocation: with no tie at the threshold and K % 8 == 0, PSADBW sums eight compares at once.
//  - metadata: each request's run of tokens is written as whole vectors.
//  - the in-bucket sort: insertion sort for the handful of keys a bucket usually holds, an LSD radix sort
//    over the key bits that vary for big buckets (exact ties, tiny survivals below the resolved octaves).
//  - the conf= prologue (chains, K % 8 == 0, AVX2): eight rows at a time, transposed so each lane runs one row's
//    left-to-right product (plan_cpu; the same bits as survival_row).
//  - slot_mapping: one division per request, the block and offset stepped along its run of tokens.
// Draft trees (Params::parents): rows are not prefixes, so the vector forms above do not apply. The walk is
// walk_tree_row per request feeding the same histogram; the allocation is the generic one; the metadata walks each
// request's verified nodes in order, keeping each node's offset and mask (the generic version, for a block's threads
// taking tokens in parallel, recomputes them per token by climbing the parents: the same values, measured 10x
// slower at R=256, N=63 here). The gather and the in-bucket sort are shared, with the tree key.
// Scratch is thread_local and reused: a decode loop plans every step, so steady state allocates nothing.
// At R=256, K=8 (2048 candidates) on this project's 2-core CI machine, a plan from confidences with metadata takes
// about 11 us and a global choose_budget about 11 us (2026-12-02, benchmarks/results/2026-12-02-cpu-verifier-host-3.md).
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

#include "adaptive_verify/planner/algorithm.h"
#include "adaptive_verify/planner/cpu.h"

namespace adaptive_verify {
namespace planner {

int prefix_survival_cpu(const SurvivalParams& p) {
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t size = p.drafts[r];
    if (size < 0 || size > p.max_drafts) return kErrDraftsOutOfRange;  // before any output
    if (p.parents == nullptr) continue;
    const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
    for (int32_t j = 0; j < size; ++j)
      if (par[j] < -1 || par[j] >= j) return kErrBadParent;
  }
  int32_t nan_count = 0, bad_parents = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const float* conf = p.conf + int64_t(r) * p.conf_stride;
    float* out = p.survival + int64_t(r) * p.max_drafts;
    nan_count += p.parents != nullptr ? tree_survival_row(conf, p.parents + int64_t(r) * p.parents_stride, p.drafts[r],
                                                          p.max_drafts, out, &bad_parents)
                                      : survival_row(conf, p.drafts[r], p.max_drafts, out);
  }
  if (nan_count && p.error_counts) p.error_counts[kCountNanSurvival] += nan_count;
  return kOk;
}

namespace {

#if defined(AV_PLANNER_AVX2)
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// ---- walk ----
// Every row marked full (caps[r] == K: every slot a candidate, none forced) as walk_row computes it, with each
// slot's bucket and survival * 2^32 (the argument of to_fixed). A row holding a NaN is marked caps[r] = -1 and
// left to walk_row.
#if defined(__SSE2__)
void walk_full_rows_sse2(const Params& p, const Buckets& bk, int32_t* words, uint16_t* bucket, float* fixed,
                         int32_t* caps) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.f), scale = _mm_set1_ps(4294967296.0f);
  const __m128i one_bits = _mm_set1_epi32(int32_t(kOneBits));
  // Bucket arithmetic in 16-bit lanes: (kOneBits - bits) >> shift < 2^14 because shift >= 16.
  const __m128i last16 = _mm_set1_epi16(int16_t(bk.per_half - 1)), nf16 = _mm_set1_epi16(int16_t(bk.nf_offset));
  const __m128i shift = _mm_cvtsi32_si128(bk.shift);
  for (int32_t r = 0; r < R; ++r) {
    if (caps[r] != K) continue;
    const float* row = p.survival + int64_t(r) * p.survival_stride;
    const int64_t o = int64_t(r) * K;
    __m128 running = one;
    for (int32_t v = 0; v < K; v += 4) {
      const __m128 raw = _mm_loadu_ps(row + v);
      if (_mm_movemask_ps(_mm_cmpunord_ps(raw, raw))) {
        caps[r] = -1;
        break;
      }
      __m128 s = _mm_min_ps(_mm_max_ps(raw, zero), one);
      s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(2, 1, 0, 0)));
      s = _mm_min_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 0, 0, 0)));
      s = _mm_min_ps(s, running);
      running = _mm_shuffle_ps(s, s, _MM_SHUFFLE(3, 3, 3, 3));
      const __m128i bits = _mm_castps_si128(s);
      __m128i q = _mm_packs_epi32(_mm_srl_epi32(_mm_sub_epi32(one_bits, bits), shift), _mm_setzero_si128());
      q = _mm_add_epi16(_mm_min_epi16(q, last16), nf16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + o + v), bits);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(bucket + o + v), q);
      _mm_storeu_ps(fixed + o + v, _mm_mul_ps(s, scale));
    }
  }
}
#endif

#if defined(AV_PLANNER_AVX2)
__attribute__((target("avx2"))) void walk_full_rows_avx2(const Params& p, const Buckets& bk, int32_t* words,
                                                         uint16_t* bucket, float* fixed, int32_t* caps) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f), scale = _mm256_set1_ps(4294967296.0f);
  const __m256i one_bits = _mm256_set1_epi32(int32_t(kOneBits)), last = _mm256_set1_epi32(bk.per_half - 1);
  const __m256i nf_offset = _mm256_set1_epi32(bk.nf_offset);
  const __m256i low_to_high = _mm256_setr_epi32(0, 1, 2, 3, 3, 3, 3, 3), top = _mm256_set1_epi32(7);
  const __m128i shift = _mm_cvtsi32_si128(bk.shift);
  const float* survival = p.survival;  // locals, so no store in the loop makes the compiler reload them
  const int64_t stride = p.survival_stride;
  for (int32_t r = 0; r < R; ++r) {
    if (caps[r] != K) continue;
    const float* row = survival + int64_t(r) * stride;
    const int64_t o = int64_t(r) * K;
    __m256 running = one;
    for (int32_t v = 0; v < K; v += 8) {
      const __m256 raw = _mm256_loadu_ps(row + v);
      if (_mm256_movemask_ps(_mm256_cmp_ps(raw, raw, _CMP_UNORD_Q))) {
        caps[r] = -1;
        break;
      }
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
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bucket + o + v),
                       _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
      _mm256_storeu_ps(fixed + o + v, _mm256_mul_ps(s, scale));
    }
  }
}
#endif

// Whether none of row[0..n) is negative (an invalidated draft): the sign bit of their OR, four at a time.
inline bool none_negative(const int32_t* row, int32_t n) {
  int32_t any = 0, i = 0;
#if defined(__SSE2__)
  __m128i acc = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) acc = _mm_or_si128(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
  any = _mm_movemask_ps(_mm_castsi128_ps(acc)) ? -1 : 0;
#endif
  for (; i < n; ++i) any |= row[i];
  return any >= 0;
}

template <typename T>
void grow(std::vector<T>& v, size_t n) {  // never shrinks, so steady state neither allocates nor clears
  if (v.size() < n) v.resize(n);
}

constexpr int64_t kPackedSlots = int64_t(1) << 16;
constexpr uint64_t kPackedOne = uint64_t(1) << 48;

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


struct CpuBackend {
  static constexpr bool kStrict = true;          // bad inputs are statuses (ValueError), not counters
  static constexpr int64_t kFirstScanChunk = 8;  // greedy usually stops within a few ranks

  std::vector<unsigned char> workspace;
  std::vector<uint64_t> keys, scratch, hist;
  std::vector<uint16_t> slot_bucket;
  std::vector<float> slot_fixed;
  std::vector<int32_t> caps, group_counts, lens_tmp, kept_words;

  int tid() const { return 0; }
  int threads() const { return 1; }
  void sync() {}
  uint64_t sum(uint64_t v) { return v; }
  int64_t min(int64_t v) { return v; }
  uint64_t exclusive_scan(uint64_t v, uint64_t* total) {
    *total = v;
    return 0;
  }
  void argmax(double t, int64_t b, double* t_out, int64_t* b_out) {
    *t_out = t;
    *b_out = b;
  }
  int32_t fetch_add(int32_t* a, int32_t v) {
    const int32_t old = *a;
    *a += v;
    return old;
  }
  template <typename T>
  void add(T* a, T v) {
    *a += v;
  }
  void count_error(int32_t* counters, int slot, int32_t n) {
    if (counters != nullptr) counters[slot] += n;
  }

  // choose_tree_shape's widths: the walk's words kept once, put back for each narrower width (instead of walking
  // again: the same words, and the histogram the walk would count is counted again by the width's first shape).
  void keep_words(const Workspace& ws, int64_t n_slots) {
    if (n_slots <= 0) return;  // (an empty batch: no copy, and no null pointer handed to memcpy)
    grow(kept_words, size_t(n_slots));
    std::memcpy(kept_words.data(), ws.words, size_t(n_slots) * sizeof(int32_t));
  }
  void restore_words(const Params&, const Workspace& ws, const Buckets&, int64_t n_slots) {
    if (n_slots > 0) std::memcpy(ws.words, kept_words.data(), size_t(n_slots) * sizeof(int32_t));
  }
  WalkTotals walk_and_count(const Params& p, const Workspace& ws, const Buckets& bk) {
    const int32_t R = p.num_reqs, K = p.max_drafts;
    const int64_t n_slots = int64_t(R) * K, n_padded = (n_slots + 15) / 16 * 16;
    grow(slot_bucket, size_t(n_slots));
    grow(slot_fixed, size_t(n_slots));
    grow(caps, size_t(R));
    std::memset(ws.ready, 0, size_t(bk.num));
    std::memset(ws.keep, 0, size_t(bk.num));
    WalkTotals t{0, 0, 0, 0, 0, 0};
    // Rows whose every slot is a candidate and none forced take the vector walk; the window check (drafts in
    // range, max_verify) is the scalar part. A row with an invalidated draft (a negative draft_tokens entry) and
    // weights send rows to walk_row, and so does a tree (walk_tree_row).
    const bool tree = p.parents != nullptr;
    const bool vec = p.min_verify <= 0 && K % 4 == 0 && p.weights == nullptr && !tree;
    int32_t full = 0;
    for (int32_t r = 0; r < R; ++r) {
      const int32_t drafts = p.drafts[r];
      // With draft_tokens, a row none of whose K tokens is invalidated (negative) has the window it has without.
      const bool is_full =
          vec && drafts == K && p.max_verify == K &&
          (p.draft_tokens == nullptr || none_negative(p.draft_tokens + int64_t(r) * p.draft_tokens_stride, K));
      caps[r] = is_full ? K : -1;
      full += is_full;
    }
    if (full) {
#if defined(AV_PLANNER_AVX2)
      if (K % 8 == 0 && cpu_has_avx2()) {
        walk_full_rows_avx2(p, bk, ws.words, slot_bucket.data(), slot_fixed.data(), caps.data());
      } else
#endif
      {
#if defined(__SSE2__)
        walk_full_rows_sse2(p, bk, ws.words, slot_bucket.data(), slot_fixed.data(), caps.data());
#else
        for (int32_t r = 0; r < R; ++r) caps[r] = -1;
#endif
      }
    }
    for (int32_t r = 0; r < R; ++r) {
      if (caps[r] < 0) {  // walk_row (walk_tree_row), then the histogram's inputs from its words
        const int64_t o = int64_t(r) * K;
        if (tree) {
          const TreeWalk w = walk_tree_row(p, r, ws.words + o, ws.depth + o,
                                            p.weights != nullptr ? request_weight(p, r, ws.wscale) : 1.f);
          if (w.bad_size || w.bad_parents || w.duplicates) {  // strict: the plan stops before writing anything
            t.bad_drafts = w.bad_size;
            t.bad_parents = w.bad_parents;
            t.duplicates = w.duplicates;
            return t;
          }
          t.nan_rows += w.nan;
          t.forced += w.forced;
          caps[r] = w.cand;
        } else {
          const RowWalk w = walk_row(p, r, ws.words + o, ws.wscale);
          if (w.bad_drafts) {
            t.bad_drafts = 1;  // strict: the plan stops before writing anything
            return t;
          }
          t.nan_rows += w.nan;
          caps[r] = w.cap;
        }
        for (int32_t j = 0; j < K; ++j) {  // slots without a candidate count in the dummy bucket bk.num
          const int32_t u = ws.words[o + j];
          slot_bucket[size_t(o + j)] = uint16_t(u >= 0 ? bk.of(u) : bk.num);
          slot_fixed[size_t(o + j)] = u >= 0 ? word_survival(u) * 4294967296.0f : 0.f;
        }
      }
      t.cand += caps[r];
    }
    if (p.min_verify > 0 && !tree)  // a tree's forced nodes are counted by its walk
      for (int32_t r = 0; r < R; ++r) t.forced += p.min_verify < caps[r] ? p.min_verify : caps[r];
    for (int64_t i = n_slots; i < n_padded; ++i) ws.words[i] = kNoSlot;
    // Below 2^16 slots a bucket's count and survival sum share one word (count << 48: sums stay below
    // 2^16 * 2^32), in two copies so consecutive slots never wait on each other's add.
    const uint16_t* sb = slot_bucket.data();
    const float* sf = slot_fixed.data();
    if (n_slots < kPackedSlots) {
      if (hist.size() < 2 * (size_t(bk.num) + 1)) hist.resize(2 * (size_t(bk.num) + 1));
      uint64_t* h1 = hist.data();
      uint64_t* h2 = h1 + bk.num + 1;
      std::memset(h1, 0, 2 * (size_t(bk.num) + 1) * sizeof(uint64_t));
      int64_t i = 0;
      for (; i + 1 < n_slots; i += 2) {
        h1[sb[i]] += kPackedOne + uint64_t(static_cast<int64_t>(sf[i]));
        h2[sb[i + 1]] += kPackedOne + uint64_t(static_cast<int64_t>(sf[i + 1]));
      }
      if (i < n_slots) h1[sb[i]] += kPackedOne + uint64_t(static_cast<int64_t>(sf[i]));
      for (int32_t k = 0; k < bk.num; ++k) {
        const uint64_t w = h1[k] + h2[k];
        ws.count[k] = int32_t(w >> 48);
        ws.sum[k] = w & (kPackedOne - 1);
      }
      ws.count[bk.num] = 0;
      ws.sum[bk.num] = 0;
    } else {
      std::memset(ws.count, 0, (size_t(bk.num) + 1) * sizeof(int32_t));
      std::memset(ws.sum, 0, (size_t(bk.num) + 1) * sizeof(uint64_t));
      for (int64_t i = 0; i < n_slots; ++i) {
        if (sb[i] == bk.num) continue;
        ++ws.count[sb[i]];
        ws.sum[sb[i]] += uint64_t(static_cast<int64_t>(sf[i]));
      }
    }
    return t;
  }

  void gather(const Workspace& ws, const Buckets& bk, int64_t n_slots, int32_t lo, int32_t hi) {
    const int64_t n_padded = (n_slots + 15) / 16 * 16;
    int32_t* fill = ws.fill;
    int32_t* sorted = ws.sorted;
    auto put = [&](int64_t i) { sorted[fill[bk.of(ws.words[i])]++] = int32_t(i); };
#if defined(AV_PLANNER_AVX2)
    if (cpu_has_avx2()) {
      for_each_hit_avx2(ws.words, n_padded, lo, hi, put);
      return;
    }
#endif
    for_each_hit(ws.words, n_padded, lo, hi, put);
  }

  void count_verified(const Params& p, const Workspace& ws, const Threshold& th) {
    if (p.parents != nullptr) return generic_count_verified(p, *this, ws, th);
    const int32_t R = p.num_reqs, K = p.max_drafts;
    if (th.none) {
      if (R > 0) std::memcpy(ws.lens, caps.data(), size_t(R) * sizeof(int32_t));  // (R = 0: caps.data() is null)
    } else if (!th.tie && K % 8 == 0 && R > 0) {  // no tie: a row's count is its words above the threshold
      const int64_t n_padded = (int64_t(R) * K + 15) / 16 * 16;
      grow(lens_tmp, size_t(n_padded / 8 + 1));  // count_above writes every padded group (K == 8)
      count_above(ws.words, n_padded, K, th.u, lens_tmp.data(), group_counts);
      std::memcpy(ws.lens, lens_tmp.data(), size_t(R) * sizeof(int32_t));  // (R > 0 here)
    } else {
      for (int32_t r = 0; r < R; ++r) ws.lens[r] = count_before(th, ws.words + int64_t(r) * K, K, r, caps[size_t(r)]);
    }
    if (R > 0) std::memcpy(p.verify_lens, ws.lens, size_t(R) * sizeof(int32_t));  // (R = 0: an empty tensor's null data)
  }

  // A tree's tokens request by request, each node's offset and mask kept for its children (parents come first).
  MetadataTotals write_tree_metadata(const Params& p, const Workspace& ws) {
    const int32_t R = p.num_reqs, N = p.max_drafts;
    int64_t tok = 0, slot_errors = 0;
    int32_t offset_of[kMaxTreeNodes];
    uint64_t mask_of[kMaxTreeNodes];
    for (int32_t r = 0; r < R; ++r) {
      const int32_t ctx = p.context_lens != nullptr ? p.context_lens[r] : 0;
      if (p.query_start_loc != nullptr) p.query_start_loc[r] = int32_t(p.token_offset + tok);
      if (p.seq_lens != nullptr) p.seq_lens[r] = ctx + 1 + ws.lens[r];
      const int32_t* par = p.parents + int64_t(r) * p.parents_stride;
      const uint8_t* depth = ws.depth + int64_t(r) * N;
      slot_errors += !write_tree_token_fields(p, r, 0, tok++, -1, 0, -1, 1);
      int32_t i = 1;
      for (uint64_t rest = ws.verified[r]; rest; rest &= rest - 1, ++i, ++tok) {
        const int32_t node = lowest_bit64(rest), pn = par[node];
        const uint64_t mask = (pn < 0 ? uint64_t(1) : mask_of[pn]) | (uint64_t(1) << i);
        offset_of[node] = i;
        mask_of[node] = mask;
        slot_errors += !write_tree_token_fields(p, r, i, tok, node, depth[node], pn < 0 ? 0 : offset_of[pn], mask);
      }
    }
    for (int64_t t = tok; t < p.num_tokens_padded; ++t) {
      if (p.token_req != nullptr) p.token_req[t] = -1;
      if (p.positions != nullptr) p.positions[t] = 0;
      if (p.slot_mapping != nullptr) p.slot_mapping[t] = -1;
      if (p.input_ids != nullptr) p.input_ids[t] = 0;
      write_tree_padding(p, t);
    }
    return MetadataTotals{tok, slot_errors};
  }

  MetadataTotals write_metadata(const Params& p, const Workspace& ws) {
    if (p.parents != nullptr) return write_tree_metadata(p, ws);
    const int32_t R = p.num_reqs, K = p.max_drafts;
    const int32_t* lens = ws.lens;
    const int64_t T_pad = p.num_tokens_padded;
    int64_t tok = 0;
    if (p.query_start_loc != nullptr && p.token_req != nullptr) {
      tok = write_token_runs(p.query_start_loc, p.token_req, lens, R, K, p.token_offset, T_pad);
    } else {
      for (int32_t r = 0; r < R; ++r) {
        if (p.query_start_loc != nullptr) p.query_start_loc[r] = int32_t(p.token_offset + tok);
        if (p.token_req != nullptr) write_run(p.token_req + tok, T_pad - tok, 1 + lens[r], K + 1, r, 0);
        tok += 1 + lens[r];
      }
    }
    if (p.token_req != nullptr)
      for (int64_t t = tok; t < T_pad; ++t) p.token_req[t] = -1;
    if (p.seq_lens != nullptr)
      for (int32_t r = 0; r < R; ++r) p.seq_lens[r] = (p.context_lens != nullptr ? p.context_lens[r] : 0) + 1 + lens[r];
    if (p.positions != nullptr) {
      int64_t t = 0;
      for (int32_t r = 0; r < R; t += 1 + lens[r], ++r)
        write_run(p.positions + t, T_pad - t, 1 + lens[r], K + 1, p.context_lens != nullptr ? p.context_lens[r] : 0, 1);
      for (; t < T_pad; ++t) p.positions[t] = 0;
    }
    int64_t slot_errors = 0;
    if (p.slot_mapping != nullptr) {
      // slot_of per token, with one division per request: the block and the offset in it step along the run
      // (context lengths are validated non-negative, so every position is).
      int64_t t = 0;
      const int32_t bs = p.block_size;
      for (int32_t r = 0; r < R; ++r) {
        const int32_t ctx = p.context_lens != nullptr ? p.context_lens[r] : 0;
        const int32_t* block_row = p.block_table + int64_t(r) * p.block_table_stride;
        int32_t blk = ctx / bs, off = ctx % bs;
        for (int32_t i = 0; i <= lens[r]; ++i, ++t) {
          const int64_t slot = blk < p.max_blocks ? int64_t(block_row[blk]) * bs + off : -1;
          slot_errors += slot < 0;
          p.slot_mapping[t] = slot;
          if (++off == bs) {
            off = 0;
            ++blk;
          }
        }
      }
      for (; t < T_pad; ++t) p.slot_mapping[t] = -1;
    }
    if (p.input_ids != nullptr) {
      int64_t t = 0;
      for (int32_t r = 0; r < R; ++r) {
        p.input_ids[t++] = p.anchor_tokens[r];
        const int32_t* drafts = p.draft_tokens + int64_t(r) * p.draft_tokens_stride;
        for (int32_t i = 0; i < lens[r]; ++i) p.input_ids[t++] = drafts[i];
      }
      for (; t < T_pad; ++t) p.input_ids[t] = 0;
    }
    // A tree batch without requests arrives here (an empty parents tensor has no data pointer): its tree outputs
    // are all padding lanes, written like every other padded buffer (a chain's tree pointers are null: a no-op).
    for (int64_t t = tok; t < T_pad && p.tree_mask != nullptr; ++t) write_tree_padding(p, t);
    return MetadataTotals{tok, slot_errors};
  }

  // Orders each bucket of [k0, k1) by candidate key (the slots arrive in slot order).
  void sort_buckets(const Workspace& ws, const Buckets& bk, int32_t K, int32_t k0, int32_t k1) {
    (void)bk;
    const bool tree = ws.depth != nullptr;
    for (int32_t k = k0; k < k1; ++k) {
      const int64_t b = ws.count[k], n = ws.count[k + 1] - b;
      if (n <= 1) continue;
      if (keys.size() < size_t(n)) keys.resize(size_t(n));
      int32_t* slots = ws.sorted + b;
      if (tree) {
        for (int64_t i = 0; i < n; ++i) keys[size_t(i)] = slot_key(ws, ws.words[slots[i]], slots[i], K);
      } else {
        for (int64_t i = 0; i < n; ++i) keys[size_t(i)] = slot_key(ws.words[slots[i]], slots[i], K);
      }
      sort_keys(keys.data(), n, scratch);
      for (int64_t i = 0; i < n; ++i) {  // key -> slot: request and position (node) are its low fields
        const uint64_t key = keys[size_t(i)];
        if (tree) {
          slots[i] = int32_t(int64_t(tree_key_req(key)) * K + tree_key_node(key));
          continue;
        }
        const int64_t r = int64_t(key & ((uint64_t(1) << kReqBits) - 1));
        slots[i] = int32_t(r * K + int64_t((key >> kReqBits) & uint64_t(kMaxDrafts - 1)));
      }
    }
  }
};

// Reused across calls. Fetched through a non-inlined call: in a shared library every thread_local access
// is a __tls_get_addr call, and once inlined GCC re-derives the address inside the hot loops.
__attribute__((noinline)) CpuBackend* thread_backend() {
  thread_local CpuBackend be;
  return &be;
}

#if defined(AV_PLANNER_AVX2)
// In-place transpose of an 8 x 8 float block held in eight vectors.
__attribute__((target("avx2"))) inline void transpose8(__m256* v) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// plan's conf= prologue for chains with K % 8 == 0 and drafts already checked in [0, K]: survival_out =
// survival_row(conf) of every row, eight rows at a time. A transpose puts each row in a lane, so each lane runs
// survival_row's own left-to-right product (the same roundings, so the same bits); MAXPS/MINPS against 0 and 1 are
// sanitize(). Leftover rows take survival_row. Returns the NaN confidences among drafted positions.
__attribute__((target("avx2"))) int32_t conf_survival_avx2(const Params& p) {
  const int32_t R = p.num_reqs, K = p.max_drafts;
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f);
  int32_t nan_count = 0;
  int32_t r = 0;
  for (; r + 8 <= R; r += 8) {
    // drafts of the eight rows; position j is drafted in lane i when j < drafts[r + i]
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.drafts + r));
    __m256 a = one;
    for (int32_t c = 0; c < K; c += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(p.conf + int64_t(r + i) * p.conf_stride + c);
      transpose8(v);  // v[j]: position c + j of the eight rows
      for (int j = 0; j < 8; ++j) {
        const __m256 drafted = _mm256_castsi256_ps(_mm256_cmpgt_epi32(d, _mm256_set1_epi32(c + j)));
        nan_count += __builtin_popcount(
            unsigned(_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q), drafted))));
        const __m256 s = _mm256_min_ps(_mm256_max_ps(v[j], zero), one);
        a = _mm256_blendv_ps(a, _mm256_mul_ps(a, s), drafted);
        v[j] = _mm256_and_ps(a, drafted);  // 0 past the drafts
      }
      transpose8(v);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(p.survival_out + int64_t(r + i) * K + c, v[i]);
    }
  }
  for (; r < R; ++r)
    nan_count += survival_row(p.conf + int64_t(r) * p.conf_stride, p.drafts[r], K, p.survival_out + int64_t(r) * K);
  return nan_count;
}
#endif

}  // namespace

int plan_cpu(const Params& p_in) {
  CpuBackend& be = *thread_backend();
  Params p = p_in;
#if defined(AV_PLANNER_AVX2)
  // The conf= prologue of chains, vectorised here (the generic one is a scalar product per row): plan then runs on
  // the survival it wrote, exactly as after the generic prologue. Inputs plan() refuses before writing (drafts out of
  // range, bad context lengths) keep the generic path, which reports them.
  if (p.conf != nullptr && p.parents == nullptr && p.max_drafts % 8 == 0 && p.num_reqs >= 8 && cpu_has_avx2()) {
    // (ORs of whole-row tests, no early exit, so the loops vectorise)
    uint32_t bad = 0;
    for (int32_t r = 0; r < p.num_reqs; ++r) bad |= uint32_t(p.drafts[r] > p.max_drafts || p.drafts[r] < 0);
    if (p.write_plan && p.context_lens != nullptr)  // plan() refuses these before writing anything
      for (int32_t r = 0; r < p.num_reqs; ++r) bad |= uint32_t(!context_len_ok(p.context_lens[r]));
    if (!bad) {
      const int32_t nan_count = conf_survival_avx2(p);
      if (nan_count) be.count_error(p.error_counts, kCountNanSurvival, nan_count);
      p.conf = nullptr;
      p.survival = p.survival_out;
      p.survival_stride = p.max_drafts;
    }
  }
#endif
  const int64_t n_slots = int64_t(p.num_reqs) * p.max_drafts;
  const Buckets bk = Buckets::make(n_slots, p.min_verify > 0);
  const WorkspaceLayout layout = workspace_layout(n_slots, bk.num, p.num_reqs, 1, false, p.parents != nullptr);
  if (be.workspace.size() < size_t(layout.bytes)) be.workspace.resize(size_t(layout.bytes));
  const Workspace ws = carve_workspace(be.workspace.data(), layout);
  return p.choose_depth ? plan<CpuBackend, true>(p, be, ws) : plan(p, be, ws);
}

}  // namespace planner
}  // namespace adaptive_verify
