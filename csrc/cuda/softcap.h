// Score soft-capping in the CUDA kernels: score = cap * tanh(scale * q.k / cap) (Gemma 2), bounded by
// +-cap. The host sets AttentionShape::softcap_inner = scale / cap and scale_log2 = cap * log2 e; the
// kernels turn their raw q.k into tanh(q.k * softcap_inner) right after the QK^T product, and every
// later step (masks, the online softmax, the LSE, the backward's P) then sees the capped score in
// base-2 units unchanged.
#pragma once

#include <cuda_runtime.h>

#include "params.h"

namespace flashattn {

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// s[i] = tanh(s[i] * inner) for the first N scores of a block.
template <int N>
__device__ __forceinline__ void softcap_scores(float (&s)[N], float inner) {
#pragma unroll
  for (int i = 0; i < N; ++i) s[i] = tanh_approx(s[i] * inner);
}

// The backward's chain factor d score / d (scale q.k) = 1 - t^2 of a score whose probability is
// p = exp2(t * scale_log2 - lse_log2), t = tanh(scale q.k / cap), with t recovered from p (the kernels
// keep no copy of t: registers); 0 where p is 0, whose dS is 0 anyway. Needs p without an additive
// mask's term (the ops refuse soft-capping with a floating attn_mask).
__device__ __forceinline__ float softcap_grad(float p, float lse_log2, float inv_scale_log2) {
  const float t = (log2f(p) + lse_log2) * inv_scale_log2;
  return p > 0.f ? fmaf(-t, t, 1.f) : 0.f;
}

}  // namespace flashattn
