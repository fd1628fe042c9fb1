// The flashattn ops: schemas, per-device implementations (checks, allocation, dispatch), module init.
//
//   fwd(q, k, v, scale, is_causal, causal_bottom_right, attn_mask=None, dropout_p=0.0,
//       rng_state=None, deterministic=False, sink=None, softcap=0.0, window_left=-1, window_right=-1)
//       -> (out, lse)
//   bwd(dout, q, k, v, out, lse, scale, is_causal, causal_bottom_right, deterministic=False,
//       attn_mask=None, dmask=None, dropout_p=0.0, rng_state=None, sink=None, dsink=None, softcap=0.0,
//       window_left=-1, window_right=-1) -> (dq, dk, dv)
//   dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p) -> keep [B, H, Lq, Lk] bool
//   varlen_fwd / varlen_bwd: the same over a variable-length batch (varlen_ops.cpp)
//
// q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] with any strides but a contiguous last dim; out [B, Lq, Hq, D]
// and lse [B, Hq, Lq] (natural log, -inf for a row that sees no key); dq like q, dk/dv like k, all
// freshly allocated and contiguous. attn_mask is a [B, Hq, Lq, Lk] view with any strides (0 on
// broadcast dims: it is read in place), bool (True = the key takes part), float32 or q's dtype (added
// to scale * q.k). dmask, a contiguous [B, Hq, Lq, Lk] tensor of attn_mask's dtype, is overwritten
// with the gradient of a floating attn_mask. dropout_p in [0, 1) drops each probability (after the
// softmax; the LSE is that of the undropped scores) with the keep-mask of common/dropout.h, seeded by
// rng_state, a [2] int64 tensor (seed, offset) on q's device that the backward must get unchanged;
// dropout_keep_mask materialises that mask (for tests: it is quadratic in memory). sink, a (Hq,) floating
// tensor of logits, joins each query head's softmax denominators (torch/sink.h); lse then includes it, and
// bwd, given the forward's sink, overwrites dsink (contiguous (Hq,) float32) with the sink's gradient.
// softcap > 0 caps every scaled score to softcap * tanh(score / softcap) before the mask and the softmax
// (Gemma 2); bwd needs the forward's. Not with a floating attn_mask. window_left / window_right (>= 0;
// -1: unbounded) restrict query i to the keys i + offset - window_left .. i + offset + window_right, offset
// the causal alignment's diagonal (a sliding window, FlashAttention-2's window_size; is_causal makes the
// right bound 0); not with an attn_mask; bwd needs the forward's. fwd's `deterministic`
// is for its backward alone (autograd.cpp passes it to bwd): the forward is always reproducible.
// fwd's autograd kernel is in autograd.cpp; the fake kernels are registered in flashattn/ops.py.
// The forward is bitwise reproducible; the CUDA backward is only with deterministic=True (its dq sums
// in a fixed order), the CPU backward always is.
#include <torch/extension.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "cpu/attention_cpu.h"
#include "cpu/attention_cpu_bwd_plain.h"
#include "cpu/attention_cpu_fwd_plain.h"
#include "cpu/attention_cpu_softmax_rows.h"
#include "torch/alibi.h"
#include "torch/checks.h"
#include "torch/decode_ops.h"
#include "torch/sink.h"
#include "torch/varlen_ops.h"

#ifdef FLASHATTN_WITH_CUDA
#include "plan.h"
#include "sm90/api.h"
#include "torch/cuda_ops.h"
#endif

namespace flashattn {
namespace {

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           double scale, bool is_causal, bool causal_bottom_right,
                                           const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                           const std::optional<at::Tensor>& rng_state,
                                           bool /*deterministic: the backward's, see autograd.cpp*/,
                                           const std::optional<at::Tensor>& sink, double softcap,
                                           int64_t window_left, int64_t window_right,
                                           const std::optional<at::Tensor>& alibi_slopes) {
  CheckedShape s = check_fwd_args(q, k, v, causal_bottom_right, attn_mask, dropout_p, rng_state);
  check_sink("flashattn.fwd", sink, q, s.heads_q);
  check_softcap("flashattn.fwd", softcap, attn_mask);
  check_alibi("flashattn.fwd", alibi_slopes, q, s, softcap, attn_mask);
  is_causal = apply_window("flashattn.fwd", s, is_causal, window_left, window_right, attn_mask);
  if (alibi_slopes.has_value()) {  // as an additive mask (alibi.h), a window's left bound in it
    const AlibiMask alibi = alibi_mask(*alibi_slopes, s, is_causal, sink.has_value());
    auto [out, lse] = cpu::fwd(q, k, v, scale, is_causal, s.causal_offset, alibi.mask, dropout_p, rng_state, sink,
                               softcap, -1);
    if (alibi.lse_shift.defined()) lse.sub_(alibi.lse_shift);
    return {out, lse};
  }
  return cpu::fwd(q, k, v, scale, is_causal, s.causal_offset, attn_mask, dropout_p, rng_state, sink, softcap,
                  s.window_span);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& out, const at::Tensor& lse,
                                                       double scale, bool is_causal, bool causal_bottom_right,
                                                       bool /*deterministic: the CPU backward always is*/,
                                                       const std::optional<at::Tensor>& attn_mask,
                                                       const std::optional<at::Tensor>& dmask, double dropout_p,
                                                       const std::optional<at::Tensor>& rng_state,
                                                       const std::optional<at::Tensor>& sink,
                                                       const std::optional<at::Tensor>& dsink, double softcap,
                                                       int64_t window_left, int64_t window_right,
                                                       const std::optional<at::Tensor>& alibi_slopes) {
  CheckedShape s =
      check_bwd_args(dout, q, k, v, out, lse, causal_bottom_right, attn_mask, dmask, dropout_p, rng_state);
  check_sink("flashattn.bwd", sink, q, s.heads_q);
  check_dsink("flashattn.bwd", dsink, sink, q, s.heads_q);
  check_softcap("flashattn.bwd", softcap, attn_mask);
  check_alibi("flashattn.bwd", alibi_slopes, q, s, softcap, attn_mask);
  is_causal = apply_window("flashattn.bwd", s, is_causal, window_left, window_right, attn_mask);
  if (dmask.has_value()) dmask->zero_();  // elements whose key takes no part keep a zero gradient
  if (dsink.has_value()) dsink->copy_(sink_gradient_of_rows(*sink, dout, out, lse));
  if (alibi_slopes.has_value()) {  // as the forward's additive mask (alibi.h); no dmask: no attn_mask
    const AlibiMask alibi = alibi_mask(*alibi_slopes, s, is_causal, sink.has_value());
    const at::Tensor mask_lse = alibi.lse_shift.defined() ? lse + alibi.lse_shift : lse;
    return cpu::bwd(dout, q, k, v, out, mask_lse, scale, is_causal, s.causal_offset, alibi.mask, dmask, dropout_p,
                    rng_state, softcap, -1);
  }
  return cpu::bwd(dout, q, k, v, out, lse, scale, is_causal, s.causal_offset, attn_mask, dmask, dropout_p, rng_state,
                  softcap, s.window_span);
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

#ifdef FLASHATTN_WITH_CUDA
// ---- the planner, for tests and `python -m flashattn info`: dicts of plain values ----

namespace py = pybind11;

const char* choice_name(Choice c) { return c == Choice::kAuto ? "auto" : c == Choice::kOn ? "on" : "off"; }

Choice choice_of(const py::handle& value) {
  if (value.is_none()) return Choice::kAuto;
  if (py::isinstance<py::str>(value)) {
    const std::string text = value.cast<std::string>();
    TORCH_CHECK(text == "auto" || text == "on" || text == "off", "plan option: expected 'auto', 'on', 'off' or a bool, got '",
                text, "'");
    return text == "auto" ? Choice::kAuto : text == "on" ? Choice::kOn : Choice::kOff;
  }
  return value.cast<bool>() ? Choice::kOn : Choice::kOff;
}

py::dict options_dict(const PlanOptions& o) {
  py::dict d;
  d["force_sm80"] = o.force_sm80;
  d["sm90_multicast"] = choice_name(o.sm90_multicast);
  d["sm90_wide_key_blocks"] = choice_name(o.sm90_wide_key_blocks);
  d["sm90_narrow_tail"] = o.sm90_narrow_tail;
  d["sm90_dynamic_tail"] = o.sm90_dynamic_tail;
  d["sm90_staged_output"] = o.sm90_staged_output;
  d["sm90_bwd_wide_steps"] = o.sm90_bwd_wide_steps;
  d["smem_per_block_cap"] = o.smem_per_block_cap;
  d["decode_stages"] = o.decode_stages;
  return d;
}

// Options from a dict of any of options_dict's keys (the others keep `base`'s values); an unknown key raises.
PlanOptions options_of(const py::dict& d, PlanOptions o) {
  for (const auto& item : d) {
    const std::string key = item.first.cast<std::string>();
    const py::handle value = item.second;
    if (key == "force_sm80") {
      o.force_sm80 = value.cast<bool>();
    } else if (key == "sm90_multicast") {
      o.sm90_multicast = choice_of(value);
    } else if (key == "sm90_wide_key_blocks") {
      o.sm90_wide_key_blocks = choice_of(value);
    } else if (key == "sm90_narrow_tail") {
      o.sm90_narrow_tail = value.cast<bool>();
    } else if (key == "sm90_dynamic_tail") {
      o.sm90_dynamic_tail = value.cast<bool>();
    } else if (key == "sm90_staged_output") {
      o.sm90_staged_output = value.cast<bool>();
    } else if (key == "sm90_bwd_wide_steps") {
      o.sm90_bwd_wide_steps = value.cast<bool>();
    } else if (key == "smem_per_block_cap") {
      o.smem_per_block_cap = value.cast<int>();
    } else if (key == "decode_stages") {
      o.decode_stages = value.cast<int>();
      TORCH_CHECK(o.decode_stages == 0 || o.decode_stages == 2 || o.decode_stages == 3,
                  "plan option: decode_stages must be 0 (the default), 2 or 3, got ", std::to_string(o.decode_stages));
    } else {
      TORCH_CHECK(false, "plan option: unknown name '", key, "'; the options are ", py::str(options_dict(o)).cast<std::string>());
    }
  }
  return o;
}

template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

// An attention call as the planner sees it, from a dict: batch, seqlen_q, seqlen_k, heads_q, heads_kv,
// head_dim, scale, is_causal, causal_offset, window_span (-1: none), dtype ("bf16" | "fp16"), mask (None | "bool" | "additive"),
// mask_batch_stride_zero, mask_head_stride_zero, mask_row_stride_zero, dropout, tma (True: every tensor
// TMA-describable), out_tma, deterministic, dmask; and the device: cc ((major, minor)), num_sms,
// pair_clusters, smem_per_block (bytes; 0 or absent: not known, not checked).
AttentionShape shape_of(const py::dict& d) {
  AttentionShape s{};
  s.batch = get<int>(d, "batch", 1);
  s.seqlen_q = get<int>(d, "seqlen_q", 1);
  s.seqlen_k = get<int>(d, "seqlen_k", s.seqlen_q);
  s.heads_q = get<int>(d, "heads_q", 1);
  s.heads_kv = get<int>(d, "heads_kv", s.heads_q);
  s.head_dim = get<int>(d, "head_dim", 64);
  s.scale = get<float>(d, "scale", 1.f / std::sqrt(static_cast<float>(s.head_dim)));
  s.scale_log2 = s.scale * 1.4426950408889634f;
  s.is_causal = get<bool>(d, "is_causal", false);
  s.causal_offset = get<int>(d, "causal_offset", 0);
  s.window_span = get<int>(d, "window_span", -1);
  s.element_type = get<std::string>(d, "dtype", "bf16") == "fp16" ? ElementType::kFloat16 : ElementType::kBFloat16;
  s.rows_aligned_16 = true;
  return s;
}

MaskLayout mask_of(const py::dict& d) {
  MaskLayout m;
  if (!d.contains("mask") || d["mask"].is_none()) return m;
  m.present = true;
  m.is_bool = d["mask"].cast<std::string>() == "bool";
  m.batch_stride_zero = get<bool>(d, "mask_batch_stride_zero", false);
  m.head_stride_zero = get<bool>(d, "mask_head_stride_zero", false);
  m.row_stride_zero = get<bool>(d, "mask_row_stride_zero", false);
  return m;
}

DeviceInfo device_of(const py::dict& d) {
  DeviceInfo dev;
  const auto cc = get<std::pair<int, int>>(d, "cc", {9, 0});
  dev.major = cc.first;
  dev.minor = cc.second;
  dev.num_sms = get<int>(d, "num_sms", 132);
  dev.pair_clusters = get<int>(d, "pair_clusters", dev.num_sms / 2);
  dev.smem_per_block = get<int>(d, "smem_per_block", 0);
  return dev;
}

const char* path_name(GpuPath path) { return path == GpuPath::kSm90 ? "sm90" : "sm80"; }

py::dict smem_dict(const SmemFit& f) {
  py::dict d;
  d["bytes"] = f.bytes;
  d["limit"] = f.limit;
  d["fits"] = f.fits();
  return d;
}

py::dict mask_policy_dict(const MaskPolicy& m) {
  static const char* const forms[] = {"none", "padding", "causal"};
  py::dict d;
  d["tile"] = py::make_tuple(m.tile.queries, m.tile.keys);
  d["classify"] = m.classify;
  d["key_form"] = forms[static_cast<int>(m.key_form)];
  return d;
}

py::dict launch_dict(const sm90::FwdLaunchPlan& l) {
  static const char* const tiles[] = {"default", "prefetch_scores", "long_rows", "wide_keys",
                                      "wide_keys_tail64", "wide_keys_tail128", "masked"};
  static const char* const rows[] = {"all", "key_ends", "masked"};
  py::dict d;
  d["width"] = l.width;
  d["rows"] = rows[static_cast<int>(l.rows)];
  d["tiles"] = tiles[static_cast<int>(l.tiles)];
  d["multicast"] = l.multicast;
  d["staged_output"] = l.staged_output;
  d["tiles_per_unit"] = l.tiles_per_unit;
  d["grid"] = l.grid;
  d["dynamic_heads"] = l.dynamic_heads;
  d["is_causal"] = l.shape.is_causal;
  d["causal_offset"] = l.shape.causal_offset;
  d["window_span"] = l.shape.window_span;
  return d;
}

py::dict plan_fwd_dict(const py::dict& call_dict, const py::dict& options) {
  FwdCall call;
  call.shape = shape_of(call_dict);
  call.mask = mask_of(call_dict);
  call.dropout = get<bool>(call_dict, "dropout", false);
  call.qkv_tma = get<bool>(call_dict, "tma", true);
  call.out_tma = get<bool>(call_dict, "out_tma", call.qkv_tma);
  const FwdPlan plan = plan_fwd(call, device_of(call_dict), options_of(options, plan_options()));
  py::dict d;
  d["path"] = path_name(plan.path);
  d["mask"] = mask_policy_dict(plan.mask);
  d["tile_counter"] = plan.tile_counter;
  d["sm80_tiles"] = plan.sm80_tiles;
  d["smem"] = smem_dict(plan.smem);
  py::list launches;
  for (int i = 0; i < plan.sm90_launches; ++i) launches.append(launch_dict(plan.sm90[i]));
  d["launches"] = launches;
  return d;
}

py::dict plan_bwd_dict(const py::dict& call_dict, const py::dict& options) {
  BwdCall call;
  call.shape = shape_of(call_dict);
  call.mask = mask_of(call_dict);
  call.dropout = get<bool>(call_dict, "dropout", false);
  call.deterministic = get<bool>(call_dict, "deterministic", false);
  call.dmask = get<bool>(call_dict, "dmask", false);
  call.tensors_tma = get<bool>(call_dict, "tma", true);
  const BwdPlan plan = plan_bwd(call, device_of(call_dict), options_of(options, plan_options()));
  py::dict d;
  d["path"] = path_name(plan.path);
  d["mask"] = mask_policy_dict(plan.mask);
  d["dq_accum_dim"] = plan.dq_accum_dim;
  d["sm80_tiles"] = plan.sm80_tiles;
  d["sm90_block_m"] = plan.sm90_block_m;
  d["smem"] = smem_dict(plan.smem);
  return d;
}
#endif  // FLASHATTN_WITH_CUDA

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
        " Tensor? attn_mask=None, float dropout_p=0.0, Tensor? rng_state=None, bool deterministic=False,"
        " Tensor? sink=None, float softcap=0.0, int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None)"
        " -> (Tensor out, Tensor lse)");
  // fwd with q, k, v in (B, H, L, E), SDPA's layout; out and lse as fwd returns them.
  m.def("fwd_heads_first(Tensor q, Tensor k, Tensor v, float scale, bool is_causal, bool causal_bottom_right,"
        " Tensor? attn_mask=None, float dropout_p=0.0, Tensor? rng_state=None, bool deterministic=False,"
        " Tensor? sink=None, float softcap=0.0, int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None)"
        " -> (Tensor out, Tensor lse)");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, bool is_causal,"
        " bool causal_bottom_right, bool deterministic=False, Tensor? attn_mask=None, Tensor(a!)? dmask=None,"
        " float dropout_p=0.0, Tensor? rng_state=None, Tensor? sink=None, Tensor(b!)? dsink=None,"
        " float softcap=0.0, int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None)"
        " -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("dropout_keep_mask(Tensor rng_state, int batch, int heads, int seqlen_q, int seqlen_k, float dropout_p)"
        " -> Tensor");
  // Variable-length batches (varlen_ops.cpp): q (total_q, Hq, D), k/v (total_k, Hk, D), int32 offsets;
  // out like q, lse (Hq, total_q). The offsets' values are checked where the op reads them (on CUDA by
  // the device, a device-side assertion), max_seqlen_q / _k as the longest sequence allowed (-1: none).
  // alibi_slopes: float32 (Hq,) or (batch, Hq), each sequence's bias from its own bottom-right diagonal.
  m.def("varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q,"
        " Tensor? seqused_k, float scale, bool is_causal, bool causal_bottom_right, bool deterministic=False,"
        " SymInt max_seqlen_q=-1, SymInt max_seqlen_k=-1, Tensor? sink=None, float softcap=0.0,"
        " int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None)"
        " -> (Tensor out, Tensor lse)");
  m.def("varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q,"
        " Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, float scale, bool is_causal,"
        " bool causal_bottom_right, bool deterministic=False, Tensor? sink=None, Tensor(a!)? dsink=None,"
        " float softcap=0.0, int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None)"
        " -> (Tensor dq, Tensor dk, Tensor dv)");
  // Decoding over a key/value cache (decode_ops.cpp, CUDA only): q (B, Lq, Hq, D); k_cache / v_cache
  // (B or pages, Lcache or page_size, Hk, D); seqlens_k (B,) int32 keys per sequence; block_table (B,
  // pages_per_seq) int32 for a paged cache; out like q, lse (B, Hq, Lq). num_splits 0: chosen from the shapes.
  // With cu_seqlens_q (B + 1,) int32: q (total_q, Hq, D) packed, at most max_seqlen_q queries a sequence,
  // out like q, lse (Hq, total_q). sink: (Hq,) float32 logits joining each row's denominator (lse includes it).
  // alibi_slopes: float32 (Hq,) or (B, Hq), the bias from each query's diagonal position (the causal mask's).
  m.def("decode_fwd(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens_k, Tensor? block_table,"
        " Tensor? cache_batch_idx, Tensor? leftpad, float scale, bool is_causal, int window_left=-1,"
        " int window_right=-1, float softcap=0.0, int num_splits=0, Tensor? cu_seqlens_q=None,"
        " int max_seqlen_q=0, Tensor? sink=None, Tensor? alibi_slopes=None) -> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("fwd", &flashattn::fwd_cpu);
  m.impl("bwd", &flashattn::bwd_cpu);
  m.impl("dropout_keep_mask", &flashattn::dropout_keep_mask_cpu);
  flashattn::register_varlen_cpu(m);
}

#ifdef FLASHATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", &flashattn::cuda_ops::fwd);
  m.impl("bwd", &flashattn::cuda_ops::bwd);
  m.impl("dropout_keep_mask", &flashattn::cuda_ops::dropout_keep_mask);
  flashattn::register_varlen_cuda(m);
  flashattn::register_decode_cuda(m);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashattn kernels; the ops live in torch.ops.flashattn";
  m.attr("MAX_HEAD_DIM") = flashattn::kMaxHeadDim;
#ifdef FLASHATTN_WITH_CUDA
  m.def("plan_options", []() { return flashattn::options_dict(flashattn::plan_options()); },
        "The planner's switches now (flashattn.plan.options)");
  m.def("set_plan_options",
        [](const pybind11::dict& d) { flashattn::set_plan_options(flashattn::options_of(d, flashattn::plan_options())); },
        "Sets some of the planner's switches for the process (flashattn.plan.options)");
  m.def("plan_fwd", &flashattn::plan_fwd_dict, pybind11::arg("call"), pybind11::arg("options") = pybind11::dict(),
        "The forward's plan for a call described by a dict (flashattn.plan.plan_fwd)");
  m.def("plan_bwd", &flashattn::plan_bwd_dict, pybind11::arg("call"), pybind11::arg("options") = pybind11::dict(),
        "The backward's plan for a call described by a dict (flashattn.plan.plan_bwd)");
#endif
  m.def("compiled_with_cuda", &flashattn::compiled_with_cuda, "True when the CUDA kernels were built");
  m.def("decode_supported", &flashattn::decode_supported, pybind11::arg("head_dim"), pybind11::arg("bf16"),
        pybind11::arg("device_index"), "Whether the decode op serves this head dim on that CUDA device");
  m.def("decode_num_splits", &flashattn::decode_num_splits, pybind11::arg("batch"), pybind11::arg("heads_q"),
        pybind11::arg("heads_kv"), pybind11::arg("seqlen_q"), pybind11::arg("max_keys"), pybind11::arg("head_dim"),
        pybind11::arg("bf16"), pybind11::arg("device_index"), pybind11::arg("sm_margin") = 0,
        "The key splits the decode op chooses (num_splits=0) for these sizes on that CUDA device");
  m.def(
      "cpu_matrix_units",
      [](bool bfloat16) {
        return flashattn::cpu::detail::matrix_units_serve(bfloat16 ? at::kBFloat16 : at::kHalf, 64);
      },
      pybind11::arg("bfloat16"),
      "True when the CPU forward's bfloat16 (else float16) products run on the CPU's 16-bit matrix units");
  m.def("cpu_softmax_rows_form", &flashattn::cpu::detail::online_softmax_rows_form,
        "The vector form of the CPU forward's per-row softmax step on this CPU: avx512, avx2 or scalar");
  m.def("cpu_fwd_bf16_products_form", &flashattn::cpu::detail::fwd_bf16_products_form,
        "The form of the CPU forward's bfloat16 products on this CPU: matrix_units, avx512_bf16 or float32");
  m.def("cpu_bwd_bf16_products_form", &flashattn::cpu::detail::bwd_bf16_products_form,
        "The form of the CPU backward's bfloat16 products on this CPU: avx512_bf16, cpublas or float32");
  m.def("compiled_with_sm90", &flashattn::compiled_with_sm90,
        "True when the Hopper (sm_90a) forward kernels were built");
}
