// Dropout in the sm90 backward: the keep-mask of common/dropout.h, regenerated on the S^T tile of one
// consumer thread (fragments.h: element i is key key_row + 8 ((i % 4) / 2), query query_col + 8 (i / 4)
// + i % 2, with key_row % 32 in [0, 8) in even warps and [16, 24) in odd ones).
//
// A keep-mask octet is {q0, q0 + 8} x {k0 + 8w, w < 4}. This thread holds two of an octet's four keys
// (key_row and key_row + 8: words 0 and 1 of the octet at key_row in an even warp, words 2 and 3 of the
// one at key_row - 16 in an odd warp; the other two keys are the neighbouring warp's), so it makes 8
// calls per 32 scores, twice the forward's rate.
#pragma once

#include <cstdint>

#include "common/dropout.h"

namespace flashattn {
namespace sm90 {

// The keep bits of this thread's 32 scores: bit i for element i. The calls run in a loop that is not
// unrolled, so that they add no registers beside dK and dV.
__device__ __forceinline__ uint32_t backward_keep_bits(const DropoutRow& rng, int query_col, int key_row) {
  const bool odd_warp = (key_row & 16) != 0;
  const int octet_key = key_row - (odd_warp ? 16 : 0);
  uint32_t keep = 0;
#pragma unroll 1
  for (int call = 0; call < 8; ++call) {  // query columns 16 (call / 2) + {0, 8} + call % 2
    const int pair = call / 2, c = call % 2;
    const PhiloxWords words = rng.octet_words(query_col + 16 * pair + c, octet_key);
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {  // key key_row + 8 kh
      const uint32_t word = odd_warp ? words.w[2 + kh] : words.w[kh];
      // Half h of the word is query q0 + 8 h, i.e. element 4 (2 pair + h) + 2 kh + c.
      keep |= static_cast<uint32_t>(dropout_keeps_low(word, rng.threshold)) << (8 * pair + 2 * kh + c);
      keep |= static_cast<uint32_t>(dropout_keeps_high(word, rng.threshold)) << (8 * pair + 4 + 2 * kh + c);
    }
  }
  return keep;
}

// With dropout, P^T (s) becomes what dV sees, P Z / (1 - p), and dP^T (dp) becomes dS^T =
// P (dP Z / (1 - p) - delta), Z the keep-mask (the LSE and delta are the undropped ones).
// chain(i, p): a factor dS^T's element i (undropped probability p) is multiplied by (soft-capping's).
struct NoChain {
  __device__ __forceinline__ float operator()(int, float) const { return 1.f; }
};

template <typename Chain = NoChain>
__device__ __forceinline__ void apply_backward_dropout(float (&s)[32], float (&dp)[32], const float (&delta)[16],
                                                       uint32_t keep, float keep_scale, Chain chain = {}) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float z = ((keep >> i) & 1u) ? keep_scale : 0.f;
    dp[i] = s[i] * fmaf(dp[i], z, -delta[2 * (i / 4) + i % 2]) * chain(i, s[i]);
    s[i] *= z;
  }
}

}  // namespace sm90
}  // namespace flashattn
