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
#include "cuda/sink.h"
#include "cuda/softcap.h"
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

// kAlibi: the form that adds ALiBi's term (sh.alibi_slopes set); a compile-time switch, so the kernels
// without it keep the registers and schedule they have without the term's code.
template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast, bool kVarlen = false,
          bool kAlibi = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fwd_kernel(const __grid_constant__ FwdTensorMaps maps,
                                                               const FwdParams p, const FwdSchedule sched,
                                                               bool staged_output) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for another architecture too (sm_80): never launched there (see sm90/api.h).
  __trap();
#else
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  // Mask terms loaded at once (mask_scores): as many as the registers left beside O allow.
  constexpr int kMaskChunk = Cfg::kHeadDim <= 64 ? 32 : Cfg::kHeadDim <= 128 ? 16 : 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* q_smem = base;                                // [kQStages][kColBlocks][kBlockM][64], swizzled
  unsigned char* k_smem = base + Cfg::kQStages * Cfg::kQBytes; // [kStages][kColBlocks][kBlockN][64]
  unsigned char* v_smem = k_smem + kStages * Cfg::kKVBytes;    // [kStages][kColBlocks][kBlockN][64]
  auto& bars = *reinterpret_cast<FwdBarriers<Cfg>*>(base + Cfg::kBarriersOffset);
  static_assert(1024 + Cfg::kBarriersOffset + sizeof(FwdBarriers<Cfg>) <= Cfg::kSmemBytes, "FwdBarriers' space");

  static_assert(!kVarlen || !(kMasked || kKeyEnds || kMulticast), "variable lengths in the plain unmasked kernel");
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
    if (threadIdx.x == 0) produce<T, Cfg, kMasked, kKeyEnds, kMulticast, kVarlen>(maps, bars, q_smem, k_smem, v_smem, p, sched);
    if constexpr (kMulticast) cluster_sync();
    return;
  }
  registers_increase<Cfg::kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int lane = threadIdx.x % 32;
  const bool warp_leader = lane == 0;
  const int row_in_tile = consumer * 64 + ((threadIdx.x / 32) % 4) * 16 + lane / 4;  // this thread's rows: +0, +8
  const unsigned char* q_rows = q_smem + consumer * 64 * 128;  // in Q buffer 0
  int kv_iter = 0, q_iter = 0;  // ring and Q positions, in step with the producer
  // With two Q buffers the consumer warpgroups start staggered: warpgroup c > 0 begins once warpgroup
  // c - 1 has run its first softmax (named barrier 1 + c - 1, used once), so that at every tile's start
  // and end, where a warpgroup's softmax or epilogue has no GEMM of its own to overlap, the tensor
  // cores run another warpgroup's GEMMs. With one Q buffer the Q release would bring them back in step
  // at every tile.
  constexpr bool kStaggered = Cfg::kQStages == 2;
  constexpr int kStaggerBarrier = 1;
  bool stagger_pending = kStaggered && consumer + 1 < Cfg::kConsumers;
  auto release_next_consumer = [&]() {
    if (kStaggered && stagger_pending) {
      named_barrier_arrive(kStaggerBarrier + consumer, 256);
      stagger_pending = false;
    }
  };
  if (kStaggered && consumer > 0) named_barrier_sync(kStaggerBarrier + consumer - 1, 256);
  // The output staging of this warpgroup (named barrier 4 + consumer: after the stagger barriers).
  OutputStaging staging;
  if (Cfg::kStagedOutput && staged_output && !kVarlen) {
    staging.map = &maps.out;
    staging.buffer = base + Cfg::kOutOffset + consumer * Cfg::kOutBytes;
    staging.barrier = 4 + consumer;
  }

  for (;;) {
    // The producer names each tile with its Q stage, whose phase completes also for a tile without
    // visible keys (without bytes), so every tile takes and releases one. The index is read by the
    // warp's leader, the thread that releases the stage, and shuffled to the warp: a read by every lane
    // would not be ordered before the leader's release (racecheck reports it).
    mbar_wait(&bars.q_full[q_iter % Cfg::kQStages], (q_iter / Cfg::kQStages) & 1);
    const int tile = __shfl_sync(0xffffffffu, warp_leader ? bars.q_tile[q_iter % Cfg::kQStages] : 0, 0);
    if (tile < 0) break;
    FwdTile t;
    SeqSpan seq{};  // kVarlen: the tile's sequence, whose own lengths and diagonal `sh` then holds
    if constexpr (kVarlen) {
      FwdVarlenTile decoded{};
      if (warp_leader) decoded = fwd_varlen_tiles<Cfg::kQStages>()[q_iter % Cfg::kQStages];
      shfl_ints_from_lane0(decoded);
      t = decoded.tile;
      seq = decoded.seq;
    } else {
      t = FwdTile::at<kBlockM, kBlockN>(tile, p.shape, sched);
    }
    const AttentionShape seq_shape = kVarlen ? seq.shape(p.shape) : AttentionShape{};
    const AttentionShape& sh = kVarlen ? seq_shape : p.shape;
    // Keys from row_key_end on are masked (seqlen_k, or the row's FwdParams::key_end).
    int row_key_end = sh.seqlen_k;
    if constexpr (kKeyEnds) {
      row_key_end = __shfl_sync(0xffffffffu, warp_leader ? bars.q_key_end[q_iter % Cfg::kQStages] : 0, 0);
      if (row_key_end < 0) {  // a row of the masked launch: nothing to compute or write here
        if (warp_leader) mbar_arrive(&bars.q_empty[q_iter % Cfg::kQStages]);
        ++q_iter;
        release_next_consumer();
        continue;
      }
      t.limit_keys<kBlockN>(row_key_end);
    }
    const int row0 = t.m0 + row_in_tile;
    const int q_stage = q_iter % Cfg::kQStages;
    const unsigned char* q_tile_rows = q_rows + q_stage * Cfg::kQBytes;
    const int first_row = t.m0 + consumer * 64;  // of this warpgroup
    if (first_row >= sh.seqlen_q) {
      // None of this warpgroup's rows exist (in a row's last tile, when the query count leaves the
      // tile's last 64 rows or more empty): it only releases the stages the others read. It starts
      // the next warpgroup first: that one's releases are what refill the stages waited on here.
      release_next_consumer();
      kv_iter += release_tile<T, Cfg, kMasked, kMulticast>(bars, p, t, kv_iter, q_iter, warp_leader);
      ++q_iter;
      continue;
    }
    float o[Cfg::kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
    float s[kBlockN / 2];
    uint32_t prob[kBlockN / 16][4];
    // kPrefetchScores: the scores of a tile's first key block (s holds the second's by then).
    float s_first[Cfg::kPrefetchScores ? kBlockN / 2 : 1];
    float(&s0)[kBlockN / 2] = *[&]() {
      if constexpr (Cfg::kPrefetchScores) {
        return &s_first;
      } else {
        return &s;
      }
    }();
    // S = Q K^T for the key block in `k_tile`, into `scores`.
    auto issue_scores = [&](float(&scores)[kBlockN / 2], const unsigned char* k_tile) {
      issue_qk<T, Cfg, kMasked && Cfg::kHeadDim >= 128, kBlockN, Cfg::kNarrowTail>(scores, q_tile_rows, k_tile);
    };
    // The narrow tail (kNarrowTail) works on the first kTailBlockN keys' share of s and prob only.
    constexpr int kTailN = Cfg::kTailBlockN;
    float(&s_tail)[kTailN / 2] = *reinterpret_cast<float(*)[kTailN / 2]>(&s[0]);
    uint32_t(&prob_tail)[kTailN / 16][4] = *reinterpret_cast<uint32_t(*)[kTailN / 16][4]>(&prob[0][0]);
    OnlineSoftmax<kBlockN> softmax;
    float correction[2];

    // Only blocks past the last key or crossing the causal diagonal need the causal/length mask;
    // with an attention mask, also the blocks whose tile class says so.
    KeyBlockWalk<T, kMasked> walk(p, t, kBlockM);
    // A block n0 needs the length/causal mask when n0 + kBlockN > seqlen_k or (causal) n0 + kBlockN - 1 >
    // first_row + causal_offset; both hold from one block on, so it is one comparison with that block.
    const int last_row_key = first_row + sh.causal_offset;  // the last key this warpgroup's first row sees
    const int edge_block = min(row_key_end / kBlockN,
                               !sh.is_causal ? INT_MAX : last_row_key + 1 >= 0 ? (last_row_key + 1) / kBlockN : 0);
    // Under a sliding window, the blocks before window_edge_block hold keys left of some row's window:
    // block n0 does when n0 < first_row + 63 + causal_offset - window_span (its last row's first key).
    const int last_row_first_key = first_row + 63 + sh.causal_offset - sh.window_span;
    const int window_edge_block =
        sh.window_span < 0 || last_row_first_key <= 0 ? 0 : (last_row_first_key + kBlockN - 1) / kBlockN;
    // Masks block `block`'s scores; returns the scale the softmax must apply to them. A block whose
    // mask tile is a key prefix ending at key_end (>= 0) takes the length test up to key_end instead of
    // its mask elements.
    auto apply_masks = [&](float(&scores)[kBlockN / 2], int block, bool mask_needed, int key_end) {
      const int n0 = block * kBlockN;
      const bool needs_mask = block >= edge_block || block < window_edge_block;
      if constexpr (kMasked) {
        if (key_end >= 0) {
          mask_scores<kBlockN>(scores, n0, row0, lane, sh, key_end);
        } else if (mask_needed || needs_mask) {
          mask_scores<kBlockN, kMaskChunk, T>(scores, n0, row0, lane, sh, walk.mask, mask_needed);
          return 1.f;  // already in base-2 units
        }
      } else {
        if (needs_mask) mask_scores<kBlockN>(scores, n0, row0, lane, sh, row_key_end);
      }
      return sh.scale_log2;
    };
    const bool dropout = kMasked && p.dropout.enabled;
    const bool softcapped = sh.softcap_inner != 0.f;  // cuda/softcap.h: before any mask
    const float alibi = kAlibi ? alibi_slope(sh, t.batch, t.head) : 0.f;  // cuda/alibi.h: after the cap, before masks
    const DropoutRow rng = dropout ? DropoutRow(p.dropout, t.batch, sh.heads_q, t.head) : DropoutRow{};
    auto apply_dropout = [&](float(&scores)[kBlockN / 2], int block) {
      if constexpr (kMasked) {
        if (dropout) drop_probabilities<kBlockN>(scores, rng, row0, block * kBlockN, lane);
      }
    };
    // Visit i (the i-th key block walked) uses ring position kv_iter + i.
    auto stage_of = [&](int i) { return (kv_iter + i) % kStages; };
    auto phase_of = [&](int i) { return ((kv_iter + i) / kStages) & 1; };

    int block = walk.next(t.first_n_block);
    if (block < t.num_n_blocks) {
      bool block_needs = walk.needs_elements(block);
      int block_key_end = block_needs ? walk.prefix_key_end(block, kBlockN, p.mask) : -1;
      mbar_wait(&bars.q_full[q_stage], (q_iter / Cfg::kQStages) & 1);
      // Block 0: S (into s0), softmax, P.
      mbar_wait(&bars.k_full[stage_of(0)], phase_of(0));
      wgmma_fence();
      issue_scores(s0, k_smem + stage_of(0) * Cfg::kKVBytes);
      wgmma_commit();
      // The next block, walked while the GEMM runs (a window refill then waits under it).
      int next = walk.next(block + 1);
      bool next_needs = next < t.num_n_blocks && walk.needs_elements(next);
      int next_key_end = next_needs ? walk.prefix_key_end(next, kBlockN, p.mask) : -1;
      // Block 0's softmax and P, once its S GEMM is done.
      auto first_softmax = [&]() {
        fence_registers(s0);
        if (warp_leader) {
          release_kv_stage<kMulticast>(&bars.k_empty[stage_of(0)]);
          // The tile's last QK^T GEMM is done.
          if (next >= t.num_n_blocks) mbar_arrive(&bars.q_empty[q_stage]);
        }
        if (softcapped) softcap_scores(s0, sh.softcap_inner);
        if constexpr (kAlibi) alibi_scores<kBlockN>(s0, block * kBlockN, row0, lane, alibi, sh.alibi_offset);
        softmax.update(s0, apply_masks(s0, block, block_needs, block_key_end), correction);
        apply_dropout(s0, block);
        release_next_consumer();
        accumulator_to_a<T, kBlockN>(prob, s0);
      };

      int n = 1;  // visits so far
      // Visit n of the tile, block `block`: S_n = Q K_n^T, then O += P_{n-1} V_{n-1}, both running while
      // this warpgroup waits for S_n; then S_n's softmax. The plain variant (kMasked at tile width 64,
      // no dropout) is for blocks inside a plain run, [block, run_end): visible, no mask elements and
      // no length or causal test, so the walk and every mask and dropout test are left out of it. The
      // prefetched variant is visit 1 with kPrefetchScores, whose S GEMM was issued before block 0's
      // softmax.
      int run_end = 0;
      auto visit = [&](auto plain, auto prefetched, auto tail) {
        constexpr bool kPlain = decltype(plain)::value;
        constexpr bool kPrefetched = decltype(prefetched)::value;
        constexpr bool kTail = decltype(tail)::value;  // the row's narrow last block (kNarrowTail)
        const int stage = stage_of(n), prev = stage_of(n - 1);
        if constexpr (!kPrefetched) mbar_wait(&bars.k_full[stage], phase_of(n));
        mbar_wait(&bars.v_full[prev], phase_of(n - 1));
        wgmma_fence();
        if constexpr (kTail) {
          issue_qk<T, Cfg, false, kTailN, true>(s, q_tile_rows, k_smem + stage * Cfg::kKVBytes);
          wgmma_commit();
        } else if constexpr (!kPrefetched) {
          issue_scores(s, k_smem + stage * Cfg::kKVBytes);
          wgmma_commit();
        }
        issue_pv<T, Cfg>(o, prob, v_smem + prev * Cfg::kKVBytes);
        wgmma_commit();
        if (!kPlain || block + 1 == run_end) {
          next = walk.next(block + 1);
          next_needs = next < t.num_n_blocks && walk.needs_elements(next);
          next_key_end = next_needs ? walk.prefix_key_end(next, kBlockN, p.mask) : -1;
        } else {
          next = block + 1;
          next_needs = false;
          next_key_end = -1;
        }
        wgmma_wait<1>();  // S_n is ready; the PV GEMM may still run
        if constexpr (kTail) {
          fence_registers(s_tail);
        } else {
          fence_registers(s);
        }
        if (warp_leader) {
          release_kv_stage<kMulticast>(&bars.k_empty[stage]);
          if (next >= t.num_n_blocks) mbar_arrive(&bars.q_empty[q_stage]);
        }
        bool moved;
        if constexpr (kTail) {
          if (softcapped) softcap_scores(s_tail, sh.softcap_inner);
          if constexpr (kAlibi) alibi_scores<kTailN>(s_tail, block * kBlockN, row0, lane, alibi, sh.alibi_offset);
        } else {
          if (softcapped) softcap_scores(s, sh.softcap_inner);
          if constexpr (kAlibi) alibi_scores<kBlockN>(s, block * kBlockN, row0, lane, alibi, sh.alibi_offset);
        }
        if constexpr (kTail) {  // unmasked launches only: the length mask
          mask_scores<kTailN>(s_tail, block * kBlockN, row0, lane, sh, row_key_end);
          moved = softmax.update(s_tail, sh.scale_log2, correction);
        } else if constexpr (kPlain) {
          moved = softmax.update(s, sh.scale_log2, correction);
        } else {
          moved = softmax.update(s, apply_masks(s, block, block_needs, block_key_end), correction);
          apply_dropout(s, block);
        }
        wgmma_wait<0>();  // the PV GEMM is done with O, P and V_{n-1}
        fence_registers(o);
        fence_registers(prob);
        if (warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[prev]);
        // Warp-uniform, so that the common case (no row of the warp moved its base) skips the multiplies.
        if (__any_sync(0xffffffff, moved)) rescale_rows(o, correction);
        if constexpr (kTail) {
          accumulator_to_a<T, kTailN>(prob_tail, s_tail);
        } else {
          accumulator_to_a<T, kBlockN>(prob, s);
        }
      };
      // The walk's next block becomes the block to visit.
      auto take_next = [&]() {
        block = next;
        block_needs = next_needs;
        block_key_end = next_key_end;
      };
      bool first_done = false;
      if constexpr (Cfg::kPrefetchScores) {
        // Block 1's K stage is waited for before block 0's is released: a ring of one stage would deadlock.
        static_assert(!kMasked && kStages >= 2, "prefetched scores: unmasked launches, two K/V stages or more");
        if (next < t.num_n_blocks) {
          // Block 1's S GEMM, into s where visit 1 finds it, runs under block 0's softmax.
          mbar_wait(&bars.k_full[stage_of(1)], phase_of(1));
          wgmma_fence();  // s was last written by the previous tile's softmax
          issue_scores(s, k_smem + stage_of(1) * Cfg::kKVBytes);
          wgmma_commit();
          wgmma_wait<1>();  // block 0's S is ready
          first_softmax();
          take_next();
          visit(std::false_type{}, std::true_type{}, std::false_type{});
          ++n;
          first_done = true;
        }
      }
      if (!first_done) {
        wgmma_wait<0>();
        first_softmax();
      }
      // With a narrow tail the loop stops before the row's last block, which the launch guarantees is
      // not block 0 and is visited after it.
      const int loop_end = Cfg::kNarrowTail ? t.num_n_blocks - 1 : t.num_n_blocks;
      for (; next < loop_end; ++n) {
        take_next();
        // Plain runs at tile width 64 only: at the wider tiles the second copy of the loop body made
        // ptxas spill more (108 against 72 bytes at width 128).
        if constexpr (kMasked && Cfg::kHeadDim <= 64) {
          if (!dropout && block >= run_end && !block_needs) run_end = walk.plain_run_end(block, edge_block);
          if (block < run_end) {
            visit(std::true_type{}, std::false_type{}, std::false_type{});
            continue;
          }
        }
        visit(std::false_type{}, std::false_type{}, std::false_type{});
      }
      if constexpr (Cfg::kNarrowTail) {
        take_next();
        visit(std::false_type{}, std::false_type{}, std::true_type{});
        ++n;
      }
      const int last = stage_of(n - 1);
      mbar_wait(&bars.v_full[last], phase_of(n - 1));
      wgmma_fence();
      issue_pv<T, Cfg, Cfg::kTailBlockN>(o, prob, v_smem + last * Cfg::kKVBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(o);
      if (warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[last]);
      kv_iter += n;
      ++q_iter;
    } else {
      if (warp_leader) mbar_arrive(&bars.q_empty[q_stage]);
      ++q_iter;
    }
    // Meanwhile the producer is already loading the next tile's Q and first key blocks.
    // This (batch, head)'s output rows [Lq, D] and LSE [Lq]: with kVarlen, from the sequence's first
    // row of the packed out [total_q, Hq, D] and lse [Hq, total_q].
    T* out_rows;
    float* lse_rows;
    if constexpr (kVarlen) {
      out_rows = static_cast<T*>(p.out) + static_cast<int64_t>(seq.q_begin) * p.out_strides.row +
                 t.head * p.out_strides.head;
      lse_rows = p.lse + static_cast<int64_t>(t.head) * p.shape.seqlen_q + seq.q_begin;
    } else {
      out_rows = static_cast<T*>(p.out) + t.batch * p.out_strides.batch + t.head * p.out_strides.head;
      lse_rows = p.lse + (static_cast<int64_t>(t.batch) * sh.heads_q + t.head) * sh.seqlen_q;
    }
    write_epilogue<T, Cfg::kHeadDim, kBlockN>(p, sh, out_rows, lse_rows, o, softmax, t.head, t.batch, row0, first_row,
                                              lane, dropout ? p.dropout.keep_scale : 1.f, sink_log2_of(p, t.head),
                                              staging);
    release_next_consumer();  // a first tile without visible keys
  }
  release_next_consumer();  // no tile at all
  // The shared memory must outlive this warpgroup's last TMA store.
  if (staging.map != nullptr && threadIdx.x % 128 == 0) bulk_wait();
  if constexpr (kMulticast) cluster_sync();
#endif
}

}  // namespace sm90
}  // namespace flashattn
