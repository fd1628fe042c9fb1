// flashattn_stable.dropout_keep_mask: the dropout keep-mask of common/dropout.h as a bool tensor
// [batch, heads, seqlen_q, seqlen_k], written against torch's stable ABI only (torch/csrc/stable and the
// C shims), so that one build of this library loads under every torch from its target version on
// (docs/stable-abi.md: the first op moved, beside the pybind11 module `_C`, which still serves the rest).
// The same function as flashattn.dropout_keep_mask (the tests compare the two).
#include <cstdint>
#include <string>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "stable/keep_mask.h"

#ifdef FLASHATTN_WITH_CUDA
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#endif

namespace flashattn {
namespace stable_ops {
namespace {

using torch::stable::Tensor;

constexpr const char* kOp = "flashattn_stable.dropout_keep_mask";

void check_args(const Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k,
                double dropout_p) {
  STD_TORCH_CHECK(batch >= 0 && heads >= 0 && seqlen_q >= 0 && seqlen_k >= 0, kOp,
                  ": batch, heads, seqlen_q and seqlen_k must be >= 0, got [", batch, ", ", heads, ", ", seqlen_q,
                  ", ", seqlen_k, "]");
  // The kernels index queries and keys with 32-bit integers.
  STD_TORCH_CHECK(seqlen_q < (int64_t{1} << 31) && seqlen_k < (int64_t{1} << 31), kOp,
                  ": seqlen_q and seqlen_k must be below 2^31, got ", seqlen_q, " and ", seqlen_k);
  STD_TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, kOp, ": dropout_p must be in [0, 1), got ", dropout_p);
  STD_TORCH_CHECK(rng_state.scalar_type() == torch::headeronly::ScalarType::Long && rng_state.dim() == 1 &&
                      rng_state.size(0) == 2 && rng_state.is_contiguous(),
                  kOp, ": rng_state must be a contiguous [2] int64 tensor (seed, offset)");
}

Tensor empty_keep(const Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k) {
  const int64_t sizes[] = {batch, heads, seqlen_q, seqlen_k};
  return torch::stable::empty({sizes, 4}, torch::headeronly::ScalarType::Bool, std::nullopt, rng_state.device());
}

Tensor keep_mask_cpu(Tensor rng_state, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k,
                     double dropout_p) {
  check_args(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
  Tensor keep = empty_keep(rng_state, batch, heads, seqlen_q, seqlen_k);
  const int64_t* state = rng_state.const_data_ptr<int64_t>();
  write_keep_mask_cpu(static_cast<uint64_t>(state[0]), static_cast<uint64_t>(state[1]), dropout_p, batch * heads,
                      seqlen_q, seqlen_k, keep.mutable_data_ptr<bool>());
  return keep;
}

#ifdef FLASHATTN_WITH_CUDA
Tensor keep_mask_cuda(Tensor rng_state, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k,
                      double dropout_p) {
  check_args(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
  const torch::stable::accelerator::DeviceGuard guard(rng_state.get_device_index());
  Tensor keep = empty_keep(rng_state, batch, heads, seqlen_q, seqlen_k);
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(rng_state.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  kOp, ": could not get the current CUDA stream");
  const std::string error = launch_keep_mask_cuda(rng_state.const_data_ptr<int64_t>(), dropout_p, batch * heads,
                                                  seqlen_q, seqlen_k, keep.mutable_data_ptr<bool>(), stream);
  STD_TORCH_CHECK(error.empty(), kOp, ": ", error);
  return keep;
}
#endif

}  // namespace
}  // namespace stable_ops
}  // namespace flashattn

STABLE_TORCH_LIBRARY(flashattn_stable, m) {
  m.def("dropout_keep_mask(Tensor rng_state, int batch, int heads, int seqlen_q, int seqlen_k, float dropout_p) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(flashattn_stable, CPU, m) {
  m.impl("dropout_keep_mask", TORCH_BOX(&flashattn::stable_ops::keep_mask_cpu));
}

#ifdef FLASHATTN_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(flashattn_stable, CUDA, m) {
  m.impl("dropout_keep_mask", TORCH_BOX(&flashattn::stable_ops::keep_mask_cuda));
}
#endif
