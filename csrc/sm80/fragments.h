// Loading mma.m16n8k16 operand fragments from padded shared tiles, and reusing an fp32 accumulator as
// the next GEMM's A operand. See ptx.h for the fragment layouts.
#pragma once

#include <cstdint>

#include "sm80/ptx.h"

namespace flashattn {
namespace sm80 {

// A fragment (16x16) of a row-major shared tile: rows [row0, row0 + 16), cols [col0, col0 + 16).
template <int kStride, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int col0, int lane) {
  const int row = row0 + (lane % 8) + ((lane / 8) % 2) * 8;
  const int col = col0 + (lane / 16) * 8;
  ldmatrix_x4(a, tile + row * kStride + col);
}

// A fragment of A = X^T where X is a row-major shared tile: A rows are X columns [a_row0, +16), A columns
// are X rows [a_col0, +16).
template <int kStride, typename T>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const T* x_tile, int a_row0, int a_col0,
                                                  int lane) {
  const int x_row = a_col0 + (lane % 8) + (lane / 16) * 8;
  const int x_col = a_row0 + ((lane / 8) % 2) * 8;
  ldmatrix_x4_trans(a, x_tile + x_row * kStride + x_col);
}

// B fragments for two adjacent n8 tiles of B = X^T where X is a row-major shared tile [n][k]
// (e.g. K for S = Q K^T): n in [n0, n0 + 16), k in [k0, k0 + 16). b[0], b[1]: tile n0; b[2], b[3]: n0 + 8.
template <int kStride, typename T>
__device__ __forceinline__ void load_b_from_rows_nk(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  const int row = n0 + (lane % 8) + (lane / 16) * 8;
  const int col = k0 + ((lane / 8) % 2) * 8;
  ldmatrix_x4(b, tile + row * kStride + col);
}

// B fragments for two adjacent n8 tiles of B = X where X is a row-major shared tile [k][n]
// (e.g. V for O = P V): k in [k0, k0 + 16), n in [n0, n0 + 16). b[0], b[1]: tile n0; b[2], b[3]: n0 + 8.
template <int kStride, typename T>
__device__ __forceinline__ void load_b_from_rows_kn(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  const int row = k0 + (lane % 8) + ((lane / 8) % 2) * 8;
  const int col = n0 + (lane / 16) * 8;
  ldmatrix_x4_trans(b, tile + row * kStride + col);
}

// The fp32 accumulators of n8 tiles 2j and 2j+1 (a 16x16 block of C) as the A fragment of k-step j.
template <typename T>
__device__ __forceinline__ void accumulator_to_a(uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = ElementOps<T>::pack(c_lo[0], c_lo[1]);
  a[1] = ElementOps<T>::pack(c_lo[2], c_lo[3]);
  a[2] = ElementOps<T>::pack(c_hi[0], c_hi[1]);
  a[3] = ElementOps<T>::pack(c_hi[2], c_hi[3]);
}

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_accumulators(float (&c)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) c[m][n][j] = 0.f;
    }
  }
}

// One warp's GEMM: acc[m][n] += sum over kKSteps x 16 of A * B, for kMTiles x 16 rows and kNTiles x 8
// columns. load_a(frag, m_tile, k_step) fills an A fragment; load_b(frag, n_pair, k_step) fills the B
// fragments of n8 tiles 2 * n_pair and 2 * n_pair + 1. Each B fragment serves every m tile, each A
// fragment every n tile, so shared-memory traffic per mma falls as the warp tile grows.
template <typename T, int kMTiles, int kNTiles, int kKSteps, typename LoadA, typename LoadB>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMTiles][kNTiles][4], LoadA&& load_a, LoadB&& load_b) {
  static_assert(kNTiles % 2 == 0, "B fragments come in pairs of n8 tiles");
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) load_a(a[mt], mt, ks);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      load_b(b, np, ks);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Max / sum over the 4 lanes of a quad: the lanes that hold one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

}  // namespace sm80
}  // namespace flashattn
