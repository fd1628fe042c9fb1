// Building blocks shared by the CPU forward and backward: tile sizes, strided row access, the causal
// mask as a per-row key limit, and the small dense loops (tile loads, tile matmuls, row updates) that
// the kernels are written in. Internal to csrc/cpu/.
//
// Every matmul loop here keeps its innermost loop element-wise over a contiguous tile row (no
// reduction in the inner loop), so the compiler vectorizes it without reassociating floating-point
// sums: the result is the same bit for bit however the work is split across threads. Their pointers
// are __restrict (the buffers never overlap): without it the compiler re-checks for overlap on every
// short inner loop and keeps the accumulators in memory, about 2x slower.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/mask.h"

namespace flashattn {
namespace cpu {
namespace detail {

// A 64 x 64 score tile (16 KiB in float) and 64-row Q/K/V tiles of up to 256 dims (64 KiB each)
// together fit in a core's L2 cache, and 64 matches the GPU kernels' key block.
constexpr int64_t kBlockQ = 64;  // query rows per tile
constexpr int64_t kBlockK = 64;  // key rows per tile

// Accumulation type: float for float16/bfloat16/float32 inputs, double for float64.
template <typename scalar_t>
using acc_type = at::opmath_type<scalar_t>;

// Rows of a [B, L, H, D] tensor with arbitrary element strides on the first three dims and a
// contiguous last dim (checked by the caller).
template <typename T>
struct RowsView {
  T* data;
  int64_t batch_stride, seq_stride, head_stride;

  T* row(int64_t b, int64_t i, int64_t h) const { return data + b * batch_stride + i * seq_stride + h * head_stride; }
};

template <typename T>
RowsView<T> rows_view(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

// A scaled score soft-capped to cap * tanh(score / cap) (Gemma 2), or unchanged for cap 0.
template <typename acc_t>
acc_t soft_capped(acc_t score, acc_t cap) {
  return cap == acc_t(0) ? score : cap * std::tanh(score / cap);
}

// The causal mask and sliding window (common/mask.h, shared with the GPU kernels) reduced to what the
// loops need: query i sees exactly the keys [key_begin(i), key_end(i)).
struct KeyLimit {
  bool is_causal;
  int64_t causal_offset;  // key j visible to query i iff j <= i + causal_offset
  int64_t seqlen_k;
  int64_t window_span;  // and, when >= 0, iff j >= i + causal_offset - window_span

  // The keys [first, first + count) of a tile, counted from its first key.
  struct TileKeys {
    int64_t first, count;
  };

  int64_t key_end(int64_t i) const {
    // Sizes are below 2^31 (checked by the caller), so the int predicates apply.
    const int end = visible_key_end(static_cast<int>(i + 1), static_cast<int>(seqlen_k), is_causal,
                                    static_cast<int>(causal_offset));
    return std::clamp<int64_t>(end, 0, seqlen_k);
  }
  int64_t key_begin(int64_t i) const {
    return visible_key_begin(static_cast<int>(i), static_cast<int>(causal_offset), static_cast<int>(window_span));
  }
  // The first key any query from q0 on sees, rounded down to a multiple of `block`: where a walk over
  // key tiles of that size starts.
  int64_t first_tile_key(int64_t q0, int64_t block) const { return key_begin(q0) / block * block; }
  // The keys of the tile of `cols` keys starting at key k0 that query i sees.
  TileKeys visible_in_tile(int64_t i, int64_t k0, int64_t cols) const {
    const int64_t end = std::clamp<int64_t>(key_end(i) - k0, 0, cols);
    const int64_t first = std::clamp<int64_t>(key_begin(i) - k0, 0, end);
    return {first, end - first};
  }
  // The first query that sees key k0 (queries before it see none of the keys >= k0).
  int64_t first_query_seeing(int64_t k0, int64_t seqlen_q) const {
    const int first = ::flashattn::first_query_seeing(static_cast<int>(k0), is_causal, static_cast<int>(causal_offset));
    return std::min<int64_t>(first, seqlen_q);
  }
  // One past the last query that sees key k_last (queries after it see none of the keys <= k_last).
  int64_t query_end_seeing(int64_t k_last, int64_t seqlen_q) const {
    return last_query_seeing_end(static_cast<int>(k_last), static_cast<int>(seqlen_q), static_cast<int>(causal_offset),
                                 static_cast<int>(window_span));
  }
};

// dst[r, :] = src row (b, i0 + r, h) converted to acc_t, for r < rows.  dst: [rows, D]
template <typename acc_t, typename scalar_t>
void load_rows(acc_t* dst, const RowsView<const scalar_t>& src, int64_t b, int64_t i0, int64_t h, int64_t rows,
               int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* x = src.row(b, i0 + r, h);  // [D]
    acc_t* y = dst + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) y[d] = static_cast<acc_t>(x[d]);
  }
}

// dst[d, r] = src row (b, i0 + r, h)[d], for r < rows.  dst: [D, kBlockK], so that a score row
// q . K^T can be accumulated with an element-wise inner loop over keys.
template <typename acc_t, typename scalar_t>
void load_rows_transposed(acc_t* dst, const RowsView<const scalar_t>& src, int64_t b, int64_t i0, int64_t h,
                          int64_t rows, int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* x = src.row(b, i0 + r, h);  // [D]
    for (int64_t d = 0; d < head_dim; ++d) dst[d * kBlockK + r] = static_cast<acc_t>(x[d]);
  }
}

// out[0:n] = a . bT[:, 0:n], with a: [D] and bT: [D, kBlockK] (a transposed tile).  out: [n]
template <typename acc_t>
void row_times_tile_transposed(acc_t* __restrict out, const acc_t* __restrict a, const acc_t* __restrict bT,
                               int64_t n, int64_t head_dim) {
  std::fill(out, out + n, acc_t(0));
  for (int64_t d = 0; d < head_dim; ++d) {
    const acc_t ad = a[d];
    const acc_t* bT_row = bT + d * kBlockK;
    for (int64_t j = 0; j < n; ++j) out[j] += ad * bT_row[j];
  }
}

// y[0:D] += sum_{j < n} w[j] * tile[j, :], with tile: [n, D].
template <typename acc_t>
void add_weighted_rows(acc_t* __restrict y, const acc_t* __restrict w, const acc_t* __restrict tile, int64_t n,
                       int64_t head_dim) {
  for (int64_t j = 0; j < n; ++j) {
    const acc_t wj = w[j];
    const acc_t* t = tile + j * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) y[d] += wj * t[d];
  }
}

// tile[j, :] += w[j] * x[0:D] for j < n, with tile: [n, D] (a rank-1 update).
template <typename acc_t>
void add_outer(acc_t* __restrict tile, const acc_t* __restrict w, const acc_t* __restrict x, int64_t n,
               int64_t head_dim) {
  for (int64_t j = 0; j < n; ++j) {
    const acc_t wj = w[j];
    acc_t* t = tile + j * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) t[d] += wj * x[d];
  }
}

// With an attention mask, keys whose bias is -inf are excluded: the two updates above restricted to
// the kept keys, so that an excluded key takes no part at all (as a causal-hidden one, which is never
// loaded): an inf/NaN in its row cannot reach the sums through a zero weight. The kept keys are
// summed in the same order as above.  bias: [n]
template <typename acc_t>
void add_weighted_kept_rows(acc_t* __restrict y, const acc_t* __restrict w, const acc_t* __restrict tile,
                            const acc_t* __restrict bias, int64_t n, int64_t head_dim) {
  for (int64_t j = 0; j < n; ++j) {
    if (bias[j] == -std::numeric_limits<acc_t>::infinity()) continue;
    const acc_t wj = w[j];
    const acc_t* t = tile + j * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) y[d] += wj * t[d];
  }
}

template <typename acc_t>
void add_outer_kept(acc_t* __restrict tile, const acc_t* __restrict w, const acc_t* __restrict x,
                    const acc_t* __restrict bias, int64_t n, int64_t head_dim) {
  for (int64_t j = 0; j < n; ++j) {
    if (bias[j] == -std::numeric_limits<acc_t>::infinity()) continue;
    const acc_t wj = w[j];
    acc_t* t = tile + j * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) t[d] += wj * x[d];
  }
}

// dst row (b, i, h)[d] = factor * src[d], converted to the output dtype.
template <typename scalar_t, typename acc_t>
void store_row(const RowsView<scalar_t>& dst, int64_t b, int64_t i, int64_t h, const acc_t* src, acc_t factor,
               int64_t head_dim) {
  scalar_t* y = dst.row(b, i, h);  // [D]
  for (int64_t d = 0; d < head_dim; ++d) y[d] = static_cast<scalar_t>(src[d] * factor);
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
