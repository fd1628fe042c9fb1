// The autograd kernel of flashattn::varlen_fwd: the forward below the autograd key (the device's kernel,
// or a tracing mode's fake one), and a backward that calls flashattn::varlen_bwd with the forward's
// inputs, out and lse (and the sink, whose gradient it returns when the sink requires one, and the ALiBi
// slopes).
//
// In C++ for the reason torch/autograd.cpp gives: a training step calls it once per attention layer,
// and a Python autograd registration (torch.library.register_autograd) costs more host time per call
// than the kernels' own launch code.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace flashattn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// max_seqlen_q / _k are SymInts here, so that tracing (torch.compile) keeps them symbolic.
using VarlenFwdSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double, bool, bool, bool, c10::SymInt,
    c10::SymInt, const std::optional<at::Tensor>&, double, int64_t, int64_t, const std::optional<at::Tensor>&);
using VarlenBwdSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, bool, bool, bool, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, int64_t, int64_t, const std::optional<at::Tensor>&);

std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// A symbolic condition decided (a guard while tracing; the value itself otherwise).
bool holds(const c10::SymBool& b) { return b.guard_bool(__FILE__, __LINE__); }

// Whether the kernels can read t's rows as they are: a contiguous last dim and 16-byte aligned rows
// (flashattn/varlen.py's _rows_aligned, from metadata alone; symbolic while torch.compile traces).
bool rows_aligned(const at::Tensor& t) {
  if (holds(t.sym_stride(-1) != 1) || holds(t.sym_storage_offset() % 8 != 0)) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (holds(t.sym_stride(d) % 8 != 0)) return false;
  }
  return true;
}

class VarlenFwdFunction : public torch::autograd::Function<VarlenFwdFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                               const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k,
                               double scale, bool is_causal, bool causal_bottom_right, bool deterministic,
                               c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
                               const std::optional<at::Tensor>& sink, double softcap, int64_t window_left,
                               int64_t window_right, const std::optional<at::Tensor>& alibi_slopes) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("flashattn::varlen_fwd", "")
                               .typed<VarlenFwdSignature>();
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, lse) = op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal,
                                   causal_bottom_right, deterministic, std::move(max_seqlen_q),
                                   std::move(max_seqlen_k), sink, softcap, window_left, window_right,
                                   alibi_slopes);
    }
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q.value_or(at::Tensor()),
                            seqused_k.value_or(at::Tensor()), sink.value_or(at::Tensor()),
                            alibi_slopes.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["causal_bottom_right"] = causal_bottom_right;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("flashattn::varlen_bwd", "")
                               .typed<VarlenBwdSignature>();
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor dout = grads[0];  // grads[1], lse's, is not differentiable
    // Not .contiguous(): it returns an empty tensor unchanged, strides and all.
    if (holds(dout.sym_numel() > 0) && !rows_aligned(dout)) dout = dout.clone(at::MemoryFormat::Contiguous);
    const at::Tensor& sink = saved[9];
    // The sink's edge follows those of the tensors given before it: q, k, v, the offsets, seqused_*.
    const size_t sink_edge = 5 + (saved[7].defined() ? 1 : 0) + (saved[8].defined() ? 1 : 0);
    at::Tensor dsink;
    if (sink.defined() && ctx->needs_input_grad(sink_edge)) {
      dsink = at::empty({sink.size(0)}, sink.options().dtype(at::kFloat));
    }
    auto [dq, dk, dv] = op.call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                                present(saved[7]), present(saved[8]), ctx->saved_data["scale"].toDouble(),
                                ctx->saved_data["is_causal"].toBool(),
                                ctx->saved_data["causal_bottom_right"].toBool(),
                                ctx->saved_data["deterministic"].toBool(), present(sink), present(dsink),
                                ctx->saved_data["softcap"].toDouble(), ctx->saved_data["window_left"].toInt(),
                                ctx->saved_data["window_right"].toInt(), present(saved[10]));
    // One gradient per forward argument: q, k, v, then the ten arguments that take none, the sink, softcap,
    // the window and the ALiBi slopes (none: ALiBi's bias is not learned).
    variable_list out = {dq, dk, dv};
    out.resize(18);
    if (dsink.defined()) out[13] = dsink.to(sink.scalar_type());
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> varlen_fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                       const std::optional<at::Tensor>& seqused_q,
                                                       const std::optional<at::Tensor>& seqused_k, double scale,
                                                       bool is_causal, bool causal_bottom_right, bool deterministic,
                                                       c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
                                                       const std::optional<at::Tensor>& sink, double softcap,
                                                       int64_t window_left, int64_t window_right,
                                                       const std::optional<at::Tensor>& alibi_slopes) {
  const variable_list outputs =
      VarlenFwdFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal,
                               causal_bottom_right, deterministic, std::move(max_seqlen_q), std::move(max_seqlen_k),
                               sink, softcap, window_left, window_right, alibi_slopes);
  return {outputs[0], outputs[1]};
}

}  // namespace
}  // namespace flashattn

TORCH_LIBRARY_IMPL(flashattn, Autograd, m) { m.impl("varlen_fwd", &flashattn::varlen_fwd_autograd); }
