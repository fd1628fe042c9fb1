// Division of non-negative ints below 2^31 by a divisor fixed for a whole kernel, as a multiply-high,
// an add and a shift (Granlund and Montgomery's round-up method): the sm90 forward splits a tile index
// into (query block, head, batch) at every tile, and ints divided by a value the compiler cannot see
// cost a reciprocal and some twenty dependent instructions each.
#pragma once

#include <cstdint>

namespace flashattn {
namespace sm90 {

struct FastDivider {
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  FastDivider() = default;
  // divisor >= 1. One 64-bit division, once per launch (on the host, or once per kernel).
  __host__ __device__ __forceinline__ explicit FastDivider(int d) : divisor(static_cast<uint32_t>(d)) {
    while ((1u << shift) < divisor) ++shift;  // shift = ceil(log2(divisor))
    multiplier = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor) / divisor + 1);
  }
  // n / divisor for 0 <= n < 2^31 (t <= n, so t + n does not overflow).
  __device__ __forceinline__ int div(int n) const {
    const uint32_t t = __umulhi(static_cast<uint32_t>(n), multiplier);
    return static_cast<int>((t + static_cast<uint32_t>(n)) >> shift);
  }
  __device__ __forceinline__ int mod(int n) const { return n - div(n) * static_cast<int>(divisor); }
};

}  // namespace sm90
}  // namespace flashattn
