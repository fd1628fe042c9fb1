// The tile shapes of the sm90 forward per tile width and of the sm90 backward, for host code (an
// attention mask's tile classes are computed on these grids). fwd_kernel.cuh and bwd_kernel.cuh check
// that their configurations agree.
#pragma once

namespace flashattn {
namespace sm90 {

constexpr int kFwdQueriesPerTile = 128;

// Keys per step of the forward kernel for a tile width (a head dim with a compiled kernel).
constexpr int fwd_keys_per_step(int tile_width) { return tile_width == 192 ? 96 : tile_width == 256 ? 80 : 128; }

// The same for the masked variant (masks and dropout), whose steps are whole multiples of 32 keys
// (dropout's keep-mask octets span 32 keys): 64 instead of 80 at tile width 256.
constexpr int masked_fwd_keys_per_step(int tile_width) { return tile_width == 256 ? 64 : fwd_keys_per_step(tile_width); }

// The backward's grid: queries per step x keys per CTA, at every tile width.
constexpr int kBwdQueriesPerStep = 64;
constexpr int kBwdKeysPerCta = 128;

}  // namespace sm90
}  // namespace flashattn
