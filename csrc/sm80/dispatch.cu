// Picks the compiled kernel for (element type, padded head dim).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm80/api.h"
#include "sm80/head_dims.h"
#include "sm80/kernel_configs.h"
#include "sm80/launch.h"

namespace flashattn {
namespace sm80 {

int padded_head_dim(int head_dim) {
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

TileShape fwd_tile_shape(int head_dim) {
  const int padded = padded_head_dim(head_dim);
#define FLASHATTN_TILE(D) \
  if (padded == D) return {DefaultFwdConfig<D>::type::kBlockM, DefaultFwdConfig<D>::type::kBlockN};
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_TILE)
#undef FLASHATTN_TILE
  return {0, 0};
}

int fwd_smem_bytes(int head_dim, bool masked) {
  const int padded = padded_head_dim(head_dim);
#define FLASHATTN_SMEM(D)                                 \
  if (padded == D) {                                      \
    using Cfg = DefaultFwdConfig<D>::type;                \
    return Cfg::kSmemBytes + (masked ? Cfg::kKeepBitsBytes : 0); \
  }
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_SMEM)
#undef FLASHATTN_SMEM
  return 0;
}

int bwd_smem_bytes(int head_dim) {
  const int padded = padded_head_dim(head_dim);
#define FLASHATTN_SMEM(D) \
  if (padded == D) return DefaultBwdConfig<D>::type::kSmemBytes;
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_SMEM)
#undef FLASHATTN_SMEM
  return 0;
}

TileShape bwd_tile_shape(int head_dim) {
  const int padded = padded_head_dim(head_dim);
#define FLASHATTN_TILE(D) \
  if (padded == D) return {DefaultBwdConfig<D>::type::kBlockM, DefaultBwdConfig<D>::type::kBlockN};
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_TILE)
#undef FLASHATTN_TILE
  return {0, 0};
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  const int padded = padded_head_dim(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  const bool masked = p.mask.kind != MaskKind::kNone || p.dropout.enabled;  // the variant with both
#define FLASHATTN_LAUNCH(D)                                                                                  \
  if (padded == D) {                                                                                         \
    if (masked) return bf16 ? launch_fwd_masked<__nv_bfloat16, D>(p, stream) : launch_fwd_masked<__half, D>(p, stream); \
    return bf16 ? launch_fwd<__nv_bfloat16, D>(p, stream) : launch_fwd<__half, D>(p, stream);               \
  }
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  const int padded = padded_head_dim(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  const bool masked = p.mask.kind != MaskKind::kNone || p.dropout.enabled;  // the variant with both
#define FLASHATTN_LAUNCH(D)                                                                                  \
  if (padded == D) {                                                                                         \
    if (masked) return bf16 ? launch_bwd_masked<__nv_bfloat16, D>(p, stream) : launch_bwd_masked<__half, D>(p, stream); \
    return bf16 ? launch_bwd<__nv_bfloat16, D>(p, stream) : launch_bwd<__half, D>(p, stream);               \
  }
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

}  // namespace sm80
}  // namespace flashattn
