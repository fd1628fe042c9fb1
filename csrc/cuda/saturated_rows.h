// Backward statistics of saturated rows: rows whose LSE is so large in magnitude that a float has no
// room left beside it for log(sum of exponentials). Used by the backward's preprocess kernel (sm80 and
// sm90 backwards alike) when the attention mask is additive.
//
// An additive mask of huge negative values on every key a query sees (torch.finfo(dtype).min, which
// the kernels floor at kMaskFloorLog2, or -1e9) puts the row's largest score, and with it the LSE,
// near the mask value. The forward's LSE = m + log(l) then rounds to m or a neighbour of m (at 1e30
// floats are 7e22 apart), and the backward's P = exp2(s * scale + mask - LSE) is off by the lost
// factor: every key of a uniform row gets P = 1 instead of 1 / l.
//
// For such a row the preprocess recomputes the row in the main kernels' own arithmetic,
//   x_j = (s_j * scale_log2 - L0) + term_j,   L0 = max over visible keys of s_j * scale_log2 + term_j,
//   l   = sum over visible keys of exp2(x_j)  (term_j: the mask's base-2 term, MaskView::add_log2),
// and hands the main kernel L0 as the row's LSE with dO and delta scaled by 1 / l. The main kernel's P
// is then l times the true one and its dP - delta 1 / l times, so dS, dV, dK, dQ and the mask's
// gradient come out as if the LSE had been exact.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "common/mask.h"
#include "params.h"
#include "cuda/mask_view.h"
#include "cuda/element_ops.h"

namespace flashattn {

// |LSE| (base 2) from which a row counts as saturated: floats there are 1/128 or more apart, so the
// LSE can be off by 0.4% in P or more (log2 of a row's sum is at most 31).
constexpr float kSaturatedLseLog2 = 65536.f;  // 2^16
// From this |L0| on, floats are 256 or more apart: every score with |s * scale_log2| < 128 is
// absorbed by the mask term in the kernels' arithmetic (x_j = term_j - L0 exactly), so the row needs
// no dot products. Below it, s_j is recomputed in float32 (the tensor cores' accumulation order
// differs only in the last bits, which move x_j by one float spacing in rare elements).
constexpr float kAbsorbedLseLog2 = 2147483648.f;  // 2^31

template <int kLanes>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

template <int kLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// Row `query` of (batch, head), shared by kLanes consecutive lanes (this one is `sub` of them). Every
// lane of the warp calls this (it shuffles), the lanes of rows that are not `saturated` included;
// for a saturated row, *lse_log2 becomes L0 and *rescale 1 / l (unchanged otherwise).
template <typename T, int kLanes>
__device__ void rebalance_saturated_row(const BwdParams& p, int batch, int head, int query, bool saturated, int sub,
                                        float* lse_log2, float* rescale) {
  using Ops = ElementOps<T>;
  const AttentionShape& s = p.shape;
  const MaskView<T> mask(p.mask, batch, head, 0);
  const int kv_head = head / (s.heads_q / s.heads_kv);
  const T* q_row = static_cast<const T*>(p.q) + batch * p.q_strides.batch + static_cast<int64_t>(query) * p.q_strides.row +
                   head * p.q_strides.head;  // [D]
  const T* k_head = static_cast<const T*>(p.k) + batch * p.k_strides.batch + kv_head * p.k_strides.head;  // [Lk, D]
  auto score = [&](int key) {  // q . k in float32
    const T* k_row = k_head + static_cast<int64_t>(key) * p.k_strides.row;
    float acc = 0.f;
    for (int d = 0; d < s.head_dim; ++d) acc = fmaf(Ops::to_float(q_row[d]), Ops::to_float(k_row[d]), acc);
    return acc;
  };
  auto visible_term = [&](int key) {  // the key's base-2 mask term, -inf where the key takes no part
    if (!saturated || !key_visible(query, key, s.seqlen_k, s.is_causal, s.causal_offset)) return -INFINITY;
    return mask.add_log2(query, key);
  };

  float term_max = -INFINITY;
  for (int key = sub; key < s.seqlen_k; key += kLanes) term_max = fmaxf(term_max, visible_term(key));
  term_max = group_max<kLanes>(term_max);
  const bool absorbed = fabsf(term_max) >= kAbsorbedLseLog2;

  float x_max = -INFINITY;
  for (int key = sub; key < s.seqlen_k && !absorbed; key += kLanes) {
    const float term = visible_term(key);
    if (term != -INFINITY) x_max = fmaxf(x_max, fmaf(score(key), s.scale_log2, term));
  }
  x_max = group_max<kLanes>(x_max);  // outside any branch: the two rows of a warp may differ in `absorbed`
  const float l0 = absorbed ? term_max : x_max;
  float sum = 0.f;
  for (int key = sub; key < s.seqlen_k; key += kLanes) {
    const float term = visible_term(key);
    if (term == -INFINITY) continue;
    // The main kernels' order: the score's FMA with -LSE first, then the term.
    const float x = fmaf(absorbed ? 0.f : score(key), s.scale_log2, -l0) + term;
    sum += exp2f(x);
  }
  sum = group_sum<kLanes>(sum);
  if (saturated && term_max != -INFINITY) {
    *lse_log2 = l0;
    *rescale = 1.f / sum;
  }
}

}  // namespace flashattn
