// The CUDA backward op (cuda_ops.h): checks, allocation of the outputs and workspaces, the plan
// (csrc/plan.h) and its launches.
#ifdef FLASHATTN_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "plan.h"
#include "sm80/api.h"
#include "sm90/api.h"
#include "torch/alibi.h"
#include "torch/cuda_ops.h"
#include "torch/mask_plan.h"
#include "torch/sink.h"

namespace flashattn {
namespace cuda_ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse_in,
                                                   double scale, bool is_causal, bool causal_bottom_right,
                                                   bool deterministic, const std::optional<at::Tensor>& attn_mask_in,
                                                   const std::optional<at::Tensor>& dmask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state,
                                                   const std::optional<at::Tensor>& sink,
                                                   const std::optional<at::Tensor>& dsink, double softcap,
                                                   int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.bwd";
  CheckedShape s =
      check_bwd_args(dout, q, k, v, out, lse_in, causal_bottom_right, attn_mask_in, dmask, dropout_p, rng_state);
  check_sink(op, sink, q, s.heads_q);
  check_dsink(op, dsink, sink, q, s.heads_q);
  check_softcap(op, softcap, attn_mask_in);
  check_alibi(op, alibi_slopes, q, s, softcap, attn_mask_in);
  is_causal = apply_window(op, s, is_causal, window_left, window_right, attn_mask_in);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);
  // ALiBi: the sm90 kernels add its term; the sm80 kernels read it as an additive mask (as the forward
  // chose, for the same shapes: the plans pick sm90 on the same conditions).
  std::optional<at::Tensor> attn_mask = attn_mask_in;
  bool alibi_in_kernel = false;
  at::Tensor lse_shift;  // the mask's per-key form: its kernels' LSE less the op's
  if (alibi_slopes.has_value()) {
    BwdCall probe;
    probe.shape = make_shape(s, q, scale, is_causal);
    probe.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v) &&
                                  rows_aligned_16(out) && rows_aligned_16(dout);
    probe.dropout = dropout_p > 0.0;
    probe.deterministic = deterministic;
    probe.tensors_tma = tma_describable(q) && tma_describable(k) && tma_describable(v) && tma_describable(dout);
    alibi_in_kernel =
        alibi_in_kernels(plan_bwd(probe, device_info(q), plan_options()).path == GpuPath::kSm90, scale);
    if (!alibi_in_kernel) {
      AlibiMask as_mask = alibi_mask(*alibi_slopes, s, is_causal, sink.has_value());
      attn_mask = std::move(as_mask.mask);
      lse_shift = std::move(as_mask.lse_shift);
      s.window_span = -1;  // a left bound is in the mask
    }
  }

  at::Tensor dq = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor dk = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, k.options());
  at::Tensor dv = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, v.options());
  if (!has_work(s)) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (dsink.has_value()) dsink->zero_();  // every row's out is 0 (or there is no row)
    return {dq, dk, dv};
  }
  // A no-op for the forward's own lse; with ALiBi's per-key mask, the LSE of the kernels' scores.
  const at::Tensor lse = lse_shift.defined() ? (lse_in.to(at::kFloat) + lse_shift).contiguous()
                                             : lse_in.to(at::kFloat).contiguous();

  // An additive mask can saturate a row's LSE (cuda/saturated_rows.h): the preprocess then writes the
  // dout the main kernel reads, rows rebalanced, into this workspace (rows padded to 8 elements, so
  // that its strides suit 16-byte loads and TMA whatever the head dim). Not with a sink: the rebalanced
  // statistics leave the sink's term out, and a row's LSE is then at least its sink, so it saturates
  // only where scores plus mask pass about +4.5e4 (the README's Limits).
  const bool rebalance_rows = attn_mask.has_value() && attn_mask->scalar_type() != at::kBool && !sink.has_value();
  at::Tensor dout_rescaled;
  if (rebalance_rows) {
    dout_rescaled = at::empty({s.batch, s.seqlen_q, s.heads_q, (s.head_dim + 7) / 8 * 8}, dout.options())
                        .narrow(3, 0, s.head_dim);
  }
  const at::Tensor& dout_read = rebalance_rows ? dout_rescaled : dout;

  BwdParams p;
  p.shape = with_softcap(make_shape(s, q, scale, is_causal), softcap);
  if (alibi_in_kernel) p.shape = with_alibi(p.shape, *alibi_slopes, s.seqlen_k - s.seqlen_q);
  p.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v) &&
                            rows_aligned_16(out) && rows_aligned_16(dout) && rows_aligned_16(dout_read);
  p.dropout = make_dropout(dropout_p, rng_state);

  BwdCall call;
  call.shape = p.shape;
  call.mask = mask_layout(attn_mask);
  call.dropout = p.dropout.enabled;
  call.deterministic = deterministic;
  call.dmask = dmask.has_value();
  call.tensors_tma = tma_describable(q) && tma_describable(k) && tma_describable(v) && tma_describable(dout_read);
  const BwdPlan plan = plan_bwd(call, device_info(q), plan_options());
  check_smem_fit(plan.smem, op, p.shape.head_dim);
  p.sm80_tiles = plan.sm80_tiles;
  p.sm90_block_m = plan.sm90_block_m;
  TORCH_CHECK(!alibi_in_kernel || plan.path == GpuPath::kSm90,
              "flashattn.bwd: internal error: ALiBi's term planned for kernels without it");

  // Zeroed by the backward's first kernel (the preprocess), not by a fill of its own.
  const int64_t stats_stride = bwd_stats_stride(s.seqlen_q);
  const int64_t dq_accum_rows = plan.dq_accum_tiled() ? stats_stride : s.seqlen_q;
  at::Tensor dq_accum = at::empty({s.batch, s.heads_q, dq_accum_rows, plan.dq_accum_dim}, q.options().dtype(at::kFloat));
  at::Tensor delta = at::empty({s.batch, s.heads_q, stats_stride}, q.options().dtype(at::kFloat));
  at::Tensor lse_log2 = at::empty_like(delta);
  // Deterministic mode: a zeroed counter per (batch, query head, query block); one per query row is
  // enough for any query block size.
  at::Tensor dq_keys_done;
  if (deterministic) dq_keys_done = at::zeros({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kInt));

  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.dout = dout_read.data_ptr();
  if (rebalance_rows) {
    p.dout_caller = dout.data_ptr();
    p.dout_caller_strides = strides_of(dout);
  }
  p.lse = lse.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.stats_stride = stats_stride;
  p.dq_accum_dim = plan.dq_accum_dim;
  p.dq_accum_tiled = plan.dq_accum_tiled();
  p.deterministic = deterministic;
  p.dq_keys_done = deterministic ? dq_keys_done.data_ptr<int>() : nullptr;
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  p.dout_strides = strides_of(dout_read);
  p.dq_strides = strides_of(dq);
  p.dk_strides = strides_of(dk);
  p.dv_strides = strides_of(dv);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  MaskPlan mask;
  if (attn_mask.has_value()) {
    if (dmask.has_value()) {
      dmask->zero_();  // tiles the kernel skips have a zero gradient
      p.dmask = dmask->data_ptr();
    }
    mask = build_mask_plan(*attn_mask, s, p.shape.element_type, plan.mask, stream);
    p.mask = mask.params;
    p.key_end = mask.key_end;
    p.key_end_causal = mask.key_end_causal;
  }
  if (plan.path == GpuPath::kSm90) {
    check_sm90_launch(sm90::run_bwd(p, stream), op);
  } else {
    C10_CUDA_CHECK(sm80::run_bwd(p, stream));
  }
  // From the preprocess's per-row statistics (delta of the output with the sink, lse_log2 with its term).
  if (dsink.has_value()) dsink->copy_(sink_gradient(*sink, lse_log2, delta));
  return {dq, dk, dv};
}

}  // namespace cuda_ops
}  // namespace flashattn

#endif  // FLASHATTN_WITH_CUDA
