// See fwd_plan.h. Host code: the configurations' constants come from fwd_config.h, the same types the
// kernels are built from, so the plan and the kernels cannot disagree on a tile shape.
#include "sm90/fwd_plan.h"

#include <algorithm>
#include <cstdint>

#include "plan.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_schedule.h"
#include "sm90/head_dims.h"

namespace flashattn {
namespace sm90 {
namespace {

// The constants of a configuration that the plan reads.
struct FwdTileConstants {
  int block_m, block_n;
  bool staged_output;
  int tail_block_n;
};

template <typename Cfg>
constexpr FwdTileConstants constants_of() {
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kStagedOutput, Cfg::kTailBlockN};
}

template <int kHeadDim>
FwdTileConstants constants_at_width(FwdTiles tiles) {
  switch (tiles) {
    case FwdTiles::kMasked:
      return constants_of<typename MaskedFwdConfig<kHeadDim>::type>();
    case FwdTiles::kLongRows:
      return constants_of<typename LongRowFwdConfig<kHeadDim>::type>();
    default:
      break;
  }
  if constexpr (kHeadDim == 64) {
    if (tiles == FwdTiles::kPrefetchScores) return constants_of<PrefetchScoresFwdConfig<64>::type>();
  }
  if constexpr (kHeadDim == 128) {
    if (tiles == FwdTiles::kWideKeys) return constants_of<WideKeyFwdConfig<128>::type>();
    if (tiles == FwdTiles::kWideKeysTail64) return constants_of<WideKeyTailFwdConfig<128, 64>::type>();
    if (tiles == FwdTiles::kWideKeysTail128) return constants_of<WideKeyTailFwdConfig<128, 128>::type>();
  }
  return constants_of<typename DefaultFwdConfig<kHeadDim>::type>();
}

FwdTileConstants constants(int width, FwdTiles tiles) {
#define FLASHATTN_AT_WIDTH(D) \
  if (width == D) return constants_at_width<D>(tiles);
  FLASHATTN_SM90_FOR_EACH_HEAD_DIM(FLASHATTN_AT_WIDTH)
#undef FLASHATTN_AT_WIDTH
  return {0, 0, false, 0};
}

bool chosen(Choice choice, bool automatic) { return choice == Choice::kAuto ? automatic : choice == Choice::kOn; }

// Whether rows of sh end in a block that a narrow tail of c covers (kTailBlockN): no causal masking, at
// least one full key block, then 1 .. tail_block_n keys.
bool narrow_tail_fits(const FwdTileConstants& c, const AttentionShape& sh) {
  const int tail = sh.seqlen_k % c.block_n;
  return !sh.is_causal && sh.seqlen_k > c.block_n && tail > 0 && tail <= c.tail_block_n;
}

// The configuration of a launch. Measured on the H200 (docs/perf-log.md has the figures):
// - width 64, long rows (uses_long_row_config): three consumer warpgroups;
// - width 128 without causal masking from 2048 keys: 176-key blocks, the last one narrow where it
//   holds at most 128 keys (the key-length form keeps 128-key blocks: its rows differ in length); a
//   sliding window keeps 128-key blocks too (at 4096 keys the 176-key ones were slower: more keys
//   outside the window at both of its edges);
// - width 64 otherwise: prefetched scores (the key-length form, whose rows can end before their
//   second block, keeps the default configuration).
FwdTiles choose_tiles(const AttentionShape& sh, int width, FwdRows rows, const PlanOptions& options) {
  if (rows == FwdRows::kMasked) return FwdTiles::kMasked;
  if (width == 64 && uses_long_row_config(sh)) return FwdTiles::kLongRows;
  const bool key_ends = rows == FwdRows::kKeyEnds;
  if (width == 128 && !key_ends &&
      chosen(options.sm90_wide_key_blocks, !sh.is_causal && sh.seqlen_k >= 2048)) {
    if (options.sm90_narrow_tail) {
      if (narrow_tail_fits(constants(128, FwdTiles::kWideKeysTail64), sh)) return FwdTiles::kWideKeysTail64;
      if (narrow_tail_fits(constants(128, FwdTiles::kWideKeysTail128), sh)) return FwdTiles::kWideKeysTail128;
    }
    return FwdTiles::kWideKeys;
  }
  if (width == 64 && !key_ends) return FwdTiles::kPrefetchScores;
  return FwdTiles::kDefault;
}

}  // namespace

int fwd_tile_width(int head_dim) {
  if (head_dim <= 32) return 0;  // smaller ones run faster on the sm80 path's 32-wide tiles
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM90_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

TileShape fwd_mask_tile(int width) {
  const FwdTileConstants c = constants(width, FwdTiles::kMasked);
  return {c.block_m, c.block_n};
}

FwdLaunchPlan plan_fwd_launch(const AttentionShape& sh, int width, FwdRows rows, bool out_tma, bool tile_counter,
                              const DeviceInfo& device, const PlanOptions& options) {
  FwdLaunchPlan plan;
  plan.shape = sh;
  plan.width = width;
  plan.rows = rows;
  plan.tiles = choose_tiles(sh, width, rows, options);
  const FwdTileConstants c = constants(width, plan.tiles);
  const bool masked = rows == FwdRows::kMasked;
  // The staged output needs a tensor map of out; without one the threads store.
  plan.staged_output = c.staged_output && options.sm90_staged_output && out_tma;

  // Persistent CTAs, at most one per SM (fwd_schedule.h). Pairs only where tiles differ in cost
  // (causal, or a mask) and do not all fit in one wave: with 192-query tiles an odd number of query
  // blocks leaves one single-tile unit per head, and when the CTA count is a multiple of the units per
  // head the same CTAs get every light unit.
  const int num_m = (sh.seqlen_q + c.block_m - 1) / c.block_m;
  const int64_t num_tiles = static_cast<int64_t>(num_m) * sh.heads_q * sh.batch;
  plan.tiles_per_unit = num_tiles > device.num_sms && (sh.is_causal || masked) ? 2 : 1;
  const int64_t num_units =
      (plan.tiles_per_unit == 2 ? (num_m + 1) / 2 : num_m) * static_cast<int64_t>(sh.heads_q) * sh.batch;
  plan.grid = static_cast<int>(std::min<int64_t>(num_units, device.num_sms));

  // K/V multicast: width 128 only (at 64 it measured no gain), rows that all walk every key block (no
  // causal masking, mask or key ends) with query tiles that pair up within each row, from 1024 keys
  // (below that a tile's few key blocks leave little L2 traffic to save), on a device where pairs of
  // CTAs can be resident together. Whole clusters, no more than can be resident at once.
  const bool multicast_fits = width == 128 && rows == FwdRows::kAll && !sh.is_causal && num_m % 2 == 0 &&
                              plan.tiles_per_unit == 1 && device.pair_clusters >= 1;
  if (multicast_fits && chosen(options.sm90_multicast, sh.seqlen_k >= 1024)) {
    plan.multicast = true;
    plan.grid = 2 * static_cast<int>(std::min<int64_t>(num_units / 2, device.pair_clusters));
  }

  // The dynamic tail: not in the masked variant, whose producer has no registers to spare for it.
  if (!masked && plan.tiles_per_unit == 2 && tile_counter && options.sm90_dynamic_tail) {
    plan.dynamic_heads = fwd_dynamic_heads(sh, num_m, plan.grid);
  }
  return plan;
}

}  // namespace sm90
}  // namespace flashattn
