// CPU implementation of the flashattn ops: the same tiled online-softmax algorithm as the GPU kernels,
// in float32/float64 (float accumulation for float16/bfloat16 inputs). Arguments are checked by the caller.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace flashattn {
namespace cpu {

// q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] (any strides). Key j is visible to query i iff !is_causal or
// j <= i + causal_offset. Returns out [B, Lq, Hq, D] contiguous in q's dtype (0 for a row that sees no
// key) and lse [B, Hq, Lq] (float64 for float64 inputs, else float32; -inf for such a row).
std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       double scale, bool is_causal, int64_t causal_offset);

// Gradients of fwd's out: dq like q, dk/dv like k (summed over each query-head group), contiguous.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& out, const at::Tensor& lse, double scale,
                                                   bool is_causal, int64_t causal_offset);

}  // namespace cpu
}  // namespace flashattn
