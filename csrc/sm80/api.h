// Entry points of the sm80 (mma.sync) kernel path. Host-callable, free of torch headers.
#pragma once

#include <cuda_runtime.h>

#include "params.h"

namespace flashattn {
namespace sm80 {

// The tile width (a head dim with a compiled kernel) that serves `head_dim`; 0 when none does.
int padded_head_dim(int head_dim);

// Forward: writes params.out and params.lse; returns the launch status. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Backward: writes dq, dk, dv. params.dq_accum must be zeroed with dq_accum_dim = padded_head_dim;
// params.delta is scratch. Requires seqlen_q, seqlen_k, batch, heads >= 1.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace sm80
}  // namespace flashattn
