// Moving [rows, head_dim] tiles between global memory and padded shared-memory tiles.
//
// Shared tiles are row-major [kRows][kCols + kRowPad]: the 16-byte pad shifts each row by 4 banks, so
// the 8 row addresses of one ldmatrix phase hit distinct banks for every kCols that is a multiple of 16.
#pragma once

#include <cstdint>

#include "sm80/ptx.h"

namespace flashattn {
namespace sm80 {

constexpr int kRowPad = 8;  // elements (16 bytes of a 2-byte type)

template <int kCols>
struct PaddedTile {
  static constexpr int kStride = kCols + kRowPad;  // elements between row starts
};

// Starts copying rows [0, kRows) of a global [rows, head_dim] slice (row stride `row_stride` elements)
// into a padded shared tile of width kCols. Rows >= valid_rows and columns >= head_dim become zero.
// With aligned16 the copy is asynchronous (cp.async: wait + barrier before use); otherwise it is done
// element by element with plain loads (a barrier before use suffices).
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride, int valid_rows,
                                          int head_dim, bool aligned16) {
  constexpr int kStride = PaddedTile<kCols>::kStride;
  const int tid = threadIdx.x;
  if constexpr (kThreads % (kCols / 8) == 0) {
    if (aligned16) {
      // Each thread copies the same 16-byte column chunk of rows row0, row0 + kRowStep, ...
      constexpr int kChunksPerRow = kCols / 8;
      constexpr int kRowStep = kThreads / kChunksPerRow;
      const int row0 = tid / kChunksPerRow;
      const int col = (tid % kChunksPerRow) * 8;
      const bool col_valid = col < head_dim;
      const T* src = gmem + row0 * row_stride + col;
      T* dst = smem + row0 * kStride + col;
#pragma unroll
      for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i) {
        const int row = row0 + i * kRowStep;
        if (kRows % kRowStep == 0 || row < kRows) {
          const bool valid = col_valid && row < valid_rows;
          cp_async_16(dst + i * kRowStep * kStride, valid ? src + i * kRowStep * row_stride : gmem, valid);
        }
      }
      return;
    }
  }
  if (aligned16) {
    constexpr int kChunksPerRow = kCols / 8;
    constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
      const int c = i * kThreads + tid;
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int row = c / kChunksPerRow;
        const int col = (c % kChunksPerRow) * 8;
        const bool valid = row < valid_rows && col < head_dim;
        cp_async_16(smem + row * kStride + col, valid ? gmem + row * row_stride + col : gmem, valid);
      }
    }
  } else {
    const T zero = ElementOps<T>::from_float(0.f);
    for (int e = tid; e < kRows * kCols; e += kThreads) {
      const int row = e / kCols;
      const int col = e % kCols;
      smem[row * kStride + col] = (row < valid_rows && col < head_dim) ? gmem[row * row_stride + col] : zero;
    }
  }
}

// Starts copying `count` consecutive floats (zero past valid) into shared memory, 4 bytes per copy.
template <int kCount, int kThreads>
__device__ __forceinline__ void load_row_floats(float* smem, const float* gmem, int valid) {
  for (int i = threadIdx.x; i < kCount; i += kThreads) {
    cp_async_4(smem + i, i < valid ? gmem + i : gmem, i < valid);
  }
}

// Writes 16 rows of a padded shared tile (one warp's rows) to global memory; rows >= valid_rows and
// columns >= head_dim are not written. 16-byte stores when aligned16.
template <int kCols, typename T>
__device__ __forceinline__ void store_warp_rows(T* gmem, int64_t row_stride, const T* smem, int valid_rows,
                                                int head_dim, bool aligned16, int lane) {
  constexpr int kStride = PaddedTile<kCols>::kStride;
  if (aligned16) {
    constexpr int kChunksPerRow = kCols / 8;
    for (int c = lane; c < 16 * kChunksPerRow; c += 32) {
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * 8;
      if (row < valid_rows && col < head_dim) {
        *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
            *reinterpret_cast<const uint4*>(smem + row * kStride + col);
      }
    }
  } else {
    for (int e = lane; e < 16 * kCols; e += 32) {
      const int row = e / kCols;
      const int col = e % kCols;
      if (row < valid_rows && col < head_dim) gmem[row * row_stride + col] = smem[row * kStride + col];
    }
  }
}

}  // namespace sm80
}  // namespace flashattn
