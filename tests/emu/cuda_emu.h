// A host emulator for this project's CUDA kernels (attention kernel_mma.cuh / kernel_tiled.cuh / merge.cuh,
// planner kernel.cuh / kernel_v2.cuh, sampling kernel.cuh / kernel_splitv.cuh), so the CPU test suite runs
// their real source: every CUDA thread of a block is a fiber (ucontext) on one OS thread; __syncthreads
// and warp collectives are barriers between fibers. Blocks run one at a time; within a block, warps run
// one at a time, each as far as it can before the next (see launch).
//
// What it checks, beyond the results the tests compare:
//   - ldmatrix / cp.async shared addresses lie inside the block's dynamic smem and are 16-byte aligned;
//   - cp.async and 16-byte __ldg global reads lie inside a registered range (the tensors) and are
//     16-byte aligned;
//   - every warp collective is reached by all 32 lanes, every __syncthreads by every live thread (a
//     divergent barrier or an early exit before a barrier is reported);
//   - dynamic and static smem start as NaN bytes (0xff) in every block, so reading what was never
//     written shows up;
//   - warps run one after another, each until it reaches a __syncthreads, and blocks, warps and threads
//     resume in order or in reverse (av_emu_set_reverse): a missing barrier shows up as stale shared data
//     in one order or the other, and blocks that cooperate see both arrival orders;
//   - cp.async data lands only at cp_async_wait (mode kLateCopies): reading a stage before its wait sees
//     the stage's previous contents; or at issue (kEarlyCopies): a stage refilled before every warp is
//     done with it corrupts the result. The tests run both; copies never waited for fail the launch.
// It does not model timing, the memory model between blocks (fences are no-ops: one block at a time),
// or the tensor cores' internal rounding: mma sums in double and rounds once, so results agree with
// hardware to fp32 rounding, not bit for bit. tests/test_emu_selftest.py shows each check firing.
//
// Include this before any adaptive_verify header; it defines AV_CUDA_EMULATION.
#pragma once

#define AV_CUDA_EMULATION 1

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Static __shared__ variables: one instance per kernel instantiation, shared by the fibers of the one block
// that runs at a time. They live in their own section, which launch() fills with 0xff bytes before every
// block, so a read of what the block never wrote sees NaN-like garbage, not a previous block's values.
#define __shared__ static __attribute__((section("av_emu_shared")))
extern "C" unsigned char __start_av_emu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_av_emu_shared[] __attribute__((weak));
#define AV_DYNAMIC_SMEM(name) unsigned char* name = ::av_emu::dynamic_smem()

#include "adaptive_verify/dtype.h"

namespace av_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum CopyMode { kLateCopies = 0, kEarlyCopies = 1 };

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct PendingCopy {
  void* dst;
  const void* src;  // null: zero fill
};

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  Dim3 thread_idx;
  bool done = false;
  std::vector<std::vector<PendingCopy>> groups;  // committed cp.async groups, oldest first
  std::vector<PendingCopy> open;                 // issued since the last commit
};

struct Block {
  Dim3 block_idx, block_dim;
  int nthreads = 0;
  std::vector<unsigned char> smem;
  std::vector<Fiber> fibers;
  int current = -1;
  // barrier state: arrivals and generation, per block and per warp
  int block_arrived = 0;
  uint64_t block_gen = 0;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> warp_gen;
  std::vector<std::vector<unsigned char>> slots;  // per thread: 64 bytes of collective payload
};

using Ranges = std::vector<std::pair<const unsigned char*, const unsigned char*>>;

struct State {
  Block* block = nullptr;
  ucontext_t scheduler;
  CopyMode mode = kLateCopies;
  // Run blocks, warps and threads last to first (a missing barrier then shows up where a thread reads
  // what a lower-numbered one writes; cooperating blocks see the other arrival order).
  bool reverse = false;
  Ranges global_ranges;  // where cp.async and 16-byte __ldg may read
  Dim3 grid_dim;         // of the running launch
  std::string error;     // first failure seen inside a fiber
  // Per launch, summed over its blocks: __syncthreads completed, and warp collectives completed (a
  // rough count of a kernel's serial phases; reset by av_emu_counters).
  uint64_t block_barriers = 0, warp_collectives = 0;
};

inline State& state() {
  static State s;
  return s;
}

inline Fiber& self() { return state().block->fibers[size_t(state().block->current)]; }

inline void fail(const std::string& what) {
  if (state().error.empty()) state().error = what;
  throw Failure(what);
}

inline void yield() { swapcontext(&self().ctx, &state().scheduler); }

inline unsigned char* dynamic_smem() { return state().block->smem.data(); }

inline void check_smem(const void* p, size_t bytes, const char* what) {
  Block& b = *state().block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < b.smem.data() || c + bytes > b.smem.data() + b.smem.size())
    fail(std::string(what) + ": shared address outside the block's dynamic shared memory");
  if ((reinterpret_cast<uintptr_t>(c) & 15u) != 0) fail(std::string(what) + ": shared address not 16-byte aligned");
}

inline void check_global(const void* p, size_t bytes, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  if ((reinterpret_cast<uintptr_t>(c) & 15u) != 0) fail(std::string(what) + ": global address not 16-byte aligned");
  for (const auto& r : state().global_ranges)
    if (c >= r.first && c + bytes <= r.second) return;
  fail(std::string(what) + ": global read outside every registered range");
}

inline void syncthreads() {
  Block& b = *state().block;
  const uint64_t gen = b.block_gen;
  if (++b.block_arrived == b.nthreads) {
    b.block_arrived = 0;
    ++b.block_gen;
    ++state().block_barriers;
    return;
  }
  while (b.block_gen == gen) yield();
}

inline void warp_barrier() {
  Block& b = *state().block;
  const int w = int(self().thread_idx.x) / 32;
  const uint64_t gen = b.warp_gen[size_t(w)];
  if (++b.warp_arrived[size_t(w)] == 32) {
    b.warp_arrived[size_t(w)] = 0;
    ++b.warp_gen[size_t(w)];
    ++state().warp_collectives;  // two warp barriers per collective
    return;
  }
  while (b.warp_gen[size_t(w)] == gen) yield();
}

inline int lane_id() { return int(self().thread_idx.x) & 31; }
inline unsigned char* slot_of(int lane) {
  Block& b = *state().block;
  const int warp0 = (int(self().thread_idx.x) / 32) * 32;
  return b.slots[size_t(warp0 + lane)].data();
}

// Deposits `mine` in this lane's slot, waits for the warp, runs f (which reads any lane's slot), waits
// again so that no slot is overwritten while another lane still reads it.
template <typename V, typename F>
inline auto collective(const V& mine, F&& f) {
  static_assert(sizeof(V) <= 64, "collective payload");
  std::memcpy(slot_of(lane_id()), &mine, sizeof(V));
  warp_barrier();
  auto result = f();
  warp_barrier();
  return result;
}

template <typename V>
inline V slot_value(int lane) {
  V v;
  std::memcpy(&v, slot_of(lane), sizeof(V));
  return v;
}

inline uint16_t read_u16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Runs grid x block fibers of `kernel(args...)`, one block at a time; dynamic smem of `smem_bytes`.
// Throws Failure (with the first error) on any check above or a deadlock.
template <typename Kernel>
inline void launch(Dim3 grid, Dim3 block_dim, size_t smem_bytes, Kernel&& kernel) {
  State& st = state();
  constexpr size_t kStack = 256 * 1024;
  const int nthreads = int(block_dim.x * block_dim.y * block_dim.z);
  if (block_dim.y != 1 || block_dim.z != 1 || nthreads % 32 != 0) throw Failure("launch: 1-D blocks of whole warps");
  static Kernel* current_kernel;
  current_kernel = &kernel;
  // Blocks one at a time, in grid order or (reverse) the opposite: kernels whose blocks cooperate (the
  // fused attention's last-arriving block) see both arrival orders.
  const uint64_t num_blocks = uint64_t(grid.x) * grid.y * grid.z;
  st.grid_dim = grid;
  for (uint64_t i = 0; i < num_blocks; ++i) {
    const uint64_t id = st.reverse ? num_blocks - 1 - i : i;
    Block b;
    b.block_idx = Dim3{unsigned(id % grid.x), unsigned(id / grid.x % grid.y), unsigned(id / grid.x / grid.y)};
    b.block_dim = block_dim;
    b.nthreads = nthreads;
    b.smem.assign(smem_bytes + 16, 0xff);  // +16: slack for alignment of the data pointer below
    b.fibers.resize(size_t(nthreads));
    b.warp_arrived.assign(size_t(nthreads / 32), 0);
    b.warp_gen.assign(size_t(nthreads / 32), 0);
    b.slots.assign(size_t(nthreads), std::vector<unsigned char>(64));
    // std::vector's storage is 16-byte aligned by the allocator on this platform; check it.
    if ((reinterpret_cast<uintptr_t>(b.smem.data()) & 15u) != 0) throw Failure("smem allocation not aligned");
    b.smem.resize(smem_bytes);
    if (__start_av_emu_shared != nullptr && __stop_av_emu_shared > __start_av_emu_shared)
      std::memset(__start_av_emu_shared, 0xff, size_t(__stop_av_emu_shared - __start_av_emu_shared));
    st.block = &b;
    for (int t = 0; t < nthreads; ++t) {
      Fiber& f = b.fibers[size_t(t)];
      f.thread_idx = Dim3{unsigned(t), 0, 0};
      f.stack.reset(new char[kStack]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = &st.scheduler;
      makecontext(&f.ctx, reinterpret_cast<void (*)()>(+[]() {
                    try {
                      (*current_kernel)();
                    } catch (const Failure&) {
                    }
                    self().done = true;
                  }),
                  0);
    }
    // Warp by warp, each as far as it can go (until all its threads wait at a __syncthreads or are
    // done) before the next: a warp never waits for other warps except at __syncthreads, so code that
    // relies on some other ordering (a missing barrier) reads stale shared memory. A full round in
    // which nothing moved is a deadlock.
    int live = nthreads;
    const int nwarps = nthreads / 32;
    auto resume = [&](int t) {
      b.current = t;
      swapcontext(&st.scheduler, &b.fibers[size_t(t)].ctx);
      if (b.fibers[size_t(t)].done) --live;
      if (!st.error.empty()) throw Failure(st.error);
    };
    while (live > 0) {
      const uint64_t round_gen = b.block_gen;
      const int round_arrived = b.block_arrived, round_live = live;
      bool round_moved = false;
      for (int wi = 0; wi < nwarps; ++wi) {
        const int w = st.reverse ? nwarps - 1 - wi : wi;
        for (;;) {
          const uint64_t gen = b.block_gen, wgen = b.warp_gen[size_t(w)];
          const int arrived = b.block_arrived, warrived = b.warp_arrived[size_t(w)], before_live = live;
          for (int li = 0; li < 32; ++li) {
            const int t = w * 32 + (st.reverse ? 31 - li : li);
            if (!b.fibers[size_t(t)].done) resume(t);
          }
          const bool moved = b.block_gen != gen || b.warp_gen[size_t(w)] != wgen || b.block_arrived != arrived ||
                             b.warp_arrived[size_t(w)] != warrived || live != before_live;
          if (!moved) break;
          round_moved = true;
        }
      }
      round_moved =
          round_moved || b.block_gen != round_gen || b.block_arrived != round_arrived || live != round_live;
      if (!round_moved && live > 0) {
        st.error = "deadlock: " + std::to_string(live) + " threads wait at a barrier that not every thread reaches";
        throw Failure(st.error);
      }
      if (live > 0 && live < nthreads && b.block_arrived > 0) {
        st.error = "a thread exited while others wait at __syncthreads";
        throw Failure(st.error);
      }
    }
    for (const Fiber& f : b.fibers)
      if (!f.groups.empty() || !f.open.empty()) {
        // Copies never waited for: legal in CUDA only if nobody reads them; flag, the kernel waits for all.
        st.error = "cp.async copies still pending when the block exited";
        throw Failure(st.error);
      }
    st.block = nullptr;
  }
}

// Runs fn (launches) for a C entry point: fresh error state, the copy mode and the global ranges cp.async
// and __ldg may read; returns 0, or 1 with the first failure's message in err.
template <typename F>
inline int run_entry(CopyMode mode, Ranges ranges, char* err, int err_len, F&& fn) {
  State& st = state();
  st.mode = mode;
  st.error.clear();
  st.global_ranges = std::move(ranges);
  try {
    fn();
  } catch (const Failure& e) {
    st.block = nullptr;
    std::snprintf(err, size_t(err_len), "%s", e.what());
    return 1;
  }
  return 0;
}

inline void perform(const PendingCopy& c) {
  if (c.src != nullptr) std::memcpy(c.dst, c.src, 16); else std::memset(c.dst, 0, 16);
}

}  // namespace av_emu

// ---- the CUDA runtime calls the launchers make (csrc/include/adaptive_verify/launch.h) ----
using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
using dim3 = ::av_emu::Dim3;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) {
  return cudaSuccess;
}
// Stream order is program order here: the memset lands before the next launch runs.
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

// ---- CUDA names the kernels use ----
#define threadIdx (::av_emu::self().thread_idx)
#define blockIdx (::av_emu::state().block->block_idx)
#define blockDim (::av_emu::state().block->block_dim)
#define gridDim (::av_emu::state().grid_dim)

inline void __syncthreads() { ::av_emu::syncthreads(); }

// CUDA vector types and bit casts (cuda_runtime's vector_types.h and device intrinsics).
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(16) int4 {
  int32_t x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
inline float __uint_as_float(uint32_t u) { return ::adaptive_verify::bits_float(u); }
struct __half {
  uint16_t bits;
};
inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
inline float __half2float(__half h) { return ::adaptive_verify::half_to_float(h.bits); }
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline float __int_as_float(int x) { return ::adaptive_verify::bits_float(uint32_t(x)); }
// One block at a time on one OS thread: every write is visible to every later read.
inline void __threadfence() {}
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}

// fp16 / bf16 pairs as cuda_fp16.h / cuda_bf16.h lay them out (x in the low 16 bits) and the few packed
// intrinsics the sampler uses; NaN-propagating max, compared through float (exact for both formats).
struct __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) { return ::adaptive_verify::bf16_to_float(h.bits); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
template <typename H, typename F>
inline H max_nan(H a, H b, F to_f) {
  const float fa = to_f(a), fb = to_f(b);
  if (fa != fa) return a;
  if (fb != fb) return b;
  return fb > fa ? b : a;
}
inline __half __hmax_nan(__half a, __half b) { return max_nan(a, b, __half2float); }
inline __nv_bfloat16 __hmax_nan(__nv_bfloat16 a, __nv_bfloat16 b) { return max_nan(a, b, __bfloat162float); }
inline __half2 __hmax2_nan(__half2 a, __half2 b) { return __half2{__hmax_nan(a.x, b.x), __hmax_nan(a.y, b.y)}; }
inline __nv_bfloat162 __hmax2_nan(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{__hmax_nan(a.x, b.x), __hmax_nan(a.y, b.y)};
}

// Read-only global load; 16-byte loads are bounds-checked against the registered ranges (the caches).
template <typename T>
inline T __ldg(const T* p) {
  if (sizeof(T) == 16) ::av_emu::check_global(p, 16, "__ldg");
  return *p;
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) ::av_emu::fail("__ballot_sync: only full-warp masks are emulated");
  return ::av_emu::collective(pred != 0, [&] {
    unsigned b = 0;
    for (int l = 0; l < 32; ++l) b |= ::av_emu::slot_value<bool>(l) ? 1u << l : 0u;
    return b;
  });
}

template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src) {
  if (mask != 0xffffffffu) ::av_emu::fail("__shfl_sync: only full-warp masks are emulated");
  return ::av_emu::collective(v, [&] { return ::av_emu::slot_value<V>(src & 31); });
}

template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int off) {
  if (mask != 0xffffffffu) ::av_emu::fail("__shfl_xor_sync: only full-warp masks are emulated");
  return ::av_emu::collective(v, [&] { return ::av_emu::slot_value<V>(::av_emu::lane_id() ^ off); });
}

// Lanes below `delta` keep their own value.
template <typename V>
inline V __shfl_up_sync(unsigned mask, V v, unsigned delta) {
  if (mask != 0xffffffffu) ::av_emu::fail("__shfl_up_sync: only full-warp masks are emulated");
  const int l = ::av_emu::lane_id();
  return ::av_emu::collective(v, [&] { return l >= int(delta) ? ::av_emu::slot_value<V>(l - int(delta)) : v; });
}

// Lanes whose `v` equals this lane's, as a bit mask.
template <typename V>
inline unsigned __match_any_sync(unsigned mask, V v) {
  if (mask != 0xffffffffu) ::av_emu::fail("__match_any_sync: only full-warp masks are emulated");
  return ::av_emu::collective(v, [&] {
    unsigned m = 0;
    for (int l = 0; l < 32; ++l) m |= ::av_emu::slot_value<V>(l) == v ? 1u << l : 0u;
    return m;
  });
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __fmul_rn(float a, float b) { return a * b; }  // the emulator builds with -ffp-contract=off
using std::max;
using std::min;

// Atomics: fibers switch only at barriers and collectives, so a plain read-modify-write is atomic.
template <typename V, typename W>
inline V atomicAdd(V* p, W v) {
  const V old = *p;
  *p = V(old + V(v));
  return old;
}
template <typename V, typename W>
inline V atomicMin(V* p, W v) {
  const V old = *p;
  *p = V(v) < old ? V(v) : old;
  return old;
}
template <typename V, typename W>
inline V atomicMax(V* p, W v) {
  const V old = *p;
  *p = V(v) > old ? V(v) : old;
  return old;
}

namespace adaptive_verify {
namespace attention {
namespace tc {

// Fragment element of the 8x8 b16 matrix whose row `row` starts at the address lane `base + row` gave.
inline uint16_t matrix_elem(int base, int row, int col) {
  const auto* addr = ::av_emu::slot_value<const unsigned char*>(base + row);
  return ::av_emu::read_u16(addr + 2 * col);
}

// ldmatrix .x4: lane l receives, from matrix i (rows at the addresses of lanes 8 i .. 8 i + 7), elements
// (row l / 4, columns 2 (l % 4) + {0, 1}), or with .trans (rows 2 (l % 4) + {0, 1}, column l / 4).
inline void ldmatrix_x4_impl(uint32_t (&r)[4], const void* row, bool trans) {
  ::av_emu::check_smem(row, 16, trans ? "ldmatrix.trans" : "ldmatrix");
  const int l = ::av_emu::lane_id();
  struct R4 {
    uint32_t v[4];
  };
  const R4 out = ::av_emu::collective(row, [&] {
    R4 o;
    for (int i = 0; i < 4; ++i) {
      const auto elem = [&](int e) {
        return trans ? matrix_elem(8 * i, 2 * (l % 4) + e, l / 4) : matrix_elem(8 * i, l / 4, 2 * (l % 4) + e);
      };
      o.v[i] = uint32_t(elem(0)) | (uint32_t(elem(1)) << 16);
    }
    return o;
  });
  for (int i = 0; i < 4; ++i) r[i] = out.v[i];
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl(r, row, true); }

inline float b16_to_float(uint16_t v, bf16_t) { return bf16_to_float(v); }
inline float b16_to_float(uint16_t v, half_t) { return half_to_float(v); }

// PTX m16n8k16 .row.col fragments (g = lane / 4, t = lane % 4): A regs {a[0]: (g, 2t..), a[1]: (g + 8,
// 2t..), a[2]: (g, 2t + 8..), a[3]: (g + 8, 2t + 8..)}; B regs {b0: (k 2t.., n g), b1: (k 2t + 8.., n g)};
// C/D: d[0..1] (g, 2t..), d[2..3] (g + 8, 2t..).
template <typename T>
inline void mma_impl(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Frag {
    uint32_t a[4], b[2];
  };
  Frag mine;
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  mine.b[0] = b0;
  mine.b[1] = b1;
  const int l = ::av_emu::lane_id();
  struct D4 {
    float v[4];
  };
  const D4 out = ::av_emu::collective(mine, [&] {
    double A[16][16], B[16][8];
    for (int src = 0; src < 32; ++src) {
      const Frag f = ::av_emu::slot_value<Frag>(src);
      const int g = src / 4, t = src % 4;
      for (int e = 0; e < 2; ++e) {
        const auto half = [&](uint32_t w) { return double(b16_to_float(uint16_t(w >> (16 * e)), T{})); };
        A[g][2 * t + e] = half(f.a[0]);
        A[g + 8][2 * t + e] = half(f.a[1]);
        A[g][2 * t + 8 + e] = half(f.a[2]);
        A[g + 8][2 * t + 8 + e] = half(f.a[3]);
        B[2 * t + e][g] = half(f.b[0]);
        B[2 * t + 8 + e][g] = half(f.b[1]);
      }
    }
    D4 o;
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
      double sum = double(d[i]);
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      o.v[i] = float(sum);
    }
    return o;
  });
  for (int i = 0; i < 4; ++i) d[i] = out.v[i];
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bf16_t) {
  mma_impl<bf16_t>(d, a, b0, b1);
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, half_t) {
  mma_impl<half_t>(d, a, b0, b1);
}

inline uint32_t pack2(float lo, float hi, bf16_t) {
  return uint32_t(float_to_bf16(lo)) | (uint32_t(float_to_bf16(hi)) << 16);
}
inline uint32_t pack2(float lo, float hi, half_t) {
  return uint32_t(float_to_half(lo)) | (uint32_t(float_to_half(hi)) << 16);
}

inline void cp_async16(void* dst, const void* src, bool fill) {
  ::av_emu::check_smem(dst, 16, "cp.async");
  if (fill) ::av_emu::check_global(src, 16, "cp.async");
  const ::av_emu::PendingCopy c{dst, fill ? src : nullptr};
  if (::av_emu::state().mode == ::av_emu::kEarlyCopies) {
    ::av_emu::perform(c);
  } else {
    ::av_emu::self().open.push_back(c);
  }
}
inline void cp_async_commit() {
  auto& f = ::av_emu::self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
template <int N>
inline void cp_async_wait() {
  auto& f = ::av_emu::self();
  while (f.groups.size() > size_t(N)) {
    for (const auto& c : f.groups.front()) ::av_emu::perform(c);
    f.groups.erase(f.groups.begin());
  }
}

}  // namespace tc
}  // namespace attention
}  // namespace adaptive_verify

// Resume order of the fibers for later launches (0: thread order, 1: reverse). One definition per driver:
// this header is included by exactly one translation unit of each.
extern "C" void av_emu_set_reverse(int reverse) { ::av_emu::state().reverse = reverse != 0; }

// Barriers completed since the last call, then reset: out[0] = __syncthreads (all blocks), out[1] = warp
// collectives (all warps).
extern "C" void av_emu_counters(uint64_t* out) {
  out[0] = ::av_emu::state().block_barriers;
  out[1] = ::av_emu::state().warp_collectives / 2;
  ::av_emu::state().block_barriers = ::av_emu::state().warp_collectives = 0;
}
