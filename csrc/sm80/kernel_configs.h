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

// The configuration each head dim runs with (docs/perf-log.md has how they were chosen).
template <int kHeadDim>
struct DefaultFwdConfig;
template <> struct DefaultFwdConfig<32> { using type = FwdConfig<32, 4, 2, 64, true, 2>; };
template <> struct DefaultFwdConfig<64> { using type = FwdConfig<64, 4, 2, 64, true, 2>; };
template <> struct DefaultFwdConfig<96> { using type = FwdConfig<96, 4, 2, 64, false, 2>; };
template <> struct DefaultFwdConfig<128> { using type = FwdConfig<128, 4, 2, 64, false, 2>; };
template <> struct DefaultFwdConfig<192> { using type = FwdConfig<192, 8, 1, 64, false, 1>; };
template <> struct DefaultFwdConfig<256> { using type = FwdConfig<256, 8, 1, 32, false, 1>; };

// A backward tile configuration. Each of the three GEMM stages splits the CTA's warps in its own
// 2-D grid, so every warp tile spans several m16 and n8 tiles and reuses its fragments:
//   S^T, dP^T [kBlockN keys, kBlockM queries]: kSKeyWarps along keys, the rest along queries
//   dK, dV    [kBlockN keys, head dim]:         kKVKeyWarps along keys, the rest along columns
//   dQ        [kBlockM queries, head dim]:      kQQueryWarps along queries, the rest along columns
// P^T and dS^T pass from the first stage to the others through shared memory.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kSKeyWarps, int kKVKeyWarps, int kQQueryWarps>
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
  static constexpr int kQStages = 2;  // Q, dO, LSE, delta double buffer
  // K, V, then per stage Q and dO, then P^T and dS^T (elements); then per stage LSE and delta (floats).
  static constexpr int kSmemElems = 2 * kKVTileElems + 2 * kQStages * kQTileElems + 2 * kPTileElems;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kQStages * kBlockM * 4;
};

template <int kHeadDim>
struct DefaultBwdConfig;
template <> struct DefaultBwdConfig<32> { using type = BwdConfig<32, 64, 128, 8, 4, 4, 4>; };
template <> struct DefaultBwdConfig<64> { using type = BwdConfig<64, 64, 128, 8, 4, 4, 2>; };
template <> struct DefaultBwdConfig<96> { using type = BwdConfig<96, 64, 128, 8, 4, 4, 4>; };
template <> struct DefaultBwdConfig<128> { using type = BwdConfig<128, 64, 128, 8, 4, 4, 2>; };
template <> struct DefaultBwdConfig<192> { using type = BwdConfig<192, 64, 64, 8, 2, 2, 4>; };
template <> struct DefaultBwdConfig<256> { using type = BwdConfig<256, 64, 64, 8, 2, 2, 4>; };

}  // namespace sm80
}  // namespace flashattn
