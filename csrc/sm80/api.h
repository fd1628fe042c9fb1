// Entry points of the sm80 (mma.sync) kernel path. Host-callable, free of torch headers.
#pragma once

#include <cuda_runtime.h>

#include "cuda/api.h"  // TileShape
#include "params.h"

namespace flashattn {
namespace sm80 {

// The tile width (a head dim with a compiled kernel) that serves `head_dim`; 0 when none does.
int padded_head_dim(int head_dim);

// The query x key tile one CTA step of a kernel covers, for a head dim with a compiled kernel: a mask's
// tile classes (classify_mask_tiles, cuda/api.h) are computed on this grid.
TileShape fwd_tile_shape(int head_dim);
TileShape bwd_tile_shape(int head_dim);

// The dynamic shared memory per block of the forward (masked: the variant with masks and dropout)
// and of the backward main kernel at a head dim with a compiled kernel, in bytes.
int fwd_smem_bytes(int head_dim, bool masked);
int bwd_smem_bytes(int head_dim);

// Forward: writes params.out and params.lse; returns the launch status. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Backward: writes dq, dk, dv. params.dq_accum is a workspace with dq_accum_dim = padded_head_dim
// (a multiple of 4), zeroed by the backward itself; params.delta is scratch. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace sm80
}  // namespace flashattn
