// The sm90 forward's part of the planner (csrc/plan.h): for one launch, which of the compiled kernel
// variants runs it (tile configuration, K/V multicast, output staging) and its persistent grid and
// schedule. The only place those variants are chosen and the PlanOptions switches that touch them read.
// Host code only.
#pragma once

#include "cuda/api.h"  // TileShape
#include "params.h"

namespace flashattn {

struct DeviceInfo;
struct PlanOptions;

namespace sm90 {

// The tile configuration of a launch (sm90/fwd_config.h).
enum class FwdTiles : int {
  kDefault = 0,          // DefaultFwdConfig
  kPrefetchScores = 1,   // PrefetchScoresFwdConfig (width 64, two consumer warpgroups)
  kLongRows = 2,         // LongRowFwdConfig (width 64: three consumer warpgroups)
  kWideKeys = 3,         // WideKeyFwdConfig (width 128: 176-key blocks)
  kWideKeysTail64 = 4,   // WideKeyTailFwdConfig<128, 64>
  kWideKeysTail128 = 5,  // WideKeyTailFwdConfig<128, 128>
  kMasked = 6,           // MaskedFwdConfig (attention masks and dropout)
};

// Which rows a launch runs: all of them, those with a key_end >= 0 over their first key_end keys (the
// key-length form of a mask; no mask read), or with the mask and dropout (with key ends: only the rows
// in FwdParams::masked_rows).
enum class FwdRows : int { kAll = 0, kKeyEnds = 1, kMasked = 2 };

struct FwdLaunchPlan {
  AttentionShape shape{};  // the launch's own (the key-length form's causal masking included)
  int width = 0;           // tile width: a head dim with compiled kernels
  FwdRows rows = FwdRows::kAll;
  FwdTiles tiles = FwdTiles::kDefault;
  bool multicast = false;      // clusters of two CTAs that share each K/V block
  bool staged_output = false;  // O through shared memory and a TMA store
  int tiles_per_unit = 1;      // 2: pairs of query tiles of equal causal cost (fwd_schedule.h)
  int grid = 0;                // CTAs
  int dynamic_heads = 0;       // rows in the dynamic tail (0: none; else FwdParams::tile_counter is used)
};

// The tile width that serves head_dim (0: none). The sm90 forward serves head dims 33..256.
int fwd_tile_width(int head_dim);

// The query x key tile of the masked variant at a tile width: a mask's tile classes are computed on it.
TileShape fwd_mask_tile(int width);

// The plan of one launch over `shape` at tile width `width` (fwd_tile_width). out_tma: out can be
// written with TMA stores; tile_counter: the call provides FwdParams::tile_counter.
FwdLaunchPlan plan_fwd_launch(const AttentionShape& shape, int width, FwdRows rows, bool out_tma, bool tile_counter,
                              const DeviceInfo& device, const PlanOptions& options);

}  // namespace sm90
}  // namespace flashattn
