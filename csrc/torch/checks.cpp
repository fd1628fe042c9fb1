#include "torch/checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include <string>

namespace flashattn {

std::string to_text(int64_t value) { return std::to_string(value); }

std::string to_text(at::IntArrayRef values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

namespace {

void check_layout(const char* op, const char* name, const at::Tensor& t, const char* expected) {
  TORCH_CHECK(t.dim() == 4, op, ": ", name, " must have 4 dims ", expected, ", got shape ", to_text(t.sizes()));
  TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, op, ": ", name,
              " must have a contiguous last dim (stride 1), got strides ", to_text(t.strides()));
}

}  // namespace

CheckedShape check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       bool causal_bottom_right) {
  check_layout(op, "q", q, "[batch, seqlen_q, heads_q, head_dim]");
  check_layout(op, "k", k, "[batch, seqlen_k, heads_kv, head_dim]");
  check_layout(op, "v", v, "[batch, seqlen_k, heads_kv, head_dim]");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
              ": q, k and v must have the same dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), op,
              ": q, k and v must be on the same device, got ", q.device().str(), ", ", k.device().str(), ", ",
              v.device().str());
  if (q.is_cuda()) {
    TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, op,
                ": CUDA inputs must be float16 or bfloat16, got ", q.scalar_type());
  } else {
    TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16 ||
                    q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                op, ": CPU inputs must be float16, bfloat16, float32 or float64, got ", q.scalar_type());
  }
  CheckedShape s;
  s.batch = q.size(0);
  s.seqlen_q = q.size(1);
  s.heads_q = q.size(2);
  s.head_dim = q.size(3);
  s.seqlen_k = k.size(1);
  s.heads_kv = k.size(2);
  TORCH_CHECK(k.size(0) == s.batch && v.size(0) == s.batch, op, ": q, k and v must have the same batch size, got ",
              to_text(s.batch), ", ", to_text(k.size(0)), ", ", to_text(v.size(0)));
  TORCH_CHECK(v.size(1) == s.seqlen_k, op, ": k and v must have the same seqlen, got ", to_text(s.seqlen_k), " and ",
              to_text(v.size(1)));
  TORCH_CHECK(v.size(2) == s.heads_kv, op, ": k and v must have the same number of heads, got ", to_text(s.heads_kv),
              " and ", to_text(v.size(2)));
  TORCH_CHECK(k.size(3) == s.head_dim && v.size(3) == s.head_dim, op,
              ": q, k and v must have the same head dim, got ", to_text(s.head_dim), ", ", to_text(k.size(3)),
              ", ", to_text(v.size(3)));
  TORCH_CHECK(s.head_dim >= 1 && s.head_dim <= kMaxHeadDim, op, ": head dim must be in [1, ", to_text(kMaxHeadDim),
              "], got ", to_text(s.head_dim));
  TORCH_CHECK(s.heads_kv >= 1 || s.heads_q == 0, op, ": k and v must have at least one head");
  TORCH_CHECK(s.heads_kv == 0 || s.heads_q % s.heads_kv == 0, op,
              ": the number of query heads must be a multiple of the number of key/value heads, got heads_q=",
              to_text(s.heads_q), " and heads_kv=", to_text(s.heads_kv));
  // The kernels count positions and blocks in 32-bit ints, and a sequence end rounded up to a whole
  // tile (at most 256 rows) must still fit.
  const int64_t int_max = std::numeric_limits<int>::max();
  const int64_t max_seqlen = int_max - 1023;
  TORCH_CHECK(s.seqlen_q <= max_seqlen && s.seqlen_k <= max_seqlen && s.batch < int_max && s.heads_q < int_max, op,
              ": sequence lengths must be at most 2^31 - 1024 and batch and head counts below 2^31, got q ",
              to_text(q.sizes()), " and k ", to_text(k.sizes()));
  s.causal_offset = causal_bottom_right ? s.seqlen_k - s.seqlen_q : 0;
  return s;
}

void check_dout_and_out(const char* op, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                        const at::Tensor& lse) {
  TORCH_CHECK(dout.sizes() == q.sizes(), op, ": dout must have q's shape ", to_text(q.sizes()), ", got ",
              to_text(dout.sizes()));
  TORCH_CHECK(out.sizes() == q.sizes(), op, ": out must have q's shape ", to_text(q.sizes()), ", got ",
              to_text(out.sizes()));
  TORCH_CHECK(dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(), op,
              ": dout and out must have q's dtype ", q.scalar_type(), ", got ", dout.scalar_type(), " and ",
              out.scalar_type());
  TORCH_CHECK(dout.device() == q.device() && out.device() == q.device() && lse.device() == q.device(), op,
              ": dout, out and lse must be on q's device ", q.device().str());
  TORCH_CHECK(dout.size(-1) <= 1 || dout.stride(-1) == 1, op, ": dout must have a contiguous last dim, got strides ",
              to_text(dout.strides()));
  TORCH_CHECK(out.size(-1) <= 1 || out.stride(-1) == 1, op, ": out must have a contiguous last dim, got strides ",
              to_text(out.strides()));
}

void check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& lse, const CheckedShape& s) {
  const char* op = "flashattn.bwd";
  check_dout_and_out(op, dout, q, out, lse);
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == s.batch && lse.size(1) == s.heads_q && lse.size(2) == s.seqlen_q,
              op, ": lse must have shape [batch, heads_q, seqlen_q] = [", to_text(s.batch), ", ",
              to_text(s.heads_q), ", ", to_text(s.seqlen_q), "], got ", to_text(lse.sizes()));
  TORCH_CHECK(lse.scalar_type() == at::kFloat || lse.scalar_type() == at::kDouble, op,
              ": lse must be float32 (float64 for float64 inputs), got ", lse.scalar_type());
}

void check_attn_mask(const char* op, const at::Tensor& mask, const at::Tensor& q, const CheckedShape& s) {
  const std::vector<int64_t> expected = {s.batch, s.heads_q, s.seqlen_q, s.seqlen_k};
  TORCH_CHECK(mask.sizes() == at::IntArrayRef(expected), op,
              ": attn_mask must have shape [batch, heads_q, seqlen_q, seqlen_k] = ", to_text(expected),
              " (a broadcast view is fine), got ", to_text(mask.sizes()));
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == q.scalar_type() ||
                  mask.scalar_type() == at::kFloat,
              op, ": attn_mask must be bool, float32 or q's dtype ", q.scalar_type(), ", got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == q.device(), op, ": attn_mask must be on q's device ", q.device().str(), ", got ",
              mask.device().str());
}

void check_dmask(const at::Tensor& dmask, const std::optional<at::Tensor>& mask, const at::Tensor& q,
                 const CheckedShape& s) {
  const char* op = "flashattn.bwd";
  TORCH_CHECK(mask.has_value() && mask->scalar_type() != at::kBool, op,
              ": dmask (the gradient of attn_mask) needs a floating attn_mask");
  const std::vector<int64_t> expected = {s.batch, s.heads_q, s.seqlen_q, s.seqlen_k};
  TORCH_CHECK(dmask.sizes() == at::IntArrayRef(expected) && dmask.is_contiguous(), op,
              ": dmask must be a contiguous tensor of shape ", to_text(expected), ", got shape ",
              to_text(dmask.sizes()), " and strides ", to_text(dmask.strides()));
  TORCH_CHECK(dmask.scalar_type() == mask->scalar_type(), op, ": dmask must have attn_mask's dtype ",
              mask->scalar_type(), ", got ", dmask.scalar_type());
  TORCH_CHECK(dmask.device() == q.device(), op, ": dmask must be on q's device ", q.device().str());
}

void check_dropout(const char* op, double dropout_p, const std::optional<at::Tensor>& rng_state, const at::Tensor& q) {
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ",
              std::to_string(dropout_p));
  if (dropout_p == 0.0) return;
  TORCH_CHECK(rng_state.has_value(), op, ": dropout_p > 0 needs rng_state (a [2] int64 tensor: seed, offset)");
  const at::Tensor& r = *rng_state;
  TORCH_CHECK(r.scalar_type() == at::kLong && r.dim() == 1 && r.size(0) == 2 && r.is_contiguous(), op,
              ": rng_state must be a contiguous [2] int64 tensor (seed, offset), got dtype ", r.scalar_type(),
              " and shape ", to_text(r.sizes()));
  TORCH_CHECK(r.device() == q.device(), op, ": rng_state must be on q's device ", q.device().str(), ", got ",
              r.device().str());
}

void check_keep_mask_args(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                          int64_t seqlen_k, double dropout_p) {
  const char* op = "flashattn.dropout_keep_mask";
  TORCH_CHECK(batch >= 0 && heads >= 0 && seqlen_q >= 0 && seqlen_k >= 0, op,
              ": batch, heads, seqlen_q and seqlen_k must be >= 0, got ",
              to_text(at::IntArrayRef({batch, heads, seqlen_q, seqlen_k})));
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ",
              std::to_string(dropout_p));
  TORCH_CHECK(rng_state.scalar_type() == at::kLong && rng_state.dim() == 1 && rng_state.size(0) == 2 &&
                  rng_state.is_contiguous(),
              op, ": rng_state must be a contiguous [2] int64 tensor (seed, offset), got dtype ",
              rng_state.scalar_type(), " and shape ", to_text(rng_state.sizes()));
}

void check_int32_vector(const char* op, const char* name, const at::Tensor& t, int64_t numel, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 1 && t.numel() == numel, op, ": ", name, " must be a 1-dim tensor of ", to_text(numel),
              " int32 values, got shape ", to_text(t.sizes()));
  TORCH_CHECK(t.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), op, ": ", name, " must be on q's device ", q.device().str(), ", got ",
              t.device().str());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_softcap(const char* op, double softcap, const std::optional<at::Tensor>& attn_mask) {
  TORCH_CHECK(std::isfinite(softcap) && softcap >= 0.0, op, ": softcap must be a finite value >= 0 (0: no cap), got ",
              std::to_string(softcap));
  TORCH_CHECK(softcap == 0.0 || !attn_mask.has_value() || attn_mask->scalar_type() == at::kBool, op,
              ": softcap with a floating (additive) attn_mask is not supported; pass a boolean mask");
}

KeyWindow resolve_window(const char* op, bool is_causal, int64_t window_left, int64_t window_right, int64_t longest,
                         const std::optional<at::Tensor>& attn_mask) {
  // A bound of `longest` keys or more excludes no key of any row.
  const int64_t left = window_left >= longest ? -1 : std::max<int64_t>(window_left, -1);
  const int64_t right = is_causal ? 0 : window_right >= longest ? -1 : std::max<int64_t>(window_right, -1);
  KeyWindow w;
  if (left < 0 && right <= 0) {  // no window, or the causal mask alone
    w.is_causal = right == 0;
    return w;
  }
  TORCH_CHECK(!attn_mask.has_value(), op, ": a sliding window (window_left=", to_text(window_left),
              ", window_right=", to_text(window_right), ") with an attn_mask is not supported");
  // The kernels' diagonals (query + offset + shift - span) stay within 32-bit ints.
  TORCH_CHECK(longest <= (int64_t{1} << 29), op, ": a sliding window needs sequences of at most 2^29 rows, got ",
              to_text(longest));
  w.is_causal = true;
  w.causal_shift = right >= 0 ? right : longest;  // an unbounded right side: past every key
  w.span = left >= 0 ? left + w.causal_shift : -1;
  return w;
}

bool apply_window(const char* op, CheckedShape& s, bool is_causal, int64_t window_left, int64_t window_right,
                  const std::optional<at::Tensor>& attn_mask) {
  const KeyWindow w =
      resolve_window(op, is_causal, window_left, window_right, std::max(s.seqlen_q, s.seqlen_k), attn_mask);
  if (!w.is_causal) return is_causal;
  s.causal_offset += w.causal_shift;
  s.window_span = w.span;
  return true;
}

CheckedShape check_fwd_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal_bottom_right,
                            const std::optional<at::Tensor>& attn_mask, double dropout_p,
                            const std::optional<at::Tensor>& rng_state) {
  const char* op = "flashattn.fwd";
  const CheckedShape s = check_qkv(op, q, k, v, causal_bottom_right);
  if (attn_mask.has_value()) check_attn_mask(op, *attn_mask, q, s);
  check_dropout(op, dropout_p, rng_state, q);
  return s;
}

CheckedShape check_bwd_args(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse, bool causal_bottom_right,
                            const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& dmask,
                            double dropout_p, const std::optional<at::Tensor>& rng_state) {
  const char* op = "flashattn.bwd";
  const CheckedShape s = check_qkv(op, q, k, v, causal_bottom_right);
  check_bwd_inputs(dout, q, out, lse, s);
  if (attn_mask.has_value()) check_attn_mask(op, *attn_mask, q, s);
  if (dmask.has_value()) check_dmask(*dmask, attn_mask, q, s);
  check_dropout(op, dropout_p, rng_state, q);
  return s;
}

}  // namespace flashattn
