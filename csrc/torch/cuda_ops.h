// The CUDA implementations of the flashattn ops (schemas in library.cpp): argument checks, output and
// workspace allocation, the plan (csrc/plan.h) and its launches on the current stream, and the pieces
// the forward and backward share. Compiled only in builds with the CUDA kernels.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <optional>
#include <tuple>

#include "params.h"
#include "plan.h"
#include "torch/checks.h"

namespace flashattn {
namespace cuda_ops {

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                       bool is_causal, bool causal_bottom_right,
                                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                       const std::optional<at::Tensor>& rng_state, bool deterministic,
                                       const std::optional<at::Tensor>& sink, double softcap, int64_t window_left,
                                       int64_t window_right, const std::optional<at::Tensor>& alibi_slopes);

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   double scale, bool is_causal, bool causal_bottom_right,
                                                   bool deterministic, const std::optional<at::Tensor>& attn_mask,
                                                   const std::optional<at::Tensor>& dmask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state,
                                                   const std::optional<at::Tensor>& sink,
                                                   const std::optional<at::Tensor>& dsink, double softcap,
                                                   int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes);

at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p);

// ---- shared by the forward and the backward ----

TensorStrides strides_of(const at::Tensor& t);

// Whether 16-byte loads can read t's rows: every row start 16-byte aligned, whole 16-byte chunks per row.
bool rows_aligned_16(const at::Tensor& t);

// Whether TMA can describe t (sm90::tma_describable).
bool tma_describable(const at::Tensor& t);

// Raises unless q's GPU can run flashattn's kernels (compute capability 8.0+).
void check_cuda_device(const char* op, const at::Tensor& q);

// The planner's view of q's GPU, asked once per device.
DeviceInfo device_info(const at::Tensor& q);

AttentionShape make_shape(const CheckedShape& s, const at::Tensor& q, double scale, bool is_causal);

// The shape with its scores soft-capped at softcap (cuda/softcap.h; 0 leaves it as it is).
AttentionShape with_softcap(AttentionShape shape, double softcap);

bool has_work(const CheckedShape& s);

// Raises, before anything is launched, when the plan's sm80 kernel needs more shared memory per block
// than the GPU offers (plan.h, SmemFit).
void check_smem_fit(const SmemFit& fit, const char* op, int head_dim);

// Raises for an sm90 launch that failed; a TMA descriptor the driver refused gets a message of its own.
void check_sm90_launch(cudaError_t err, const char* op);

// DropoutParams for a checked (dropout_p, rng_state); disabled for dropout_p == 0.
DropoutParams make_dropout(double dropout_p, const std::optional<at::Tensor>& rng_state);

}  // namespace cuda_ops
}  // namespace flashattn
