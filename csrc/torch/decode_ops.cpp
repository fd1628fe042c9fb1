// The decode op (schema in library.cpp): attention of a few queries per sequence over a key/value cache,
// contiguous or paged, on the split-KV kernel of csrc/decode. CUDA only: flash_attn_with_kvcache
// (flashattn/kvcache.py) takes the batched ops on other devices and for calls this op does not serve
// (decode_supported).
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "torch/alibi.h"
#include "torch/checks.h"
#include "torch/decode_ops.h"

#ifdef FLASHATTN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "decode/api.h"
#include "torch/cuda_ops.h"
#endif

namespace flashattn {

#ifdef FLASHATTN_WITH_CUDA
namespace {

constexpr const char* op = "flashattn.decode_fwd";

ElementType element_type_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
}

// The split count num_splits = 0 takes for a call of these sizes on the current device: its kv heads'
// query rows (group query heads times seqlen_q) in blocks of decode::rows_per_block(), max_keys keys.
int heuristic_splits(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t max_keys,
                     int64_t head_dim, ElementType type, int num_sms) {
  const int rows = static_cast<int>(heads_q / heads_kv * seqlen_q);
  const int row_groups = (rows + decode::rows_per_block() - 1) / decode::rows_per_block();
  return decode::choose_splits(static_cast<int>(batch), static_cast<int>(heads_kv), row_groups,
                               static_cast<int>(max_keys), static_cast<int>(head_dim), type, num_sms);
}

std::tuple<at::Tensor, at::Tensor> decode_fwd_cuda(const at::Tensor& q_arg, const at::Tensor& k_cache,
                                                   const at::Tensor& v_cache, const at::Tensor& seqlens_k,
                                                   const std::optional<at::Tensor>& block_table,
                                                   const std::optional<at::Tensor>& cache_batch_idx,
                                                   const std::optional<at::Tensor>& leftpad, double scale,
                                                   bool is_causal, int64_t window_left, int64_t window_right,
                                                   double softcap, int64_t num_splits,
                                                   const std::optional<at::Tensor>& cu_seqlens_q_arg,
                                                   int64_t max_seqlen_q, const std::optional<at::Tensor>& sink,
                                                   const std::optional<at::Tensor>& alibi_slopes) {
  // Packed queries are run as a [1, total_q, H, D] view whose sequences the kernel finds in cu_seqlens_q.
  const bool packed = cu_seqlens_q_arg.has_value();
  if (packed) {
    TORCH_CHECK(q_arg.dim() == 3, op, ": with cu_seqlens_q, q must be (total_q, heads_q, head_dim), got shape ",
                to_text(q_arg.sizes()));
    TORCH_CHECK(max_seqlen_q >= 1, op, ": with cu_seqlens_q, max_seqlen_q must be >= 1, got ", to_text(max_seqlen_q));
  }
  const at::Tensor q = packed ? q_arg.unsqueeze(0) : q_arg;
  TORCH_CHECK(q.dim() == 4, op, ": q must be (batch, seqlen_q, heads_q, head_dim), got shape ", to_text(q.sizes()));
  TORCH_CHECK(k_cache.dim() == 4, op, ": k_cache must be (pages or batch, page_size or seqlen_cache, heads_kv, ",
              "head_dim), got shape ", to_text(k_cache.sizes()));
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), op, ": v_cache must have k_cache's shape ",
              to_text(k_cache.sizes()), ", got ", to_text(v_cache.sizes()));
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, op,
              ": q must be float16 or bfloat16, got ", q.scalar_type());
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(), op,
              ": k_cache and v_cache must have q's dtype ", q.scalar_type(), ", got ", k_cache.scalar_type(), " and ",
              v_cache.scalar_type());
  TORCH_CHECK(q.is_cuda() && k_cache.device() == q.device() && v_cache.device() == q.device(), op,
              ": q, k_cache and v_cache must be on one CUDA device");
  const int64_t batch = packed ? cu_seqlens_q_arg->numel() - 1 : q.size(0);
  const int64_t seqlen_q = packed ? max_seqlen_q : q.size(1), heads_q = q.size(2), head_dim = q.size(3);
  if (packed) {
    const at::Tensor& cu = *cu_seqlens_q_arg;
    TORCH_CHECK(cu.dim() == 1 && cu.numel() >= 1, op, ": cu_seqlens_q must be a 1-dim tensor of batch + 1 offsets, ",
                "got shape ", to_text(cu.sizes()));
    check_int32_vector(op, "cu_seqlens_q", cu, batch + 1, q);
  }
  const int64_t heads_kv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim, op, ": k_cache's head dim ", to_text(k_cache.size(3)),
              " must equal q's ", to_text(head_dim));
  TORCH_CHECK(heads_kv >= 1 && heads_q % heads_kv == 0, op, ": q's heads (", to_text(heads_q),
              ") must be a multiple of k_cache's (", to_text(heads_kv), ")");
  cuda_ops::check_cuda_device(op, q);
  const DeviceInfo device = cuda_ops::device_info(q);
  TORCH_CHECK(decode::supported(static_cast<int>(head_dim), element_type_of(q), device.smem_per_block), op,
              ": head_dim ", to_text(head_dim), " is not served on this GPU (a multiple of 8 up to 256, and the ",
              "shared memory its width needs)");
  TORCH_CHECK(cuda_ops::rows_aligned_16(q) && cuda_ops::rows_aligned_16(k_cache) && cuda_ops::rows_aligned_16(v_cache),
              op, ": q, k_cache and v_cache need 16-byte aligned rows (strides multiples of 8 elements, a ",
              "contiguous last dim)");
  TORCH_CHECK(q.stride(3) == 1 && k_cache.stride(3) == 1 && v_cache.stride(3) == 1, op,
              ": q, k_cache and v_cache need a contiguous last dim");
  check_int32_vector(op, "seqlens_k", seqlens_k, batch, q);
  if (cache_batch_idx.has_value()) check_int32_vector(op, "cache_batch_idx", *cache_batch_idx, batch, q);
  if (leftpad.has_value()) check_int32_vector(op, "cache_leftpad", *leftpad, batch, q);
  if (block_table.has_value()) {
    const at::Tensor& bt = *block_table;
    TORCH_CHECK(!cache_batch_idx.has_value(), op, ": block_table and cache_batch_idx cannot be given together");
    TORCH_CHECK(bt.scalar_type() == at::kInt, op, ": block_table must be int32, got ", bt.scalar_type());
    TORCH_CHECK(bt.dim() == 2 && bt.size(0) == batch, op, ": block_table must be (batch=", to_text(batch),
                ", pages_per_sequence), got shape ", to_text(bt.sizes()));
    TORCH_CHECK(bt.device() == q.device(), op, ": block_table must be on q's device ", q.device().str(), ", got ",
                bt.device().str());
    TORCH_CHECK(bt.stride(1) == 1, op, ": block_table needs a contiguous last dim");
  } else {
    TORCH_CHECK(cache_batch_idx.has_value() || k_cache.size(0) == batch, op, ": k_cache's batch ",
                to_text(k_cache.size(0)), " must equal q's ", to_text(batch), " (or pass cache_batch_idx)");
  }
  TORCH_CHECK(num_splits >= 0, op, ": num_splits must be >= 0 (0: chosen from the shapes), got ",
              to_text(num_splits));
  TORCH_CHECK(window_left >= -1 && window_right >= -1, op, ": window_size entries must be >= -1, got (",
              to_text(window_left), ", ", to_text(window_right), ")");
  TORCH_CHECK(softcap >= 0.0 && std::isfinite(softcap), op, ": softcap must be finite and >= 0, got ",
              std::to_string(softcap));
  TORCH_CHECK(k_cache.size(1) >= 1 && k_cache.size(0) >= 1, op, ": k_cache must hold at least one row");
  if (sink.has_value()) {
    TORCH_CHECK(sink->scalar_type() == at::kFloat && sink->dim() == 1 && sink->size(0) == heads_q &&
                    sink->is_contiguous(),
                op, ": sink must be a contiguous float32 (heads_q=", to_text(heads_q), ",) tensor, got ",
                sink->scalar_type(), " of shape ", to_text(sink->sizes()));
    TORCH_CHECK(sink->device() == q.device(), op, ": sink must be on q's device ", q.device().str(), ", got ",
                sink->device().str());
  }
  // The batch ops' checks (alibi.h); the cache's keys stand in for seqlen_k, which they do not read.
  check_alibi(op, alibi_slopes, q, CheckedShape{batch, seqlen_q, k_cache.size(1), heads_q, heads_kv, head_dim, 0},
              softcap, std::nullopt);
  const int64_t pages_per_seq = block_table.has_value() ? block_table->size(1) : 1;
  const int64_t capacity = pages_per_seq * k_cache.size(1);
  TORCH_CHECK(capacity < (int64_t{1} << 31) && k_cache.size(0) < (int64_t{1} << 31) && batch < (int64_t{1} << 24) &&
                  q.size(1) < (int64_t{1} << 31),
              op, ": the cache must hold fewer than 2^31 rows per sequence and pages");

  const at::cuda::CUDAGuard guard(q.device());
  const int64_t total_q = q.size(1);
  at::Tensor out = packed ? at::empty({1, total_q, heads_q, head_dim}, q.options())
                          : at::empty({batch, seqlen_q, heads_q, head_dim}, q.options());
  at::Tensor lse = packed ? at::empty({heads_q, total_q}, q.options().dtype(at::kFloat))
                          : at::empty({batch, heads_q, seqlen_q}, q.options().dtype(at::kFloat));
  auto result = [&]() -> std::tuple<at::Tensor, at::Tensor> { return {packed ? out.squeeze(0) : out, lse}; };
  if (out.numel() == 0 || batch == 0) return result();

  const int64_t rows = heads_q / heads_kv * seqlen_q;  // query rows of one kv head
  int splits = static_cast<int>(std::min<int64_t>(num_splits, 1024));
  if (splits == 0) {
    splits = heuristic_splits(batch, heads_q, heads_kv, seqlen_q, capacity, head_dim, element_type_of(q),
                              device.num_sms);
  }

  DecodeParams p{};
  p.q = q.data_ptr();
  p.k = k_cache.data_ptr();
  p.v = v_cache.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_strides = cuda_ops::strides_of(q);
  p.k_strides = cuda_ops::strides_of(k_cache);
  p.v_strides = cuda_ops::strides_of(v_cache);
  p.out_strides = cuda_ops::strides_of(out);
  p.seqlens_k = seqlens_k.data_ptr<int>();
  p.leftpad = leftpad.has_value() ? leftpad->data_ptr<int>() : nullptr;
  p.block_table = block_table.has_value() ? block_table->data_ptr<int>() : nullptr;
  p.cache_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
  p.block_table_stride = block_table.has_value() ? block_table->stride(0) : 0;
  p.pages_per_seq = static_cast<int>(pages_per_seq);
  p.num_pages = static_cast<int>(k_cache.size(0));
  p.page_size = static_cast<int>(k_cache.size(1));
  p.batch = static_cast<int>(batch);
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_kv);
  p.head_dim = static_cast<int>(head_dim);
  p.element_type = element_type_of(q);
  constexpr double kLog2e = 1.4426950408889634;
  p.scale_log2 = static_cast<float>(softcap > 0.0 ? softcap * kLog2e : scale * kLog2e);
  p.softcap_inner = static_cast<float>(softcap > 0.0 ? scale / softcap : 0.0);
  p.is_causal = is_causal;
  p.window_left = static_cast<int>(std::min<int64_t>(window_left, capacity));
  p.window_right = is_causal ? -1 : static_cast<int>(std::min<int64_t>(window_right, capacity));
  p.num_splits = splits;
  p.sink = sink.has_value() ? sink->data_ptr<float>() : nullptr;
  if (alibi_slopes.has_value()) {
    p.alibi_slopes = alibi_slopes->data_ptr<float>();
    p.alibi_batch_stride = alibi_slopes->dim() == 2 ? static_cast<int>(heads_q) : 0;
  }
  if (packed) {
    p.cu_seqlens_q = cu_seqlens_q_arg->data_ptr<int>();
    p.total_q = static_cast<int>(total_q);
    p.q_strides.batch = 0;
    p.out_strides.batch = 0;
  }
  at::Tensor partial_out, partial_lse;
  if (splits > 1) {
    const int64_t partial_rows = int64_t{splits} * batch * heads_kv * rows;
    partial_out = at::empty({partial_rows * head_dim}, q.options().dtype(at::kFloat));
    partial_lse = at::empty({partial_rows}, q.options().dtype(at::kFloat));
    p.partial_out = partial_out.data_ptr<float>();
    p.partial_lse = partial_lse.data_ptr<float>();
  }
  C10_CUDA_CHECK(decode::launch(p, at::cuda::getCurrentCUDAStream()));
  return result();
}

}  // namespace

void register_decode_cuda(torch::Library& m) { m.impl("decode_fwd", &decode_fwd_cuda); }

bool decode_supported(int64_t head_dim, bool bf16, int64_t device_index) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device_index));
  return prop->major >= 8 && decode::supported(static_cast<int>(head_dim),
                                               bf16 ? ElementType::kBFloat16 : ElementType::kFloat16,
                                               static_cast<int>(prop->sharedMemPerBlockOptin));
}
int64_t decode_num_splits(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t max_keys,
                          int64_t head_dim, bool bf16, int64_t device_index, int64_t sm_margin) {
  TORCH_CHECK(batch >= 1 && heads_kv >= 1 && heads_q % heads_kv == 0 && seqlen_q >= 1 && max_keys >= 0 &&
                  head_dim >= 1,
              "flashattn.decode_num_splits: sizes must be positive with heads_q a multiple of heads_kv, got batch ",
              to_text(batch), ", heads_q ", to_text(heads_q), ", heads_kv ", to_text(heads_kv), ", seqlen_q ",
              to_text(seqlen_q), ", max_keys ", to_text(max_keys), ", head_dim ", to_text(head_dim));
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device_index));
  const int num_sms = std::max(1, prop->multiProcessorCount - static_cast<int>(std::clamp<int64_t>(sm_margin, 0, 1 << 20)));
  return heuristic_splits(batch, heads_q, heads_kv, seqlen_q, std::min<int64_t>(max_keys, (int64_t{1} << 31) - 1),
                          head_dim, bf16 ? ElementType::kBFloat16 : ElementType::kFloat16, num_sms);
}
#else
bool decode_supported(int64_t, bool, int64_t) { return false; }
int64_t decode_num_splits(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t) { return 1; }
#endif

}  // namespace flashattn
