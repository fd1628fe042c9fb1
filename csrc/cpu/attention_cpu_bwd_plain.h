// The CPU backward without dropout (attention_cpu_bwd_plain.cpp): the scores recomputed and every
// product (S, dP, dV, dK, dQ) run as a gemm with float32 results. Float32 and float16 inputs
// multiply as float32 tiles (ATen gemms, as the plain forward, attention_cpu_fwd_plain.h, runs its
// own); bfloat16 inputs multiply as bfloat16 operands (P and dS rounded to bfloat16 for their
// products), with dQ, dK and dV accumulated in float32. P and dS come from one fused vector pass
// per row (attention_cpu_bwd_rows.h).
#pragma once

#include <ATen/ATen.h>

#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

// Whether bwd_plain serves a call: inputs of a dtype the plain forward serves (so that the backward
// recomputes the scores with the forward's own roundings) whose lse is small enough everywhere for
// exp(score - lse) to be precise (attention_cpu_bwd.cpp's lse_too_coarse rows need the loops).
bool bwd_plain_serves(at::ScalarType dtype, const at::Tensor& lse);

// dq [B, Lq, Hq, D], dk / dv [B, Lk, Hk, D] (the inputs' dtype), written in place, from dout / out /
// q [B, Lq, Hq, D], k / v [B, Lk, Hk, D] (any strides) and lse [B, Hq, Lq] (float32, the forward's);
// mask and softcap as the forward's (undefined, 0: none); dmask (a floating mask only, or undefined): the
// zero-filled contiguous [B, Hq, Lq, Lk] gradient of the mask, dS, written where the tiles visit.
void bwd_plain(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
               const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
               const at::Tensor& dmask, double softcap);

// The form of the bfloat16 backward's products on this CPU: "avx512_bf16" (PairProducts), "cpublas"
// (CpublasProducts) or "float32" (float32 copies, as for float16 inputs).
const char* bwd_bf16_products_form();

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
