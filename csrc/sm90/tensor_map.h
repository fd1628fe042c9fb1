// TMA descriptors (CUtensorMap) of the [B, L, H, D] tensors the sm90 kernels read. Host code.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "params.h"

namespace flashattn {
namespace sm90 {

// Describes `ptr`, a [batch, seqlen, heads, head_dim] tensor of shape.element_type with `strides`,
// read in boxes of [box_rows][64 columns] with the 128-byte swizzle; reads past seqlen or head_dim
// return zeros. Returns cudaErrorNotSupported when TMA cannot describe the tensor (the caller then
// uses another path).
cudaError_t make_tensor_map(CUtensorMap* map, const void* ptr, const AttentionShape& shape, int seqlen, int heads,
                            const TensorStrides& strides, int box_rows);

}  // namespace sm90
}  // namespace flashattn
