// Entry points of the sm80 (mma.sync) kernel path. Host-callable, free of torch headers.
#pragma once

#include <cuda_runtime.h>

#include "cuda/api.h"  // TileShape
#include "params.h"

namespace flashattn {
namespace sm80 {

// The tile width (a head dim with a compiled kernel) that serves `head_dim`; 0 when none does.
int padded_head_dim(int head_dim);

// Each head dim with a compiled kernel has one or more tile configurations ("tiles" 0, 1, ...;
// FwdConfigs and BwdConfigs in sm80/kernel_configs.h), fastest first, each needing less shared memory
// than the one before. fwd_tiles / bwd_tiles: the first whose dynamic shared memory per block fits
// smem_limit bytes (0: not known, the first), or the last when none fits. params.sm80_tiles names the
// one a launch runs.
int fwd_tiles(int head_dim, bool masked, int smem_limit);
int bwd_tiles(int head_dim, int smem_limit);

// The query x key tile one CTA step of a configuration covers: a mask's tile classes
// (classify_mask_tiles, cuda/api.h) are computed on this grid.
TileShape fwd_tile_shape(int head_dim, int tiles);
TileShape bwd_tile_shape(int head_dim, int tiles);

// The dynamic shared memory per block of a configuration's forward (masked: the variant with masks and
// dropout) and backward main kernel, in bytes.
int fwd_smem_bytes(int head_dim, bool masked, int tiles);
int bwd_smem_bytes(int head_dim, int tiles);

// Forward: writes params.out and params.lse; returns the launch status. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Backward: writes dq, dk, dv. params.dq_accum is a workspace with dq_accum_dim = padded_head_dim
// (a multiple of 4), zeroed by the backward itself; params.delta is scratch. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace sm80
}  // namespace flashattn
