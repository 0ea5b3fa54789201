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

struct SoftmaxStats {
  float max;  // max_v z_v (-inf when the row has no finite logit)
  float sum;  // canonical sum of av_exp(z_v - max)
};

// Race score of one logit: z - log(E), E = -log(u), u the race uniform of id v.
AV_HD float race_score(float z, RaceUniforms& u, int64_t v) {
  const float e = -av_log(u.at(uint64_t(v)));
  return fsub(z, av_log(e));
}

// Better (score, id) under "higher score, then smaller id"; NaN scores never win.
AV_HD bool better(float s, int64_t v, float best_s, int64_t best_v) {
  return s > best_s || (s == best_s && v < best_v && best_v >= 0);
}

// Running argmax of logits: ties to the smallest id, NaN ignored (and counted), -inf a real candidate (a
// row of -inf returns its first id).
struct ArgmaxBest {
  float x = -INFINITY;
  int64_t id = -1;
  int32_t nan = 0;
  AV_HD void push(float xv, int64_t v) {
    nan += xv != xv;
    if (xv > x || (id < 0 && xv == x)) {
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

// Running winner of a race: ids below the window floor cannot win and draw no random number.
struct RaceBest {
  float floor_z;
  RaceUniforms u;
  float score = -INFINITY;
  int64_t id = -1;
  AV_HD void push(float z, int64_t v) {
    if (!(z >= floor_z)) return;  // cannot win (or NaN)
    const float s = race_score(z, u, v);
    if (better(s, v, score, id)) {
      score = s;
      id = v;
    }
  }
};

// Running winner of the residual race: argmax_v max(p_v - q_v, 0) / E_v, and of argmax_v p_v / E_v for
// the fallback when every residual weight is 0 (p == q up to rounding).
struct ResidualBest {
  float key_w = 0.f, key_p = -1.f;
  int64_t id_w = -1, id_p = -1;

  AV_HD void push(float logit, float qv, float temp, const SoftmaxStats& st, RaceUniforms& u, int64_t v) {
    const float pv = fdiv(av_exp(fsub(fdiv(logit, temp), st.max)), st.sum);
    const float w = fsub(pv, qv);
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

// Runs request r. `writer` is true on exactly one thread (the one that stores results and counts errors).
template <typename T, typename Backend>
AV_HD void rejection_request(const RejectionParams& p, int32_t r, Backend& be, bool writer) {
  const int32_t K = p.max_drafts;
  int32_t* out = p.output_tokens + int64_t(r) * (K + 1);
  if (writer)
    for (int32_t i = 0; i <= K; ++i) out[i] = -1;
  const int64_t begin = p.query_start_loc[r], end = p.query_start_loc[r + 1];
  if (end <= begin || begin < 0 || end > p.num_tokens) {  // padding row (or lengths no row can satisfy)
    if (writer) {
      p.num_emitted[r] = 0;
      if (end < begin || begin < 0 || end > p.num_tokens) atomic_count(p.error_counts, kCountQueryLenOutOfRange);
    }
    return;
  }
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
  int32_t n = 0;
  for (int32_t j = 0; j <= L; ++j) {
    const T* row = logits + (begin + j) * p.logits_stride;
    if (j == L) {  // every verified draft accepted: the bonus token
      const int64_t bonus = greedy ? be.argmax(row, V) : be.race(row, V, temp, rng, j, kRace);
      if (writer) {
        out[n] = int32_t(bonus);
        p.num_emitted[r] = n + 1;
      }
      return;
    }
    const int64_t x = draft_id<T>(p, r, j);
    const bool valid = x >= 0 && x < V;
    if (!valid && writer) atomic_count(p.error_counts, kCountDraftIdOutOfRange);
    bool accept;
    int64_t emit = 0;
    if (greedy) {
      emit = be.argmax(row, V);
      accept = valid && emit == x;
    } else if (p.draft_probs == nullptr) {
      emit = be.race(row, V, temp, rng, j, kRace);
      accept = valid && emit == x;
    } else {
      const float* q = p.draft_probs + int64_t(r) * p.draft_probs_stride_r + int64_t(j) * p.draft_probs_stride_k;
      const SoftmaxStats st = be.softmax_stats(row, V, temp);
      accept = false;
      if (valid && st.max > -INFINITY) {
        const float qx = q[x];
        const float px = fdiv(av_exp(fsub(fdiv(to_float(row[x]), temp), st.max)), st.sum);
        accept = qx > 0.f && fmul(rng.uniform(j, kAccept, 0), qx) < px;
      }
      if (!accept) emit = be.residual_race(row, q, V, temp, st, rng, j);
    }
    if (accept) {
      if (writer) out[n] = int32_t(x);
      ++n;
      continue;
    }
    if (writer) {
      out[n] = int32_t(emit);
      p.num_emitted[r] = n + 1;
    }
    return;
  }
}

}  // namespace sampling
}  // namespace adaptive_verify
