// The rejection sampler's control flow for one request, shared by the CPU kernel and the CUDA kernel.
// A Backend supplies the row-wide reductions (sequential on the CPU, block-wide on the GPU, returning
// the same value to every thread); everything else here runs identically on both.
#pragma once

#include <cstdint>

#include "adaptive_verify/dtype.h"
#include "adaptive_verify/sampling/math.h"
#include "adaptive_verify/sampling/params.h"

namespace adaptive_verify {
namespace sampling {

// With u in [2^-24, 1 - 2^-24], Gumbel noise lies in [-log(-log 2^-24), -log(-log(1 - 2^-24))] =
// [-2.82, 16.64], so a logit more than 19.46 below the row's max (after temperature) can never win a race:
// it is skipped without drawing its random number. Exact: skipping changes no argmax.
constexpr float kRaceWindow = 20.25f;

// ---- non-finite logits (docs/design.md, "Non-finite logits") ----
//
// One rule for every decision (greedy, races, draft-probability tests, residuals, truncation, logprobs), on
// the scaled logits z = x / T:
//   - NaN never wins and is counted (once per row read for a decision);
//   - a row whose largest z is +inf samples from the limit of softmax as those logits grow: the +inf logits
//     share the mass equally and every other token gets none. It is realised by working with limit logits:
//     +inf -> 0, every other number -> -inf (NaN stays NaN), and 0 as the row's max, so the same arithmetic
//     below gives p = 1/n on the n +inf logits (a race among them alone, ties of rank broken by id);
//   - a row with no number above -inf (only -inf and NaN) emits id 0, with logprob -inf.
// Rows without +inf see z unchanged, bit for bit. `m` below is always the row's raw max scaled logit (what
// max_scaled returns); every use of z goes through scaled_logit and every subtraction of the max through
// softmax_max, so that the rule lives in these two functions.
AV_HD float scaled_logit(float x, float temp, float m) {
  const float z = fdiv(x, temp);
  if (m != INFINITY) return z;
  return z == INFINITY ? 0.f : (z == z ? -INFINITY : z);
}
AV_HD float softmax_max(float m) { return m == INFINITY ? 0.f : m; }

struct SoftmaxStats {
  float max;  // the row's raw max scaled logit (+inf: limit logits; -inf when the row has no number)
  float sum;  // canonical sum of av_exp(z_v - softmax_max(max)) over the kept limit logits z_v
};

// ---- truncation: min-p, then top-k, then top-p (vLLM's order) ----
//
// Rank order of a row: logit z = row[v] / T descending, then id ascending (ties keep the lower ids). Every
// filter keeps a prefix of that order, so a kept set is given by the largest rank key it keeps ("limit"):
//   min-p: z_v >= m + av_log(min_p) (p_v >= min_p * p_max, on the scaled logits);
//   top-k: the first k tokens of the min-p set;
//   top-p: on the top-k set, masses f_v = fixed(av_exp(z_v - m)) (32.32 fixed point, so sums are exact in any
//          order), M their sum: the first tokens up to and including the one where the cumulative mass reaches
//          top_p * M (compared in double; M = 0 keeps the set as it is).
// The target is softmax(z) restricted to the kept set and renormalised; greedy rows ignore truncation (the
// argmax is always kept). Selections walk the key 8 bits at a time with exact integer histograms (no sort of
// the vocabulary, no probability tensor): each level is one pass over the row.
constexpr uint64_t kKeepAll = ~uint64_t(0);

struct Truncation {
  int32_t top_k = 0;    // 0 (or >= V): off
  float top_p = 1.f;    // 1: off
  float min_p = 0.f;    // 0: off
  bool bad = false;     // a value outside its range was turned off (the caller counts it)
  AV_HD bool active() const { return top_k > 0 || top_p < 1.f || min_p > 0.f; }
};

// The request's filters; out-of-range values (top_k < 0, top_p outside (0, 1], min_p outside [0, 1], NaN) are
// off and flagged.
AV_HD Truncation truncation_of(const int32_t* top_k, const float* top_p, const float* min_p, int64_t i, int64_t V) {
  Truncation t;
  if (top_k != nullptr) {
    const int32_t k = top_k[i];
    t.bad |= k < 0;
    t.top_k = k > 0 && int64_t(k) < V ? k : 0;
  }
  if (top_p != nullptr) {
    const float pv = top_p[i];
    const bool ok = pv > 0.f && pv <= 1.f;  // NaN fails both
    t.bad |= !ok;
    t.top_p = ok ? pv : 1.f;
  }
  if (min_p != nullptr) {
    const float mv = min_p[i];
    const bool ok = mv >= 0.f && mv <= 1.f;
    t.bad |= !ok;
    t.min_p = ok && mv >= 1.17549435e-38f ? mv : 0.f;  // below the smallest normal float: off (av_log needs one)
  }
  return t;
}

// Rank key of token v with scaled logit z (not NaN): ascending key = z descending, then v ascending.
AV_HD uint64_t rank_key(float z, int64_t v) {
  uint32_t b = float_bits(z == 0.f ? 0.f : z);  // -0 ranks as +0
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ascending in z
  return (uint64_t(~b) << 32) | uint64_t(uint32_t(v));
}


// One level of a selection: per bucket of the key's bits [shift, shift + 8), among tokens kept by `limit`
// whose key agrees with `prefix` above the level: their count, mass (when asked) and smallest / largest key.
// With masses, tokens of mass 0 are left out (they never end a top-p prefix).
struct RankHist {
  uint32_t count[256];
  unsigned long long mass[256];
  unsigned long long lo[256], hi[256];
};

// What one token adds to a level's histogram; returns its bucket, or -1 when it is not in this level.
// z: scaled_logit(x, temp, m).
AV_HD int rank_bucket(float z, int64_t v, float m, uint64_t limit, uint64_t prefix, int shift, bool with_mass,
                      uint64_t* key_out, uint64_t* mass_out) {
  if (z != z) return -1;
  const uint64_t key = rank_key(z, v);
  if (key > limit) return -1;
  if (shift < 56 && (key >> (shift + 8)) != (prefix >> (shift + 8))) return -1;
  uint64_t mass = 0;
  if (with_mass) {
    mass = to_fixed(av_exp(fsub(z, softmax_max(m))));  // a softmax term in [0, 1], summed exactly in any order
    if (mass == 0) return -1;
  }
  *key_out = key;
  *mass_out = mass;
  return int((key >> shift) & 255u);
}

// The key of the token that ends a selection within `limit`: by count, the need-th token (1-based); by mass,
// the first token at which the cumulative mass reaches top_p * M (M the mass within limit, computed on the
// first level). Returns `limit` when the selection keeps everything.
template <typename T, typename Backend>
AV_HD uint64_t select_key(Backend& be, const T* row, int64_t V, float temp, float m, uint64_t limit, bool by_mass,
                          uint64_t need, float top_p) {
  uint64_t prefix = 0, acc_count = 0, acc_mass = 0;
  double target = 0.0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const RankHist& h = be.rank_histogram(row, V, temp, m, limit, prefix, shift, by_mass);
    if (by_mass && shift == 56) {
      uint64_t total = 0;
      for (int b = 0; b < 256; ++b) total += h.mass[b];
      if (total == 0) return limit;  // no mass to take a share of: the set stays as it is
      target = double(top_p) * double(total);
    }
    int b = 0;
    for (; b < 256; ++b) {
      if (h.count[b] == 0) continue;
      const bool ends = by_mass ? double(acc_mass + h.mass[b]) >= target : acc_count + h.count[b] >= need;
      if (ends) break;
      acc_mass += h.mass[b];
      acc_count += h.count[b];
    }
    if (b == 256) return limit;
    if (h.count[b] == 1) return h.lo[b];
    if (!by_mass && acc_count + h.count[b] == need) return h.hi[b];
    prefix |= uint64_t(b) << shift;
  }
  return prefix;
}

// Largest rank key the row keeps under t (kKeepAll: everything). m: the row's largest scaled logit.
template <typename T, typename Backend>
AV_HD uint64_t kept_limit(Backend& be, const T* row, int64_t V, float temp, float m, const Truncation& t) {
  uint64_t limit = kKeepAll;
  if (!(m > -INFINITY)) return limit;  // no number in the row: nothing to rank
  if (t.min_p > 0.f) {
    const float zt = fadd(softmax_max(m), av_log(t.min_p));
    limit = rank_key(zt, 0) | 0xffffffffull;  // every id whose z >= zt
  }
  if (t.top_k > 0) limit = select_key<T>(be, row, V, temp, m, limit, false, uint64_t(t.top_k), 1.f);
  if (t.top_p < 1.f) limit = select_key<T>(be, row, V, temp, m, limit, true, 0, t.top_p);
  return limit;
}

// Whether token v (scaled logit z) is kept under limit.
AV_HD bool kept(float z, int64_t v, uint64_t limit) { return limit == kKeepAll ? z == z : z == z && rank_key(z, v) <= limit; }

// Race score of one logit: z - log(E), E = -log(u), u the race uniform of id v.
AV_HD float race_score(float z, RaceUniforms& u, int64_t v) {
  const float e = -av_log(u.at(uint64_t(v)));
  return fsub(z, av_log(e));
}

// Better (score, id) under "higher score, then smaller id"; NaN scores never win.
AV_HD bool better(float s, int64_t v, float best_s, int64_t best_v) {
  return s > best_s || (s == best_s && v < best_v && best_v >= 0);
}

// Running argmax of logits: ties to the smallest id, NaN ignored (and counted), -inf never a candidate: a row
// with no number above -inf leaves id -1, which every caller turns into id 0 (the non-finite rule's fallback,
// the same id a race over such a row gives).
struct ArgmaxBest {
  float x = -INFINITY;
  int64_t id = -1;
  int32_t nan = 0;
  AV_HD void push(float xv, int64_t v) {
    nan += xv != xv;
    if (xv > x) {
      x = xv;
      id = v;
    }
  }
};

// Running max of temperature-scaled logits, NaN ignored (and counted).
struct ScaledMax {
  float m = -INFINITY;
  int32_t nan = 0;
  AV_HD void push(float z) {
    nan += z != z;
    m = z > m ? z : m;
  }
};

// Running winner of a race over limit-aware logits z (scaled_logit): ids below the window floor
// (softmax_max(m) - kRaceWindow) cannot win and draw no random number; ids past the truncation limit are not in
// the race.
struct RaceBest {
  float floor_z;
  RaceUniforms u;
  uint64_t limit = kKeepAll;
  float score = -INFINITY;
  int64_t id = -1;
  AV_HD void push(float z, int64_t v) {
    if (!(z >= floor_z)) return;  // cannot win (or NaN)
    if (limit != kKeepAll && rank_key(z, v) > limit) return;
    const float s = race_score(z, u, v);
    if (better(s, v, score, id)) {
      score = s;
      id = v;
    }
  }
};

// Running winner of the residual race: argmax_v max(p_v - q_v, 0) / E_v, and of argmax_v p_v / E_v for
// the fallback when every residual weight is 0 (p == q up to rounding). Draft probabilities that are not > 0
// (negative, NaN) count as 0, so a token the target gives no mass (p_v = 0: a NaN logit, one outside the kept
// set or below a +inf) never gets weight, whatever q holds.
struct ResidualBest {
  float key_w = 0.f, key_p = -1.f;
  int64_t id_w = -1, id_p = -1;

  AV_HD void push(float logit, float qv, float temp, const SoftmaxStats& st, RaceUniforms& u, int64_t v,
                  uint64_t limit) {
    const float z = scaled_logit(logit, temp, st.max);
    const float pv = kept(z, v, limit) ? fdiv(av_exp(fsub(z, softmax_max(st.max))), st.sum) : 0.f;
    const float w = fsub(pv, qv > 0.f ? qv : 0.f);  // q_v not > 0 (negative, NaN) counts as 0: w <= p_v
    const float e = -av_log(u.at(uint64_t(v)));
    if (w > 0.f) {
      const float key = fdiv(w, e);
      if (better(key, v, key_w, id_w)) {
        key_w = key;
        id_w = v;
      }
    }
    const float key = fdiv(pv, e);
    if (better(key, v, key_p, id_p)) {
      key_p = key;
      id_p = v;
    }
  }
};

template <typename T>
AV_HD int64_t draft_id(const RejectionParams& p, int32_t r, int32_t j) {
  return p.draft_tokens_int64 ? static_cast<const int64_t*>(p.draft_tokens)[int64_t(r) * p.draft_tokens_stride + j]
                              : int64_t(static_cast<const int32_t*>(p.draft_tokens)[int64_t(r) * p.draft_tokens_stride + j]);
}

// Log-probability of token `tok` under softmax(row / tl), untruncated (tl: the temperature, 1 for greedy rows).
template <typename T, typename Backend>
AV_HD float token_logprob(Backend& be, const T* row, int64_t V, float tl, int64_t tok) {
  const float m = be.max_scaled(row, V, tl, false);
  if (!(m > -INFINITY)) return -INFINITY;  // no number in the row
  const SoftmaxStats st = be.softmax_stats(row, V, tl, m, kKeepAll);
  return fsub(fsub(scaled_logit(to_float(row[tok]), tl, m), softmax_max(m)), av_log(st.sum));
}

// One sampled token of a row at temperature temp > 0 under truncation t: a race over the kept tokens. Backends
// expose it as `sampled` (the split-vocabulary merge answers untruncated races from its partials instead).
template <typename T, typename Backend>
AV_HD int64_t truncated_race(Backend& be, const T* row, int64_t V, float temp, const Truncation& t, const Rng& rng,
                             int32_t j, uint32_t stream) {
  const float m = be.max_scaled(row, V, temp, true);
  const uint64_t limit = t.active() ? kept_limit<T>(be, row, V, temp, m, t) : kKeepAll;
  return be.race(row, V, temp, m, rng, j, stream, limit);
}

// Whether request r's rows [begin, end) of query_start_loc are a padding row (q_len 0, or lengths no row can
// satisfy): then its num_emitted is 0, and impossible lengths are counted (the rejection and tree samplers alike).
template <typename Params>
AV_HD bool padding_request(const Params& p, int32_t r, int64_t begin, int64_t end, bool writer) {
  if (end > begin && begin >= 0 && end <= p.num_tokens) return false;
  if (writer) {
    p.num_emitted[r] = 0;
    if (end < begin || begin < 0 || end > p.num_tokens) atomic_count(p.error_counts, kCountQueryLenOutOfRange);
  }
  return true;
}

// Runs request r. `writer` is true on exactly one thread (the one that stores results and counts errors).
template <typename T, typename Backend>
AV_HD void rejection_request(const RejectionParams& p, int32_t r, Backend& be, bool writer) {
  const int32_t K = p.max_drafts;
  int32_t* out = p.output_tokens + int64_t(r) * (K + 1);
  float* lp = p.logprobs != nullptr ? p.logprobs + int64_t(r) * (K + 1) : nullptr;
  if (writer)
    for (int32_t i = 0; i <= K; ++i) {
      out[i] = -1;
      if (lp != nullptr) lp[i] = -INFINITY;
    }
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  if (padding_request(p, r, begin, end, writer)) return;
  int32_t L = int32_t(end - begin - 1);
  if (L > K) {
    L = K;
    if (writer) atomic_count(p.error_counts, kCountQueryLenOutOfRange);
  }
  const float temp = p.temperature != nullptr ? p.temperature[r] : 0.f;
  const bool greedy = !(temp > 0.f);  // 0, negative or NaN (the host rejects negatives on CPU)
  const Rng rng{p.seeds != nullptr ? uint64_t(p.seeds[r]) : 0ull,
                p.offset_ptr != nullptr ? uint64_t(*p.offset_ptr) : p.offset};
  const T* logits = static_cast<const T*>(p.logits);
  const int64_t V = p.vocab;
  const Truncation trunc = truncation_of(p.top_k, p.top_p, p.min_p, r, V);
  if (trunc.bad && writer) atomic_count(p.error_counts, kCountSamplingParamOutOfRange);
  int32_t n = 0;
  for (int32_t j = 0; j <= L; ++j) {
    const T* row = logits + (begin + j) * p.logits_stride;
    int64_t emit = 0;
    bool accept = false, stop = true;
    if (j == L) {  // every verified draft accepted: the bonus token
      emit = greedy ? be.argmax(row, V) : be.sampled(row, V, temp, trunc, rng, j, kRace);
    } else {
      const int64_t x = draft_id<T>(p, r, j);
      const bool valid = x >= 0 && x < V;
      if (!valid && writer) atomic_count(p.error_counts, kCountDraftIdOutOfRange);
      if (greedy) {
        emit = be.argmax(row, V);
        accept = valid && emit == x;
      } else if (p.draft_probs == nullptr) {
        emit = be.sampled(row, V, temp, trunc, rng, j, kRace);
        accept = valid && emit == x;
      } else {
        const float* q = p.draft_probs + int64_t(r) * p.draft_probs_stride_r + int64_t(j) * p.draft_probs_stride_k;
        const float m = be.max_scaled(row, V, temp, true);
        const uint64_t limit = trunc.active() ? kept_limit<T>(be, row, V, temp, m, trunc) : kKeepAll;
        const SoftmaxStats st = be.softmax_stats(row, V, temp, m, limit);
        if (valid && st.max > -INFINITY) {
          const float qx = q[x];
          const float zx = scaled_logit(to_float(row[x]), temp, st.max);
          const float px = kept(zx, x, limit) ? fdiv(av_exp(fsub(zx, softmax_max(st.max))), st.sum) : 0.f;
          accept = qx > 0.f && fmul(rng.uniform(j, kAccept, 0), qx) < px;
        }
        if (!accept) emit = be.residual_race(row, q, V, temp, st, rng, j, limit);
      }
      if (accept) {
        emit = x;
        stop = false;
      }
    }
    if (lp != nullptr) {
      const float logprob = token_logprob<T>(be, row, V, greedy ? 1.f : temp, emit);
      if (writer) lp[n] = logprob;
    }
    if (writer) out[n] = int32_t(emit);
    ++n;
    if (stop) {
      if (writer) p.num_emitted[r] = n;
      return;
    }
  }
}

// sample(): row i's token (RNG stream kSample, position 0): argmax at temperature 0, else a race over the
// row's kept tokens; its untruncated log-probability when asked.
template <typename T, typename Backend>
AV_HD void sample_row(const SampleParams& p, int32_t i, Backend& be, bool writer) {
  const T* row = static_cast<const T*>(p.logits) + int64_t(i) * p.logits_stride;
  const float temp = p.temperature != nullptr ? p.temperature[i] : 0.f;
  const Rng rng{p.seeds != nullptr ? uint64_t(p.seeds[i]) : 0ull,
                p.offset_ptr != nullptr ? uint64_t(*p.offset_ptr) : p.offset};
  const Truncation trunc = truncation_of(p.top_k, p.top_p, p.min_p, i, p.vocab);
  if (trunc.bad && writer) atomic_count(p.error_counts, kCountSamplingParamOutOfRange);
  const bool greedy = !(temp > 0.f);
  const int64_t tok = greedy ? be.argmax(row, p.vocab) : be.sampled(row, p.vocab, temp, trunc, rng, 0, kSample);
  float logprob = 0.f;
  if (p.logprobs != nullptr) logprob = token_logprob<T>(be, row, p.vocab, greedy ? 1.f : temp, tok);
  if (writer) {
    p.tokens[i] = int32_t(tok);
    if (p.logprobs != nullptr) p.logprobs[i] = logprob;
  }
}

}  // namespace sampling
}  // namespace adaptive_verify
