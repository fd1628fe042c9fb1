// Gathering one bit of each byte of a word into adjacent bits, for the kernels that test 16 bytes
// (mask elements, tile classes) at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashattn {

// Bit i of the result (i < 4): bit 0 of byte i of x. (x & 0x01010101) * 0x01020408 puts byte i's low
// bit at bit 24 + i, with no carries between them.
__device__ __forceinline__ uint32_t byte_low_bits(uint32_t x) { return ((x & 0x01010101u) * 0x01020408u) >> 24; }

// Bit i of the result (i < 16): bit 0 of byte i of the 16 bytes w.
__device__ __forceinline__ uint32_t byte_low_bits(const uint4& w) {
  return byte_low_bits(w.x) | byte_low_bits(w.y) << 4 | byte_low_bits(w.z) << 8 | byte_low_bits(w.w) << 12;
}

}  // namespace flashattn
