// How an attention-mask element acts on its score, for the passes that summarise a mask before the
// attention kernels run (classify_mask_tiles, find_key_prefix_rows, find_causal_prefix_rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "params.h"
#include "cuda/byte_bits.h"
#include "cuda/element_ops.h"

namespace flashattn {

// Neutral: leaves the score alone (True, or 0.0). Excluded: removes the key (False, or -inf). A float
// element that is neither (any other value; NaN too, which must reach the output) is read by the
// masked kernels. T is the element type of a floating mask that is not float32.
struct MaskElement {
  bool neutral, excluded;
};

template <typename T>
__device__ __forceinline__ MaskElement read_mask_element(const MaskParams& m, int64_t offset) {
  if (m.kind == MaskKind::kBool) {
    const bool keep = static_cast<const unsigned char*>(m.data)[offset] != 0;
    return {keep, !keep};
  }
  const float value = m.kind == MaskKind::kAdditiveFloat32
                          ? static_cast<const float*>(m.data)[offset]
                          : ElementOps<T>::to_float(static_cast<const T*>(m.data)[offset]);
  return {value == 0.f, value == -INFINITY};
}

// Boolean masks with unit column stride are read 16 elements per load where a row segment starts
// 16-byte aligned (one byte per element; a warp then reads 512 keys per load instruction).
constexpr int kBoolVectorKeys = 16;

__device__ __forceinline__ bool bool_vector_aligned(const MaskParams& m, int64_t offset) {
  return m.kind == MaskKind::kBool && m.col_stride == 1 &&
         (reinterpret_cast<uintptr_t>(m.data) + static_cast<uintptr_t>(offset)) % 16 == 0;
}

// Bit i set when element offset + i (i < 16) of a boolean mask is True (bool_vector_aligned(m, offset)).
__device__ __forceinline__ uint32_t bool_keep_bits16(const MaskParams& m, int64_t offset) {
  const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(m.data) + offset);
  // Bit 0 of each byte: whether the byte is not zero. Bit 7 is set by the byte itself or by the carry of
  // its low 7 bits + 0x7f (no carry crosses into the next byte).
  auto nonzero = [](uint32_t x) { return ((((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u) >> 7; };
  return byte_low_bits(make_uint4(nonzero(w.x), nonzero(w.y), nonzero(w.z), nonzero(w.w)));
}

}  // namespace flashattn
