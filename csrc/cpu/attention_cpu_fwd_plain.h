// The CPU forward without dropout for float32 / float16 / bfloat16 inputs: tiles whose products and
// exponentials run in ATen's vectorized CPU kernels. Internal to csrc/cpu/.
#pragma once

#include <ATen/ATen.h>

#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

// Whether fwd_plain serves inputs of this dtype: float32, float16 and bfloat16. Not float64 (the tiles
// are float32). A masked call also needs finite k and v (tiles_take_mask).
inline bool fwd_plain_serves(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
}

// Whether the plain forward's 16-bit products of this dtype and head dim run on the CPU's 16-bit matrix
// units (ATen's brgemm where cpublas::could_pack: AMX), P rounded to the dtype for P V; else on float32
// copies.
bool matrix_units_serve(at::ScalarType dtype, int64_t head_dim);

// The form of the forward's bfloat16 products on this CPU: "matrix_units" (AMX), "avx512_bf16"
// (attention_cpu_gemm_bf16.h), both rounding P to bfloat16 for P V, or "float32" (float32 copies).
const char* fwd_bf16_products_form();

// Whether the tiles may run a masked call: an excluded key takes no part in the loops, and in a gemm only
// while its k and v rows are finite (0 * inf is NaN).
inline bool tiles_take_mask(const at::Tensor& k, const at::Tensor& v) {
  return at::isfinite(k).all().item<bool>() && at::isfinite(v).all().item<bool>();
}

// out [B, Lq, Hq, D] (q's dtype) and lse [B, Hq, Lq] (float32), written in place; q [B, Lq, Hq, D],
// k / v [B, Lk, Hk, D], any strides; mask: an attention mask [B, Hq, Lq, Lk] (any strides; bool, or
// floating, added to the scaled scores), or undefined; sink [Hq] logits joining each row's denominator,
// or nullptr; softcap > 0 caps the scaled scores to softcap * tanh(score / softcap) (before the mask).
void fwd_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, const KeyLimit& keys, const at::Tensor& mask, const float* sink,
               double softcap);

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
