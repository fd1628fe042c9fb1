// The CUDA forward op (cuda_ops.h): checks, allocation, the plan (csrc/plan.h) and its launches.
#ifdef FLASHATTN_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <limits>

#include "plan.h"
#include "sm80/api.h"
#include "sm90/api.h"
#include "torch/alibi.h"
#include "torch/cuda_ops.h"
#include "torch/mask_plan.h"
#include "torch/sink.h"

namespace flashattn {
namespace cuda_ops {
namespace {

// A forward pass over more keys than this runs as several passes over consecutive key ranges whose
// (out, lse) pairs are merged in float32: one fp32 accumulator summing millions of keys loses accuracy
// (the tensor cores' accumulation rounds toward zero; docs/perf-log.md), and ranges of 2^20 keys keep
// the error at the level of shorter rows.
constexpr int64_t kKeysPerPass = int64_t{1} << 20;

// ALiBi for the kernels to add (alibi.h), or none: the slopes and query i's key position less i.
struct KernelAlibi {
  const at::Tensor* slopes = nullptr;
  int64_t offset = 0;
};

// Whether the plan runs a forward of this shape on the sm90 kernels.
bool fwd_on_sm90(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CheckedShape& s, double scale,
                 bool is_causal, double softcap, bool dropout) {
  FwdCall call;
  call.shape = with_softcap(make_shape(s, q, scale, is_causal), softcap);
  call.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v);
  call.dropout = dropout;
  call.qkv_tma = tma_describable(q) && tma_describable(k) && tma_describable(v);
  return plan_fwd(call, device_info(q), plan_options()).path == GpuPath::kSm90;
}

// One forward pass of q over k and v (some key range of the caller's) into out and lse; sink: [Hq] float32
// on the device, or nullptr.
void fwd_pass(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CheckedShape& s, double scale,
              bool is_causal, double softcap, const std::optional<at::Tensor>& attn_mask,
              const DropoutParams& dropout, const KernelAlibi& alibi, const float* sink, at::Tensor& out,
              at::Tensor& lse) {
  FwdParams p;
  p.dropout = dropout;
  p.sink = sink;
  p.shape = with_softcap(make_shape(s, q, scale, is_causal), softcap);
  if (alibi.slopes != nullptr) p.shape = with_alibi(p.shape, *alibi.slopes, alibi.offset);
  p.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);

  FwdCall call;
  call.shape = p.shape;
  call.mask = mask_layout(attn_mask);
  call.dropout = dropout.enabled;
  call.qkv_tma = tma_describable(q) && tma_describable(k) && tma_describable(v);
  call.out_tma = tma_describable(out);
  const FwdPlan plan = plan_fwd(call, device_info(q), plan_options());
  check_smem_fit(plan.smem, "flashattn.fwd", p.shape.head_dim);
  p.sm80_tiles = plan.sm80_tiles;
  TORCH_CHECK(alibi.slopes == nullptr || plan.path == GpuPath::kSm90,
              "flashattn.fwd: internal error: ALiBi's term planned for kernels without it");

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  MaskPlan mask;
  if (attn_mask.has_value()) {
    mask = build_mask_plan(*attn_mask, s, p.shape.element_type, plan.mask, stream);
    p.mask = mask.params;
    p.key_end = mask.key_end;
    p.masked_rows = mask.masked_rows;
    p.masked_row_count = mask.masked_row_count;
    p.key_end_causal = mask.key_end_causal;
  }
  if (plan.path == GpuPath::kSm80) {
    C10_CUDA_CHECK(sm80::run_fwd(p, stream));
    return;
  }
  // The counter of the causal schedule's dynamic tail (freed on this stream after the kernels).
  at::Tensor tile_counter;
  if (plan.tile_counter) {
    tile_counter = at::empty({1}, q.options().dtype(at::kInt));
    p.tile_counter = tile_counter.data_ptr<int>();
  }
  for (int i = 0; i < plan.sm90_launches; ++i) check_sm90_launch(sm90::run_fwd(p, plan.sm90[i], stream), "flashattn.fwd");
}

// The forward over more than kKeysPerPass keys: one pass per key range, merged as
// lse = log(sum_r exp(lse_r)) and out = sum_r exp(lse_r - lse) out_r, in float32; a sink joins the
// merged pair once, at the end.
void fwd_in_key_ranges(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CheckedShape& s,
                       double scale, bool is_causal, double softcap, const std::optional<at::Tensor>& attn_mask,
                       const DropoutParams& dropout, const KernelAlibi& alibi,
                       const std::optional<at::Tensor>& sink, at::Tensor& out, at::Tensor& lse) {
  at::Tensor out_sum = at::zeros(out.sizes(), out.options().dtype(at::kFloat));  // [B, Lq, Hq, D]
  at::Tensor lse_sum = at::full(lse.sizes(), -std::numeric_limits<float>::infinity(), lse.options());
  at::Tensor range_out = at::empty_like(out);
  at::Tensor range_lse = at::empty_like(lse);
  for (int64_t k0 = 0; k0 < s.seqlen_k; k0 += kKeysPerPass) {
    const int64_t keys = std::min(kKeysPerPass, s.seqlen_k - k0);
    CheckedShape range = s;
    range.seqlen_k = keys;
    range.causal_offset = s.causal_offset - k0;  // key k0 + j is visible iff k0 + j <= i + offset
    std::optional<at::Tensor> range_mask;
    if (attn_mask.has_value()) range_mask = attn_mask->narrow(3, k0, keys);
    DropoutParams range_dropout = dropout;
    range_dropout.key_base = static_cast<uint32_t>(k0);  // a multiple of 32 (kKeysPerPass), as key_base must be
    KernelAlibi range_alibi = alibi;
    range_alibi.offset = alibi.offset - k0;  // key k0 + j is key j of the range
    fwd_pass(q, k.narrow(1, k0, keys), v.narrow(1, k0, keys), range, scale, is_causal, softcap, range_mask,
             range_dropout, range_alibi, nullptr, range_out, range_lse);
    // A row that saw no key so far and none in this range stays -inf with weight 0 (not NaN);
    // a NaN anywhere stays NaN.
    const at::Tensor merged = at::logaddexp(lse_sum, range_lse);
    const at::Tensor none = at::isneginf(merged);
    const at::Tensor old_weight = at::where(none, 0.f, at::exp(lse_sum - merged));    // [B, Hq, Lq]
    const at::Tensor range_weight = at::where(none, 0.f, at::exp(range_lse - merged));
    out_sum.mul_(old_weight.transpose(1, 2).unsqueeze(-1))
        .add_(range_out.to(at::kFloat) * range_weight.transpose(1, 2).unsqueeze(-1));
    lse_sum = merged;
  }
  if (sink.has_value()) join_sink(out_sum, lse_sum, *sink);
  out.copy_(out_sum);
  lse.copy_(lse_sum);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                       bool is_causal, bool causal_bottom_right,
                                       const std::optional<at::Tensor>& attn_mask_in, double dropout_p,
                                       const std::optional<at::Tensor>& rng_state, bool /*deterministic*/,
                                       const std::optional<at::Tensor>& sink_in, double softcap,
                                       int64_t window_left, int64_t window_right,
                                       const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.fwd";
  CheckedShape s = check_fwd_args(q, k, v, causal_bottom_right, attn_mask_in, dropout_p, rng_state);
  check_sink(op, sink_in, q, s.heads_q);
  check_softcap(op, softcap, attn_mask_in);
  check_alibi(op, alibi_slopes, q, s, softcap, attn_mask_in);
  is_causal = apply_window(op, s, is_causal, window_left, window_right, attn_mask_in);
  const DropoutParams dropout = make_dropout(dropout_p, rng_state);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);
  // ALiBi: the sm90 kernels add its term; the sm80 kernels read it as an additive mask.
  std::optional<at::Tensor> attn_mask = attn_mask_in;
  KernelAlibi alibi;
  at::Tensor lse_shift;  // the mask's per-key form: its kernels' LSE less the op's
  if (alibi_slopes.has_value()) {
    if (alibi_in_kernels(fwd_on_sm90(q, k, v, s, scale, is_causal, softcap, dropout.enabled), scale)) {
      alibi = {&*alibi_slopes, s.seqlen_k - s.seqlen_q};
    } else {
      AlibiMask as_mask = alibi_mask(*alibi_slopes, s, is_causal, sink_in.has_value());
      attn_mask = std::move(as_mask.mask);
      lse_shift = std::move(as_mask.lse_shift);
      s.window_span = -1;  // a left bound is in the mask
    }
  }

  at::Tensor out = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kFloat));
  std::optional<at::Tensor> sink;
  if (sink_in.has_value()) sink = sink_values(*sink_in);
  if (!has_work(s)) {
    // No keys: every row attends to nothing, so out is 0 and lse is -inf (the empty log-sum-exp), or the
    // sink's logit.
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    if (sink.has_value()) join_sink(out, lse, *sink);
  } else if (s.seqlen_k > kKeysPerPass) {
    fwd_in_key_ranges(q, k, v, s, scale, is_causal, softcap, attn_mask, dropout, alibi, sink, out, lse);
  } else {
    fwd_pass(q, k, v, s, scale, is_causal, softcap, attn_mask, dropout, alibi,
             sink.has_value() ? sink->data_ptr<float>() : nullptr, out, lse);
  }
  if (lse_shift.defined()) lse.sub_(lse_shift);
  return {out, lse};
}

}  // namespace cuda_ops
}  // namespace flashattn

#endif  // FLASHATTN_WITH_CUDA
