// The online softmax of the sm90 forward, in registers: each thread holds two rows of a consumer
// warpgroup's 64 x kBlockN score tile in the wgmma accumulator layout (s[4j + 2 half + c] is row
// row0 + 8 half, key 8j + 2 (lane % 4) + c), and their running max and sum; dropout's zeroing of
// probabilities, and the rescaling of the older O rows when the max grows.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/dropout.h"

namespace flashattn {
namespace sm90 {

// The base each of this thread's two rows subtracts before exp2 (its running max, in base-2 units:
// scores times their scale, possibly stale, see update) and partial sum (this thread's columns only).
template <int kBlockN>
struct OnlineSoftmax {
  // A row's base moves only when a block's max exceeds it by more than this (base-2 units), so after
  // its first blocks a row seldom needs its O accumulators rescaled. Probabilities then reach at most
  // 2^kRebaseAbove: the float sums and O, and P in bf16 or fp16, hold them with the same relative
  // rounding as values near 1, and the output and the LSE use the same base, so they are unchanged.
  static constexpr float kRebaseAbove = 8.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  // Turns scores into exp2(s * scale - base) in place (one FFMA and one EX2 per score; the scale must be
  // positive: scale * log2 e for raw scores, 1 for scores already in base-2 units) and sets the factor
  // the older O rows must be scaled by. Since a positive scale keeps the order of the scores, the max
  // of s * scale is (the max of s) * scale: one multiply per row. Returns whether a row's base moved
  // (otherwise both factors are 1 and O may be left alone).
  // s may also be the first kCount of a block's scores (a narrow last block).
  template <int kCount>
  __device__ __forceinline__ bool update(float (&s)[kCount], float scale, float (&correction)[2]) {
    static_assert(kCount <= kBlockN / 2 && kCount % 4 == 0, "whole n8 blocks of one key block");
    bool moved = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCount / 4; ++j) {
        block_max = fmaxf(block_max, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
      }
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 2));
      const float candidate = block_max * scale;
      // -inf + kRebaseAbove is -inf: a row's first block with a visible key always moves it.
      const bool moves = candidate > row_max[half] + kRebaseAbove;
      correction[half] = moves ? exp2f(row_max[half] - candidate) : 1.f;
      if (moves) row_max[half] = candidate;
      moved |= moves;
      // A row that has seen no key yet keeps base -inf; subtracting 0 then keeps its exp2 at 0.
      const float base = row_max[half] == -INFINITY ? 0.f : row_max[half];
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kCount / 4; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = s[4 * j + 2 * half + c];
          x = exp2f(fmaf(x, scale, -base));
          sum += x;
        }
      }
      row_sum[half] = row_sum[half] * correction[half] + sum;
    }
    return moved;
  }
};

// Zeroes the probabilities of key block n0 (a multiple of 32) that dropout drops. s[4j + 2 half + c]
// is row row0 + 8 half (row0 % 16 < 8), key n0 + 8j + 2 (lane % 4) + c, so for each 32 keys g and each
// c this thread holds one whole keep-mask octet: word i of its call decides s[4 (4g + i) + c] (low
// half) and s[4 (4g + i) + 2 + c] (high half). Each half is tested and applied where it is made, a
// compare and a select per score (collecting keep bits first cost ~6 instructions per score more).
template <int kBlockN>
__device__ __forceinline__ void drop_probabilities(float (&s)[kBlockN / 2], const DropoutRow& rng, int row0, int n0,
                                                   int lane) {
  static_assert(kBlockN % 32 == 0, "whole octets");
#pragma unroll
  for (int g = 0; g < kBlockN / 32; ++g) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const PhiloxWords words = rng.octet_words(row0, n0 + 32 * g + 2 * (lane % 4) + c);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float& low = s[4 * (4 * g + i) + c];
        float& high = s[4 * (4 * g + i) + 2 + c];
        low = dropout_keeps_low(words.w[i], rng.threshold) ? low : 0.f;
        high = dropout_keeps_high(words.w[i], rng.threshold) ? high : 0.f;
      }
    }
  }
}

template <int kCount>
__device__ __forceinline__ void rescale_rows(float (&o)[kCount], const float (&correction)[2]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) o[i] *= correction[(i % 4) / 2];
}

}  // namespace sm90
}  // namespace flashattn
