// The CPU forward without a mask or dropout for float16 / bfloat16 inputs: tiles whose products and
// exponentials run in ATen's vectorized CPU kernels. Internal to csrc/cpu/.
#pragma once

#include <ATen/ATen.h>

#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

// Whether fwd_plain serves inputs of this dtype: float16 and bfloat16. Not float64 (the tiles are
// float32), nor float32 yet: there the loops' results with a neutral mask (all True, all 0) are the
// same bits as without one (tests/test_cpu_masks.py), which the tiles' other roundings would break;
// the tiled backward (attention_cpu_bwd_plain.h) would serve float32 as well (it recomputes the
// scores over the forward's tiles with its roundings, and passed the ill-conditioned float32 cases).
inline bool fwd_plain_serves(at::ScalarType dtype) { return dtype == at::kHalf || dtype == at::kBFloat16; }

// out [B, Lq, Hq, D] (q's dtype) and lse [B, Hq, Lq] (float32), written in place; q [B, Lq, Hq, D],
// k / v [B, Lk, Hk, D], any strides; sink [Hq] logits joining each row's denominator, or nullptr;
// softcap > 0 caps the scaled scores to softcap * tanh(score / softcap).
void fwd_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, const KeyLimit& keys, const float* sink, double softcap);

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
