// Python bindings for the tuning variants: contiguous bf16 [B, S, H, D] inputs, top-left causal only.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "variants.h"

namespace {

std::vector<FwdVariant>& fwd_variants() {
  static std::vector<FwdVariant> v = [] {
    std::vector<FwdVariant> out;
    add_fwd_variants_64(out);
    add_fwd_variants_128(out);
    add_fwd_variants_sm90_64(out);
    add_fwd_variants_sm90_128(out);
    add_fwd_variants_sm90_256(out);
    return out;
  }();
  return v;
}

std::vector<BwdVariant>& bwd_variants() {
  static std::vector<BwdVariant> v = [] {
    std::vector<BwdVariant> out;
    add_bwd_variants_64(out);
    add_bwd_variants_128(out);
    add_bwd_variants_256(out);
    add_bwd_variants_sm90(out);
    return out;
  }();
  return v;
}

flashattn::AttentionShape shape_of(const at::Tensor& q, const at::Tensor& k, double scale, bool causal) {
  flashattn::AttentionShape s;
  s.batch = q.size(0); s.seqlen_q = q.size(1); s.seqlen_k = k.size(1); s.heads_q = q.size(2);
  s.heads_kv = k.size(2); s.head_dim = q.size(3); s.scale = scale; s.scale_log2 = scale * 1.4426950408889634;
  s.is_causal = causal; s.causal_offset = 0; s.element_type = flashattn::ElementType::kBFloat16;
  s.rows_aligned_16 = true;
  return s;
}

flashattn::TensorStrides strides(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

std::vector<at::Tensor> fwd(int variant, at::Tensor q, at::Tensor k, at::Tensor v, double scale, bool causal) {
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && q.size(3) == fwd_variants()[variant].head_dim);
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  flashattn::FwdParams p;
  p.shape = shape_of(q, k, scale, causal);
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.out = out.data_ptr(); p.lse = lse.data_ptr<float>();
  p.q_strides = strides(q); p.k_strides = strides(k); p.v_strides = strides(v); p.out_strides = strides(out);
  C10_CUDA_CHECK(fwd_variants()[variant].launch(p, at::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

std::vector<at::Tensor> bwd(int variant, at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                            at::Tensor lse, double scale, bool causal) {
  const int d = bwd_variants()[variant].head_dim;
  TORCH_CHECK(q.size(3) == d);
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto dq_accum = at::zeros({q.size(0), q.size(2), q.size(1), d}, q.options().dtype(at::kFloat));
  const int64_t stats_stride = flashattn::bwd_stats_stride(q.size(1));
  auto delta = at::empty({q.size(0), q.size(2), stats_stride}, q.options().dtype(at::kFloat));
  auto lse_log2 = at::empty_like(delta);
  flashattn::BwdParams p;
  p.shape = shape_of(q, k, scale, causal);
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.out = out.data_ptr(); p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>(); p.dq = dq.data_ptr(); p.dk = dk.data_ptr(); p.dv = dv.data_ptr();
  p.dq_accum = dq_accum.data_ptr<float>(); p.delta = delta.data_ptr<float>(); p.lse_log2 = lse_log2.data_ptr<float>(); p.dq_accum_dim = d;
  p.stats_stride = stats_stride;
  p.q_strides = strides(q); p.k_strides = strides(k); p.v_strides = strides(v); p.out_strides = strides(out);
  p.dout_strides = strides(dout); p.dq_strides = strides(dq); p.dk_strides = strides(dk); p.dv_strides = strides(dv);
  C10_CUDA_CHECK(bwd_variants()[variant].launch(p, at::cuda::getCurrentCUDAStream()));
  return {dq, dk, dv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd_variants", [] {
    std::vector<std::pair<int, std::string>> r;
    for (auto& v : fwd_variants()) r.emplace_back(v.head_dim, v.name);
    return r;
  });
  m.def("bwd_variants", [] {
    std::vector<std::pair<int, std::string>> r;
    for (auto& v : bwd_variants()) r.emplace_back(v.head_dim, v.name);
    return r;
  });
  m.def("fwd", &fwd);
  m.def("bwd", &bwd);
}
