// The producer warp of the sm90 forward: TMA loads of each tile's Q and of its K and V blocks into
// the shared-memory rings, and the mbarriers and tensor maps the roles share.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "params.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_key_walk.h"
#include "sm90/fwd_schedule.h"
#include "sm90/ptx.h"
#include "sm90/tensor_map.h"

namespace flashattn {
namespace sm90 {

struct FwdTensorMaps {
  CUtensorMap q, k, v;  // [B, L, H, D] read in [rows][64] boxes, 128-byte swizzle
  CUtensorMap out;      // [B, Lq, Hq, D] written in [64][64] boxes (configurations with kStagedOutput)
};

// The mbarriers of one CTA, in shared memory after the tiles, and the tile index the producer passes
// with each Q stage (fwd_schedule.h): written before q_full's arrival, read after its wait, rewritten
// only after q_empty's.
template <typename Cfg>
struct FwdBarriers {
  uint64_t q_full[Cfg::kQStages], q_empty[Cfg::kQStages];
  uint64_t k_full[Cfg::kStages], v_full[Cfg::kStages];
  uint64_t k_empty[Cfg::kStages], v_empty[Cfg::kStages];
  int q_tile[Cfg::kQStages];  // -1: no tile is left
  int q_key_end[Cfg::kQStages];  // the kKeyEnds variant: the tile's FwdParams::key_end
};

// The kVarlen variant: what the producer decoded of a Q stage's tile (written and read as
// FwdBarriers::q_tile is), so that its consumers read no list or offsets of their own.
struct FwdVarlenTile {
  FwdTile tile;
  SeqSpan seq;
};
// Broadcasts `value` (a struct of 4-byte fields) from lane 0 to the warp.
template <typename S>
__device__ __forceinline__ void shfl_ints_from_lane0(S& value) {
  static_assert(sizeof(S) % 4 == 0, "whole 4-byte words");
  int words[sizeof(S) / 4];
  memcpy(words, &value, sizeof(S));
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(S) / 4); ++i) words[i] = __shfl_sync(0xffffffffu, words[i], 0);
  memcpy(&value, words, sizeof(S));
}
// Its slots, one per Q stage, in static shared memory (only the kVarlen kernels instantiate it).
template <int kQStages>
__device__ __forceinline__ FwdVarlenTile* fwd_varlen_tiles() {
  __shared__ FwdVarlenTile slots[kQStages];
  return slots;
}

// Whether the variant ends its pairs in a dynamic tail (fwd_schedule.h). Not the masked one: its
// producer, which also walks the mask's tile classes, has no registers to spare for the claim loop in
// its 24 (ptxas spilled at every width; docs/perf-log.md).
template <bool kMasked>
constexpr bool kFwdDynamicTail = !kMasked;

// K/V multicast (kMulticast): the CTAs of a cluster of two run query tiles of one (head, batch) row
// side by side, tile 2u + rank of cluster unit u, so both read the same key blocks in the same order.
// Each CTA's producer loads half of every K and V block (its rank's kBlockN / 2 rows) into both CTAs'
// ring stages with one multicast TMA load, and both halves complete on each CTA's full barrier: L2
// sends each block once per cluster instead of once per CTA. A stage is refilled once the consumers of
// both CTAs have released it, so each consumer warp arrives on its own CTA's empty barrier and on the
// peer's. Used for rows without causal masking, an attention mask or key ends (every tile of a row
// then walks the same key blocks), with an even number of query tiles per row.
template <bool kMulticast>
constexpr int kFwdClusterCtas = kMulticast ? 2 : 1;

// Releases a K or V ring stage whose empty barrier is `empty` (see kMulticast above).
template <bool kMulticast>
__device__ __forceinline__ void release_kv_stage(uint64_t* empty) {
  mbar_arrive(empty);
  if constexpr (kMulticast) mbar_arrive_cluster(empty, cluster_cta_rank() ^ 1u);
}

// Loads key block rows [row, row + kBlockN) of `map` into a ring stage, completing on `full`: the whole
// block, or with kMulticast this CTA's half of it into both CTAs of the cluster (the map's box is then
// kBlockN / 2 rows).
template <typename Cfg, bool kMulticast>
__device__ __forceinline__ void load_kv_block(unsigned char* stage, const CUtensorMap* map, uint64_t* full, int row,
                                              int head, int batch) {
  if constexpr (kMulticast) {
    constexpr int kHalf = Cfg::kBlockN / 2;
    static_assert(kHalf * 128 % 1024 == 0, "each half starts on a swizzle-pattern boundary");
    const int half = static_cast<int>(cluster_cta_rank()) * kHalf;
#pragma unroll
    for (int cb = 0; cb < Cfg::kColBlocks; ++cb) {
      tma_load_4d_multicast(stage + cb * Cfg::kKVColBlockBytes + half * 128, map, full, cb * 64, row + half, head,
                            batch, 0x3);
    }
  } else {
    tma_load_tile<Cfg::kColBlocks>(stage, map, full, row, head, batch, Cfg::kKVColBlockBytes);
  }
}

// Issued by one thread, for every tile of this CTA (its static units, then what it claims of the
// dynamic tail): the tile's index and Q into a Q stage once the consumers have released it, then K_n
// and V_n for every key block, each into its ring stage once the consumers have released the stage's
// previous contents. The ring position runs on across tiles. A tile without visible keys, and the
// final -1, complete their Q stage without bytes.
//
// kVarlen: the tiles are the items of p.varlen's list, the CTA's first item blockIdx.x, each next one
// claimed from p.tile_counter (a greedy schedule over the list's longest-first order); rows are
// addressed in the packed tensors from the sequence's first row.
template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast, bool kVarlen>
__device__ void produce(const FwdTensorMaps& maps, FwdBarriers<Cfg>& bars, unsigned char* q_smem,
                        unsigned char* k_smem, unsigned char* v_smem, const FwdParams& p, const FwdSchedule& sched) {
  const AttentionShape& sh = p.shape;
  int kv_iter = 0, q_iter = 0;
  // Names tile `tile` (-1: none left) to the consumers with the next Q stage, once they have released
  // it, and loads Q and the tile's key blocks into it; a tile without visible keys (and -1) completes
  // the stage without bytes.
  auto run_tile = [&](int tile) {
    // The tile and its first key block (with a mask, an L2 round trip for the class window) before the
    // wait for the Q stage, so that Q's load starts as soon as the stage is free.
    FwdTile t{};
    SeqSpan seq{};  // kVarlen: the tile's sequence
    int key_end = sh.seqlen_k;
    if (tile >= 0) {
      if constexpr (kVarlen) {
        const int2 item = varlen_item(p.varlen, tile);
        seq = SeqSpan::of(p.varlen, item.x);
        t = FwdTile::of_item<Cfg::kBlockM, Cfg::kBlockN>(item, sh, sched, seq);
      } else {
        t = FwdTile::at<Cfg::kBlockM, Cfg::kBlockN>(tile, sh, sched);
      }
      if constexpr (kKeyEnds) {
        key_end = p.key_end[t.batch * sh.heads_q + t.head];
        t.limit_keys<Cfg::kBlockN>(key_end);
      }
    }
    KeyBlockWalk<T, kMasked> walk(p, t, Cfg::kBlockM);
    const bool has_keys = tile >= 0 && walk.next(t.first_n_block) < t.num_n_blocks;
    const int q_stage = q_iter % Cfg::kQStages, q_use = q_iter / Cfg::kQStages;
    if (q_use > 0) mbar_wait(&bars.q_empty[q_stage], (q_use - 1) & 1);
    ++q_iter;
    bars.q_tile[q_stage] = tile;
    if constexpr (kKeyEnds) bars.q_key_end[q_stage] = key_end;
    if constexpr (kVarlen) fwd_varlen_tiles<Cfg::kQStages>()[q_stage] = FwdVarlenTile{t, seq};
    // TMA coordinates: rows of the packed tensors (batch 0) with kVarlen.
    const int q_row = kVarlen ? seq.q_begin + t.m0 : t.m0;
    const int k_row0 = kVarlen ? seq.k_begin : 0;
    const int tma_batch = kVarlen ? 0 : t.batch;
    if (!has_keys) {
      mbar_arrive(&bars.q_full[q_stage]);
      return;
    }
    mbar_arrive_expect_tx(&bars.q_full[q_stage], Cfg::kQBytes);
    tma_load_tile<Cfg::kColBlocks>(q_smem + q_stage * Cfg::kQBytes, &maps.q, &bars.q_full[q_stage], q_row, t.head,
                                   tma_batch, Cfg::kQColBlockBytes);
    // Not unrolled: the producer has 24 registers, and the unrolled copies inlined twice (static and
    // dynamic tiles) spilled. The loop's few extra instructions run in one thread, once per key block.
#pragma unroll 1
    for (int n = walk.next(t.first_n_block); n < t.num_n_blocks; n = walk.next(n + 1), ++kv_iter) {
      const int stage = kv_iter % Cfg::kStages;
      const int use = kv_iter / Cfg::kStages;
      if (use > 0) mbar_wait(&bars.k_empty[stage], (use - 1) & 1);
      mbar_arrive_expect_tx(&bars.k_full[stage], Cfg::kKVBytes);
      load_kv_block<Cfg, kMulticast>(k_smem + stage * Cfg::kKVBytes, &maps.k, &bars.k_full[stage],
                                     k_row0 + n * Cfg::kBlockN, t.kv_head, tma_batch);
      if (use > 0) mbar_wait(&bars.v_empty[stage], (use - 1) & 1);
      mbar_arrive_expect_tx(&bars.v_full[stage], Cfg::kKVBytes);
      load_kv_block<Cfg, kMulticast>(v_smem + stage * Cfg::kKVBytes, &maps.v, &bars.v_full[stage],
                                     k_row0 + n * Cfg::kBlockN, t.kv_head, tma_batch);
    }
  };
  if constexpr (kVarlen) {
    const int items = *p.varlen.tile_count;
    for (int item = blockIdx.x; item < items; item = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1)) {
      run_tile(item);
    }
    run_tile(-1);
    return;
  }
  if constexpr (kMulticast) {  // one tile per unit (no causal pairs), two units per cluster unit
    const int rank = static_cast<int>(cluster_cta_rank());
    for (int u = blockIdx.x / 2; u < sched.static_units / 2; u += gridDim.x / 2) run_tile(2 * u + rank);
    run_tile(-1);
    return;
  }
  // With FwdParams::masked_rows (the masked variant), only the listed rows' units, dealt out alike.
  const bool listed_rows = kMasked && p.masked_rows != nullptr;
  const int units = listed_rows ? *p.masked_row_count * sched.units_per_head : sched.static_units;
  for (int v = blockIdx.x; v < units; v += gridDim.x) {
    int unit = v;
    if (listed_rows) {
      const int row = sched.by_units_per_head.div(v);
      unit = p.masked_rows[row] * sched.units_per_head + (v - row * sched.units_per_head);
    }
    for (int i = 0; i < sched.tiles_in(unit); ++i) run_tile(sched.tile(unit, i));
  }
  if (kFwdDynamicTail<kMasked> && sched.dynamic_tiles > 0) {
    for (int claim = 0; claim < sched.dynamic_tiles;) {
      claim = atomicAdd(p.tile_counter, 1);
      run_tile(claim < sched.dynamic_tiles ? sched.dynamic_tile(claim) : -1);
    }
  } else {
    run_tile(-1);
  }
}

}  // namespace sm90
}  // namespace flashattn
