// The tile shape of the sm90 forward per tile width, for host code (an attention mask's tile classes
// are computed on this grid). fwd_kernel.cuh checks that its configurations agree.
#pragma once

namespace flashattn {
namespace sm90 {

constexpr int kFwdQueriesPerTile = 128;

// Keys per step of the forward kernel for a tile width (a head dim with a compiled kernel).
constexpr int fwd_keys_per_step(int tile_width) { return tile_width == 192 ? 96 : tile_width == 256 ? 80 : 128; }

}  // namespace sm90
}  // namespace flashattn
