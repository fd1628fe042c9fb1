// The CPU backward's two elementwise steps over one float32 tile of the gemm-tiled backward
// (attention_cpu_bwd_plain.cpp), each one pass per row instead of a chain of ATen operations over the
// whole tile, optionally writing the tile's bfloat16 copy (the operand of the bfloat16 products) in the
// same pass. Internal to csrc/cpu/.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cpu {
namespace detail {

// s[r, j] <- exp(a s[r, j] - lse[r]) (P from the scores and the forward's lse; a: the softmax scale
// where s holds unscaled products, else 1). lse[r] = +inf gives a row P = 0 (the caller's form of a
// row that saw no key), a -inf score P = 0, a NaN score NaN; exponentials below float32's normal range
// are 0, as in online_softmax_rows.  s: [rows, cols] float32, contiguous; lse: [rows].
// p16 (or null): [rows, cols] contiguous, P's bfloat16 bits (round to nearest even, NaN -> 0x7fc0).
void bwd_probs_rows(float* s, int64_t rows, int64_t cols, float a, const float* lse, uint16_t* p16);

// dp[r, j] <- p[r, j] (dp[r, j] - delta[r]) (dS from dP, P and delta = rowsum(dO * O)).
// dp, p: [rows, cols] float32, contiguous; delta: [rows]; ds16 (or null): dS's bfloat16 bits, as p16.
void bwd_dscores_rows(float* dp, const float* p, int64_t rows, int64_t cols, const float* delta, uint16_t* ds16);

// bits[i] <- the bfloat16 bits of x[i], i < n (as above): for tiles the steps above could not convert.
void to_bf16_bits(const float* x, int64_t n, uint16_t* bits);

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
