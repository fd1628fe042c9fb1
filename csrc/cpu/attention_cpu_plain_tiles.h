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

// The largest tile of a call: kPlainBlockQ x kPlainBlockK, or less for short rows. The threads' working
// memory is sized by it, so that a small call does not map (and fault in) a whole tile's memory.
struct TileBounds {
  int64_t rows;  // queries, at most kPlainBlockQ
  int64_t cols;  // keys, at most kPlainBlockK
};

inline TileBounds tile_bounds(int64_t seqlen_q, int64_t seqlen_k) {
  return {std::min(kPlainBlockQ, seqlen_q), std::min(kPlainBlockK, seqlen_k)};
}

// The first rows * cols elements of `buffer` as a contiguous [rows, cols] matrix.
inline at::Tensor matrix(const at::Tensor& buffer, int64_t rows, int64_t cols) {
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

// t ([rows, cols]) with contiguous rows: itself, or a contiguous copy.
inline at::Tensor with_unit_column_stride(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) >= t.size(1) ? t : t.contiguous();
}

// The bfloat16 bits of a bfloat16 tensor (the 16-bit operands of attention_cpu_gemm_bf16.h and of
// attention_cpu_bwd_rows.h's copies).
inline uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// Scores of keys outside each row's causal limit and window become -inf.  scores: [rows, cols]
// contiguous float32, rows from query q0, columns from key k0.
inline void mask_causal_tile(const at::Tensor& scores, const KeyLimit& keys, int64_t q0, int64_t k0) {
  const int64_t rows = scores.size(0), cols = scores.size(1);
  float* s = scores.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const KeyLimit::TileKeys seen = keys.visible_in_tile(q0 + r, k0, cols);
    float* row = s + r * cols;
    std::fill(row, row + seen.first, -std::numeric_limits<float>::infinity());
    std::fill(row + seen.first + seen.count, row + cols, -std::numeric_limits<float>::infinity());
  }
}

// The [rows, cols] tile of (batch b, query head h)'s [Lq, Lk] plane of an attention mask ([B, Hq, Lq, Lk],
// any strides), rows from query q0 and columns from key k0: a view.
inline at::Tensor mask_tile(const at::Tensor& mask, int64_t b, int64_t h, int64_t q0, int64_t k0, int64_t rows,
                            int64_t cols) {
  return mask.select(0, b).select(0, h).narrow(0, q0, rows).narrow(1, k0, cols);
}

// Where a mask tile excludes its key: False, or -inf (whatever the score: attention_cpu_mask.h's rule).
inline at::Tensor excluded(const at::Tensor& tile) {
  return tile.scalar_type() == at::kBool ? tile.logical_not() : at::isneginf(tile);
}

// Applies an attention mask tile to a score tile (scores: [rows, cols] contiguous float32): a floating
// mask adds to the scores, and an excluded key's score becomes -inf.
inline void apply_mask_tile(const at::Tensor& scores, const at::Tensor& tile) {
  if (tile.scalar_type() != at::kBool) scores.add_(tile);
  scores.masked_fill_(excluded(tile), -std::numeric_limits<float>::infinity());
}

// Whether the tile of rows from q0 and cols keys from k0 holds a key some row does not see.
inline bool tile_needs_causal_mask(const KeyLimit& keys, int64_t q0, int64_t rows, int64_t k0, int64_t cols) {
  return keys.is_causal && (keys.key_end(q0) < k0 + cols || keys.key_begin(q0 + rows - 1) > k0);
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
