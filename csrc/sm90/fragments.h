// Register fragments shared by the sm90 kernels. A wgmma m64nN accumulator holds, per thread, the
// elements d[4j .. 4j + 3] of n8 block j: rows lane / 4 and lane / 4 + 8 of the warp's 16 rows,
// columns 8j + 2 (lane % 4) + {0, 1} (mma.sync's C layout), which is also the layout a register A
// operand of the next GEMM expects, 16 columns (one k16 step) at a time.
#pragma once

#include <cstdint>

#include "cuda/element_ops.h"

namespace flashattn {
namespace sm90 {

// The accumulator's n8 blocks 2kk and 2kk + 1 as the A fragment of k16 step kk, rounded to T.
template <typename T, int kCols>
__device__ __forceinline__ void accumulator_to_a(uint32_t (&a)[kCols / 16][4], const float (&acc)[kCols / 2]) {
  using Ops = ElementOps<T>;
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = Ops::pack(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
  }
}

// Row (0..63 within the warpgroup) and column (0..N-1) of accumulator element i of this thread.
__device__ __forceinline__ int accumulator_row(int i, int warp_in_group, int lane) {
  return warp_in_group * 16 + lane / 4 + ((i % 4) / 2) * 8;
}
__device__ __forceinline__ int accumulator_col(int i, int lane) { return (i / 4) * 8 + (lane % 4) * 2 + (i % 2); }

}  // namespace sm90
}  // namespace flashattn
