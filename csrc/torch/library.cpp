// The flashattn ops: schemas, per-device implementations (checks, allocation, dispatch), module init.
//
//   fwd(q, k, v, scale, is_causal, causal_bottom_right, attn_mask=None, dropout_p=0.0,
//       rng_state=None, deterministic=False) -> (out, lse)
//   bwd(dout, q, k, v, out, lse, scale, is_causal, causal_bottom_right, deterministic=False,
//       attn_mask=None, dmask=None, dropout_p=0.0, rng_state=None) -> (dq, dk, dv)
//   dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p) -> keep [B, H, Lq, Lk] bool
//
// q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] with any strides but a contiguous last dim; out [B, Lq, Hq, D]
// and lse [B, Hq, Lq] (natural log, -inf for a row that sees no key); dq like q, dk/dv like k, all
// freshly allocated and contiguous. attn_mask is a [B, Hq, Lq, Lk] view with any strides (0 on
// broadcast dims: it is read in place), bool (True = the key takes part), float32 or q's dtype (added
// to scale * q.k). dmask, a contiguous [B, Hq, Lq, Lk] tensor of attn_mask's dtype, is overwritten
// with the gradient of a floating attn_mask. dropout_p in [0, 1) drops each probability (after the
// softmax; the LSE is that of the undropped scores) with the keep-mask of common/dropout.h, seeded by
// rng_state, a [2] int64 tensor (seed, offset) on q's device that the backward must get unchanged;
// dropout_keep_mask materialises that mask (for tests: it is quadratic in memory). fwd's `deterministic`
// is for its backward alone (autograd.cpp passes it to bwd): the forward is always reproducible.
// fwd's autograd kernel is in autograd.cpp; the fake kernels are registered in flashattn/ops.py.
// The forward is bitwise reproducible; the CUDA backward is only with deterministic=True (its dq sums
// in a fixed order), the CPU backward always is.
#include <torch/extension.h>

#include <tuple>

#include "torch/checks.h"
#include "cpu/attention_cpu.h"

#ifdef FLASHATTN_WITH_CUDA
#include "torch/cuda_ops.h"
#include "sm90/api.h"
#endif

namespace flashattn {
namespace {

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           double scale, bool is_causal, bool causal_bottom_right,
                                           const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                           const std::optional<at::Tensor>& rng_state,
                                           bool /*deterministic: the backward's, see autograd.cpp*/) {
  const CheckedShape s = check_fwd_args(q, k, v, causal_bottom_right, attn_mask, dropout_p, rng_state);
  return cpu::fwd(q, k, v, scale, is_causal, s.causal_offset, attn_mask, dropout_p, rng_state);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& out, const at::Tensor& lse,
                                                       double scale, bool is_causal, bool causal_bottom_right,
                                                       bool /*deterministic: the CPU backward always is*/,
                                                       const std::optional<at::Tensor>& attn_mask,
                                                       const std::optional<at::Tensor>& dmask, double dropout_p,
                                                       const std::optional<at::Tensor>& rng_state) {
  const CheckedShape s =
      check_bwd_args(dout, q, k, v, out, lse, causal_bottom_right, attn_mask, dmask, dropout_p, rng_state);
  if (dmask.has_value()) dmask->zero_();  // elements whose key takes no part keep a zero gradient
  return cpu::bwd(dout, q, k, v, out, lse, scale, is_causal, s.causal_offset, attn_mask, dmask, dropout_p, rng_state);
}

at::Tensor dropout_keep_mask_cpu(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                                 int64_t seqlen_k, double dropout_p) {
  check_keep_mask_args(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
  return cpu::dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
}

bool compiled_with_sm90() {
#ifdef FLASHATTN_WITH_CUDA
  return sm90::compiled();
#else
  return false;
#endif
}

bool compiled_with_cuda() {
#ifdef FLASHATTN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace
}  // namespace flashattn

TORCH_LIBRARY(flashattn, m) {
  m.def("fwd(Tensor q, Tensor k, Tensor v, float scale, bool is_causal, bool causal_bottom_right,"
        " Tensor? attn_mask=None, float dropout_p=0.0, Tensor? rng_state=None, bool deterministic=False)"
        " -> (Tensor out, Tensor lse)");
  // fwd with q, k, v in (B, H, L, E), SDPA's layout; out and lse as fwd returns them.
  m.def("fwd_heads_first(Tensor q, Tensor k, Tensor v, float scale, bool is_causal, bool causal_bottom_right,"
        " Tensor? attn_mask=None, float dropout_p=0.0, Tensor? rng_state=None, bool deterministic=False)"
        " -> (Tensor out, Tensor lse)");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, bool is_causal,"
        " bool causal_bottom_right, bool deterministic=False, Tensor? attn_mask=None, Tensor(a!)? dmask=None,"
        " float dropout_p=0.0, Tensor? rng_state=None) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("dropout_keep_mask(Tensor rng_state, int batch, int heads, int seqlen_q, int seqlen_k, float dropout_p)"
        " -> Tensor");
}

TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("fwd", &flashattn::fwd_cpu);
  m.impl("bwd", &flashattn::bwd_cpu);
  m.impl("dropout_keep_mask", &flashattn::dropout_keep_mask_cpu);
}

#ifdef FLASHATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", &flashattn::cuda_ops::fwd);
  m.impl("bwd", &flashattn::cuda_ops::bwd);
  m.impl("dropout_keep_mask", &flashattn::cuda_ops::dropout_keep_mask);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashattn kernels; the ops live in torch.ops.flashattn";
  m.def("compiled_with_cuda", &flashattn::compiled_with_cuda, "True when the CUDA kernels were built");
  m.def("compiled_with_sm90", &flashattn::compiled_with_sm90,
        "True when the Hopper (sm_90a) forward kernels were built");
}
