// The CUDA implementations of the flashattn ops (schemas in library.cpp): argument checks, output
// and workspace allocation, the choice between the sm90 and sm80 kernel paths, and the launch on the
// current stream. Compiled only in builds with the CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace flashattn {
namespace cuda_ops {

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                       bool is_causal, bool causal_bottom_right,
                                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                       const std::optional<at::Tensor>& rng_state, bool deterministic);

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   double scale, bool is_causal, bool causal_bottom_right,
                                                   bool deterministic, const std::optional<at::Tensor>& attn_mask,
                                                   const std::optional<at::Tensor>& dmask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state);

at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p);

}  // namespace cuda_ops
}  // namespace flashattn
