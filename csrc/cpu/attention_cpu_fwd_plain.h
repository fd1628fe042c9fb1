// The CPU forward without a mask or dropout for float16 / bfloat16 inputs: tiles whose products and
// exponentials run in ATen's vectorized CPU kernels. Internal to csrc/cpu/.
#pragma once

#include <ATen/ATen.h>

#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

// Whether fwd_plain serves inputs of this dtype. Not float32 (nor float64) yet: the backward, still
// in the plain loops, recomputes the scores with other roundings than the gemm's, and on
// ill-conditioned float32 inputs (scores near +-200) dV then erred 3.8x as much as float32 autograd
// attention, past the tests' 3x, which the loops' forward (whose roundings the backward repeats)
// meets. In 16-bit inputs the inputs' own rounding dominates both.
inline bool fwd_plain_serves(at::ScalarType dtype) { return dtype == at::kHalf || dtype == at::kBFloat16; }

// out [B, Lq, Hq, D] (q's dtype) and lse [B, Hq, Lq] (float32), written in place; q [B, Lq, Hq, D],
// k / v [B, Lk, Hk, D], any strides; sink [Hq] logits joining each row's denominator, or nullptr;
// softcap > 0 caps the scaled scores to softcap * tanh(score / softcap).
void fwd_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, const KeyLimit& keys, const float* sink, double softcap);

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
