// Reading an attention mask (params.h, MaskParams) inside the kernels of both GPU paths: the per-tile class that
// lets a kernel skip a tile or leave its elements unread, and one element as an additive term in the
// kernels' base-2 score units.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"
#include "cuda/element_ops.h"

namespace flashattn {

// Additive mask values below this (in base-2 units, about -6.9e29 in the mask's own units) are raised
// to it, so that a very negative finite value (e.g. torch.finfo(torch.bfloat16).min, which times
// log2(e) overflows float) stays finite: a row whose every key carries such a value then gets the
// uniform softmax the reference gives, and the row's LSE stays finite through the backward's base-2
// conversion and through the sm90 forward's division by the scale.
constexpr float kMaskFloorLog2 = -1e30f;

template <typename T>
__host__ __device__ __forceinline__ int mask_element_bytes(MaskKind kind) {
  return kind == MaskKind::kBool ? 1 : kind == MaskKind::kAdditiveFloat32 ? 4 : static_cast<int>(sizeof(T));
}

// The mask of one (batch, query head), and the tile classes of one query tile of it.
template <typename T>
struct MaskView {
  const unsigned char* base = nullptr;  // element (batch, head, 0, 0), as bytes
  int64_t row_stride = 0, col_stride = 0;  // in elements
  MaskKind kind = MaskKind::kNone;
  // [class_row_stride] classes of this query tile, 16-byte aligned; nullptr: read every element
  const unsigned char* classes = nullptr;

  MaskView() = default;
  __device__ __forceinline__ MaskView(const MaskParams& m, int batch, int head, int query_tile) {
    base = static_cast<const unsigned char*>(m.data) +
           (batch * m.batch_stride + head * m.head_stride) * mask_element_bytes<T>(m.kind);
    row_stride = m.row_stride;
    col_stride = m.col_stride;
    kind = m.kind;
    classes = m.tile_class == nullptr ? nullptr
                                      : m.tile_class + batch * m.class_batch_stride + head * m.class_head_stride +
                                            static_cast<int64_t>(query_tile) * m.class_row_stride;
  }

  // Whether key tile `key_tile` of this query tile can be skipped (the mask excludes every element).
  __device__ __forceinline__ bool skips(int key_tile) const {
    return classes != nullptr && !(classes[key_tile] & kTileAnyVisible);
  }
  // Whether the elements of key tile `key_tile` must be read (some are not neutral). Never without a
  // mask (the masked kernel variants also run dropout without one).
  __device__ __forceinline__ bool needed(int key_tile) const {
    return kind != MaskKind::kNone && (classes == nullptr || (classes[key_tile] & kTileNeedsMask));
  }
  // The term element (query, key) adds to a base-2 score: 0 or -inf for a boolean mask, the value
  // times log2(e) (floored at kMaskFloorLog2, -inf and NaN kept) for an additive one.
  __device__ __forceinline__ float add_log2(int query, int key) const {
    const int64_t offset = query * row_stride + key * col_stride;
    if (kind == MaskKind::kBool) return base[offset] != 0 ? 0.f : -INFINITY;
    const float value = kind == MaskKind::kAdditiveFloat32
                            ? reinterpret_cast<const float*>(base)[offset]
                            : ElementOps<T>::to_float(reinterpret_cast<const T*>(base)[offset]);
    return additive_log2(value);
  }
  // A mask value (not boolean) as a base-2 term.
  __device__ __forceinline__ static float additive_log2(float value) {
    if (value == -INFINITY) return value;
    const float x = value * 1.4426950408889634f;  // -inf when a finite value overflows
    return x < kMaskFloorLog2 ? kMaskFloorLog2 : x;  // a NaN stays NaN
  }

  // The base-2 terms (as add_log2) of n elements, element e at offset where(e) in elements from base
  // (negative: not read, the term is 0 for additive masks and -inf for boolean ones). Every load is issued
  // before any is used, so that their latencies overlap: one add_log2 per element, behind its per-kind
  // branches, waited for each load in turn.
  template <int n, typename Where>
  __device__ __forceinline__ void load_terms(Where where, float (&out)[n]) const {
    if (kind == MaskKind::kBool) {
      uint32_t raw[n];
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const int64_t at = where(e);
        raw[e] = at >= 0 ? base[at] : 0u;
      }
#pragma unroll
      for (int e = 0; e < n; ++e) out[e] = raw[e] != 0 ? 0.f : -INFINITY;
    } else if (kind == MaskKind::kAdditiveFloat32) {
      const float* floats = reinterpret_cast<const float*>(base);
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const int64_t at = where(e);
        out[e] = at >= 0 ? floats[at] : 0.f;
      }
#pragma unroll
      for (int e = 0; e < n; ++e) out[e] = additive_log2(out[e]);
    } else {
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(base);  // T's 16 bits
      uint32_t raw[n];
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const int64_t at = where(e);
        raw[e] = at >= 0 ? bits[at] : 0u;  // 0: +0.0 in both 16-bit formats
      }
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const uint16_t b = static_cast<uint16_t>(raw[e]);
        out[e] = additive_log2(ElementOps<T>::to_float(*reinterpret_cast<const T*>(&b)));
      }
    }
  }
};

}  // namespace flashattn
