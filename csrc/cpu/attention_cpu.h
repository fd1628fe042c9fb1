// CPU implementation of the flashattn ops: the same tiled online-softmax algorithm as the GPU kernels,
// in float32/float64 (float accumulation for float16/bfloat16 inputs). Arguments are checked by the caller.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace flashattn {
namespace cpu {

// q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] (any strides). Key j is visible to query i iff !is_causal or
// j <= i + causal_offset (and, with window_span >= 0, j >= i + causal_offset - window_span: a sliding
// window), and the attention mask, if any, keeps it. attn_mask: [B, Hq, Lq, Lk] with
// any element strides (0 for broadcast dims; read in place, never copied), either bool (True = the key
// takes part) or of q's dtype or float32 (added to the scaled score scale * q.k; -inf excludes the
// key, whatever q.k is). Returns out [B, Lq, Hq, D] contiguous in q's dtype (0 for a row that sees no
// key) and lse [B, Hq, Lq], the log-sum-exp of the masked scaled scores (float64 for float64 inputs,
// else float32; -inf for such a row). With dropout_p > 0, rng_state (a [2] int64 CPU tensor: seed,
// offset) picks the keep-mask of common/dropout.h: out = (P * Z / (1 - p)) V, lse unchanged. sink, a
// (Hq,) tensor of logits (torch/sink.h), joins each row's softmax denominator: lse includes it and a
// row without keys gets lse = sink. softcap > 0 caps every scaled score to softcap * tanh(score /
// softcap) before the mask and the softmax (0: none).
std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       double scale, bool is_causal, int64_t causal_offset,
                                       const std::optional<at::Tensor>& attn_mask = std::nullopt,
                                       double dropout_p = 0.0,
                                       const std::optional<at::Tensor>& rng_state = std::nullopt,
                                       const std::optional<at::Tensor>& sink = std::nullopt, double softcap = 0.0,
                                       int64_t window_span = -1);

// Gradients of fwd's out: dq like q, dk/dv like k (summed over each query-head group), contiguous.
// attn_mask must be the forward's. dmask (floating masks only): a contiguous, zero-filled
// [B, Hq, Lq, Lk] tensor of the mask's dtype that receives the mask's gradient, which is that of the
// pre-softmax score: dS_ij = P_ij (dP_ij - delta_i). Excluded elements, and rows that see no key,
// stay 0. dropout_p and rng_state must be the forward's (the keep-mask is regenerated); dP then carries
// the keep factor Z / (1 - p). softcap must be the forward's; dS then carries the cap's chain factor
// 1 - (capped score / softcap)^2.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& out, const at::Tensor& lse, double scale,
                                                   bool is_causal, int64_t causal_offset,
                                                   const std::optional<at::Tensor>& attn_mask = std::nullopt,
                                                   const std::optional<at::Tensor>& dmask = std::nullopt,
                                                   double dropout_p = 0.0,
                                                   const std::optional<at::Tensor>& rng_state = std::nullopt,
                                                   double softcap = 0.0, int64_t window_span = -1);

// The dropout keep-mask of common/dropout.h for rng_state (seed, offset): [batch, heads, seqlen_q,
// seqlen_k] bool on rng_state's device, True where the probability is kept.
at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p);

}  // namespace cpu
}  // namespace flashattn
