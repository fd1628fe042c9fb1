// The variable-length ops (varlen_ops.cpp): their argument checks and their registration per device.
#pragma once

#include <torch/library.h>

#include <optional>

#include "torch/checks.h"

namespace flashattn {

struct VarlenShape {
  CheckedShape packed;  // q, k, v as [1, total, H, D]: seqlen_q / seqlen_k are total_q / total_k
  int64_t batch;        // sequences
};

// Checks q (total_q, Hq, D), k and v (total_k, Hk, D) as check_qkv does, and the offsets: int32,
// contiguous, on q's device, cu_seqlens_q / cu_seqlens_k of batch + 1 entries, seqused_q / seqused_k of
// batch. Their values are not read here (on CUDA that would be a host synchronisation).
VarlenShape check_varlen_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                              const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k);

// Checks the backward's extra inputs: dout and out like q, lse (Hq, total_q).
void check_varlen_bwd_inputs(const char* op, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                             const at::Tensor& lse, const VarlenShape& shape);

void register_varlen_cpu(torch::Library& m);
#ifdef FLASHATTN_WITH_CUDA
void register_varlen_cuda(torch::Library& m);
#endif

}  // namespace flashattn
