// Entry points of the sm90 (Hopper: TMA + wgmma) kernel path. Host-callable, free of torch headers.
// The path runs only on compute capability 9.0 and only in builds that include sm_90a
// (FLASHATTN_CUDA_ARCHS containing 90); everything it does not cover goes to the sm80 path.
#pragma once

#include <cuda_runtime.h>

#include "cuda/api.h"  // TileShape
#include "params.h"

namespace flashattn {
namespace sm90 {

// True when this build has the sm90 kernels.
bool compiled();

// Whether the sm90 forward covers these inputs: head dim 33..256 (smaller ones run faster on the
// sm80 path's 32-wide tiles), a positive scale, and tensors TMA can describe (16-byte aligned base,
// strides that are positive multiples of 16 bytes).
bool fwd_supported(const FwdParams& params);

// The query x key tile of the forward's masked variant (the one that reads masks) for this head dim
// (fwd_supported): an attention mask's tile classes must be computed on it ({0, 0} when no sm90
// forward serves the head dim).
TileShape fwd_tile_shape(int head_dim);

// Whether the backward's masked variant serves this head dim (given bwd_supported).
bool bwd_masked_supported(int head_dim);

// The query x key grid of the backward (every head dim it serves): a mask's tile classes for it.
TileShape bwd_tile_shape();

// Forward: writes params.out and params.lse (applying params.mask when it has one). Returns cudaErrorNotSupported, before launching
// anything, when a TMA descriptor cannot be built; the caller then falls back to the sm80 path.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Whether the sm90 backward covers these inputs: head dims 33..64 and 97..128 (tiles 64 and 128, the
// widths of the dq workspace the host allocates for them), a positive scale, q, k, v and dout that TMA
// can describe. Deterministic mode is the sm80 path's.
bool bwd_supported(const BwdParams& params);

// Backward: writes dq, dk, dv (same workspace contract as sm80::run_bwd, sm80/api.h). Returns
// cudaErrorNotSupported, before launching anything, when a TMA descriptor cannot be built.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashattn
