// See mask_plan.h.
#ifdef FLASHATTN_WITH_CUDA

#include "torch/mask_plan.h"

#include <c10/cuda/CUDAException.h>

#include "cuda/api.h"

namespace flashattn {
namespace {

// The mask's strides, element kind and data; broadcast dims (stride 0, or size 1) get stride 0.
MaskParams mask_strides(const at::Tensor& mask, const CheckedShape& s) {
  // CUDA inputs are 16-bit, so a float32 mask is never of q's own type.
  MaskParams m;
  m.kind = mask.scalar_type() == at::kBool    ? MaskKind::kBool
           : mask.scalar_type() == at::kFloat ? MaskKind::kAdditiveFloat32
                                              : MaskKind::kAdditive;
  m.data = mask.data_ptr();
  m.batch_stride = mask.stride(0);
  m.head_stride = mask.stride(1);
  m.row_stride = mask.stride(2);
  m.col_stride = mask.stride(3);
  if (distinct_batches(mask, s) == 1) m.batch_stride = 0;
  if (distinct_heads(mask, s) == 1) m.head_stride = 0;
  return m;
}

}  // namespace

int64_t distinct_batches(const at::Tensor& mask, const CheckedShape& s) {
  return (mask.size(0) > 1 && mask.stride(0) != 0) ? s.batch : 1;
}

int64_t distinct_heads(const at::Tensor& mask, const CheckedShape& s) {
  return (mask.size(1) > 1 && mask.stride(1) != 0) ? s.heads_q : 1;
}

MaskLayout mask_layout(const std::optional<at::Tensor>& mask) {
  MaskLayout layout;
  if (!mask.has_value()) return layout;
  layout.present = true;
  layout.is_bool = mask->scalar_type() == at::kBool;
  layout.batch_stride_zero = mask->stride(0) == 0;
  layout.head_stride_zero = mask->stride(1) == 0;
  layout.row_stride_zero = mask->stride(2) == 0;
  return layout;
}

MaskPlan build_mask_plan(const at::Tensor& mask, const CheckedShape& s, ElementType element_type,
                         const MaskPolicy& policy, cudaStream_t stream) {
  MaskPlan plan;
  plan.params = mask_strides(mask, s);
  const int batch = static_cast<int>(s.batch), heads = static_cast<int>(s.heads_q);
  const int seqlen_q = static_cast<int>(s.seqlen_q), seqlen_k = static_cast<int>(s.seqlen_k);
  const int rows = batch * heads;
  const int* causal_stats = nullptr;
  if (policy.key_form == KeyLengthForm::kPadding) {
    // [key_end: B * Hq, masked_rows: B * Hq, masked_row_count: 1]
    plan.key_rows = at::empty({2 * static_cast<int64_t>(rows) + 1}, mask.options().dtype(at::kInt));
    int* key_end = plan.key_rows.data_ptr<int>();
    C10_CUDA_CHECK(find_key_prefix_rows(plan.params, element_type, batch, heads, seqlen_k, key_end, key_end + rows,
                                        key_end + 2 * rows, stream));
  } else if (policy.key_form == KeyLengthForm::kCausal) {
    // The same, then per-slice statistics (cuda/api.h, find_causal_prefix_rows).
    plan.key_rows = at::empty({causal_prefix_workspace_ints(batch, heads, plan.params)}, mask.options().dtype(at::kInt));
    C10_CUDA_CHECK(find_causal_prefix_rows(plan.params, element_type, batch, heads, seqlen_q, seqlen_k,
                                           causal_form_offset(seqlen_q, seqlen_k), plan.key_rows.data_ptr<int>(),
                                           stream));
    plan.key_end_causal = true;
    causal_stats = plan.key_rows.data_ptr<int>() + causal_prefix_stats_offset(batch, heads);
  }
  if (plan.key_rows.defined()) {
    plan.key_end = plan.key_rows.data_ptr<int>();
    plan.masked_rows = plan.key_end + rows;
    plan.masked_row_count = plan.key_end + 2 * rows;
  }
  if (!policy.classify || policy.tile.queries == 0) return plan;
  MaskParams& m = plan.params;
  const int64_t batches = distinct_batches(mask, s), class_heads = distinct_heads(mask, s);
  m.tile_q = policy.tile.queries;
  m.tile_k = policy.tile.keys;
  m.tiles_k = static_cast<int>((s.seqlen_k + m.tile_k - 1) / m.tile_k);
  const int64_t tiles_q = (s.seqlen_q + m.tile_q - 1) / m.tile_q;
  m.class_row_stride = (m.tiles_k + kClassWindow - 1) / kClassWindow * kClassWindow;
  // [0]: the classes, [1]: the key counts of key-prefix tiles.
  plan.classes = at::empty({2, batches, class_heads, tiles_q, m.class_row_stride}, mask.options().dtype(at::kByte));
  C10_CUDA_CHECK(classify_mask_tiles(m, element_type, static_cast<int>(batches), static_cast<int>(class_heads), seqlen_q,
                                     seqlen_k, causal_stats, plan.classes[0].data_ptr<unsigned char>(),
                                     plan.classes[1].data_ptr<unsigned char>(), stream));
  m.tile_class = plan.classes[0].data_ptr<unsigned char>();
  m.tile_key_count = plan.classes[1].data_ptr<unsigned char>();
  m.class_batch_stride = batches > 1 ? class_heads * tiles_q * m.class_row_stride : 0;
  m.class_head_stride = class_heads > 1 ? tiles_q * m.class_row_stride : 0;
  return plan;
}

}  // namespace flashattn

#endif  // FLASHATTN_WITH_CUDA
