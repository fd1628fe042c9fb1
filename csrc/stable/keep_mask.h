// The dropout keep-mask's writers for the stable-ABI library (keep_mask_op.cpp), free of torch headers.
#pragma once

#include <cstdint>
#include <string>

namespace flashattn {
namespace stable_ops {

// keep [batch_heads, seqlen_q, seqlen_k] (contiguous) of dropout with probability dropout_p and the
// given seed and offset (common/dropout.h's keep-mask).
void write_keep_mask_cpu(uint64_t seed, uint64_t offset, double dropout_p, int64_t batch_heads, int64_t seqlen_q,
                         int64_t seqlen_k, bool* keep);

// The same on the GPU, queued on `stream` (a cudaStream_t); rng_state: [2] int64 (seed, offset) on the
// device, read by the kernel. Returns the CUDA error's text, empty on success.
std::string launch_keep_mask_cuda(const int64_t* rng_state, double dropout_p, int64_t batch_heads, int64_t seqlen_q,
                                  int64_t seqlen_k, bool* keep, void* stream);

}  // namespace stable_ops
}  // namespace flashattn
