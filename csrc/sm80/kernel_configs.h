// The tile configurations of the sm80 kernels, apart from the kernels so that host code (dispatch.cu)
// can read tile shapes without instantiating a kernel.
#pragma once

#include "sm80/tile_io.h"

namespace flashattn {
namespace sm80 {

// A forward tile configuration. kMTiles = 2 lets each K/V fragment read from shared memory feed two
// mma (halving shared-memory traffic) at the cost of twice the accumulator registers.
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, bool kQInRegisters_, int kMinBlocksPerSM_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim tiles are multiples of 16 up to 256");
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kBlockM = kWarps * kMTiles * 16;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;               // keys per step
  static_assert(kBlockN % 16 == 0, "keys come in k16 steps");
  static constexpr bool kQInRegisters = kQInRegisters_;
  static constexpr int kMinBlocksPerSM = kMinBlocksPerSM_;
  static constexpr int kStride = PaddedTile<kHeadDim>::kStride;
  static constexpr int kQTileElems = kBlockM * kStride;
  static constexpr int kKVTileElems = kBlockN * kStride;
  static constexpr int kStages = 2;  // K/V double buffer
  static constexpr int kSmemBytes = (kQTileElems + 2 * kStages * kKVTileElems) * 2;
  // The kMasked variant's dropout keep bits: one 64-bit word per thread and m tile, after the tiles.
  static constexpr int kKeepBitsBytes = kThreads * kMTiles * 8;
};

// A list of tile configurations, and its entry kIndex.
template <typename... Configs>
struct ConfigList {
  static constexpr int kCount = sizeof...(Configs);
};
template <int kIndex, typename List>
struct ConfigAt;
template <int kIndex, typename First, typename... Rest>
struct ConfigAt<kIndex, ConfigList<First, Rest...>> : ConfigAt<kIndex - 1, ConfigList<Rest...>> {};
template <typename First, typename... Rest>
struct ConfigAt<0, ConfigList<First, Rest...>> {
  using type = First;
};

// Calls f(Config{}) with entry `index` of List (0 <= index < List::kCount), returning what f returns:
// the run-time index of a plan picks a compile-time configuration.
template <typename List, int kIndex = 0, typename F>
auto with_config(int index, F&& f) {
  if constexpr (kIndex + 1 < List::kCount) {
    if (index != kIndex) return with_config<List, kIndex + 1>(index, f);
  }
  return f(typename ConfigAt<kIndex, List>::type{});
}

// The configurations each head dim can run with ("tiles" 0, 1, ...), fastest first: entry 0 is the
// one docs/perf-log.md measured, and each later one needs less shared memory per block, for GPUs that
// offer less than the one before needs (an A100 163 KiB, sm86 and sm89 99 KiB). The planner takes the
// first that fits the GPU (sm80::fwd_tiles, bwd_tiles) and the launch reads its index from the params.
template <int kHeadDim>
struct FwdConfigs;
template <> struct FwdConfigs<32> { using type = ConfigList<FwdConfig<32, 4, 2, 64, true, 2>>; };
template <> struct FwdConfigs<64> { using type = ConfigList<FwdConfig<64, 4, 2, 64, true, 2>>; };
template <> struct FwdConfigs<96> { using type = ConfigList<FwdConfig<96, 4, 2, 64, false, 2>>; };
// 104 KiB, then 85 KiB (64 query rows a CTA).
template <> struct FwdConfigs<128> {
  using type = ConfigList<FwdConfig<128, 4, 2, 64, false, 2>, FwdConfig<128, 4, 1, 64, false, 1>>;
};
// 152 KiB, then 75 KiB (64 query rows, 32 keys a step).
template <> struct FwdConfigs<192> {
  using type = ConfigList<FwdConfig<192, 8, 1, 64, false, 1>, FwdConfig<192, 4, 1, 32, false, 1>>;
};
// 134 KiB, 99 KiB (64 query rows; the masked variant's keep bits do not fit beside it in 99 KiB), then
// 83 KiB (32 query rows, two warps).
template <> struct FwdConfigs<256> {
  using type = ConfigList<FwdConfig<256, 8, 1, 32, false, 1>, FwdConfig<256, 4, 1, 32, false, 1>,
                          FwdConfig<256, 2, 1, 32, false, 1>>;
};

// A backward tile configuration. Each of the three GEMM stages splits the CTA's warps in its own
// 2-D grid, so every warp tile spans several m16 and n8 tiles and reuses its fragments:
//   S^T, dP^T [kBlockN keys, kBlockM queries]: kSKeyWarps along keys, the rest along queries
//   dK, dV    [kBlockN keys, head dim]:         kKVKeyWarps along keys, the rest along columns
//   dQ        [kBlockM queries, head dim]:      kQQueryWarps along queries, the rest along columns
// P^T and dS^T pass from the first stage to the others through shared memory.
// Q, dO, LSE and delta of a step are double-buffered (kQStages = 2: the next step's land during this
// one) or, to save shared memory, single-buffered (1: the next step's are loaded once this step's dK
// GEMM has read them, and land during its dQ GEMM).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kSKeyWarps, int kKVKeyWarps, int kQQueryWarps,
          int kQStages_ = 2>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;

  static constexpr int kSKeys = kBlockN / kSKeyWarps;                  // warp tile of S^T / dP^T
  static constexpr int kSQueries = kBlockM / (kWarps / kSKeyWarps);
  static constexpr int kKVKeys = kBlockN / kKVKeyWarps;                // warp tile of dK / dV
  static constexpr int kKVCols = kHeadDim / (kWarps / kKVKeyWarps);
  static constexpr int kQQueries = kBlockM / kQQueryWarps;             // warp tile of dQ
  static constexpr int kQCols = kHeadDim / (kWarps / kQQueryWarps);
  static_assert(kSKeys % 16 == 0 && kSQueries % 16 == 0, "S^T warp tile: m16 rows, n16 column pairs");
  static_assert(kKVKeys % 16 == 0 && kKVCols % 16 == 0, "dK/dV warp tile: m16 rows, n16 column pairs");
  static_assert(kQQueries % 16 == 0 && kQCols % 16 == 0, "dQ warp tile: m16 rows, n16 column pairs");

  static constexpr int kStride = PaddedTile<kHeadDim>::kStride;
  static constexpr int kPStride = PaddedTile<kBlockM>::kStride;
  static constexpr int kKVTileElems = kBlockN * kStride;
  static constexpr int kQTileElems = kBlockM * kStride;
  static constexpr int kPTileElems = kBlockN * kPStride;
  static constexpr int kQStages = kQStages_;
  static_assert(kQStages == 1 || kQStages == 2, "Q, dO, LSE, delta: one or two buffers");
  // K, V, then per stage Q and dO, then P^T and dS^T (elements); then per stage LSE and delta (floats).
  static constexpr int kSmemElems = 2 * kKVTileElems + 2 * kQStages * kQTileElems + 2 * kPTileElems;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kQStages * kBlockM * 4;
};

// The backward's, as FwdConfigs (shared memory of each in the comments).
template <int kHeadDim>
struct BwdConfigs;
template <> struct BwdConfigs<32> { using type = ConfigList<BwdConfig<32, 64, 128, 8, 4, 4, 4>>; };
// 109 KiB, then 91 KiB (one Q/dO buffer).
template <> struct BwdConfigs<64> {
  using type = ConfigList<BwdConfig<64, 64, 128, 8, 4, 4, 2>, BwdConfig<64, 64, 128, 8, 4, 4, 2, 1>>;
};
// 141 KiB, then 97 KiB (64 keys a CTA).
template <> struct BwdConfigs<96> {
  using type = ConfigList<BwdConfig<96, 64, 128, 8, 4, 4, 4>, BwdConfig<96, 64, 64, 8, 2, 4, 4>>;
};
// 173 KiB, 139 KiB (one Q/dO buffer), then 87 KiB (and 64 keys a CTA).
template <> struct BwdConfigs<128> {
  using type = ConfigList<BwdConfig<128, 64, 128, 8, 4, 4, 2>, BwdConfig<128, 64, 128, 8, 4, 4, 2, 1>,
                          BwdConfig<128, 64, 64, 8, 2, 2, 4, 1>>;
};
// 169 KiB, then 119 KiB (one Q/dO buffer). Nothing at 99 KiB: K and V alone take 50 KiB at 64 keys, and
// fewer keys or queries a step break the warp grid (32 keys per warp for the dropout bits, 16 queries).
template <> struct BwdConfigs<192> {
  using type = ConfigList<BwdConfig<192, 64, 64, 8, 2, 2, 4>, BwdConfig<192, 64, 64, 8, 2, 2, 4, 1>>;
};
// 217 KiB, then 151 KiB (one Q/dO buffer). Nothing at 99 KiB, as at 192.
template <> struct BwdConfigs<256> {
  using type = ConfigList<BwdConfig<256, 64, 64, 8, 2, 2, 4>, BwdConfig<256, 64, 64, 8, 2, 2, 4, 1>>;
};

}  // namespace sm80
}  // namespace flashattn
