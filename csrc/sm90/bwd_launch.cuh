// The sm90 backward launchers declared in sm90/launch.h: the tile configuration of each width.
#pragma once

#include "sm90/bwd_kernel.cuh"
#include "sm90/bwd_wide_kernel.cuh"

namespace flashattn {
namespace sm90 {

// Width 128 and below: the narrow kernel (at width 64 unmasked, in the plan's steps of 64 or 128
// queries); above: the wide one.
template <typename T, int kHeadDim, bool kMasked>
cudaError_t launch_bwd_at_width(const BwdParams& p, cudaStream_t stream) {
  if constexpr (kHeadDim > 128) {
    return launch_bwd_wide<T, BwdWideConfig<kHeadDim>, kMasked>(p, stream);
  } else if constexpr (kHeadDim == 64 && !kMasked) {
    if (p.sm90_block_m == 128) return launch_bwd_with_config<T, BwdConfig<kHeadDim, 128>, false>(p, stream);
    return launch_bwd_with_config<T, BwdConfig<kHeadDim>, false>(p, stream);
  } else {
    return launch_bwd_with_config<T, BwdConfig<kHeadDim>, kMasked>(p, stream);
  }
}

// The variable-length backward (p.varlen), in the kernel and steps the batched unmasked backward takes
// at the width.
template <typename T, int kHeadDim>
cudaError_t launch_bwd_varlen(const BwdParams& p, cudaStream_t stream) {
  if constexpr (kHeadDim > 128) {
    return launch_bwd_wide_varlen<T, BwdWideConfig<kHeadDim>>(p, stream);
  } else {
    if constexpr (kHeadDim == 64) {
      if (p.sm90_block_m == 128) return launch_bwd_varlen_with_config<T, BwdConfig<kHeadDim, 128>>(p, stream);
    }
    return launch_bwd_varlen_with_config<T, BwdConfig<kHeadDim>>(p, stream);
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  return launch_bwd_at_width<T, kHeadDim, false>(p, stream);
}

template <typename T, int kHeadDim>
cudaError_t launch_bwd_masked(const BwdParams& p, cudaStream_t stream) {
  return launch_bwd_at_width<T, kHeadDim, true>(p, stream);
}

}  // namespace sm90
}  // namespace flashattn
