// The online softmax's step over one float32 score tile of the CPU's gemm-tiled forward, fused per row
// (one pass for the row's max, one for its exponentials and their sum) instead of a chain of ATen
// operations over the whole tile. Internal to csrc/cpu/.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cpu {
namespace detail {

// For each row r of `scores` ([rows, cols] float32, contiguous), with m = row_max[r], l = row_sum[r]:
//   m' = max(m, max_j s[r, j]);  shift = m', or 0 where m' is -inf (no key seen yet: exp(-inf - -inf)
//   would be NaN);  s[r, j] <- exp(s[r, j] - shift) (P, relative to m');  c = exp(m - shift) (0 on a
//   row's first visible tile);  l <- l c + sum_j P[r, j];  m <- m';  acc[r, :] *= c (acc: [rows, head_dim]
//   float32, contiguous, the unnormalized output).
// A NaN score makes its P, and so the row's sum and output, NaN. Exponentials below float32's normal
// range are 0 (an excluded key, -inf, gives exactly 0).
// Vectorized for the CPU it runs on (AVX-512 or AVX2 where the CPU has it, chosen once at run time).
void online_softmax_rows(float* scores, int64_t rows, int64_t cols, float* row_max, float* row_sum, float* acc,
                         int64_t head_dim);

// The form online_softmax_rows runs on this CPU: "avx512", "avx2" or "scalar" (FLASHATTN_CPU_VECTOR=avx2
// or scalar, read once, caps it).
const char* online_softmax_rows_form();

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
