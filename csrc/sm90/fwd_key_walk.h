// The key blocks one tile of the sm90 forward visits (the same walk in the producer and the consumers,
// so the K/V ring stays in step): every block, or with an attention mask those its tile classes let
// through.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/mask.h"
#include "cuda/byte_bits.h"
#include "cuda/mask_view.h"
#include "params.h"
#include "sm90/class_bits.h"
#include "sm90/fwd_schedule.h"

namespace flashattn {
namespace sm90 {

// The key blocks a tile visits: from block n on, the first one the mask does not exclude entirely
// (all of them without a mask); num_n_blocks when none is left. The tile's classes are read
// kClassWindow at a time (a class read from memory between a consumer's GEMMs stalled the consumer
// for a memory round trip at every key block) and kept as two bit sets, so that finding the next
// block and whether its elements are read is a shift and a find-first-set, not a byte-by-byte scan:
// the walk runs on the consumers' critical path at every key block.
template <typename T, bool kMasked>
struct KeyBlockWalk {
  MaskView<T> mask;
  int num_n_blocks;
  ClassBits bits;  // the window of blocks last loaded

  __device__ __forceinline__ KeyBlockWalk(const FwdParams& p, const FwdTile& t, int block_m)
      : mask(kMasked ? MaskView<T>(p.mask, t.batch, t.head, t.m0 / block_m) : MaskView<T>()),
        num_n_blocks(t.num_n_blocks) {}

  // Bit i = bit `flag_bit` of byte i of the four words (16 class bytes).
  __device__ __forceinline__ static uint32_t gather_flag(const uint4& w, int flag_bit) {
    return byte_low_bits(make_uint4(w.x >> flag_bit, w.y >> flag_bit, w.z >> flag_bit, w.w >> flag_bit));
  }
  __device__ __forceinline__ void load_window(int first) {
    static_assert(kClassWindow == 16, "one uint4 per window");
    static_assert(kTileAnyVisible == 1 && kTileNeedsMask == 2 && kTileKeyPrefix == 4, "flag bits 0, 1 and 2");
    bits.first = first;
    const uint4 w = *reinterpret_cast<const uint4*>(mask.classes + first);
    // Class bytes past the last block are padding: never visible.
    const int blocks = num_n_blocks - first;
    const uint32_t exists = blocks >= kClassWindow ? 0xffffu : (1u << blocks) - 1;
    bits.visible = gather_flag(w, 0) & exists;
    bits.needs = gather_flag(w, 1) & exists;
    bits.prefix = gather_flag(w, 2) & exists;
  }
  __device__ __forceinline__ int next(int n) {
    if constexpr (kMasked) {
      if (mask.classes != nullptr) {
        return bits.next_visible(n, num_n_blocks, [&](int m) { load_window(m & ~(kClassWindow - 1)); });
      }
    }
    return n;
  }
  // One past the last block of the plain run that starts at block n (the last block next() returned,
  // < num_n_blocks): blocks n, n + 1, ... that are all visible, need no mask elements and lie before
  // `edge` (the first block that needs the length or causal test), within the current window. n itself
  // when it is not plain.
  __device__ __forceinline__ int plain_run_end(int n, int edge) const {
    if constexpr (kMasked) {
      if (mask.classes == nullptr) return n;  // every block reads its elements
      const uint32_t plain = (bits.visible & ~bits.needs) >> (n - bits.first);  // below bit 16
      return min(n + __ffs(~plain) - 1, edge);
    }
    return n;
  }
  // Whether the mask's elements of key block n (the last block next() returned, < num_n_blocks) must
  // be read.
  __device__ __forceinline__ bool needs_elements(int n) const {
    if constexpr (kMasked) {
      return mask.kind != MaskKind::kNone && (mask.classes == nullptr || bits.needs_elements(n));
    }
    return false;
  }
  // For key block n (as needs_elements, which it holds for): one past the last key its tile keeps when
  // the tile is a key prefix (a length test then replaces the elements), else -1. The key counts lie
  // at the classes' offset in m.tile_key_count.
  __device__ __forceinline__ int prefix_key_end(int n, int block_n, const MaskParams& m) const {
    if constexpr (kMasked) {
      if (mask.classes != nullptr && bits.is_prefix(n)) {
        return n * block_n + m.tile_key_count[(mask.classes - m.tile_class) + n];
      }
    }
    return -1;
  }
};

}  // namespace sm90
}  // namespace flashattn
