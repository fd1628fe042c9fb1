// The autograd kernels of flashattn::fwd and flashattn::fwd_heads_first: the forward below the autograd
// key (the device's kernel, or a tracing mode's fake one), and a backward that calls flashattn::bwd with
// the forward's inputs, out and lse (deterministic, dropout_p and rng_state as the forward had them, so
// the backward regenerates the same keep-mask). A floating attn_mask that requires grad gets
// dmask, its gradient over the [B, Hq, Lq, Lk] view the op took (autograd sums it back over broadcast
// dims); a sink that requires grad gets dsink, in the sink's dtype.
//
// fwd_heads_first takes q, k, v in SDPA's (B, H, L, E) layout: the transposes to the kernels' (B, L, H, E)
// are made here, below autograd, instead of as three autograd views in Python (about half of the SDPA
// drop-in's host time went to those and the calls around them).
//
// Written in C++ rather than as a Python autograd.Function because a training step calls it once per
// attention layer: a Python Function costs tens of microseconds of host time per call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "torch/checks.h"  // to_text

namespace flashattn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using FwdSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        double, bool, bool, const std::optional<at::Tensor>&,
                                                        double, const std::optional<at::Tensor>&, bool,
                                                        const std::optional<at::Tensor>&, double, int64_t, int64_t,
                                                        const std::optional<at::Tensor>&);
using BwdSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, double, bool, bool, bool, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, int64_t, int64_t, const std::optional<at::Tensor>&);

std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// A (B, H, L, E) tensor as the kernels take it: the (B, L, H, E) transposed view, with a contiguous last
// dim (copied when it is not; not .contiguous(), which returns an empty tensor unchanged).
at::Tensor kernel_layout(const at::Tensor& t) {
  at::Tensor view = t.transpose(1, 2);
  return view.size(-1) > 1 && view.stride(-1) != 1 ? view.clone(at::MemoryFormat::Contiguous) : view;
}

void check_heads_first(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flashattn.fwd_heads_first: q, k and v must be 4-D (B, H, L, E), got ", to_text(q.dim()), ", ",
              to_text(k.dim()), " and ", to_text(v.dim()), " dims");
}

const auto& fwd_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::fwd", "").typed<FwdSignature>();
  return op;
}

// fwd_heads_first below autograd (its device kernel, and the forward of its autograd kernel): fwd on
// the kernels' views.
std::tuple<at::Tensor, at::Tensor> fwd_heads_first(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   double scale, bool is_causal, bool causal_bottom_right,
                                                   const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state, bool deterministic,
                                                   const std::optional<at::Tensor>& sink, double softcap, int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  check_heads_first(q, k, v);
  return fwd_op().call(kernel_layout(q), kernel_layout(k), kernel_layout(v), scale, is_causal, causal_bottom_right,
                       attn_mask, dropout_p, rng_state, deterministic, sink, softcap, window_left,
                       window_right, alibi_slopes);
}

// heads_first: q, k, v (and the gradients returned for them) in (B, H, L, E), else (B, L, H, E).
class FwdFunction : public torch::autograd::Function<FwdFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, bool is_causal, bool causal_bottom_right,
                               const std::optional<at::Tensor>& attn_mask, double dropout_p,
                               const std::optional<at::Tensor>& rng_state, bool deterministic,
                               const std::optional<at::Tensor>& sink, double softcap, int64_t window_left, int64_t window_right,
                               const std::optional<at::Tensor>& alibi_slopes, bool heads_first) {
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, lse) = heads_first ? fwd_heads_first(q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
                                                         dropout_p, rng_state, deterministic, sink, softcap, window_left,
                                                         window_right, alibi_slopes)
                                       : fwd_op().call(q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
                                                       dropout_p, rng_state, deterministic, sink, softcap, window_left, window_right,
                                                       alibi_slopes);
    }
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    // The inputs as given (the backward makes the kernels' views again); rng_state is saved, not its
    // values: the backward regenerates the forward's keep-mask from it.
    ctx->save_for_backward({q, k, v, out, lse, attn_mask.value_or(at::Tensor()), rng_state.value_or(at::Tensor()),
                            sink.value_or(at::Tensor()), alibi_slopes.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["causal_bottom_right"] = causal_bottom_right;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["heads_first"] = heads_first;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::bwd", "").typed<BwdSignature>();
    const variable_list saved = ctx->get_saved_variables();
    const bool heads_first = ctx->saved_data["heads_first"].toBool();
    const at::Tensor q = heads_first ? kernel_layout(saved[0]) : saved[0];
    const at::Tensor k = heads_first ? kernel_layout(saved[1]) : saved[1];
    const at::Tensor v = heads_first ? kernel_layout(saved[2]) : saved[2];
    const at::Tensor &out = saved[3], &lse = saved[4];
    const at::Tensor &attn_mask = saved[5], &rng_state = saved[6], &sink = saved[7], &alibi_slopes = saved[8];
    at::Tensor grad_out = grads[0];  // grads[1], lse's, is not differentiable
    if (grad_out.size(-1) > 1 && grad_out.stride(-1) != 1) {
      // The kernels take any strides but need a contiguous last dim (e.g. an expanded grad of sum()).
      // Not .contiguous(): it returns an empty tensor (e.g. batch 0) unchanged, strides and all.
      grad_out = grad_out.clone(at::MemoryFormat::Contiguous);
    }
    at::Tensor dmask;
    // The tensor inputs' edges: q, k, v, then attn_mask when there is one.
    if (attn_mask.defined() && ctx->needs_input_grad(3)) {
      // Full size: the expand that made the [B, Hq, Lq, Lk] view sums it back to the mask's shape.
      dmask = at::empty(attn_mask.sizes(), attn_mask.options().device(q.device()));
    }
    // The sink's edge follows those of the tensors given before it (attn_mask, rng_state).
    const size_t sink_edge = 3 + (attn_mask.defined() ? 1 : 0) + (rng_state.defined() ? 1 : 0);
    at::Tensor dsink;
    if (sink.defined() && ctx->needs_input_grad(sink_edge)) {
      dsink = at::empty({sink.size(0)}, sink.options().dtype(at::kFloat));
    }
    auto [dq, dk, dv] = op.call(grad_out, q, k, v, out, lse, ctx->saved_data["scale"].toDouble(),
                                ctx->saved_data["is_causal"].toBool(),
                                ctx->saved_data["causal_bottom_right"].toBool(),
                                ctx->saved_data["deterministic"].toBool(),
                                present(attn_mask), present(dmask), ctx->saved_data["dropout_p"].toDouble(),
                                present(rng_state), present(sink), present(dsink),
                                ctx->saved_data["softcap"].toDouble(), ctx->saved_data["window_left"].toInt(),
                                ctx->saved_data["window_right"].toInt(), present(alibi_slopes));
    if (heads_first) {  // back to the inputs' (B, H, L, E)
      dq = dq.transpose(1, 2);
      dk = dk.transpose(1, 2);
      dv = dv.transpose(1, 2);
    }
    // One gradient per forward argument: q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
    // dropout_p, rng_state, deterministic, sink, softcap, window_left, window_right, alibi_slopes (no
    // gradient, as in FlashAttention-2), heads_first.
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), dmask, at::Tensor(), at::Tensor(), at::Tensor(),
            dsink.defined() ? dsink.to(sink.scalar_type()) : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                double scale, bool is_causal, bool causal_bottom_right,
                                                const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                                const std::optional<at::Tensor>& rng_state, bool deterministic,
                                                const std::optional<at::Tensor>& sink, double softcap, int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  const variable_list outputs = FwdFunction::apply(q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
                                                   dropout_p, rng_state, deterministic, sink, softcap, window_left,
                                                   window_right, alibi_slopes, false);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor> fwd_heads_first_autograd(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, double scale, bool is_causal,
                                                            bool causal_bottom_right,
                                                            const std::optional<at::Tensor>& attn_mask,
                                                            double dropout_p,
                                                            const std::optional<at::Tensor>& rng_state,
                                                            bool deterministic,
                                                            const std::optional<at::Tensor>& sink, double softcap, int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  const variable_list outputs = FwdFunction::apply(q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
                                                   dropout_p, rng_state, deterministic, sink, softcap, window_left,
                                                   window_right, alibi_slopes, true);
  return {outputs[0], outputs[1]};
}

}  // namespace
}  // namespace flashattn

TORCH_LIBRARY_IMPL(flashattn, Autograd, m) {
  m.impl("fwd", &flashattn::fwd_autograd);
  m.impl("fwd_heads_first", &flashattn::fwd_heads_first_autograd);
}

TORCH_LIBRARY_IMPL(flashattn, CPU, m) { m.impl("fwd_heads_first", &flashattn::fwd_heads_first); }

#ifdef FLASHATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(flashattn, CUDA, m) { m.impl("fwd_heads_first", &flashattn::fwd_heads_first); }
#endif
