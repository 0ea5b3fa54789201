// Warp-level primitives of the tensor-core attention kernel (kernel_mma.cuh): ldmatrix, mma.sync
// m16n8k16 (bf16/fp16 in, fp32 accumulate), cp.async with zero fill, and bf16x2/fp16x2 packing. All are
// sm_80 PTX, so one source serves sm_90a and the SM100 family.
//
// Under AV_CUDA_EMULATION (tests/emu/cuda_emu.h, defined before this header is included) the same names
// come from a host emulator that runs every CUDA thread as a fiber, so the CPU test suite executes the
// kernel's real indexing: fragment layouts, swizzles, pipeline waits and barriers.
#pragma once

#include <cstdint>

#include "adaptive_verify/dtype.h"

#if !defined(AV_CUDA_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace adaptive_verify {
namespace attention {
namespace tc {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-aligned).
// Lane l receives r[i] = elements (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1) of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// As ldmatrix_x4 with each matrix transposed: r[i] = elements (rows 2 (l % 4) and 2 (l % 4) + 1, column
// l / 4) of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// d = a (16x16, row major) * b (16x8, column major) + d, fp32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bf16_t) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, half_t) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values, round to nearest even; `lo` in the low half (the
// lower column index of a fragment pair).
__device__ __forceinline__ uint32_t pack2(float lo, float hi, bf16_t) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, half_t) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 16 bytes global -> shared without registers (L2 only: streamed K/V have no reuse in L1). When `fill`
// is false nothing is read and the 16 bytes are zeroed, so skipped positions hold zeros, not NaN.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(fill ? 16 : 0));
}
// "memory" clobbers on commit and wait: no plain shared-memory access moves across them.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace tc
}  // namespace attention
}  // namespace adaptive_verify
#endif  // !AV_CUDA_EMULATION
