#include "torch/sink.h"

#include <cmath>

#include "torch/checks.h"

namespace flashattn {

void check_sink(const char* op, const std::optional<at::Tensor>& sink, const at::Tensor& q, int64_t heads_q) {
  if (!sink.has_value()) return;
  const at::Tensor& s = *sink;
  TORCH_CHECK(s.dim() == 1 && s.size(0) == heads_q, op, ": sink must have shape (heads_q,) = (", to_text(heads_q),
              ",), one logit per query head, got ", to_text(s.sizes()));
  TORCH_CHECK(at::isFloatingType(s.scalar_type()), op, ": sink must be a floating tensor, got ", s.scalar_type());
  TORCH_CHECK(s.device() == q.device(), op, ": sink must be on q's device ", q.device().str(), ", got ",
              s.device().str());
}

void check_dsink(const char* op, const std::optional<at::Tensor>& dsink, const std::optional<at::Tensor>& sink,
                 const at::Tensor& q, int64_t heads_q) {
  if (!dsink.has_value()) return;
  TORCH_CHECK(sink.has_value(), op, ": dsink (the gradient of sink) needs a sink");
  const at::Tensor& d = *dsink;
  TORCH_CHECK(d.dim() == 1 && d.size(0) == heads_q && d.is_contiguous() && d.scalar_type() == at::kFloat, op,
              ": dsink must be a contiguous float32 tensor of shape (", to_text(heads_q), ",), got dtype ",
              d.scalar_type(), " and shape ", to_text(d.sizes()));
  TORCH_CHECK(d.device() == q.device(), op, ": dsink must be on q's device ", q.device().str());
}

at::Tensor sink_values(const at::Tensor& sink) { return sink.detach().to(at::kFloat).contiguous(); }

void join_sink(at::Tensor& out, at::Tensor& lse, const at::Tensor& sink) {
  const at::Tensor s = sink.to(lse.scalar_type()).view({lse.size(-2), 1});  // [H, 1]: broadcasts over [..., H, L]
  const at::Tensor joined = at::logaddexp(lse, s);
  // exp(-inf - finite) is 0: a row without keys keeps out 0 (as it does beside a sink of -inf).
  const at::Tensor factor = at::where(at::isneginf(joined), 0.0, at::exp(lse - joined));  // [..., H, L]
  out.mul_(factor.transpose(-1, -2).unsqueeze(-1).to(out.scalar_type()));
  lse.copy_(joined);
}

at::Tensor sink_gradient(const at::Tensor& sink, const at::Tensor& lse_log2, const at::Tensor& delta) {
  const at::Tensor s = sink.detach().to(at::kFloat).view({1, -1, 1});
  const at::Tensor weight = at::exp2(s * static_cast<float>(1.0 / std::log(2.0)) - lse_log2);
  return (weight * delta).sum(at::IntArrayRef{0, 2}).neg_().to(at::kFloat);
}

at::Tensor sink_gradient_of_rows(const at::Tensor& sink, const at::Tensor& dout, const at::Tensor& out,
                                 const at::Tensor& lse) {
  const at::ScalarType acc = out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor delta = (dout.to(acc) * out.to(acc)).sum(-1).transpose(1, 2);  // [B, Hq, L]
  const at::Tensor s = sink.detach().to(acc).view({1, -1, 1});
  const at::Tensor l = lse.to(acc);
  // Rows of no sequence in a variable-length batch keep lse -inf (and out 0): weight 0, not inf * 0.
  const at::Tensor weight = at::where(at::isneginf(l), 0.0, at::exp(s - l));
  return (weight * delta).sum(at::IntArrayRef{0, 2}).neg_().to(at::kFloat);
}

}  // namespace flashattn
