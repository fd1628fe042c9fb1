// The decode op (decode_ops.cpp): its CUDA registration, and whether a GPU serves a head dim on it.
#pragma once

#include <torch/library.h>

#include <cstdint>

namespace flashattn {

// Whether the decode op runs head_dim (bfloat16 or float16) on CUDA device device_index; false in a
// build without the CUDA kernels.
bool decode_supported(int64_t head_dim, bool bf16, int64_t device_index);

#ifdef FLASHATTN_WITH_CUDA
void register_decode_cuda(torch::Library& m);
#endif

}  // namespace flashattn
