// The tile configuration of the sm90 backward (its tile shape, ring depth, warpgroups and shared-memory
// layout) and its named barriers, for the kernel and for the host code that plans around it.
#pragma once

#include "cuda/dq_accum_layout.h"
#include "params.h"
#include "sm90/ptx.h"

namespace flashattn {
namespace sm90 {

// Named barriers of the backward (0 is __syncthreads): the consumers' own, then one per ring stage
// between the consumer warps and the producer warp (the stage's release).
constexpr int kBwdConsumerBarrier = 1;
constexpr int kBwdStageBarrier0 = 2;
constexpr int kBwdStageBarrierThreads = 256 + 32;  // both consumer warpgroups and the producer warp

// kBlockM_ 128 (width 64 only): a consumer's S^T and dP^T are 64 keys x 128 queries (64 registers
// each), and the consumers split dQ by its rows (each its 64 queries, every head dim) instead of its
// columns.
// Tile width 96 computes 96 head dims in tiles of two 64-column blocks (the second half zero, filled
// so by TMA past the tensor's columns): its consumers' dQ columns come in two pieces each (DqPieces).
template <int kHeadDim_, int kBlockM_ = 64>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;  // tile width (64, 96 or 128), equal to the dq workspace width
  static constexpr int kBlockM = kBlockM_;    // queries per step
  static constexpr int kBlockN = 128;         // keys per CTA: 64 per consumer warpgroup
  static constexpr int kStages = 2;           // Q / dO ring depth (3 measured the same)
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerRegisters = 240;
  // setmaxnreg moves registers within the CTA's launch allocation (384 x 168): the producer warpgroup
  // gives up 128 x (168 - 24), exactly what the consumers take, 256 x (240 - 168).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kColBlocks = (kHeadDim + 63) / 64;  // 64-column blocks of a Q, dO, K or V tile
  static constexpr int kQColBlockBytes = kBlockM * 128;   // one [kBlockM queries][64] column block
  static constexpr int kKVColBlockBytes = kBlockN * 128;  // one [128 keys][64] column block
  static constexpr int kQBytes = kColBlocks * kQColBlockBytes;    // a Q or dO tile
  static constexpr int kKVBytes = kColBlocks * kKVColBlockBytes;  // a K or V tile
  // dS^T of one consumer: [kBlockM / 64 query blocks][64 keys][64 queries] (128-byte swizzled rows).
  // With the consumers splitting dQ by columns, two sets of both consumers' tiles, used by alternate
  // steps by the kernels whose consumers meet once a step (before dQ): a consumer writes the next
  // step's while the other may still read this one's in its dQ GEMM.
  static constexpr int kDsBytes = 64 * kBlockM * 2;
  static constexpr int kDsSetBytes = kConsumers * kDsBytes;
  static constexpr int kDsQueryBlockBytes = 64 * 64 * 2;
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;  // the step's dQ partial, fp32, tile layout
  static constexpr bool kDqByRows = kBlockM == 2 * kDqTileRows;  // each consumer its own 64 queries
  static constexpr int kDsSets = kDqByRows ? 1 : 2;  // (above)
  static constexpr int kDqCols = kDqByRows ? kHeadDim : kHeadDim / kConsumers;  // dQ columns per consumer
  static constexpr int kStatsBytes = 2 * kBlockM * 4;             // a step's LSE (base 2) then delta, fp32
  // K, V, the Q ring, the dO ring, the sets of dS^T per consumer, the dQ staging tiles, the LSE / delta
  // ring, then the mbarriers.
  static constexpr int kVOffset = kKVBytes;
  static constexpr int kQOffset = 2 * kKVBytes;
  static constexpr int kDoOffset = kQOffset + kStages * kQBytes;
  static constexpr int kDsOffset = kDoOffset + kStages * kQBytes;
  // Width 96's unmasked kernels give each step's whole dQ to one consumer, alternate steps to each
  // (bwd_kernel's kDqOwner): a staging tile per consumer.
  static constexpr int kDqTiles = kHeadDim == 96 && !kDqByRows ? 2 : 1;
  static constexpr int kDqOffset = kDsOffset + kDsSets * kDsSetBytes;
  static constexpr int kStatsOffset = kDqOffset + kDqTiles * kDqBytes;
  static constexpr int kBarriersOffset = kStatsOffset + kStages * kStatsBytes;
  static constexpr int kSmemBytes = 1024 + kBarriersOffset + (1 + kStages) * 8;

  static_assert(register_split_fits(kProducerRegisters, kConsumers, kConsumerRegisters), "setmaxnreg split");
  static_assert(kHeadDim % 64 == 0 || kHeadDim == 96, "whole 64-column blocks, or width 96");
  static_assert(kBlockM == kDqTileRows || (kDqByRows && kHeadDim == 64),
                "a step's dQ partial is one block of the dq workspace's tile layout, or (128-query steps, "
                "width 64 only: S^T, dP^T, dK and dV take 192 registers) two, one per consumer");
  static_assert(kConsumers == 2 && (kDqCols == 32 || kDqCols == 64 || kDqCols == 48),
                "each consumer's dQ columns lie in one 64-column block, or (width 96) in two pieces");
  static_assert(kBlockM % kBwdStatsAlign == 0 || kBwdStatsAlign % kBlockM == 0, "steps never cross a stats row");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
  // Per consumer, a barrier of its own warpgroup: its part of the dQ partial staged.
  static constexpr int kDqStagedBarrier0 = kBwdStageBarrier0 + kStages;
  static_assert(kDqStagedBarrier0 + kConsumers <= 16, "16 named barriers per CTA");
};

// The wide backward (bwd_wide_kernel.cuh) for tile widths above 128, where one consumer cannot hold dK
// and dV for all of its keys' head dims: a CTA owns 64 keys; each consumer computes S and dP for 32 of
// them (all queries of the step) and dK, dV and dQ for its 64-column blocks of head dims (all 64 keys):
// consumer 0 the first kDims0 head dims, consumer 1 the other kDims1 (128 each at width 256; 128 and
// 64 at 192, whose 96-dim halves would split a 128-byte swizzled column block).
template <int kHeadDim_>
struct BwdWideConfig {
  static constexpr int kHeadDim = kHeadDim_;  // tile width, equal to the dq workspace width
  static constexpr int kBlockM = 64;          // queries per step
  static constexpr int kBlockN = 64;          // keys per CTA
  static constexpr int kConsumers = 2;
  static constexpr int kKeysPerConsumer = kBlockN / kConsumers;  // S and dP columns of one consumer
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kDims0 = 64 * ((kColBlocks + 1) / 2);  // dK, dV and dQ columns of consumer 0
  static constexpr int kDims1 = kHeadDim - kDims0;            // ... of consumer 1, from column kDims0
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerRegisters = 240;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kQColBlockBytes = kBlockM * 128;   // one [64 queries][64] column block
  static constexpr int kKVColBlockBytes = kBlockN * 128;  // one [64 keys][64] column block
  static constexpr int kQBytes = kColBlocks * kQColBlockBytes;
  static constexpr int kKVBytes = kColBlocks * kKVColBlockBytes;
  static constexpr int kScoreTileBytes = kBlockM * kBlockN * 2;  // P or dS: [64 queries][64 keys]
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;         // the step's dQ partial, fp32 [64][kHeadDim]
  static constexpr int kStatsBytes = 2 * kBlockM * 4;
  // K, V, the Q ring, the dO ring, P, dS, the dQ staging tile, the LSE / delta ring, then the mbarriers.
  static constexpr int bytes_with_stages(int stages) {
    return 1024 + 2 * kKVBytes + 2 * stages * kQBytes + 2 * kScoreTileBytes + kDqBytes + stages * kStatsBytes +
           (1 + stages) * 8;
  }
  // Two stages where they fit (at 256 they do not: the next step's loads then wait for this one's
  // dK and dV GEMMs).
  static constexpr int kStages = bytes_with_stages(2) <= 227 * 1024 ? 2 : 1;
  static constexpr int kVOffset = kKVBytes;
  static constexpr int kQOffset = 2 * kKVBytes;
  static constexpr int kDoOffset = kQOffset + kStages * kQBytes;
  static constexpr int kPOffset = kDoOffset + kStages * kQBytes;
  static constexpr int kDsOffset = kPOffset + kScoreTileBytes;
  static constexpr int kDqOffset = kDsOffset + kScoreTileBytes;
  static constexpr int kStatsOffset = kDqOffset + kDqBytes;
  static constexpr int kBarriersOffset = kStatsOffset + kStages * kStatsBytes;
  static constexpr int kSmemBytes = 1024 + kBarriersOffset + (1 + kStages) * 8;

  static_assert(register_split_fits(kProducerRegisters, kConsumers, kConsumerRegisters), "setmaxnreg split");
  static_assert(kHeadDim % 64 == 0 && kDims1 > 0, "each consumer's head dims are whole 64-column blocks");
  static_assert(kDims0 <= 128, "a consumer's dK and dV take kDims0 registers a thread");
  static_assert(kBlockN == 64, "P and dS rows are one 128-byte swizzle row");
  static_assert(kBlockM == kDqTileRows, "a step's dQ partial is one block of the dq workspace's tile layout");
  static_assert(kBlockM % kBwdStatsAlign == 0 || kBwdStatsAlign % kBlockM == 0, "steps never cross a stats row");
  static_assert(kSmemBytes == bytes_with_stages(kStages) && kSmemBytes <= 227 * 1024, "shared memory per CTA");
  // With an uneven split the consumers run separate copies of the step loop and meet through two
  // barriers (wide_consumers_meet): kBwdConsumerBarrier and this one.
  static constexpr int kSecondConsumerBarrier = kBwdStageBarrier0 + kStages;
  static_assert(kSecondConsumerBarrier < 16, "16 named barriers per CTA");
};

}  // namespace sm90
}  // namespace flashattn
