// Entry points of the sm90 (Hopper: TMA + wgmma) kernel path. Host-callable, free of torch headers.
// The path runs only on compute capability 9.0 and only in builds that include sm_90a
// (FLASHATTN_CUDA_ARCHS containing 90); the planner (csrc/plan.h) sends everything else to the sm80 path.
#pragma once

#include <cuda_runtime.h>

#include "cuda/api.h"  // TileShape
#include "params.h"
#include "sm90/fwd_plan.h"

namespace flashattn {
namespace sm90 {

// True when this build has the sm90 kernels.
bool compiled();

// Whether TMA can describe a [B, L, H, D] tensor of 2-byte elements at ptr with these element strides:
// a 16-byte aligned base and strides that are positive multiples of 16 bytes, below 2^40 bytes.
bool tma_describable(const void* ptr, const TensorStrides& strides);

// Whether the sm90 forward serves a shape: head dim 33..256 (smaller ones run faster on the sm80
// path's 32-wide tiles) and a positive, finite scale, with q, k and v TMA-describable (qkv_tma).
bool fwd_supported(const AttentionShape& shape, bool qkv_tma);

// How many clusters of two CTAs of the forward's multicast kernels can be resident at once on
// `device` (0: none, or the query failed), asked once per device.
int max_pair_clusters(int device);

// One forward launch as planned (plan.shape replaces p.shape; launches of unmasked rows read no mask).
// Returns cudaErrorInvalidValue, before launching anything, for a plan no compiled kernel matches, and
// cudaErrorNotSupported when a TMA descriptor cannot be built.
cudaError_t run_fwd(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream);

// The backward's tile width for a head dim (0: none serves it): the smallest compiled width at least
// the head dim (64, 128, 256 for head dims 33..256), which is also the width of the dq workspace the
// host allocates for it.
int bwd_tile_width(int head_dim);

// Whether the sm90 backward serves a shape: a compiled tile width, a positive, finite scale, and q, k,
// v and dout TMA-describable (tensors_tma).
bool bwd_supported(const AttentionShape& shape, bool tensors_tma);

// Whether the backward's masked variant (masks and dropout) serves this head dim (given bwd_supported):
// tile widths 64 and 128.
bool bwd_masked_supported(int head_dim);

// The query x key grid of the masked backward (both of its widths): a mask's tile classes for it.
TileShape bwd_tile_shape();

// Backward: writes dq, dk, dv (same workspace contract as sm80::run_bwd, sm80/api.h), with the masked
// variant when params.mask or params.dropout is set. Returns cudaErrorNotSupported, before launching
// anything, when a TMA descriptor cannot be built.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

// Variable-length batches in the kernels (params.h, VarlenParams; no mask, no dropout): whether the
// sm90 kernels serve the shape in both directions (head dims 33..256, a positive finite scale, the
// tensors TMA-describable), and the forward (on `grid` persistent CTAs, FwdParams::tile_counter set)
// and backward launches. The schedule lists are built on the stream into params.varlen's buffers, of
// varlen_list_capacity_bound items (cuda/varlen_schedule.h).
bool varlen_supported(const AttentionShape& shape, bool tensors_tma);
cudaError_t run_fwd_varlen(const FwdParams& params, int grid, cudaStream_t stream);
cudaError_t run_bwd_varlen(const BwdParams& params, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashattn
