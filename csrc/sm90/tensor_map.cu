#include "sm90/tensor_map.h"

#include <cudaTypedefs.h>

namespace flashattn {
namespace sm90 {
namespace {

// The driver's encoder, looked up once through the runtime (no link-time dependency on libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status);
    return (err == cudaSuccess && status == cudaDriverEntryPointSuccess)
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

}  // namespace

cudaError_t make_tensor_map(CUtensorMap* map, const void* ptr, const AttentionShape& shape, int seqlen, int heads,
                            const TensorStrides& strides, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr int kElementBytes = 2;
  // Dimensions and strides innermost first: column, row, head, batch.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(shape.head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(shape.batch)};
  const cuuint64_t byte_strides[3] = {static_cast<cuuint64_t>(strides.row) * kElementBytes,
                                      static_cast<cuuint64_t>(strides.head) * kElementBytes,
                                      static_cast<cuuint64_t>(strides.batch) * kElementBytes};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = shape.element_type == ElementType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult result = encode(map, type, 4, const_cast<void*>(ptr), dims, byte_strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorNotSupported;
}

}  // namespace sm90
}  // namespace flashattn
