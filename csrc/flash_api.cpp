// The flashattn ops: schemas, per-device implementations (checks, allocation, dispatch), module init.
//
//   fwd(q, k, v, scale, is_causal, causal_bottom_right) -> (out, lse)
//   bwd(dout, q, k, v, out, lse, scale, is_causal, causal_bottom_right, deterministic=False) -> (dq, dk, dv)
//
// q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] with any strides but a contiguous last dim; out [B, Lq, Hq, D]
// and lse [B, Hq, Lq] (natural log, -inf for a row that sees no key); dq like q, dk/dv like k, all
// freshly allocated and contiguous. Autograd and fake kernels are registered in flashattn/ops.py.
// The forward is bitwise reproducible; the CUDA backward is only with deterministic=True (its dq sums
// in a fixed order), the CPU backward always is.
#include <torch/extension.h>

#include <cstdlib>
#include <limits>
#include <tuple>

#include "checks.h"
#include "cpu/attention_cpu.h"

#ifdef FLASHATTN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "sm80/api.h"
#include "sm90/api.h"
#endif

namespace flashattn {
namespace {

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           double scale, bool is_causal, bool causal_bottom_right) {
  const CheckedShape s = check_qkv("flashattn.fwd", q, k, v, causal_bottom_right);
  return cpu::fwd(q, k, v, scale, is_causal, s.causal_offset);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& out, const at::Tensor& lse,
                                                       double scale, bool is_causal, bool causal_bottom_right,
                                                       bool /*deterministic: the CPU backward always is*/) {
  const CheckedShape s = check_qkv("flashattn.bwd", q, k, v, causal_bottom_right);
  check_bwd_inputs(dout, q, out, lse, s);
  return cpu::bwd(dout, q, k, v, out, lse, scale, is_causal, s.causal_offset);
}

#ifdef FLASHATTN_WITH_CUDA

TensorStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// 16-byte loads need every row start 16-byte aligned and whole 16-byte chunks per row.
bool rows_aligned_16(const at::Tensor& t) {
  const int64_t elems_per_16b = 16 / t.element_size();
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  return addr % 16 == 0 && t.size(3) % elems_per_16b == 0 && t.stride(0) % elems_per_16b == 0 &&
         t.stride(1) % elems_per_16b == 0 && t.stride(2) % elems_per_16b == 0;
}

void check_cuda_device(const char* op, const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(prop->major >= 8, op, ": flashattn's CUDA kernels need a GPU of compute capability 8.0 or newer, ",
              q.device().str(), " is ", to_text(prop->major), ".", to_text(prop->minor),
              " (flashattn.scaled_dot_product_attention falls back to torch there)");
}

AttentionShape make_shape(const CheckedShape& s, const at::Tensor& q, double scale, bool is_causal) {
  AttentionShape shape;
  shape.batch = static_cast<int>(s.batch);
  shape.seqlen_q = static_cast<int>(s.seqlen_q);
  shape.seqlen_k = static_cast<int>(s.seqlen_k);
  shape.heads_q = static_cast<int>(s.heads_q);
  shape.heads_kv = static_cast<int>(s.heads_kv);
  shape.head_dim = static_cast<int>(s.head_dim);
  shape.scale = static_cast<float>(scale);
  shape.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  shape.is_causal = is_causal;
  shape.causal_offset = static_cast<int>(s.causal_offset);
  shape.element_type = q.scalar_type() == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
  shape.rows_aligned_16 = true;
  return shape;
}

bool has_work(const CheckedShape& s) { return s.batch > 0 && s.heads_q > 0 && s.seqlen_q > 0 && s.seqlen_k > 0; }

// The Hopper kernels run on compute capability 9.0 for the inputs they cover, unless the environment
// variable FLASHATTN_FORCE_SM80=1 asks for the sm80 path (read on every call: tests compare both).
bool sm90_allowed(const at::Tensor& q) {
  const char* force_sm80 = std::getenv("FLASHATTN_FORCE_SM80");
  if (force_sm80 != nullptr && force_sm80[0] == '1') return false;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  return prop->major == 9 && prop->minor == 0;
}

bool use_sm90_fwd(const at::Tensor& q, const FwdParams& p) { return sm90_allowed(q) && sm90::fwd_supported(p); }
// Deterministic mode exists on the sm80 path only (the sm90 backward adds dq partials in any order).
bool use_sm90_bwd(const at::Tensor& q, const BwdParams& p) {
  return !p.deterministic && sm90_allowed(q) && sm90::bwd_supported(p);
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            double scale, bool is_causal, bool causal_bottom_right) {
  const char* op = "flashattn.fwd";
  const CheckedShape s = check_qkv(op, q, k, v, causal_bottom_right);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);

  at::Tensor out = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kFloat));
  if (!has_work(s)) {
    // No keys: every row attends to nothing, so out is 0 and lse is -inf (the empty log-sum-exp).
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  FwdParams p;
  p.shape = make_shape(s, q, scale, is_causal);
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
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (use_sm90_fwd(q, p)) {
    const cudaError_t err = sm90::run_fwd(p, stream);
    if (err != cudaErrorNotSupported) {
      C10_CUDA_CHECK(err);
      return {out, lse};
    }
  }
  C10_CUDA_CHECK(sm80::run_fwd(p, stream));
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(const at::Tensor& dout, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v,
                                                        const at::Tensor& out, const at::Tensor& lse_in,
                                                        double scale, bool is_causal, bool causal_bottom_right,
                                                        bool deterministic) {
  const char* op = "flashattn.bwd";
  const CheckedShape s = check_qkv(op, q, k, v, causal_bottom_right);
  check_bwd_inputs(dout, q, out, lse_in, s);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);

  at::Tensor dq = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor dk = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, k.options());
  at::Tensor dv = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, v.options());
  if (!has_work(s)) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  const at::Tensor lse = lse_in.to(at::kFloat).contiguous();  // no-op for the forward's own lse
  const int accum_dim = sm80::padded_head_dim(static_cast<int>(s.head_dim));
  at::Tensor dq_accum = at::zeros({s.batch, s.heads_q, s.seqlen_q, accum_dim}, q.options().dtype(at::kFloat));
  at::Tensor delta = at::empty({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kFloat));
  at::Tensor lse_log2 = at::empty_like(delta);
  // Deterministic mode: a zeroed counter per (batch, query head, query block); one per query row is
  // enough for any query block size.
  at::Tensor dq_keys_done;
  if (deterministic) dq_keys_done = at::zeros({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kInt));

  BwdParams p;
  p.shape = make_shape(s, q, scale, is_causal);
  p.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v) &&
                            rows_aligned_16(out) && rows_aligned_16(dout);
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
  p.dq_accum_dim = accum_dim;
  p.deterministic = deterministic;
  p.dq_keys_done = deterministic ? dq_keys_done.data_ptr<int>() : nullptr;
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  p.dout_strides = strides_of(dout);
  p.dq_strides = strides_of(dq);
  p.dk_strides = strides_of(dk);
  p.dv_strides = strides_of(dv);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (use_sm90_bwd(q, p)) {
    const cudaError_t err = sm90::run_bwd(p, stream);
    if (err != cudaErrorNotSupported) {
      C10_CUDA_CHECK(err);
      return {dq, dk, dv};
    }
  }
  C10_CUDA_CHECK(sm80::run_bwd(p, stream));
  return {dq, dk, dv};
}

#endif  // FLASHATTN_WITH_CUDA

bool compiled_with_sm90() {
#ifdef FLASHATTN_WITH_CUDA
  return sm90::compiled();
#else
  return false;
#endif
}

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
  m.def("fwd(Tensor q, Tensor k, Tensor v, float scale, bool is_causal, bool causal_bottom_right)"
        " -> (Tensor out, Tensor lse)");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, bool is_causal,"
        " bool causal_bottom_right, bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)");
}

TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("fwd", &flashattn::fwd_cpu);
  m.impl("bwd", &flashattn::bwd_cpu);
}

#ifdef FLASHATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", &flashattn::fwd_cuda);
  m.impl("bwd", &flashattn::bwd_cuda);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashattn kernels; the ops live in torch.ops.flashattn";
  m.def("compiled_with_cuda", &flashattn::compiled_with_cuda, "True when the CUDA kernels were built");
  m.def("compiled_with_sm90", &flashattn::compiled_with_sm90,
        "True when the Hopper (sm_90a) forward kernels were built");
}
