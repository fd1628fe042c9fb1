// ALiBi in the CUDA kernels: query i's score for key j gets -slope * |i + alibi_offset - j| added after
// the scale (FlashAttention-2's bias; alibi_offset = seqlen_k - seqlen_q puts query i at key position
// i + Lk - Lq). The kernels hold raw q.k (or, soft-capped, tanh of it) until they scale it to base-2
// units, so they add the term in raw units, slope * AttentionShape::alibi_unit * distance, right
// after the QK^T product (and soft-capping): every later step (masks, the online softmax, the LSE, the
// backward's P) then sees the biased score. The term does not depend on q or k, so the backward's dS
// is unchanged. The distances are exact in float32 up to 2^24 keys.
#pragma once

#include <cuda_runtime.h>

#include "params.h"

namespace flashattn {

// The slope of (batch, query head) in raw-score units, negated (the term is slope * |distance|);
// 0 without ALiBi, where the kernels skip the term.
__device__ __forceinline__ float alibi_slope(const AttentionShape& sh, int batch, int head) {
  if (sh.alibi_slopes == nullptr) return 0.f;
  return -__ldg(sh.alibi_slopes + static_cast<int64_t>(batch) * sh.alibi_batch_stride + head) * sh.alibi_unit;
}

// s += slope * |distance|, where slope is alibi_slope's.
__device__ __forceinline__ float add_alibi(float s, float slope, float distance) {
  return fmaf(slope, fabsf(distance), s);
}

}  // namespace flashattn
