// What the CPU's gemm-tiled forward and backward (attention_cpu_fwd_plain.cpp, attention_cpu_bwd_plain.cpp)
// share: their tile sizes, a buffer viewed as a tile, and the causal mask of a score tile.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

constexpr int64_t kPlainBlockQ = 256;
constexpr int64_t kPlainBlockK = 512;

// The first rows * cols elements of `buffer` as a contiguous [rows, cols] matrix.
inline at::Tensor matrix(const at::Tensor& buffer, int64_t rows, int64_t cols) {
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

// Scores of keys past each row's causal limit become -inf.  scores: [rows, cols] contiguous float32,
// rows from query q0, columns from key k0.
inline void mask_causal_tile(const at::Tensor& scores, const KeyLimit& keys, int64_t q0, int64_t k0) {
  const int64_t rows = scores.size(0), cols = scores.size(1);
  float* s = scores.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = keys.visible_in_tile(q0 + r, k0, cols);
    std::fill(s + r * cols + n, s + (r + 1) * cols, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
