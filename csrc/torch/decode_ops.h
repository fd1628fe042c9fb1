// The decode op (decode_ops.cpp): its CUDA registration, and whether a GPU serves a head dim on it.
#pragma once

#include <torch/library.h>

#include <cstdint>

namespace flashattn {

// Whether the decode op runs head_dim (bfloat16 or float16) on CUDA device device_index; false in a
// build without the CUDA kernels.
bool decode_supported(int64_t head_dim, bool bf16, int64_t device_index);

// The key splits the decode op chooses (num_splits = 0) for a call of these sizes on CUDA device
// device_index (max_keys: each sequence's key capacity), counting sm_margin fewer SMs than it has (0 for
// the op's own choice); 1 in a build without the CUDA kernels.
int64_t decode_num_splits(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t max_keys,
                          int64_t head_dim, bool bf16, int64_t device_index, int64_t sm_margin);

#ifdef FLASHATTN_WITH_CUDA
void register_decode_cuda(torch::Library& m);
#endif

}  // namespace flashattn
