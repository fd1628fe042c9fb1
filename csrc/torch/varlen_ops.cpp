// The variable-length ops (schemas in library.cpp): sequences of different lengths packed along dim 0,
// sequence b at rows cu_seqlens[b] .. cu_seqlens[b + 1] of q (total_q, Hq, D) and of k, v (total_k,
// Hk, D), each attending only within itself. The CPU implementation runs the batched CPU kernels on
// each sequence's rows in place; the CUDA one runs the sm90 kernels over the packed rows (params.h,
// VarlenParams), whose schedule is built on the device from the offsets: the host never reads them.
#include <torch/extension.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>

#include "cpu/attention_cpu.h"
#include "cuda/varlen.h"
#include "torch/alibi.h"
#include "torch/checks.h"
#include "torch/sink.h"
#include "torch/varlen_ops.h"

#ifdef FLASHATTN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/varlen_schedule.h"
#include "plan.h"
#include "sm90/api.h"
#include "torch/cuda_ops.h"
#endif

namespace flashattn {

VarlenShape check_varlen_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                              const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k) {
  TORCH_CHECK(q.dim() == 3, op, ": q must be (total_q, heads_q, head_dim), got shape ", to_text(q.sizes()));
  TORCH_CHECK(k.dim() == 3, op, ": k must be (total_k, heads_kv, head_dim), got shape ", to_text(k.sizes()));
  TORCH_CHECK(v.dim() == 3, op, ": v must be (total_k, heads_kv, head_dim), got shape ", to_text(v.sizes()));
  VarlenShape s;
  s.packed = check_qkv(op, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), false);
  TORCH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.numel() >= 1, op,
              ": cu_seqlens_q must be a 1-dim tensor of batch + 1 offsets, got shape ", to_text(cu_seqlens_q.sizes()));
  s.batch = cu_seqlens_q.numel() - 1;
  check_int32_vector(op, "cu_seqlens_q", cu_seqlens_q, s.batch + 1, q);
  check_int32_vector(op, "cu_seqlens_k", cu_seqlens_k, s.batch + 1, q);
  if (seqused_q.has_value()) check_int32_vector(op, "seqused_q", *seqused_q, s.batch, q);
  if (seqused_k.has_value()) check_int32_vector(op, "seqused_k", *seqused_k, s.batch, q);
  TORCH_CHECK(s.batch < (int64_t{1} << 24), op, ": at most 2^24 sequences, got ", to_text(s.batch));
  return s;
}

namespace {

// ---- CPU: the batched kernels over each sequence's rows (the offsets are host memory here) ----

struct CpuSpan {
  int64_t q_begin, k_begin, len_q, len_k;
};

// The offsets' values, read here (host memory): what the CUDA ops have the list build check on the
// device (cuda/varlen_schedule.cu), with the same messages. max_seqlen_*: -1 leaves it unchecked.
void check_offset_values(const char* op, const at::Tensor& cu, const std::optional<at::Tensor>& used, int64_t total,
                         int64_t max_seqlen, const char* cu_name, const char* used_name, const char* max_name) {
  const int* c = cu.data_ptr<int>();
  const int64_t batch = cu.numel() - 1;
  TORCH_CHECK(c[0] == 0, op, ": ", cu_name, "[0] must be 0, got ", to_text(c[0]));
  TORCH_CHECK(c[batch] == total, op, ": ", cu_name, "[-1] must be the packed row count ", to_text(total), ", got ",
              to_text(c[batch]));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = c[b + 1] - c[b];
    TORCH_CHECK(len >= 0, op, ": ", cu_name, " must not decrease (entry ", to_text(b + 1), ")");
    TORCH_CHECK(max_seqlen < 0 || len <= max_seqlen, op, ": a sequence of ", cu_name, " is longer than ", max_name,
                "=", to_text(max_seqlen), " (sequence ", to_text(b), ": ", to_text(len), ")");
    if (used.has_value()) {
      const int u = used->data_ptr<int>()[b];
      TORCH_CHECK(u >= 0 && u <= len, op, ": ", used_name, " must be in [0, the sequence's length] for every sequence (",
                  "sequence ", to_text(b), ": ", to_text(u), " of ", to_text(len), ")");
    }
  }
}

// Both sides' offsets (check_offset_values), before any span is read.
void check_cpu_offsets(const char* op, const VarlenShape& s, const at::Tensor& cu_q, const at::Tensor& cu_k,
                       const std::optional<at::Tensor>& used_q, const std::optional<at::Tensor>& used_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check_offset_values(op, cu_q, used_q, s.packed.seqlen_q, max_seqlen_q, "cu_seqlens_q", "seqused_q", "max_seqlen_q");
  check_offset_values(op, cu_k, used_k, s.packed.seqlen_k, max_seqlen_k, "cu_seqlens_k", "seqused_k", "max_seqlen_k");
}

// The sliding window of a variable-length call (resolve_window): every sequence is at most the packed
// row counts long, and its causal_offset adds the window's causal_shift.
KeyWindow packed_window(const char* op, const VarlenShape& s, bool is_causal, int64_t window_left,
                        int64_t window_right) {
  return resolve_window(op, is_causal, window_left, window_right, std::max(s.packed.seqlen_q, s.packed.seqlen_k),
                        std::nullopt);
}

// Sequence b's rows (the offsets checked by check_cpu_offsets: inside q's and k's rows).
CpuSpan cpu_span(const at::Tensor& cu_q, const at::Tensor& cu_k, const std::optional<at::Tensor>& used_q,
                 const std::optional<at::Tensor>& used_k, int64_t b) {
  const int* cq = cu_q.data_ptr<int>();
  const int* ck = cu_k.data_ptr<int>();
  CpuSpan s{cq[b], ck[b], cq[b + 1] - cq[b], ck[b + 1] - ck[b]};
  if (used_q.has_value()) s.len_q = used_q->data_ptr<int>()[b];
  if (used_k.has_value()) s.len_k = used_k->data_ptr<int>()[b];
  return s;
}

// alibi_slopes checked against the batch of sequences (check_alibi).
void check_varlen_alibi(const char* op, const std::optional<at::Tensor>& slopes, const at::Tensor& q,
                        const VarlenShape& s, double softcap) {
  CheckedShape sequences = s.packed;
  sequences.batch = s.batch;
  check_alibi(op, slopes, q, sequences, softcap, std::nullopt);
}

// ALiBi over sequence b's rows (span, its diagonal at causal_offset, a window of window_span) as the
// batched CPU op runs it: alibi_mask's additive mask, with a window's left bound in it.
AlibiMask sequence_alibi(const at::Tensor& slopes, const VarlenShape& s, const CpuSpan& span, int64_t b,
                         bool is_causal, int64_t causal_offset, int64_t window_span, bool has_sink) {
  const CheckedShape sequence{1, span.len_q, span.len_k, s.packed.heads_q, s.packed.heads_kv, s.packed.head_dim,
                              causal_offset, window_span};
  return alibi_mask(slopes.dim() == 2 ? slopes.narrow(0, b, 1) : slopes, sequence, is_causal, has_sink);
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                  const std::optional<at::Tensor>& seqused_q,
                                                  const std::optional<at::Tensor>& seqused_k, double scale,
                                                  bool is_causal, bool causal_bottom_right,
                                                  bool /*deterministic: the backward's*/, int64_t max_seqlen_q,
                                                  int64_t max_seqlen_k, const std::optional<at::Tensor>& sink,
                                                  double softcap, int64_t window_left, int64_t window_right,
                                                  const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.varlen_fwd";
  const VarlenShape s = check_varlen_args(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k);
  check_sink(op, sink, q, s.packed.heads_q);
  check_softcap(op, softcap, std::nullopt);
  check_varlen_alibi(op, alibi_slopes, q, s, softcap);
  check_cpu_offsets(op, s, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  const KeyWindow window = packed_window(op, s, is_causal, window_left, window_right);
  const at::ScalarType lse_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::zeros(q.sizes(), q.options());
  at::Tensor lse = at::full({s.packed.heads_q, s.packed.seqlen_q}, -std::numeric_limits<double>::infinity(),
                            q.options().dtype(lse_type));
  for (int64_t b = 0; b < s.batch; ++b) {
    const CpuSpan span = cpu_span(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, b);
    // Without keys: out 0 and lse -inf (or, with a sink, the sink's logit: the op computes that).
    if (span.len_q == 0 || (span.len_k == 0 && !sink.has_value())) continue;
    const int64_t offset = (causal_bottom_right ? span.len_k - span.len_q : 0) + window.causal_shift;
    std::optional<at::Tensor> mask;
    at::Tensor lse_shift;  // alibi_mask's per-key form: the kernels' LSE less the op's
    if (alibi_slopes.has_value()) {
      AlibiMask alibi =
          sequence_alibi(*alibi_slopes, s, span, b, window.is_causal, offset, window.span, sink.has_value());
      mask = std::move(alibi.mask);
      lse_shift = std::move(alibi.lse_shift);
    }
    auto [o, l] = cpu::fwd(q.narrow(0, span.q_begin, span.len_q).unsqueeze(0),
                           k.narrow(0, span.k_begin, span.len_k).unsqueeze(0),
                           v.narrow(0, span.k_begin, span.len_k).unsqueeze(0), scale, window.is_causal,
                           offset, mask, 0.0, std::nullopt, sink, softcap, mask.has_value() ? -1 : window.span);
    if (lse_shift.defined()) l.sub_(lse_shift);
    out.narrow(0, span.q_begin, span.len_q).copy_(o[0]);
    lse.narrow(1, span.q_begin, span.len_q).copy_(l[0]);
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k, double scale,
    bool is_causal, bool causal_bottom_right, bool /*deterministic: the CPU backward always is*/,
    const std::optional<at::Tensor>& sink, const std::optional<at::Tensor>& dsink, double softcap,
    int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.varlen_bwd";
  const VarlenShape s = check_varlen_args(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k);
  check_varlen_bwd_inputs(op, dout, q, out, lse, s);
  check_sink(op, sink, q, s.packed.heads_q);
  check_dsink(op, dsink, sink, q, s.packed.heads_q);
  check_softcap(op, softcap, std::nullopt);
  check_varlen_alibi(op, alibi_slopes, q, s, softcap);
  check_cpu_offsets(op, s, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, -1, -1);
  const KeyWindow window = packed_window(op, s, is_causal, window_left, window_right);
  if (dsink.has_value()) dsink->copy_(sink_gradient_of_rows(*sink, dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0)));
  at::Tensor dq = at::zeros(q.sizes(), q.options());
  at::Tensor dk = at::zeros(k.sizes(), k.options());
  at::Tensor dv = at::zeros(v.sizes(), v.options());
  for (int64_t b = 0; b < s.batch; ++b) {
    const CpuSpan span = cpu_span(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, b);
    if (span.len_q == 0 || span.len_k == 0) continue;
    const int64_t offset = (causal_bottom_right ? span.len_k - span.len_q : 0) + window.causal_shift;
    auto rows_q = [&](const at::Tensor& t) { return t.narrow(0, span.q_begin, span.len_q).unsqueeze(0); };
    auto rows_k = [&](const at::Tensor& t) { return t.narrow(0, span.k_begin, span.len_k).unsqueeze(0); };
    at::Tensor rows_lse = lse.narrow(1, span.q_begin, span.len_q).unsqueeze(0);
    std::optional<at::Tensor> mask;
    if (alibi_slopes.has_value()) {  // the forward's mask, and its LSE (the op's plus lse_shift)
      AlibiMask alibi =
          sequence_alibi(*alibi_slopes, s, span, b, window.is_causal, offset, window.span, sink.has_value());
      mask = std::move(alibi.mask);
      if (alibi.lse_shift.defined()) rows_lse = rows_lse + alibi.lse_shift;
    }
    auto [g_q, g_k, g_v] = cpu::bwd(rows_q(dout), rows_q(q), rows_k(k), rows_k(v), rows_q(out), rows_lse, scale,
                                    window.is_causal, offset, mask, std::nullopt, 0.0, std::nullopt, softcap,
                                    mask.has_value() ? -1 : window.span);
    dq.narrow(0, span.q_begin, span.len_q).copy_(g_q[0]);
    dk.narrow(0, span.k_begin, span.len_k).copy_(g_k[0]);
    dv.narrow(0, span.k_begin, span.len_k).copy_(g_v[0]);
  }
  return {dq, dk, dv};
}

#ifdef FLASHATTN_WITH_CUDA
// ---- CUDA: the sm90 kernels over the packed rows ----

using cuda_ops::strides_of;

// The packed tensor t (total, H, D) as the kernels' [1, total, H, D].
at::Tensor as_batch_of_one(const at::Tensor& t) { return t.unsqueeze(0); }

void check_varlen_gpu(const char* op, const at::Tensor& q, const AttentionShape& shape, bool tensors_tma) {
  cuda_ops::check_cuda_device(op, q);
  const DeviceInfo device = cuda_ops::device_info(q);
  TORCH_CHECK(device.major == 9 && device.minor == 0 && !plan_options().force_sm80 &&
                  sm90::varlen_supported(shape, tensors_tma),
              op, ": variable-length batches run in the kernels on sm_90 GPUs at head dims 33..256 with 16-byte "
              "aligned rows (flashattn.flash_attn_varlen_func pads the batch elsewhere); got head dim ",
              to_text(shape.head_dim), " on compute capability ", to_text(device.major), ".", to_text(device.minor));
}

// The variable-length kernels add ALiBi's term in raw-score units (slope / scale): a positive scale.
void check_alibi_scale(const char* op, const std::optional<at::Tensor>& slopes, double scale) {
  TORCH_CHECK(!slopes.has_value() || alibi_in_kernels(true, scale), op,
              ": alibi_slopes on a variable-length batch needs a positive finite scale, got ", std::to_string(scale));
}

// The VarlenParams of a call, its schedule list in `list` (allocated here: capacity items and a count).
// The limits the list build checks the offsets against: the packed row counts of `s`, max_seqlen_q / _k
// (-1: unchecked).
VarlenParams make_varlen(const at::Tensor& cu_q, const at::Tensor& cu_k, const std::optional<at::Tensor>& used_q,
                         const std::optional<at::Tensor>& used_k, bool causal_bottom_right, const VarlenShape& s,
                         int64_t max_seqlen_q, int64_t max_seqlen_k, int64_t capacity, at::Tensor& list) {
  list = at::empty({2 * capacity + 1}, cu_q.options());
  VarlenParams v;
  v.cu_seqlens_q = cu_q.data_ptr<int>();
  v.cu_seqlens_k = cu_k.data_ptr<int>();
  v.total_q = static_cast<int>(s.packed.seqlen_q);
  v.total_k = static_cast<int>(s.packed.seqlen_k);
  v.max_seqlen_q = static_cast<int>(std::min<int64_t>(max_seqlen_q, std::numeric_limits<int>::max()));
  v.max_seqlen_k = static_cast<int>(std::min<int64_t>(max_seqlen_k, std::numeric_limits<int>::max()));
  v.seqused_q = used_q.has_value() ? used_q->data_ptr<int>() : nullptr;
  v.seqused_k = used_k.has_value() ? used_k->data_ptr<int>() : nullptr;
  v.causal_bottom_right = causal_bottom_right;
  v.tiles = list.data_ptr<int>();
  v.tile_count = list.data_ptr<int>() + 2 * capacity;
  return v;
}

AttentionShape varlen_shape(const VarlenShape& s, const at::Tensor& q, double scale, const KeyWindow& window) {
  CheckedShape packed = s.packed;
  packed.batch = s.batch;  // sequences; seqlen_q / seqlen_k stay the packed row counts
  packed.window_span = window.span;  // each sequence's causal_offset is its own (cuda/varlen.h, SeqSpan)
  return cuda_ops::make_shape(packed, q, scale, window.is_causal);
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                   const std::optional<at::Tensor>& seqused_q,
                                                   const std::optional<at::Tensor>& seqused_k, double scale,
                                                   bool is_causal, bool causal_bottom_right,
                                                   bool /*deterministic: the backward's*/, int64_t max_seqlen_q,
                                                   int64_t max_seqlen_k, const std::optional<at::Tensor>& sink_in,
                                                   double softcap, int64_t window_left, int64_t window_right,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.varlen_fwd";
  const VarlenShape s = check_varlen_args(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k);
  check_sink(op, sink_in, q, s.packed.heads_q);
  check_softcap(op, softcap, std::nullopt);
  check_varlen_alibi(op, alibi_slopes, q, s, softcap);
  check_alibi_scale(op, alibi_slopes, scale);
  const KeyWindow window = packed_window(op, s, is_causal, window_left, window_right);
  const at::Tensor sink = sink_in.has_value() ? sink_values(*sink_in) : at::Tensor();
  const c10::cuda::CUDAGuard device_guard(q.device());
  const at::Tensor q4 = as_batch_of_one(q), k4 = as_batch_of_one(k), v4 = as_batch_of_one(v);
  FwdParams p;
  p.shape = cuda_ops::with_softcap(varlen_shape(s, q, scale, window), softcap);
  if (alibi_slopes.has_value()) p.shape = with_alibi(p.shape, *alibi_slopes, 0);  // offsets: each sequence's
  p.shape.rows_aligned_16 = cuda_ops::rows_aligned_16(q4) && cuda_ops::rows_aligned_16(k4) && cuda_ops::rows_aligned_16(v4);
  const bool tma = cuda_ops::tma_describable(q4) && cuda_ops::tma_describable(k4) && cuda_ops::tma_describable(v4);
  check_varlen_gpu(op, q, p.shape, tma && p.shape.rows_aligned_16);

  // Rows outside every sequence's used rows (seqused_q) are never written by the kernels.
  const bool partial = seqused_q.has_value();
  at::Tensor out = partial ? at::zeros(q.sizes(), q.options()) : at::empty(q.sizes(), q.options());
  at::Tensor lse = partial ? at::full({s.packed.heads_q, s.packed.seqlen_q}, -std::numeric_limits<float>::infinity(),
                                      q.options().dtype(at::kFloat))
                           : at::empty({s.packed.heads_q, s.packed.seqlen_q}, q.options().dtype(at::kFloat));
  if (s.batch == 0 || s.packed.seqlen_q == 0 || s.packed.heads_q == 0) return {out, lse};
  if (s.packed.seqlen_k == 0) {  // no keys at all: every row attends to nothing (or to the sink alone)
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    if (sink.defined()) join_sink(out, lse, sink);
    return {out, lse};
  }
  at::Tensor list;
  const int64_t capacity = varlen_list_capacity_bound(p.shape.heads_q, p.shape.batch, s.packed.seqlen_q);
  p.varlen = make_varlen(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, causal_bottom_right, s, max_seqlen_q,
                         max_seqlen_k, capacity, list);
  p.varlen.causal_shift = static_cast<int>(window.causal_shift);
  at::Tensor tile_counter = at::empty({1}, q.options().dtype(at::kInt));
  p.tile_counter = tile_counter.data_ptr<int>();
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sink = sink.defined() ? sink.data_ptr<float>() : nullptr;
  p.q_strides = strides_of(q4);
  p.k_strides = strides_of(k4);
  p.v_strides = strides_of(v4);
  p.out_strides = strides_of(as_batch_of_one(out));
  const int grid = static_cast<int>(std::min<int64_t>(cuda_ops::device_info(q).num_sms, capacity));
  cuda_ops::check_sm90_launch(sm90::run_fwd_varlen(p, grid, at::cuda::getCurrentCUDAStream()), op);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse_in, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k, double scale,
    bool is_causal, bool causal_bottom_right, bool deterministic, const std::optional<at::Tensor>& sink,
    const std::optional<at::Tensor>& dsink, double softcap, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "flashattn.varlen_bwd";
  const VarlenShape s = check_varlen_args(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k);
  check_varlen_bwd_inputs(op, dout, q, out, lse_in, s);
  check_sink(op, sink, q, s.packed.heads_q);
  check_dsink(op, dsink, sink, q, s.packed.heads_q);
  check_softcap(op, softcap, std::nullopt);
  check_varlen_alibi(op, alibi_slopes, q, s, softcap);
  check_alibi_scale(op, alibi_slopes, scale);
  const KeyWindow window = packed_window(op, s, is_causal, window_left, window_right);
  const c10::cuda::CUDAGuard device_guard(q.device());
  const at::Tensor q4 = as_batch_of_one(q), k4 = as_batch_of_one(k), v4 = as_batch_of_one(v);
  const at::Tensor out4 = as_batch_of_one(out), dout4 = as_batch_of_one(dout);
  BwdParams p;
  p.shape = cuda_ops::with_softcap(varlen_shape(s, q, scale, window), softcap);
  if (alibi_slopes.has_value()) p.shape = with_alibi(p.shape, *alibi_slopes, 0);  // offsets: each sequence's
  p.shape.rows_aligned_16 = cuda_ops::rows_aligned_16(q4) && cuda_ops::rows_aligned_16(k4) &&
                            cuda_ops::rows_aligned_16(v4) && cuda_ops::rows_aligned_16(out4) &&
                            cuda_ops::rows_aligned_16(dout4);
  const bool tma = cuda_ops::tma_describable(q4) && cuda_ops::tma_describable(k4) &&
                   cuda_ops::tma_describable(v4) && cuda_ops::tma_describable(dout4);
  check_varlen_gpu(op, q, p.shape, tma && p.shape.rows_aligned_16);

  // Rows outside every sequence's used rows get no gradient from the kernels: zeros.
  const bool partial = seqused_q.has_value() || seqused_k.has_value();
  auto alloc = [&](const at::Tensor& like) { return partial ? at::zeros(like.sizes(), like.options()) : at::empty(like.sizes(), like.options()); };
  at::Tensor dq = alloc(q), dk = alloc(k), dv = alloc(v);
  if (s.batch == 0 || s.packed.heads_q == 0 || s.packed.seqlen_k == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (dsink.has_value()) dsink->zero_();  // every out row is 0
    return {dq, dk, dv};
  }
  const at::Tensor lse = lse_in.to(at::kFloat).contiguous();
  const int width = sm90::bwd_tile_width(p.shape.head_dim);
  p.sm90_block_m = width == 64 && plan_options().sm90_bwd_wide_steps ? 128 : 64;
  // 64-row sequence regions where the kernel's query steps are 64 rows and the preprocess's blocks too
  // (it takes 64 rows a block above head dim 64, 128 up to it): half the padding of 128-row regions.
  const int workspace_align = p.sm90_block_m == 64 && p.shape.head_dim > 64 ? 64 : kBwdStatsAlign;
  const int64_t workspace_rows = varlen_workspace_row(s.packed.seqlen_q, s.batch, workspace_align);
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dq_accum = at::empty({s.packed.heads_q, workspace_rows, width}, f32);
  at::Tensor delta = at::empty({s.packed.heads_q, workspace_rows}, f32);
  at::Tensor lse_log2 = at::empty_like(delta);
  at::Tensor dq_keys_done;  // deterministic mode: a zeroed counter per 64 workspace rows
  if (deterministic) dq_keys_done = at::zeros({s.packed.heads_q * workspace_rows / 64}, q.options().dtype(at::kInt));

  at::Tensor list;
  const int64_t capacity = varlen_list_capacity_bound(p.shape.heads_kv, p.shape.batch, s.packed.seqlen_k);
  p.varlen = make_varlen(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, causal_bottom_right, s, -1, -1, capacity,
                         list);
  p.varlen.causal_shift = static_cast<int>(window.causal_shift);
  p.varlen.workspace_rows = workspace_rows;
  p.varlen.workspace_align = workspace_align;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.stats_stride = workspace_rows;
  p.dq_accum_dim = width;
  p.dq_accum_tiled = true;
  p.deterministic = deterministic;
  p.dq_keys_done = deterministic ? dq_keys_done.data_ptr<int>() : nullptr;
  p.q_strides = strides_of(q4);
  p.k_strides = strides_of(k4);
  p.v_strides = strides_of(v4);
  p.out_strides = strides_of(out4);
  p.dout_strides = strides_of(dout4);
  p.dq_strides = strides_of(as_batch_of_one(dq));
  p.dk_strides = strides_of(as_batch_of_one(dk));
  p.dv_strides = strides_of(as_batch_of_one(dv));
  cuda_ops::check_sm90_launch(sm90::run_bwd_varlen(p, at::cuda::getCurrentCUDAStream()), op);
  // From the preprocess's statistics of every sequence's rows (padding rows: lse_log2 +inf, delta 0).
  if (dsink.has_value()) dsink->copy_(sink_gradient(*sink, lse_log2.unsqueeze(0), delta.unsqueeze(0)));
  return {dq, dk, dv};
}
#endif  // FLASHATTN_WITH_CUDA

}  // namespace

void check_varlen_bwd_inputs(const char* op, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                             const at::Tensor& lse, const VarlenShape& s) {
  check_dout_and_out(op, dout, q, out, lse);
  const std::vector<int64_t> lse_shape = {s.packed.heads_q, s.packed.seqlen_q};
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(lse_shape), op, ": lse must be (heads_q, total_q) ", to_text(lse_shape),
              ", got ", to_text(lse.sizes()));
}

void register_varlen_cpu(torch::Library& m) {
  m.impl("varlen_fwd", &varlen_fwd_cpu);
  m.impl("varlen_bwd", &varlen_bwd_cpu);
}

#ifdef FLASHATTN_WITH_CUDA
void register_varlen_cuda(torch::Library& m) {
  m.impl("varlen_fwd", &varlen_fwd_cuda);
  m.impl("varlen_bwd", &varlen_bwd_cuda);
}
#endif

}  // namespace flashattn
