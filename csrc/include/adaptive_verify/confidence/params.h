// Arguments of the confidence-area ops as raw pointers and sizes (no torch types).
#pragma once

#include <cstdint>

#include "adaptive_verify/common.h"

namespace adaptive_verify {
namespace confidence {

// conf[r, j] = sigmoid((hidden[r, j, :] . weight[:H] + markov[r, j, :] . weight[H:] + bias) / T_j)
struct ConfidenceParams {
  const void* hidden = nullptr;  // [R, K, H] of `dtype`, strides (hidden_stride_r, hidden_stride_k, 1)
  int64_t hidden_stride_r = 0, hidden_stride_k = 0;
  const void* markov = nullptr;  // [R, K, Q] of `dtype` or null, strides (markov_stride_r, markov_stride_k, 1)
  int64_t markov_stride_r = 0, markov_stride_k = 0;
  int32_t dtype = 0;             // DType of hidden and markov
  const float* weight = nullptr;  // [H + Q] float32
  float bias = 0.f;               // used when bias_ptr is null
  const float* bias_ptr = nullptr;  // 0-d float32 on the kernel's device, or null
  const float* temperature = nullptr;  // [K] float32 or null
  int32_t num_reqs = 0, max_drafts = 0;
  int64_t hidden_size = 0, markov_size = 0;  // H, Q
  int32_t survival = 0;  // 1: write the cumulative product along K
  float* out = nullptr;  // [R, K] float32 contiguous
};

// conf[r, j] = sigmoid(logits[r, j] / T_j) (cumprod along K when survival)
struct LogitParams {
  const void* logits = nullptr;  // [R, K] of `dtype`, row stride logits_stride
  int64_t logits_stride = 0;
  int32_t dtype = 0;
  const float* temperature = nullptr;
  int32_t num_reqs = 0, max_drafts = 0;
  int32_t survival = 0;
  float* out = nullptr;
};

// margin[r, j] = top-1 minus top-2 of draft_logits[r, j, :] (NaN entries ignored and counted)
struct MarginParams {
  const void* logits = nullptr;  // [R, K, V] of `dtype`, strides (stride_r, stride_k, 1)
  int64_t stride_r = 0, stride_k = 0;
  int32_t dtype = 0;
  int32_t num_reqs = 0, max_drafts = 0;
  int64_t vocab = 0;
  float* out = nullptr;  // [R, K] float32
  int32_t* error_counts = nullptr;
};

// Binned acceptance statistics (see stats.py): trial at (r, j) iff j < verify_lens[r] and
// j <= num_accepted[r]; survival iff j < num_accepted[r]; bin of conf[r, j] among num_bins; counted at position j,
// or at row_position[r] + j when row_position is given (rows that are single trials somewhere else, e.g. the nodes
// of a draft tree at their depths: conf [T, 1], verify_lens 1 for a trial, num_accepted 1 for a survival).
struct StatsParams {
  const float* conf = nullptr;  // [R, K] float32, row stride conf_stride
  int64_t conf_stride = 0;
  const int32_t* verify_lens = nullptr;   // [R]
  const int32_t* num_accepted = nullptr;  // [R]
  int32_t num_reqs = 0, max_drafts = 0;   // K of conf (<= num_positions)
  int32_t num_positions = 0, num_bins = 0;
  int64_t* trials = nullptr;     // [num_positions, num_bins]
  int64_t* survivals = nullptr;  // [num_positions, num_bins]
  int64_t* conf_sum = nullptr;   // [num_positions, num_bins], sum of conf in 32.32 fixed point (exact, any order)
  int32_t* error_counts = nullptr;
  // [2] nullable: += sum_r verify_lens[r] and sum_r min(num_accepted[r], verify_lens[r]) (every row, as given), so a
  // caller's running totals cost no extra op per step.
  int64_t* totals = nullptr;
  // [R] nullable: row r's entry j counts at position row_position[r] + j. A trial whose position falls outside
  // [0, num_positions) is not counted: the CPU returns kErrStatsPosition, CUDA counts kCountStatsPosition.
  const int32_t* row_position = nullptr;
};

}  // namespace confidence
}  // namespace adaptive_verify
