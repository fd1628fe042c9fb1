// ALiBi at the ops (alibi.h).
#include "torch/alibi.h"

#include <cmath>
#include <limits>

namespace flashattn {

void check_alibi(const char* op, const std::optional<at::Tensor>& slopes, const at::Tensor& q, const CheckedShape& s,
                 double softcap, const std::optional<at::Tensor>& attn_mask) {
  if (!slopes.has_value()) return;
  const at::Tensor& a = *slopes;
  const bool shape_ok = (a.dim() == 1 && a.size(0) == s.heads_q) ||
                        (a.dim() == 2 && a.size(0) == s.batch && a.size(1) == s.heads_q);
  TORCH_CHECK(shape_ok, op, ": alibi_slopes must have shape (heads_q,) = (", to_text(s.heads_q),
              ",) or (batch, heads_q) = (", to_text(s.batch), ", ", to_text(s.heads_q), "), got ", to_text(a.sizes()));
  TORCH_CHECK(a.scalar_type() == at::kFloat, op, ": alibi_slopes must be float32, got ",
              a.scalar_type());
  TORCH_CHECK(a.device() == q.device(), op, ": alibi_slopes must be on q's device ", q.device().str(), ", got ",
              a.device().str());
  TORCH_CHECK(a.is_contiguous(), op, ": alibi_slopes must be contiguous");
  TORCH_CHECK(softcap == 0.0, op, ": alibi_slopes with softcap is not supported");
  TORCH_CHECK(!attn_mask.has_value(), op,
              ": alibi_slopes with an attn_mask is not supported; add ALiBi's bias to the mask instead");
}

bool alibi_in_kernels(bool sm90_path, double scale) { return sm90_path && std::isfinite(scale) && scale > 0.0; }

AttentionShape with_alibi(AttentionShape shape, const at::Tensor& slopes, int64_t alibi_offset) {
  shape.alibi_slopes = slopes.data_ptr<float>();
  shape.alibi_batch_stride = slopes.dim() == 2 ? static_cast<int>(slopes.size(1)) : 0;
  shape.alibi_offset = static_cast<int>(alibi_offset);
  shape.alibi_unit = static_cast<float>(1.4426950408889634 / shape.scale_log2);
  return shape;
}

AlibiMask alibi_mask(const at::Tensor& slopes, const CheckedShape& s, bool is_causal, bool has_sink) {
  const auto positions = slopes.options().dtype(at::kLong);
  const at::Tensor per_head = slopes.view({slopes.dim() == 1 ? 1 : s.batch, s.heads_q, 1, 1});  // [1 or B, Hq, 1, 1]
  const at::Tensor query_pos = at::arange(s.seqlen_q, positions).add_(s.seqlen_k - s.seqlen_q).unsqueeze(1);  // [Lq, 1]
  const at::Tensor keys = at::arange(s.seqlen_k, positions).unsqueeze(0);  // [1, Lk]
  AlibiMask result;
  if (is_causal && s.causal_offset <= s.seqlen_k - s.seqlen_q && s.window_span < 0 && !has_sink) {
    const int64_t center = s.seqlen_k / 2;
    const at::Tensor terms = per_head * (keys - center).to(at::kFloat);  // [1 or B, Hq, 1, Lk]
    result.mask = terms.expand({s.batch, s.heads_q, 1, s.seqlen_k}).contiguous().expand(
        {s.batch, s.heads_q, s.seqlen_q, s.seqlen_k});
    result.lse_shift = (per_head * (query_pos - center).to(at::kFloat)).squeeze(-1);  // [1 or B, Hq, Lq]
    return result;
  }
  const at::Tensor distance = (query_pos - keys).abs().to(at::kFloat);  // [Lq, Lk]
  at::Tensor bias = -per_head * distance;  // [1 or B, Hq, Lq, Lk]
  if (s.window_span >= 0) {
    const at::Tensor left_of_window = keys < query_pos + (s.causal_offset - (s.seqlen_k - s.seqlen_q) - s.window_span);
    bias.masked_fill_(left_of_window, -std::numeric_limits<float>::infinity());
  }
  result.mask = bias.expand({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k});
  return result;
}

}  // namespace flashattn
