// Declarations of the per-(element type, head dim) sm90 launchers; each is instantiated in its own
// file under csrc/instantiations/ so the build parallelizes.
#pragma once

#include <cuda_runtime.h>

#include "params.h"
#include "sm90/fwd_plan.h"

namespace flashattn {
namespace sm90 {

// A forward launch without a mask or dropout, as planned: every row, or (FwdRows::kKeyEnds) each row
// over its first params.key_end keys (rows with -1 are left alone).
// kAlibi (every forward launcher): the kernels' form with ALiBi's term, for the calls with
// shape.alibi_slopes and only those (another call is cudaErrorInvalidValue).
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream);

// The forward with params.mask and params.dropout applied (with params.key_end: only the rows in
// params.masked_rows).
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd_masked(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream);

template <typename T, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream);

// The backward with params.mask applied (and its gradient written to params.dmask when set).
template <typename T, int kHeadDim>
cudaError_t launch_bwd_masked(const BwdParams& p, cudaStream_t stream);

// A variable-length batch (params.varlen, no mask or dropout): the forward on `grid` persistent CTAs,
// the backward (its schedule lists built on the stream into params.varlen's buffers).
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd_varlen(const FwdParams& p, int grid, cudaStream_t stream);
template <typename T, int kHeadDim>
cudaError_t launch_bwd_varlen(const BwdParams& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashattn
