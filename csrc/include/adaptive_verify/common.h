// Torch-free definitions shared by every area: host/device qualifiers, status codes and the
// indices of the device error counters.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define AV_HD __host__ __device__ __forceinline__
#else
#define AV_HD inline
#endif

// Dynamic shared memory of a kernel, 16-byte aligned (cp.async, ldmatrix and vector stores need it). The
// host emulator (tests/emu/cuda_emu.h, AV_CUDA_EMULATION) defines its own.
#if defined(__CUDACC__) && !defined(AV_CUDA_EMULATION)
#define AV_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace adaptive_verify {

// Status returned by CPU kernels (CUDA launchers return cudaError_t as int). The Python layer turns
// each into an error that names the offending argument.
enum Status : int {
  kOk = 0,
  kErrDraftsOutOfRange = 1,     // drafts[r] outside [0, K]
  kErrBlockTableTooShort = 2,   // a position's block index is >= max_blocks (or a position is < 0)
  kErrBadArgument = 3,          // a size or mode the host should have rejected
  kErrQueryLen = 4,             // query_start_loc decreasing / past T, or a q_len above max_query_len
  kErrSeqLens = 5,              // seq_lens[r] < q_len[r]
  kErrBlockIdOutOfRange = 6,    // a block id the request needs lies outside [0, num_blocks)
  kErrSlotOutOfRange = 7,       // write_kv: a slot other than -1 outside the cache
  kErrTemperature = 8,          // sampler: a negative or NaN temperature
  kErrTopK = 9,                 // sampler: top_k < 0
  kErrTopP = 10,                // sampler: top_p outside (0, 1] (or NaN)
  kErrMinP = 11,                // sampler: min_p outside [0, 1] (or NaN)
  kErrWeights = 12,             // planner: a weight that is NaN, negative or infinite
  kErrBadParent = 13,           // draft trees: parents[r, j] outside [-1, j) (not topological, out of range)
  kErrDuplicateSibling = 14,    // draft trees: two children of one node carry the same draft id
  kErrAcceptedPath = 15,        // commit_tree_kv: an accepted path that is not a valid move (offsets, lengths)
  kErrContextLen = 16,          // planner: context_lens[r] outside [0, kMaxContextLen]
  kErrTokenParent = 17,         // tree_rejection_sample: token_parent of offset i >= 1 outside [0, i)
  kErrStatsPosition = 18,       // AcceptanceStats.update: a trial's row_position + j outside [0, num_positions)
  kErrKvScale = 19,             // fp8 KV: a scale that is NaN, infinite or <= 0
  kErrSinks = 20,               // verify_attention: a sink that is NaN or infinite
};

// Slots of the per-device error counter buffer (int32 [kNumErrorCounters]). Values that cannot be
// checked without a host sync are made safe on the device and counted here; the Python layer names
// them in adaptive_verify.error_counts(). Keep in sync with python/adaptive_verify/errors.py.
enum ErrorCounter : int {
  kCountNanSurvival = 0,        // NaN confidence (prefix_survival) / request cut by a NaN survival (planner)
  kCountDraftsOutOfRange = 1,   // drafts[r] outside [0, K] on the device (clamped)
  kCountSlotOutOfRange = 2,     // position beyond the block table (slot written as -1)
  kCountNanLogits = 3,          // NaN logits: ignored by draft_margin, never emitted by the sampler
  kCountNanConfidence = 4,      // NaN confidences skipped by AcceptanceStats.update
  kCountDraftIdOutOfRange = 5,  // rejection_sample: draft id outside [0, V) (rejected, never an index)
  kCountQueryLenOutOfRange = 6, // rejection_sample: q_len < 0, > K + 1 or rows past T (clamped / padding)
  kCountSamplingParamOutOfRange = 7,  // top_k < 0, top_p or min_p NaN / outside their range: that filter is off
  kCountWeightOutOfRange = 8,   // planner weights NaN, negative or infinite: the request weighs 1
  kCountBadParent = 9,          // draft trees: a parent outside [-1, j): the node (and its subtree) is no candidate
  kCountDuplicateSibling = 10,  // draft trees: a node repeating an earlier sibling's id: it (and its subtree) is none
  kCountAcceptedPath = 11,      // commit_tree_kv: a request whose accepted path is invalid: nothing of it is moved
  kCountContextLenOutOfRange = 12,  // planner: context_lens[r] outside [0, kMaxContextLen] (its metadata padding)
  kCountTokenParent = 13,       // tree_rejection_sample: a token whose parent offset is outside [0, i): never entered
  kCountStatsPosition = 14,     // AcceptanceStats.update: a trial at a position outside [0, num_positions): not counted
  kCountKvScale = 15,           // fp8 KV: a per-head scale tensor entry that is NaN, infinite or <= 0 (used as given)
  kCountSink = 16,              // verify_attention: a sinks entry that is NaN or infinite (used as given)
  kNumErrorCounters = 24,
};

AV_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

// Set bits of a 64-bit word (the planner's candidate sets, a draft-tree mask's depths).
AV_HD int popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

AV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// A non-NaN float's place in the order of floats, as an integer (a min / max reduction over integers then orders
// floats; -0 and +0 map to the same 0), and back.
AV_HD int64_t float_order(float x) {
  const uint32_t b = float_bits(x);
  return (b >> 31) ? -int64_t(b & 0x7fffffffu) : int64_t(b);
}
AV_HD float float_of_order(int64_t o) { return bits_float(o < 0 ? uint32_t(-o) | 0x80000000u : uint32_t(o)); }

// A value in [0, 1] in 32.32 fixed point (survivals, softmax terms, confidences): x * 2^32 is exact in float (a
// power-of-two scale) and the conversion truncates identically on host and device, so sums of these are exact in
// any order. x <= 1 keeps x * 2^32 <= 2^32 within int64: the signed conversion is one instruction on x86-64.
AV_HD uint64_t to_fixed(float x) {
#if defined(__CUDA_ARCH__)
  return uint64_t(__float2ll_rz(x * 4294967296.0f));
#else
  return uint64_t(static_cast<int64_t>(x * 4294967296.0f));
#endif
}

// Adds one to an error counter: atomically on the device, plainly on the host (CPU kernels are serial).
AV_HD void atomic_count(int32_t* counters, int slot) {
  if (counters == nullptr) return;
#if defined(__CUDA_ARCH__)
  atomicAdd(counters + slot, 1);
#else
  counters[slot] += 1;
#endif
}

}  // namespace adaptive_verify
