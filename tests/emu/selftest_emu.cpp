// Deliberately broken kernels, one per check of the emulator (cuda_emu.h), so tests/test_emu_selftest.py can
// show that each check fires (a check that never fails would let a broken kernel pass its tests) and that a
// correct kernel passes. Built by the tests with the host compiler; not part of the package.
#include "cuda_emu.h"

#include <cstring>

namespace tc = adaptive_verify::attention::tc;

namespace {

// Threads write their id to smem, then read their neighbour's: correct only with the barrier in between.
void neighbour_kernel(bool with_barrier, int32_t* out) {
  __shared__ int32_t vals[64];
  const int t = int(threadIdx.x);
  vals[t] = t + 1;
  if (with_barrier) __syncthreads();
  out[t] = vals[(t + 33) % 64];
}

void divergent_barrier_kernel() {
  if (threadIdx.x < 32) __syncthreads();
}

void early_exit_kernel() {
  if (threadIdx.x == 5) return;
  __syncthreads();
}

void ldmatrix_out_of_bounds_kernel() {
  AV_DYNAMIC_SMEM(smem);
  uint32_t r[4];
  tc::ldmatrix_x4(r, smem + 256 + 16 * (threadIdx.x & 31));  // 512 bytes allocated: the last lanes overrun
}

void ldmatrix_misaligned_kernel() {
  AV_DYNAMIC_SMEM(smem);
  uint32_t r[4];
  tc::ldmatrix_x4(r, smem + 8 + 16 * (threadIdx.x & 7));
}

// cp.async into smem, then reading it: the wait must come before the read (late copies land at the wait).
void cp_async_kernel(const int32_t* src, int32_t* out, bool wait_first) {
  AV_DYNAMIC_SMEM(smem);
  const int t = int(threadIdx.x);
  tc::cp_async16(smem + 16 * t, src + 4 * t, true);
  tc::cp_async_commit();
  if (wait_first) tc::cp_async_wait<0>();
  __syncthreads();
  int32_t v;
  std::memcpy(&v, smem + 16 * ((t + 1) % 32), 4);
  out[t] = v;
  tc::cp_async_wait<0>();
}

void pending_copy_kernel(const int32_t* src) {
  AV_DYNAMIC_SMEM(smem);
  tc::cp_async16(smem + 16 * threadIdx.x, src + 4 * threadIdx.x, true);
  tc::cp_async_commit();
}

void shfl_kernel(int32_t* out) { out[threadIdx.x] = int32_t(__shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1)); }

}  // namespace

extern "C" {

// Runs self-test `which` (see the switch); out receives what the kernel writes (64 int32). Returns 0, or 1
// with the emulator's message.
int av_emu_selftest(int which, int32_t* out, char* err, int err_len) {
  static int32_t src[32 * 4];
  for (int i = 0; i < 32 * 4; ++i) src[i] = 1000 + i;
  const auto* s = reinterpret_cast<const unsigned char*>(src);
  return av_emu::run_entry(av_emu::kLateCopies, {{s, s + sizeof(src)}}, err, err_len, [&] {
    const av_emu::Dim3 one{1, 1, 1};
    switch (which) {
      case 0: av_emu::launch(one, av_emu::Dim3{64, 1, 1}, 0, [&] { neighbour_kernel(true, out); }); break;
      case 1: av_emu::launch(one, av_emu::Dim3{64, 1, 1}, 0, [&] { neighbour_kernel(false, out); }); break;
      case 2: av_emu::launch(one, av_emu::Dim3{64, 1, 1}, 0, [&] { divergent_barrier_kernel(); }); break;
      case 3: av_emu::launch(one, av_emu::Dim3{64, 1, 1}, 0, [&] { early_exit_kernel(); }); break;
      case 4: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { ldmatrix_out_of_bounds_kernel(); }); break;
      case 5: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { ldmatrix_misaligned_kernel(); }); break;
      case 6: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { cp_async_kernel(src, out, true); }); break;
      case 7: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { cp_async_kernel(src, out, false); }); break;
      case 8: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { pending_copy_kernel(src); }); break;
      case 9: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 512, [&] { cp_async_kernel(src + 1, out, true); }); break;
      case 10: av_emu::launch(one, av_emu::Dim3{32, 1, 1}, 0, [&] { shfl_kernel(out); }); break;
      default: throw av_emu::Failure("unknown self-test");
    }
  });
}

}  // extern "C"
