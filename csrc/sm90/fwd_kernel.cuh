// Forward attention on the sm90 path: TMA, mbarriers, wgmma and warp specialisation (sm_90a only).
//
// Persistent CTAs (at most one per SM) walk the tiles, (64 x kConsumers-query block, query head,
// batch), in pairs of equal causal cost where tiles differ in cost, the last rows' tiles one by one
// from a shared counter (fwd_schedule.h). 1 + kConsumers
// warpgroups (kConsumers = 2, or 3 for the long rows of LongRowFwdConfig):
//   warpgroup 0, the producer: one thread issues TMA loads of each tile's Q block and of its K and V
//     blocks into rings of kStages shared-memory stages. A stage is "full" when its bytes have landed
//     (an mbarrier with the transaction count) and "empty" when every consumer warp is done with it.
//     The producer gives most of its registers to the consumers (setmaxnreg).
//   warpgroups 1.., the consumers: each owns 64 query rows. Per key block n:
//     S = Q K_n^T (wgmma, both operands in shared memory), then the online softmax in registers, then
//     O += P V_n (wgmma, P from registers). The QK^T GEMM of block n + 1 is issued before the PV GEMM
//     of block n, so the softmax of block n + 1 overlaps the PV GEMM on the tensor cores.
//   The epilogue (fwd_epilogue.h) divides O by the row sums and writes the LSE from registers and O
//   through a shared-memory buffer and a TMA store (widths 64-128 without a mask; else from registers),
//   while the producer already loads the CTA's next tile. The online softmax is in fwd_softmax.h.
// The kMulticast variant runs as clusters of two CTAs that share every K and V block through
// multicast TMA loads (rows without causal masking; see kFwdClusterCtas below).
//
// The kMasked variant applies params.mask: producer and consumers walk only the key blocks whose tile
// class lets some key through (the same walk on both sides, so the rings stay in step), and blocks
// whose class needs it add the mask element by element. Those blocks' scores are scaled to base-2
// units before the softmax (which then runs them with scale 1): a huge mask value such as finfo.min
// must not meet the fused scale-and-subtract of raw scores, whose rounding residual at 1e30 is itself
// about 1e22. Blocks the mask leaves alone go through the softmax as raw scores, as without a mask.
// The kKeyEnds variant (no mask, no dropout) runs each (batch, head) row over its first
// FwdParams::key_end keys, the key-length form of a padding mask, and leaves out the rows whose
// key_end is -1 (not even their output is written): the masked variant, walking only those rows
// (FwdParams::masked_rows), runs them in a launch of its own.
// The kMasked variant also applies dropout (params.dropout, with or without a mask): after the softmax has summed P, each
// probability is kept or zeroed by the keep-mask of common/dropout.h (this overlaps the PV GEMM of
// the previous block), and the epilogue scales O by 1 / (1 - p).
//
// Shared tiles use the 128-byte swizzle: a [rows][kHeadDim] tile is stored as column blocks of
// [rows][64] elements (128 bytes per row), which TMA writes and wgmma reads through descriptors.
// Columns past the real head dim, and rows past the sequence ends, are zero-filled by TMA.
#pragma once
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"
#include "params.h"
#include "sm90/fragments.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_epilogue.h"
#include "sm90/fwd_key_walk.h"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_schedule.h"
#include "sm90/fwd_softmax.h"
#include "sm90/ptx.h"

namespace flashattn {
namespace sm90 {

template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fwd_kernel(const __grid_constant__ FwdTensorMaps maps,
                                                               const FwdParams p, const FwdSchedule sched,
                                                               bool staged_output) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for another architecture too (sm_80): never launched there (see sm90/api.h).
  __trap();
#else
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* q_smem = base;                                // [kQStages][kColBlocks][kBlockM][64], swizzled
  unsigned char* k_smem = base + Cfg::kQStages * Cfg::kQBytes; // [kStages][kColBlocks][kBlockN][64]
  unsigned char* v_smem = k_smem + kStages * Cfg::kKVBytes;    // [kStages][kColBlocks][kBlockN][64]
  auto& bars = *reinterpret_cast<FwdBarriers<Cfg>*>(base + Cfg::kBarriersOffset);
  static_assert(1024 + Cfg::kBarriersOffset + sizeof(FwdBarriers<Cfg>) <= Cfg::kSmemBytes, "FwdBarriers' space");

  const AttentionShape& sh = p.shape;
  // Broadcast from lane 0: the compiler then knows the value is the same across the warp, so what
  // derives from it (each consumer's shared-memory tile addresses, its wgmma descriptors) lives in
  // uniform registers instead of being moved there before every wgmma.
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    for (int i = 0; i < Cfg::kQStages; ++i) {
      mbar_init(&bars.q_full[i], 1);
      mbar_init(&bars.q_empty[i], Cfg::kConsumers * 4);  // one arrival per consumer warp
    }
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&bars.k_full[i], 1);
      mbar_init(&bars.v_full[i], 1);
      // One arrival per consumer warp of each CTA that reads the stage.
      mbar_init(&bars.k_empty[i], Cfg::kConsumers * 4 * kFwdClusterCtas<kMulticast>);
      mbar_init(&bars.v_empty[i], Cfg::kConsumers * 4 * kFwdClusterCtas<kMulticast>);
    }
    mbar_fence_init();
  }
  // With multicast, the peer's loads and arrivals reach this CTA's barriers: both CTAs' must be
  // initialised first. And at the end no CTA may exit while the other can still arrive on its barriers.
  if constexpr (kMulticast) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {
    registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0) produce<T, Cfg, kMasked, kKeyEnds, kMulticast>(maps, bars, q_smem, k_smem, v_smem, p, sched);
    if constexpr (kMulticast) cluster_sync();
    return;
  }
  registers_increase<Cfg::kConsumerRegisters>();

  FwdConsumer<Cfg> wg(warpgroup - 1, q_smem, k_smem, v_smem);
  wg.wait_for_turn();
  // The output staging of this warpgroup (named barrier 4 + consumer: after the stagger barriers).
  OutputStaging staging;
  if (Cfg::kStagedOutput && staged_output) {
    staging.map = &maps.out;
    staging.buffer = base + Cfg::kOutOffset + wg.consumer * Cfg::kOutBytes;
    staging.barrier = 4 + wg.consumer;
  }

  for (;;) {
    // The producer names each tile with its Q stage, whose phase completes also for a tile without
    // visible keys (without bytes), so every tile takes and releases one. The index is read by the
    // warp's leader, the thread that releases the stage, and shuffled to the warp: a read by every lane
    // would not be ordered before the leader's release (racecheck reports it).
    mbar_wait(&bars.q_full[wg.q_iter % Cfg::kQStages], (wg.q_iter / Cfg::kQStages) & 1);
    const int tile = __shfl_sync(0xffffffffu, wg.warp_leader ? bars.q_tile[wg.q_iter % Cfg::kQStages] : 0, 0);
    if (tile < 0) break;
    FwdTile t = FwdTile::at<kBlockM, kBlockN>(tile, sh, sched);
    // Keys from row_key_end on are masked (seqlen_k, or the row's FwdParams::key_end).
    int row_key_end = sh.seqlen_k;
    if constexpr (kKeyEnds) {
      row_key_end = __shfl_sync(0xffffffffu, wg.warp_leader ? bars.q_key_end[wg.q_iter % Cfg::kQStages] : 0, 0);
      if (row_key_end < 0) {  // a row of the masked launch: nothing to compute or write here
        if (wg.warp_leader) mbar_arrive(&bars.q_empty[wg.q_iter % Cfg::kQStages]);
        ++wg.q_iter;
        wg.release_next_consumer();
        continue;
      }
      t.limit_keys<kBlockN>(row_key_end);
    }
    if (t.m0 + wg.consumer * 64 >= sh.seqlen_q) {
      // None of this warpgroup's rows exist (in a row's last tile, when the query count leaves the
      // tile's last 64 rows or more empty): it only releases the stages the others read. It starts
      // the next warpgroup first: that one's releases are what refill the stages waited on here.
      wg.release_next_consumer();
      wg.kv_iter += release_tile<T, Cfg, kMasked, kMulticast>(bars, p, t, wg.kv_iter, wg.q_iter, wg.warp_leader);
      ++wg.q_iter;
      continue;
    }
    FwdTileMainloop<T, Cfg, kMasked, kKeyEnds, kMulticast> mainloop(p, bars, wg, t, row_key_end);
    mainloop.run();
    // Meanwhile the producer is already loading the next tile's Q and first key blocks.
    write_epilogue<T, Cfg::kHeadDim, kBlockN>(p, mainloop.o, mainloop.softmax, t.head, t.batch, mainloop.row0,
                                              mainloop.first_row, wg.lane,
                                              mainloop.dropout ? p.dropout.keep_scale : 1.f, staging);
    wg.release_next_consumer();  // a first tile without visible keys
  }
  wg.release_next_consumer();  // no tile at all
  // The shared memory must outlive this warpgroup's last TMA store.
  if (staging.map != nullptr && threadIdx.x % 128 == 0) bulk_wait();
  if constexpr (kMulticast) cluster_sync();
#endif
}

}  // namespace sm90
}  // namespace flashattn
