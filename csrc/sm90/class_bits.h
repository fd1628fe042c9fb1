// kClassWindow consecutive mask-tile classes (params.h) held as two bit sets, as the sm90 kernels walk
// them: the forward over a query tile's key blocks, the backward over a key block's steps. Finding the
// next tile that lets a key through is a shift and a find-first-set per window, not a class test per
// tile: the walk runs on the consumers' critical path at every block.
#pragma once

#include <cstdint>

#include "params.h"

namespace flashattn {
namespace sm90 {

struct ClassBits {
  int first = -kClassWindow;  // the window holds tiles [first, first + kClassWindow)
  uint32_t visible = 0;       // bit i: tile first + i exists and some key of it is visible
  uint32_t needs = 0;         // bit i: tile first + i's mask elements must be read
  uint32_t prefix = 0;        // bit i: tile first + i is a key prefix (kTileKeyPrefix)

  // From tile n on, the first visible one below `count`; a value >= count when none is left. `refill(n)`
  // loads a window holding tile n (n < count) into this object.
  template <typename Refill>
  __device__ __forceinline__ int next_visible(int n, int count, Refill refill) {
    while (n < count) {
      if (static_cast<unsigned>(n - first) >= static_cast<unsigned>(kClassWindow)) refill(n);
      const uint32_t ahead = visible >> (n - first);
      if (ahead != 0) return n + __ffs(ahead) - 1;
      n = first + kClassWindow;
    }
    return n;
  }
  // Whether tile n (the last one next_visible returned) needs its mask elements.
  __device__ __forceinline__ bool needs_elements(int n) const { return ((needs >> (n - first)) & 1u) != 0; }
  // Whether tile n (the last one next_visible returned) is a key prefix.
  __device__ __forceinline__ bool is_prefix(int n) const { return ((prefix >> (n - first)) & 1u) != 0; }
};

}  // namespace sm90
}  // namespace flashattn
