// See cuda_ops.h: the pieces the CUDA forward (cuda_fwd.cpp) and backward (cuda_bwd.cpp) share, and the
// dropout keep-mask op.
#ifdef FLASHATTN_WITH_CUDA

#include "torch/cuda_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <mutex>

#include "cuda/api.h"
#include "sm90/api.h"

namespace flashattn {
namespace cuda_ops {

TensorStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

bool rows_aligned_16(const at::Tensor& t) {
  const int64_t elems_per_16b = 16 / t.element_size();
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  return addr % 16 == 0 && t.size(3) % elems_per_16b == 0 && t.stride(0) % elems_per_16b == 0 &&
         t.stride(1) % elems_per_16b == 0 && t.stride(2) % elems_per_16b == 0;
}

bool tma_describable(const at::Tensor& t) { return sm90::tma_describable(t.data_ptr(), strides_of(t)); }

void check_cuda_device(const char* op, const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(prop->major >= 8, op, ": flashattn's CUDA kernels need a GPU of compute capability 8.0 or newer, ",
              q.device().str(), " is ", to_text(prop->major), ".", to_text(prop->minor),
              " (flashattn.scaled_dot_product_attention falls back to torch there)");
}

DeviceInfo device_info(const at::Tensor& q) {
  constexpr int kCachedDevices = 64;
  static std::array<DeviceInfo, kCachedDevices> cache{};
  static std::array<std::once_flag, kCachedDevices> asked;
  const int device = q.get_device();
  auto ask = [device]() {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
    DeviceInfo info;
    info.major = prop->major;
    info.minor = prop->minor;
    info.num_sms = prop->multiProcessorCount;
    info.smem_per_block = static_cast<int>(prop->sharedMemPerBlockOptin);
    if (info.major == 9 && info.minor == 0) info.pair_clusters = sm90::max_pair_clusters(device);
    return info;
  };
  if (device < 0 || device >= kCachedDevices) return ask();
  std::call_once(asked[device], [&]() { cache[device] = ask(); });
  return cache[device];
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
  shape.window_span = static_cast<int>(s.window_span);
  shape.element_type = q.scalar_type() == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
  shape.rows_aligned_16 = true;
  return shape;
}

AttentionShape with_softcap(AttentionShape shape, double softcap) {
  if (softcap == 0.0) return shape;
  shape.softcap_inner = static_cast<float>(shape.scale / softcap);
  shape.scale_log2 = static_cast<float>(softcap * 1.4426950408889634);
  return shape;
}

bool has_work(const CheckedShape& s) { return s.batch > 0 && s.heads_q > 0 && s.seqlen_q > 0 && s.seqlen_k > 0; }

void check_smem_fit(const SmemFit& fit, const char* op, int head_dim) {
  TORCH_CHECK(fit.fits(), op, ": the sm80 kernel for head dim ", to_text(head_dim), " needs ", to_text(fit.bytes),
              " bytes of shared memory per block (its smallest tiles) and this GPU offers ", to_text(fit.limit),
              " (README, Limits)");
}

void check_sm90_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err != cudaErrorNotSupported, op,
              ": the sm90 kernels could not describe the inputs for TMA (cuTensorMapEncodeTiled failed); "
              "FLASHATTN_FORCE_SM80=1 runs the sm80 kernels instead");
  C10_CUDA_CHECK(err);
}

DropoutParams make_dropout(double dropout_p, const std::optional<at::Tensor>& rng_state) {
  DropoutParams d;
  if (dropout_p == 0.0) return d;
  d.enabled = true;
  d.threshold = dropout_threshold(dropout_p);
  d.keep_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
  d.rng_state = rng_state->data_ptr<int64_t>();
  return d;
}

at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p) {
  check_keep_mask_args(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
  const c10::cuda::CUDAGuard device_guard(rng_state.device());
  at::Tensor keep = at::empty({batch, heads, seqlen_q, seqlen_k}, rng_state.options().dtype(at::kBool));
  if (keep.numel() == 0) return keep;
  DropoutParams d = make_dropout(dropout_p, rng_state);
  if (!d.enabled) return keep.fill_(true);
  C10_CUDA_CHECK(write_dropout_keep_mask(d, batch * heads, static_cast<int>(seqlen_q), static_cast<int>(seqlen_k),
                                         keep.data_ptr<bool>(), at::cuda::getCurrentCUDAStream()));
  return keep;
}

}  // namespace cuda_ops
}  // namespace flashattn

#endif  // FLASHATTN_WITH_CUDA
