// Picks the compiled sm90 kernel for (element type, tile width).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "sm90/api.h"
#include "sm90/fwd_tiles.h"
#include "sm90/head_dims.h"
#include "sm90/launch.h"

namespace flashattn {
namespace sm90 {
namespace {

bool tma_compatible(const void* ptr, const TensorStrides& st) {
  auto ok = [](int64_t stride) { return stride > 0 && stride % 8 == 0; };  // elements of 2 bytes
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ok(st.batch) && ok(st.row) && ok(st.head);
}

int tile_width(int head_dim) {
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM90_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

int bwd_tile_width(int head_dim) {
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM90_BWD_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

}  // namespace

bool compiled() {
#if defined(FLASHATTN_SM90)
  return true;
#else
  return false;
#endif
}

bool fwd_supported(const FwdParams& p) {
  const AttentionShape& s = p.shape;
  return compiled() && s.head_dim > 32 && tile_width(s.head_dim) > 0 && s.scale > 0.f && std::isfinite(s.scale) &&
         tma_compatible(p.q, p.q_strides) && tma_compatible(p.k, p.k_strides) && tma_compatible(p.v, p.v_strides);
}

TileShape fwd_tile_shape(int head_dim) {
  const int width = tile_width(head_dim);
  return width == 0 ? TileShape{0, 0} : TileShape{kFwdQueriesPerTile, masked_fwd_keys_per_step(width)};
}

TileShape bwd_tile_shape() { return TileShape{kBwdQueriesPerStep, kBwdKeysPerCta}; }

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  const int width = tile_width(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  const bool masked = p.mask.kind != MaskKind::kNone || p.dropout.enabled;  // the variant with both
  // The key-length form of a padding or causal mask: the masked variant runs the listed rows, then the
  // unmasked one the others (disjoint rows of out and lse), causal in the causal form.
  FwdParams key_rows = p;
  key_rows.mask = MaskParams{};
  key_rows.shape = key_end_shape(p.shape, p.key_end_causal);
#define FLASHATTN_LAUNCH(D)                                                                                  \
  if (width == D) {                                                                                          \
    if (masked) {                                                                                            \
      const cudaError_t err =                                                                                \
          bf16 ? launch_fwd_masked<__nv_bfloat16, D>(p, stream) : launch_fwd_masked<__half, D>(p, stream);   \
      if (err != cudaSuccess || p.key_end == nullptr) return err;                                            \
      return bf16 ? launch_fwd<__nv_bfloat16, D>(key_rows, stream) : launch_fwd<__half, D>(key_rows, stream); \
    }                                                                                                        \
    return bf16 ? launch_fwd<__nv_bfloat16, D>(p, stream) : launch_fwd<__half, D>(p, stream);               \
  }
  FLASHATTN_SM90_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorNotSupported;
}

bool bwd_supported(const BwdParams& p) {
  const AttentionShape& s = p.shape;
  return compiled() && s.head_dim > 32 && bwd_tile_width(s.head_dim) == p.dq_accum_dim && s.scale > 0.f &&
         std::isfinite(s.scale) && tma_compatible(p.q, p.q_strides) && tma_compatible(p.k, p.k_strides) &&
         tma_compatible(p.v, p.v_strides) && tma_compatible(p.dout, p.dout_strides);
}

bool bwd_masked_supported(int head_dim) {
  const int width = bwd_tile_width(head_dim);
#define FLASHATTN_MATCH(D) \
  if (width == D) return true;
  FLASHATTN_SM90_BWD_MASKED_FOR_EACH_HEAD_DIM(FLASHATTN_MATCH)
#undef FLASHATTN_MATCH
  return false;
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  const int width = bwd_tile_width(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  if (p.mask.kind != MaskKind::kNone || p.dropout.enabled) {  // the variant with both
#define FLASHATTN_LAUNCH(D) \
  if (width == D) return bf16 ? launch_bwd_masked<__nv_bfloat16, D>(p, stream) : launch_bwd_masked<__half, D>(p, stream);
    FLASHATTN_SM90_BWD_MASKED_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
    return cudaErrorNotSupported;
  }
#define FLASHATTN_LAUNCH(D) \
  if (width == D) return bf16 ? launch_bwd<__nv_bfloat16, D>(p, stream) : launch_bwd<__half, D>(p, stream);
  FLASHATTN_SM90_BWD_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorNotSupported;
}

}  // namespace sm90
}  // namespace flashattn
