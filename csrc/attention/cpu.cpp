// C++ CPU verification attention over a paged KV cache, KV writes and the tree KV commit.
//
// Threads over (request, KV head) pairs for large problems (unlike the other CPU kernels: here each pair
// is milliseconds of work, which dwarfs the cost of competing with torch's idle-spinning threads).
//
// Per (request, KV head): the q_len x (Hq / Hkv) query rows that share the KV head are processed
// together, so each cached K/V row is converted once and reused by every query row (the CPU analogue
// of the GPU's GQA packing). Within each kSplitTokens chunk of KV positions an online softmax keeps
// (max, sum, acc) per row; chunks are then merged by log-sum-exp in order. fp32 throughout. A draft-tree
// mask (AttentionParams::tree_mask) only removes positions inside the verified block (tree_mask.h): the
// loops and their order are the chain's, so a chain's mask gives mask=None's bits.
#include <cmath>
#include <algorithm>
#include <array>
#include <type_traits>
#include <cstring>
#include <thread>
#include <vector>

#include "adaptive_verify/attention/commit.h"
#include "adaptive_verify/attention/cpu.h"
#include "adaptive_verify/attention/tree_mask.h"
#include "adaptive_verify/dtype.h"

namespace adaptive_verify {
namespace attention {
namespace {

struct RowState {
  float m, l;  // running max and sum of exp(score - m)
};

struct Scratch {
  std::vector<float> qf, acc, total, kf, vf;
  std::vector<RowState> st, tot;
  std::vector<uint64_t> mask;  // [q_len] each query token's in-block mask (tree_mask.h)
  std::vector<int32_t> low;    // [q_len] the lowest key position each sees (its window; tree_mask.h)
};

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(uint8_t(i));
    return t;
  }();
  return table;
}

// T: q's and the output's storage type; KT: the cache's (T, or fp8e4m3_t: dequantised by its KV head's scale on
// load, each element exactly as the float64 reference does before rounding to float).
template <typename T, typename KT>
void attend(const AttentionParams& p, int32_t r, int32_t h, Scratch& sc) {
  std::vector<float>& qf = sc.qf;
  std::vector<float>& acc = sc.acc;
  std::vector<float>& total = sc.total;
  std::vector<RowState>& st = sc.st;
  std::vector<RowState>& tot = sc.tot;
  std::vector<float>& kf = sc.kf;
  std::vector<float>& vf = sc.vf;
  const int64_t begin = p.query_start_loc[r];
  const int32_t q_len = int32_t(p.query_start_loc[r + 1] - begin);
  if (q_len <= 0) return;
  const int32_t kv_len = p.seq_lens[r];
  // K rows have D values; V and the output Dv (D, or MLA's latent part: the first Dv values of the same row)
  const int32_t D = p.head_dim, Dv = value_dim(p), Hkv = p.num_kv_heads, group = p.num_q_heads / Hkv;
  const int32_t rows = q_len * group;  // row = i * group + g: query token i, head h * group + g
  const T* q = static_cast<const T*>(p.q);
  const KT* kc = static_cast<const KT*>(p.k_cache);
  const KT* vc = static_cast<const KT*>(p.v_cache);
  const float k_scale = kv_scale(p, h, false), v_scale = kv_scale(p, h, true);
  // fp8 elements decode through a 256-entry table (the same values as fp8_e4m3_to_float, which builds it)
  const auto load = [](KT x) {
    if constexpr (std::is_same<KT, fp8e4m3_t>::value) return fp8_table()[x.bits]; else return to_float(x);
  };
  const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
  qf.resize(size_t(rows) * D);
  acc.resize(size_t(rows) * Dv);
  total.resize(size_t(rows) * Dv);
  st.resize(size_t(rows));
  tot.resize(size_t(rows));
  kf.resize(size_t(D));
  vf.resize(size_t(Dv));
  std::vector<uint64_t>& mask = sc.mask;
  std::vector<int32_t>& low = sc.low;
  mask.resize(size_t(q_len));
  low.resize(size_t(q_len));
  const int32_t context_len = kv_len - q_len;
  for (int32_t i = 0; i < q_len; ++i) {
    mask[i] = token_tree_mask(p.tree_mask, begin + i);
    low[i] = window_low(mask[i], context_len, context_len + i, p.window_left);
  }
  const float softcap = p.softcap;
  {
    for (int32_t i = 0; i < q_len; ++i)
      for (int32_t g = 0; g < group; ++g) {
        const T* src = q + (begin + i) * p.q_stride_t + int64_t(h * group + g) * p.q_stride_h;
        float* dst = qf.data() + size_t(i * group + g) * D;
        for (int32_t d = 0; d < D; ++d) dst[d] = to_float(src[d]) * p.scale;
      }
    for (int32_t row = 0; row < rows; ++row) {
      tot[row] = RowState{-INFINITY, 0.f};
      std::memset(total.data() + size_t(row) * Dv, 0, sizeof(float) * Dv);
    }
    const int32_t last_visible = kv_len - 1;  // the last query token sees every position
    // splits wholly below every token's window are skipped (the CUDA kernels skip the same ones)
    const int32_t window_start = request_window_start(context_len, p.window_left);
    for (int32_t s0 = window_start / kSplitTokens * kSplitTokens; s0 <= last_visible; s0 += kSplitTokens) {
      const int32_t s1 = s0 + kSplitTokens - 1 < last_visible ? s0 + kSplitTokens - 1 : last_visible;
      for (int32_t row = 0; row < rows; ++row) {
        st[row] = RowState{-INFINITY, 0.f};
        std::memset(acc.data() + size_t(row) * Dv, 0, sizeof(float) * Dv);
      }
      for (int32_t pos = s0 > window_start ? s0 : window_start; pos <= s1; ++pos) {
        const int64_t slot = int64_t(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
        const KT* krow = kc + (slot * Hkv + h) * D;
        const KT* vrow = vc + (slot * Hkv + h) * D;
        // (the scales are 1 for 16-bit caches: exact)
        for (int32_t d = 0; d < D; ++d) kf[d] = load(krow[d]) * k_scale;
        for (int32_t d = 0; d < Dv; ++d) vf[d] = load(vrow[d]) * v_scale;
        for (int32_t row = 0; row < rows; ++row) {
          const int32_t i = row / group;
          // causal inside the verified block, and a tree token's ancestors only
          if (!position_visible(mask[i], pos, context_len, context_len + i, low[i])) continue;
          const float* qr = qf.data() + size_t(row) * D;
          float s = 0.f;
          for (int32_t d = 0; d < D; ++d) s += qr[d] * kf[d];
          if (softcap > 0.f) s = softcap * std::tanh(s / softcap);
          float* a = acc.data() + size_t(row) * Dv;
          RowState& w = st[row];
          if (s > w.m) {  // new max: rescale what was accumulated
            const float c = std::exp(w.m - s);
            w.l *= c;
            for (int32_t d = 0; d < Dv; ++d) a[d] *= c;
            w.m = s;
          }
          const float e = std::exp(s - w.m);
          w.l += e;
          for (int32_t d = 0; d < Dv; ++d) a[d] += e * vf[d];
        }
      }
      for (int32_t row = 0; row < rows; ++row) {  // merge this split into the running total
        const RowState& w = st[row];
        if (w.l == 0.f) continue;  // no visible position in this split
        RowState& t = tot[row];
        const float m = w.m > t.m ? w.m : t.m;
        const float ct = t.l == 0.f ? 0.f : std::exp(t.m - m), cw = std::exp(w.m - m);
        float* tv = total.data() + size_t(row) * Dv;
        const float* av = acc.data() + size_t(row) * Dv;
        for (int32_t d = 0; d < Dv; ++d) tv[d] = tv[d] * ct + av[d] * cw;
        t.l = t.l * ct + w.l * cw;
        t.m = m;
      }
    }
    T* out = static_cast<T*>(p.out);
    for (int32_t row = 0; row < rows; ++row) {
      const int32_t i = row / group, qh = h * group + row % group;
      const int64_t token = begin + i;
      RowState& t = tot[row];
      if (p.sinks != nullptr) {  // the sink joins the denominator with no value: rescale to the larger max
        const float sink = p.sinks[qh];
        const float m = t.l > 0.f && t.m > sink ? t.m : sink;
        const float c = t.l > 0.f ? std::exp(t.m - m) : 0.f;
        float* tv = total.data() + size_t(row) * Dv;
        for (int32_t d = 0; d < Dv; ++d) tv[d] *= c;
        t.l = t.l * c + std::exp(sink - m);
        t.m = m;
      }
      const float inv = t.l > 0.f ? 1.f / t.l : 0.f;
      T* dst = out + (token * p.num_q_heads + qh) * Dv;
      const float* tv = total.data() + size_t(row) * Dv;
      for (int32_t d = 0; d < Dv; ++d) from_float(tv[d] * inv, dst + d);
      if (p.lse) p.lse[token * p.num_q_heads + qh] = t.l > 0.f ? t.m + std::log(t.l) : -INFINITY;
    }
  }
}

// The scales of every KV head: finite and > 0 (the CPU reads them for free; CUDA counts bad ones instead).
template <typename P>
bool kv_scales_ok(const P& p, int32_t num_kv_heads) {
  for (int32_t h = 0; h < num_kv_heads; ++h)
    if (!kv_scale_ok(kv_scale(p, h, false)) || !kv_scale_ok(kv_scale(p, h, true))) return false;
  return true;
}

// write_kv into an fp8 cache: x / scale in float, rounded by float_to_fp8_e4m3 (the CUDA kernel's function).
template <typename T>
void write_kv_fp8(const WriteKvParams& p) {
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  uint8_t* kc = static_cast<uint8_t*>(p.k_cache);
  uint8_t* vc = static_cast<uint8_t*>(p.v_cache);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    for (int32_t h = 0; h < p.num_kv_heads; ++h) {
      const float ks = kv_scale(p, h, false), vs = kv_scale(p, h, true);
      const int64_t dst = slot * write_row(p) + p.cache_offset + int64_t(h) * p.head_dim;
      const T* k_row = k + t * p.k_stride_t + h * p.k_stride_h;
      for (int32_t d = 0; d < p.head_dim; ++d) kc[dst + d] = float_to_fp8_e4m3(to_float(k_row[d]) / ks);
      if (vc == nullptr) continue;  // K only (MLA)
      const T* v_row = v + t * p.v_stride_t + h * p.v_stride_h;
      for (int32_t d = 0; d < p.head_dim; ++d) vc[dst + d] = float_to_fp8_e4m3(to_float(v_row[d]) / vs);
    }
  }
}

}  // namespace

int validate_attention_cpu(const AttentionParams& p) {
  int64_t prev = 0;
  for (int32_t r = 0; r <= p.num_reqs; ++r) {
    const int64_t v = p.query_start_loc[r];
    if (v < prev || v > p.num_tokens) return kErrQueryLen;
    prev = v;
  }
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t q_len = p.query_start_loc[r + 1] - p.query_start_loc[r];
    if (q_len == 0) continue;
    if (q_len > p.max_query_len) return kErrQueryLen;
    const int32_t kv_len = p.seq_lens[r];
    if (kv_len < q_len) return kErrSeqLens;
    const int64_t blocks = (int64_t(kv_len) + p.block_size - 1) / p.block_size;
    if (blocks > p.max_blocks) return kErrBlockTableTooShort;
    const int32_t* table = p.block_table + int64_t(r) * p.block_table_stride;
    // blocks wholly below a sliding window are never read (an engine may leave them unmapped)
    for (int64_t b = request_window_start(kv_len - q_len, p.window_left) / p.block_size; b < blocks; ++b)
      if (table[b] < 0 || table[b] >= p.num_blocks) return kErrBlockIdOutOfRange;
  }
  return kOk;
}

int verify_attention_cpu(const AttentionParams& p) {
  const int status = validate_attention_cpu(p);
  if (status != kOk) return status;
  const bool fp8 = p.kv_dtype == kFloat8E4M3;
  if (!fp8 && p.kv_dtype != p.dtype) return kErrBadArgument;
  if (fp8 && !kv_scales_ok(p, p.num_kv_heads)) return kErrKvScale;
  if (p.sinks != nullptr)
    for (int32_t h = 0; h < p.num_q_heads; ++h)
      if (!(std::fabs(p.sinks[h]) <= 3.4028234663852886e38f)) return kErrSinks;
  const int64_t row_elems = int64_t(p.num_q_heads) * value_dim(p);
  // Padding first: every token not owned by a request keeps zeros and lse -inf.
  const size_t elem = p.dtype == kFloat32 ? 4 : 2;
  if (p.num_tokens * row_elems > 0) std::memset(p.out, 0, size_t(p.num_tokens * row_elems) * elem);  // (else out may be null)
  if (p.lse)
    for (int64_t i = 0; i < p.num_tokens * p.num_q_heads; ++i) p.lse[i] = -INFINITY;
  // Threads over (request, KV head) pairs when there is enough work to pay for starting them (each pair
  // writes its own output rows, so no synchronisation is needed); small decode-size calls stay serial.
  double work = 0;
  for (int32_t r = 0; r < p.num_reqs; ++r)
    work += double(p.query_start_loc[r + 1] - p.query_start_loc[r]) * p.seq_lens[r];
  work *= double(p.num_q_heads) * p.head_dim;
  const int64_t pairs = int64_t(p.num_reqs) * p.num_kv_heads;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = work < 5e7 ? 1 : int(std::min<int64_t>(hw, pairs));
  const bool ok = dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](int t) {
      Scratch sc;
      for (int64_t i = t; i < pairs; i += threads) {
        const int32_t r = int32_t(i / p.num_kv_heads), h = int32_t(i % p.num_kv_heads);
        if (fp8) attend<T, fp8e4m3_t>(p, r, h, sc); else attend<T, T>(p, r, h, sc);
      }
    };
    if (threads <= 1) {
      run(0);
      return;
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(run, t);
    for (auto& th : pool) th.join();
  });
  return ok ? kOk : kErrBadArgument;
}

int write_kv_cpu(const WriteKvParams& p) {
  const int64_t capacity = p.num_blocks * p.block_size;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot != -1 && (slot < 0 || slot >= capacity)) return kErrSlotOutOfRange;
  }
  if (p.cache_dtype == kFloat8E4M3) {
    if (!kv_scales_ok(p, p.num_kv_heads)) return kErrKvScale;
    bool ok = false;
    if (p.dtype == kBFloat16) ok = (write_kv_fp8<bf16_t>(p), true);
    if (p.dtype == kFloat16) ok = (write_kv_fp8<half_t>(p), true);
    return ok ? kOk : kErrBadArgument;
  }
  const size_t bytes = size_t(p.head_dim) * p.elem_size;
  const char* k = static_cast<const char*>(p.k);
  const char* v = static_cast<const char*>(p.v);
  char* kc = static_cast<char*>(p.k_cache);
  char* vc = static_cast<char*>(p.v_cache);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    for (int32_t h = 0; h < p.num_kv_heads; ++h) {
      const int64_t dst = (slot * write_row(p) + p.cache_offset + int64_t(h) * p.head_dim) * p.elem_size;
      std::memcpy(kc + dst, k + (t * p.k_stride_t + h * p.k_stride_h) * p.elem_size, bytes);
      if (vc != nullptr) std::memcpy(vc + dst, v + (t * p.v_stride_t + h * p.v_stride_h) * p.elem_size, bytes);
    }
  }
  return kOk;
}

// Every path is checked before anything moves (a strict backend: an invalid one is a ValueError), then each path
// is moved entry by entry in increasing depth (commit.h: no entry is overwritten before it is read).
int commit_tree_kv_cpu(const CommitTreeKvParams& p) {
  for (int32_t r = 0; r < p.num_reqs; ++r)
    if (!accepted_path_ok(p, r)) return kErrAcceptedPath;
  char* k = static_cast<char*>(p.k_cache);
  char* v = static_cast<char*>(p.v_cache);
  const size_t bytes = size_t(p.row_bytes);
  for (int32_t r = 0; r < p.num_reqs; ++r) {
    const int32_t n = p.num_accepted[r], ctx = p.context_lens[r];
    const int32_t* off = p.accepted_offsets + int64_t(r) * p.accepted_offsets_stride;
    for (int32_t i = 1; i <= n; ++i) {
      if (off[i] == i) continue;
      const int64_t src = commit_slot(p, r, int64_t(ctx) + off[i]) * p.row_bytes;
      const int64_t dst = commit_slot(p, r, int64_t(ctx) + i) * p.row_bytes;
      std::memcpy(k + dst, k + src, bytes);
      if (v != nullptr) std::memcpy(v + dst, v + src, bytes);  // (MLA: one latent cache)
    }
  }
  return kOk;
}

}  // namespace attention
}  // namespace adaptive_verify
