// The autograd kernel of flashattn::fwd: the forward below the autograd key (the device's kernel, or a
// tracing mode's fake one), and a backward that calls flashattn::bwd with the forward's inputs, out and
// lse (deterministic=False; dropout_p and rng_state as the forward had them, so the backward regenerates
// the same keep-mask). A floating attn_mask that requires grad gets dmask, its gradient over the
// [B, Hq, Lq, Lk] view the op took (autograd sums it back over broadcast dims).
//
// Written in C++ rather than as a Python autograd.Function because a training step calls it once per
// attention layer: the Python form cost tens of microseconds of host time per call. flashattn/ops.py's
// deterministic variant (attention(..., deterministic=True)) stays a Python Function over this op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace flashattn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using FwdSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        double, bool, bool, const std::optional<at::Tensor>&,
                                                        double, const std::optional<at::Tensor>&);
using BwdSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, double, bool, bool, bool, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, const std::optional<at::Tensor>&);

std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

class FwdFunction : public torch::autograd::Function<FwdFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, bool is_causal, bool causal_bottom_right,
                               const std::optional<at::Tensor>& attn_mask, double dropout_p,
                               const std::optional<at::Tensor>& rng_state) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::fwd", "").typed<FwdSignature>();
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, lse) = op.call(q, k, v, scale, is_causal, causal_bottom_right, attn_mask, dropout_p, rng_state);
    }
    // rng_state is saved, not its values: the backward regenerates the forward's keep-mask from it.
    ctx->save_for_backward({q, k, v, out, lse, attn_mask.value_or(at::Tensor()), rng_state.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["causal_bottom_right"] = causal_bottom_right;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashattn::bwd", "").typed<BwdSignature>();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor &attn_mask = saved[5], &rng_state = saved[6];
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
    auto [dq, dk, dv] = op.call(grad_out, q, k, v, out, lse, ctx->saved_data["scale"].toDouble(),
                                ctx->saved_data["is_causal"].toBool(),
                                ctx->saved_data["causal_bottom_right"].toBool(), /*deterministic=*/false,
                                present(attn_mask), present(dmask), ctx->saved_data["dropout_p"].toDouble(),
                                present(rng_state));
    // One gradient per forward argument: q, k, v, scale, is_causal, causal_bottom_right, attn_mask,
    // dropout_p, rng_state.
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), dmask, at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                double scale, bool is_causal, bool causal_bottom_right,
                                                const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                                const std::optional<at::Tensor>& rng_state) {
  const variable_list outputs =
      FwdFunction::apply(q, k, v, scale, is_causal, causal_bottom_right, attn_mask, dropout_p, rng_state);
  return {outputs[0], outputs[1]};
}

}  // namespace
}  // namespace flashattn

TORCH_LIBRARY_IMPL(flashattn, Autograd, m) { m.impl("fwd", &flashattn::fwd_autograd); }
