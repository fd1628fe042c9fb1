// The consumer warpgroups of the sm90 forward: the QK^T and PV GEMMs, the length, causal and
// attention-mask masking of a block's scores, the release of a tile without rows, and the mainloop of
// one tile over its key blocks (FwdTileMainloop).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/mask_view.h"
#include "params.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_key_walk.h"
#include "sm90/fwd_producer.cuh"
#include "sm90/fragments.h"
#include "sm90/fwd_schedule.h"
#include "sm90/fwd_softmax.h"
#include "sm90/ptx.h"
#include "sm90/wgmma.h"

namespace flashattn {
namespace sm90 {

// S (64 x kBlockN per warpgroup) = Q K^T. Both tiles are K-major (head dim contiguous): a k16 step
// advances the start address by 32 bytes inside a 128-byte row, and every 4 steps moves to the next
// column block; the stride byte offset 1024 is the distance between 8-row groups.
//
// kRecomputeQ: build Q's descriptors here at every call from one opaque address, instead of letting
// the compiler keep one per k16 step (2 registers each) live across the key-block loop: the masked
// kernel at tile width 128 and up spilled those and reloaded them from local memory at every GEMM.
//
// kKeys < kBlockN: only the block's first kKeys keys, into s's first kKeys / 2 accumulators (the rest
// keep what they held). kSet: the first k16 step overwrites the accumulators without reading them
// (Wgmma::ss_set), so that s's earlier value need not stay live up to the GEMM.
template <typename T, typename Cfg, bool kRecomputeQ = false, int kKeys = Cfg::kBlockN, bool kSet = false>
__device__ __forceinline__ void issue_qk(float (&scores)[Cfg::kBlockN / 2], const unsigned char* q_rows,
                                         const unsigned char* k_tile) {
  float(&s)[kKeys / 2] = *reinterpret_cast<float(*)[kKeys / 2]>(&scores[0]);
  uint32_t q_addr = smem_u32(q_rows);
  if constexpr (kRecomputeQ) asm volatile("" : "+r"(q_addr));
  const uint64_t desc_q0 = smem_desc_sw128(q_addr, 16, 1024), desc_k0 = smem_desc_sw128(k_tile, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks) {
    const int offset = (ks % 4) * 32;
    const uint64_t desc_q = smem_desc_advance(desc_q0, (ks / 4) * Cfg::kQColBlockBytes + offset);
    const uint64_t desc_k = smem_desc_advance(desc_k0, (ks / 4) * Cfg::kKVColBlockBytes + offset);
    if (kSet && ks == 0) {
      Wgmma<T, kKeys>::ss_set(s, desc_q, desc_k);
    } else {
      Wgmma<T, kKeys>::ss(s, desc_q, desc_k, ks > 0);
    }
  }
}

// O (64 x kHeadDim per warpgroup) += P V. V is [keys][head dim], so B is MN-major: the leading byte
// offset steps between 64-column blocks, the stride byte offset between 8-key groups, and a k16 step
// (16 keys) advances the start by 16 rows of 128 bytes. kKeys < kBlockN: the block's first kKeys keys only.
template <typename T, typename Cfg, int kKeys = Cfg::kBlockN>
__device__ __forceinline__ void issue_pv(float (&o)[Cfg::kHeadDim / 2], uint32_t (&p)[Cfg::kBlockN / 16][4],
                                         const unsigned char* v_tile) {
  const uint64_t desc_v0 = smem_desc_sw128(v_tile, Cfg::kKVColBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint64_t desc_v = smem_desc_advance(desc_v0, kk * 16 * 128);
    Wgmma<T, Cfg::kHeadDim>::rs(o, p[kk], desc_v, 1);
  }
}

// Scores of keys a row may not see become -inf: keys from key_end on (seqlen_k, or the end of a
// key-prefix mask tile; TMA filled keys past seqlen_k with zeros) and, with causal masking, keys right
// of the diagonal.
template <int kBlockN>
__device__ __forceinline__ void mask_scores(float (&s)[kBlockN / 2], int n0, int row0, int lane, const AttentionShape& sh,
                                            int key_end) {
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    const int key = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
    const int query = row0 + ((i % 4) / 2) * 8;
    s[i] = key_visible(query, key, key_end, sh.is_causal, sh.causal_offset) ? s[i] : -INFINITY;
  }
}

// The masked kernel's scores for a block that needs masking: scaled to base-2 units, then
// mask_scores' rule plus the attention mask's base-2 term where `mask_needed`. kChunk of a row's mask
// terms are loaded together before any is used (MaskView::load_terms); a larger chunk waits fewer
// times but holds more registers.
template <int kBlockN, int kChunk, typename T>
__device__ __forceinline__ void mask_scores(float (&s)[kBlockN / 2], int n0, int row0, int lane, const AttentionShape& sh,
                                            const MaskView<T>& mask, bool mask_needed) {
  static_assert((kBlockN / 4) % kChunk == 0 && kChunk % 2 == 0, "whole chunks of key pairs");
  // The common case of a boolean mask with contiguous, even-aligned rows (causal-shaped, padding and
  // block-sparse masks as torch builds them) over a block inside the keys: a thread's keys come in
  // adjacent pairs, 8 keys apart, so one 16-bit load at a fixed offset from the row's address reads
  // both, with no per-element index arithmetic or bounds test.
  const bool pairs = mask_needed && mask.kind == MaskKind::kBool && mask.col_stride == 1 &&
                     ((reinterpret_cast<uintptr_t>(mask.base) | static_cast<uintptr_t>(mask.row_stride)) & 1) == 0 &&
                     n0 + kBlockN <= sh.seqlen_k;
  if (pairs) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query = row0 + half * 8;
      const unsigned char* row =
          mask.base + static_cast<int64_t>(query) * mask.row_stride + n0 + 2 * (lane % 4);  // keys of pair 0
      // kChunk loads in flight, as the general path has kChunk terms.
      constexpr int kPairs = kChunk < kBlockN / 8 ? kChunk : kBlockN / 8;
#pragma unroll
      for (int chunk = 0; chunk < kBlockN / 8; chunk += kPairs) {
        uint32_t pair_bytes[kPairs];  // byte c: key n0 + 8 (chunk + j) + 2 (lane % 4) + c kept (!= 0)
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          // Rows past seqlen_q are computed and never written: not read (all kept, as in the general path).
          pair_bytes[j] = query < sh.seqlen_q ? __ldg(reinterpret_cast<const unsigned short*>(row + 8 * (chunk + j)))
                                              : 0x0101u;
        }
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int key = n0 + (chunk + j) * 8 + (lane % 4) * 2 + c;
            float& x = s[4 * (chunk + j) + 2 * half + c];
            // key_visible's causal half (the block lies inside the keys), as a branch: the bitwise form
            // made ptxas lay out the masked kernel differently.
            const bool visible = ((pair_bytes[j] >> (8 * c)) & 0xffu) != 0 &&
                                 (!sh.is_causal || key <= query + sh.causal_offset);
            x = visible ? x * sh.scale_log2 : -INFINITY;
          }
        }
      }
    }
    return;
  }
  // Elements 4j + 2 half + {0, 1} are keys 8j + 2 (lane % 4) + {0, 1} of row row0 + 8 half; term e of a
  // row is its key n0 + 8 (e / 2) + 2 (lane % 4) + e % 2.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = row0 + half * 8;
    const bool read = mask_needed && query < sh.seqlen_q;
    const int64_t row = static_cast<int64_t>(query) * mask.row_stride;
#pragma unroll
    for (int chunk = 0; chunk < kBlockN / 4; chunk += kChunk) {
      float term[kChunk];
      if (read) {
        mask.template load_terms<kChunk>(
            [&](int e) -> int64_t {
              const int key = n0 + ((chunk + e) / 2) * 8 + (lane % 4) * 2 + e % 2;
              return key < sh.seqlen_k ? row + key * mask.col_stride : -1;
            },
            term);
      } else {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) term[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int pair = (chunk + e) / 2, c = e % 2;
        const int key = n0 + pair * 8 + (lane % 4) * 2 + c;
        float& x = s[4 * pair + 2 * half + c];
        const bool visible = key_visible(query, key, sh.seqlen_k, sh.is_causal, sh.causal_offset);
        x = visible ? x * sh.scale_log2 + term[e] : -INFINITY;
      }
    }
  }
}

// For a consumer warpgroup without rows in tile t: releases Q (whose stage the caller has waited for)
// and waits for and releases every K/V stage of the tile in the producer's order (waiting first keeps
// each arrival in its own phase). Returns the number of key blocks visited.
template <typename T, typename Cfg, bool kMasked, bool kMulticast>
__device__ __forceinline__ int release_tile(FwdBarriers<Cfg>& bars, const FwdParams& p, const FwdTile& t, int kv_iter,
                                            int q_iter, bool warp_leader) {
  KeyBlockWalk<T, kMasked> walk(p, t, Cfg::kBlockM);
  int visits = 0;
  for (int n = walk.next(0); n < t.num_n_blocks; n = walk.next(n + 1), ++visits) {
    const int stage = (kv_iter + visits) % Cfg::kStages, phase = ((kv_iter + visits) / Cfg::kStages) & 1;
    mbar_wait(&bars.k_full[stage], phase);
    if (warp_leader) release_kv_stage<kMulticast>(&bars.k_empty[stage]);
    mbar_wait(&bars.v_full[stage], phase);
    if (warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[stage]);
  }
  if (warp_leader) mbar_arrive(&bars.q_empty[q_iter % Cfg::kQStages]);
  return visits;
}
// A consumer warpgroup's place in the CTA and its positions in the shared rings, kept across tiles.
// With two Q buffers the consumer warpgroups start staggered: warpgroup c > 0 begins once warpgroup
// c - 1 has run its first softmax (named barrier kStaggerBarrier + c - 1, used once), so that at every
// tile's start and end, where a warpgroup's softmax or epilogue has no GEMM of its own to overlap, the
// tensor cores run another warpgroup's GEMMs. With one Q buffer the Q release would bring them back in
// step at every tile.
template <typename Cfg>
struct FwdConsumer {
  static constexpr bool kStaggered = Cfg::kQStages == 2;
  static constexpr int kStaggerBarrier = 1;

  int consumer;              // 0 .. kConsumers - 1
  int lane;
  bool warp_leader;
  int row_in_tile;           // this thread's rows of a tile: +0, +8
  const unsigned char* q_rows;  // this warpgroup's 64 rows in Q buffer 0
  unsigned char* k_smem;     // [kStages][kColBlocks][kBlockN][64]
  unsigned char* v_smem;     // [kStages][kColBlocks][kBlockN][64]
  int kv_iter = 0, q_iter = 0;  // ring and Q positions, in step with the producer
  bool stagger_pending;

  __device__ __forceinline__ FwdConsumer(int consumer_, unsigned char* q_smem, unsigned char* k_smem_,
                                         unsigned char* v_smem_)
      : consumer(consumer_),
        lane(threadIdx.x % 32),
        warp_leader(lane == 0),
        row_in_tile(consumer_ * 64 + ((threadIdx.x / 32) % 4) * 16 + lane / 4),
        q_rows(q_smem + consumer_ * 64 * 128),
        k_smem(k_smem_),
        v_smem(v_smem_),
        stagger_pending(kStaggered && consumer_ + 1 < Cfg::kConsumers) {}

  // Waits for the previous warpgroup's first softmax (staggered start).
  __device__ __forceinline__ void wait_for_turn() const {
    if (kStaggered && consumer > 0) named_barrier_sync(kStaggerBarrier + consumer - 1, 256);
  }
  // Lets the next warpgroup start (once).
  __device__ __forceinline__ void release_next_consumer() {
    if (kStaggered && stagger_pending) {
      named_barrier_arrive(kStaggerBarrier + consumer, 256);
      stagger_pending = false;
    }
  }
};

// One tile of one consumer warpgroup: S = Q K^T, the online softmax and O += P V over the key blocks
// the tile's walk visits, leaving O and the row statistics for the epilogue. Visit n (n >= 1) issues
// S_n = Q K_n^T and O += P_{n-1} V_{n-1}, so that both GEMMs run while this warpgroup waits for S_n, then
// runs S_n's softmax. The plain visit (kMasked at tile width 64, no dropout) is for blocks inside a
// plain run, [block, run_end): visible, no mask elements and no length or causal test, so the walk and
// every mask and dropout test are left out of it. The prefetched visit is visit 1 with
// kPrefetchScores, whose S GEMM was issued before block 0's softmax. The tail visit is a row's narrow
// last block (kNarrowTail).
template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast>
struct FwdTileMainloop {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kTailN = Cfg::kTailBlockN;
  // Mask terms loaded at once (mask_scores): as many as the registers left beside O allow.
  static constexpr int kMaskChunk = Cfg::kHeadDim <= 64 ? 32 : Cfg::kHeadDim <= 128 ? 16 : 8;

  const FwdParams& p;
  const AttentionShape& sh;
  FwdBarriers<Cfg>& bars;
  FwdConsumer<Cfg>& wg;
  const FwdTile& t;
  const int row0, first_row;
  const int row_key_end;  // keys from here on are masked (seqlen_k, or the row's FwdParams::key_end)
  const int q_stage;
  const unsigned char* q_tile_rows;

  float o[Cfg::kHeadDim / 2];
  float s[kBlockN / 2];
  uint32_t prob[kBlockN / 16][4];
  // kPrefetchScores: the scores of a tile's first key block (s holds the second's by then).
  float s_first[Cfg::kPrefetchScores ? kBlockN / 2 : 1];
  OnlineSoftmax<kBlockN> softmax;
  float correction[2];

  // Only blocks past the last key or crossing the causal diagonal need the causal/length mask; with an
  // attention mask, also the blocks whose tile class says so.
  KeyBlockWalk<T, kMasked> walk;
  // A block n0 needs the length/causal mask when n0 + kBlockN > seqlen_k or (causal) n0 + kBlockN - 1 >
  // first_row + causal_offset; both hold from one block on, so it is one comparison with that block.
  const int edge_block;
  const bool dropout;
  const DropoutRow rng;

  // The block being visited and the one the walk found after it, with whether their mask elements are
  // read and, for a key-prefix mask tile, where its keys end (-1 otherwise).
  int block = 0, next = 0;
  bool block_needs = false, next_needs = false;
  int block_key_end = -1, next_key_end = -1;
  int n = 1;        // visits so far
  int run_end = 0;  // one past the current plain run's last block

  __device__ __forceinline__ FwdTileMainloop(const FwdParams& p_, FwdBarriers<Cfg>& bars_, FwdConsumer<Cfg>& wg_,
                                             const FwdTile& t_, int row_key_end_)
      : p(p_),
        sh(p_.shape),
        bars(bars_),
        wg(wg_),
        t(t_),
        row0(t_.m0 + wg_.row_in_tile),
        first_row(t_.m0 + wg_.consumer * 64),
        row_key_end(row_key_end_),
        q_stage(wg_.q_iter % Cfg::kQStages),
        q_tile_rows(wg_.q_rows + (wg_.q_iter % Cfg::kQStages) * Cfg::kQBytes),
        walk(p_, t_, kBlockM),
        edge_block(edge_block_of(t_.m0 + wg_.consumer * 64, row_key_end_, p_.shape)),
        dropout(kMasked && p_.dropout.enabled),
        rng(kMasked && p_.dropout.enabled ? DropoutRow(p_.dropout, t_.batch, p_.shape.heads_q, t_.head) : DropoutRow{}) {
#pragma unroll
    for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
  }

  // The first block that needs the length or causal test (see edge_block).
  __device__ __forceinline__ static int edge_block_of(int first_row, int row_key_end, const AttentionShape& sh) {
    const int last_row_key = first_row + sh.causal_offset;  // the last key the first row sees
    return min(row_key_end / kBlockN,
               !sh.is_causal ? INT_MAX : last_row_key + 1 >= 0 ? (last_row_key + 1) / kBlockN : 0);
  }

  // Visit i (the i-th key block walked) uses ring position kv_iter + i.
  __device__ __forceinline__ int stage_of(int i) const { return (wg.kv_iter + i) % kStages; }
  __device__ __forceinline__ int phase_of(int i) const { return ((wg.kv_iter + i) / kStages) & 1; }

  // Where block 0's scores go: s_first with kPrefetchScores, else s.
  __device__ __forceinline__ float (&first_scores())[kBlockN / 2] {
    if constexpr (Cfg::kPrefetchScores) {
      return s_first;
    } else {
      return s;
    }
  }

  // S = Q K^T for the key block in `k_tile`, into `scores`.
  __device__ __forceinline__ void issue_scores(float (&scores)[kBlockN / 2], const unsigned char* k_tile) {
    issue_qk<T, Cfg, kMasked && Cfg::kHeadDim >= 128, kBlockN, Cfg::kNarrowTail>(scores, q_tile_rows, k_tile);
  }

  // Masks block `block_`'s scores; returns the scale the softmax must apply to them. A block whose mask
  // tile is a key prefix ending at key_end (>= 0) takes the length test up to key_end instead of its
  // mask elements.
  __device__ __forceinline__ float apply_masks(float (&scores)[kBlockN / 2], int block_, bool mask_needed, int key_end) {
    const int n0 = block_ * kBlockN;
    const bool needs_mask = block_ >= edge_block;
    if constexpr (kMasked) {
      if (key_end >= 0) {
        mask_scores<kBlockN>(scores, n0, row0, wg.lane, sh, key_end);
      } else if (mask_needed || needs_mask) {
        mask_scores<kBlockN, kMaskChunk, T>(scores, n0, row0, wg.lane, sh, walk.mask, mask_needed);
        return 1.f;  // already in base-2 units
      }
    } else {
      if (needs_mask) mask_scores<kBlockN>(scores, n0, row0, wg.lane, sh, row_key_end);
    }
    return sh.scale_log2;
  }

  __device__ __forceinline__ void apply_dropout(float (&scores)[kBlockN / 2], int block_) {
    if constexpr (kMasked) {
      if (dropout) drop_probabilities<kBlockN>(scores, rng, row0, block_ * kBlockN, wg.lane);
    }
  }

  // The walk's next block after block_ (plain: block_ + 1 inside a plain run).
  __device__ __forceinline__ void walk_next(int block_) {
    next = walk.next(block_ + 1);
    next_needs = next < t.num_n_blocks && walk.needs_elements(next);
    next_key_end = next_needs ? walk.prefix_key_end(next, kBlockN, p.mask) : -1;
  }

  // The walk's next block becomes the block to visit.
  __device__ __forceinline__ void take_next() {
    block = next;
    block_needs = next_needs;
    block_key_end = next_key_end;
  }

  // Block 0's softmax and P, once its S GEMM is done.
  __device__ __forceinline__ void first_softmax() {
    float(&s0)[kBlockN / 2] = first_scores();
    fence_registers(s0);
    if (wg.warp_leader) {
      release_kv_stage<kMulticast>(&bars.k_empty[stage_of(0)]);
      // The tile's last QK^T GEMM is done.
      if (next >= t.num_n_blocks) mbar_arrive(&bars.q_empty[q_stage]);
    }
    softmax.update(s0, apply_masks(s0, block, block_needs, block_key_end), correction);
    apply_dropout(s0, block);
    wg.release_next_consumer();
    accumulator_to_a<T, kBlockN>(prob, s0);
  }

  template <bool kPlain, bool kPrefetched, bool kTail>
  __device__ __forceinline__ void visit() {
    // The narrow tail works on the first kTailBlockN keys' share of s and prob only.
    float(&s_tail)[kTailN / 2] = *reinterpret_cast<float(*)[kTailN / 2]>(&s[0]);
    uint32_t(&prob_tail)[kTailN / 16][4] = *reinterpret_cast<uint32_t(*)[kTailN / 16][4]>(&prob[0][0]);
    const int stage = stage_of(n), prev = stage_of(n - 1);
    if constexpr (!kPrefetched) mbar_wait(&bars.k_full[stage], phase_of(n));
    mbar_wait(&bars.v_full[prev], phase_of(n - 1));
    wgmma_fence();
    if constexpr (kTail) {
      issue_qk<T, Cfg, false, kTailN, true>(s, q_tile_rows, wg.k_smem + stage * Cfg::kKVBytes);
      wgmma_commit();
    } else if constexpr (!kPrefetched) {
      issue_scores(s, wg.k_smem + stage * Cfg::kKVBytes);
      wgmma_commit();
    }
    issue_pv<T, Cfg>(o, prob, wg.v_smem + prev * Cfg::kKVBytes);
    wgmma_commit();
    if (!kPlain || block + 1 == run_end) {
      walk_next(block);
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
    if (wg.warp_leader) {
      release_kv_stage<kMulticast>(&bars.k_empty[stage]);
      if (next >= t.num_n_blocks) mbar_arrive(&bars.q_empty[q_stage]);
    }
    bool moved;
    if constexpr (kTail) {  // unmasked launches only: the length mask
      mask_scores<kTailN>(s_tail, block * kBlockN, row0, wg.lane, sh, row_key_end);
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
    if (wg.warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[prev]);
    // Warp-uniform, so that the common case (no row of the warp moved its base) skips the multiplies.
    if (__any_sync(0xffffffff, moved)) rescale_rows(o, correction);
    if constexpr (kTail) {
      accumulator_to_a<T, kTailN>(prob_tail, s_tail);
    } else {
      accumulator_to_a<T, kBlockN>(prob, s);
    }
  }

  // The tile's key blocks, from the Q stage's wait to the last PV GEMM; advances the ring positions.
  __device__ __forceinline__ void run() {
    block = walk.next(0);
    if (block >= t.num_n_blocks) {  // no visible key: O stays 0
      if (wg.warp_leader) mbar_arrive(&bars.q_empty[q_stage]);
      ++wg.q_iter;
      return;
    }
    block_needs = walk.needs_elements(block);
    block_key_end = block_needs ? walk.prefix_key_end(block, kBlockN, p.mask) : -1;
    mbar_wait(&bars.q_full[q_stage], (wg.q_iter / Cfg::kQStages) & 1);
    // Block 0: S (into first_scores()), softmax, P.
    mbar_wait(&bars.k_full[stage_of(0)], phase_of(0));
    wgmma_fence();
    issue_scores(first_scores(), wg.k_smem + stage_of(0) * Cfg::kKVBytes);
    wgmma_commit();
    // The next block, walked while the GEMM runs (a window refill then waits under it).
    walk_next(block);
    bool first_done = false;
    if constexpr (Cfg::kPrefetchScores) {
      // Block 1's K stage is waited for before block 0's is released: a ring of one stage would deadlock.
      static_assert(!kMasked && kStages >= 2, "prefetched scores: unmasked launches, two K/V stages or more");
      if (next < t.num_n_blocks) {
        // Block 1's S GEMM, into s where visit 1 finds it, runs under block 0's softmax.
        mbar_wait(&bars.k_full[stage_of(1)], phase_of(1));
        wgmma_fence();  // s was last written by the previous tile's softmax
        issue_scores(s, wg.k_smem + stage_of(1) * Cfg::kKVBytes);
        wgmma_commit();
        wgmma_wait<1>();  // block 0's S is ready
        first_softmax();
        take_next();
        visit<false, true, false>();
        ++n;
        first_done = true;
      }
    }
    if (!first_done) {
      wgmma_wait<0>();
      first_softmax();
    }
    // With a narrow tail the loop stops before the row's last block, which the launch guarantees is not
    // block 0 and is visited after it.
    const int loop_end = Cfg::kNarrowTail ? t.num_n_blocks - 1 : t.num_n_blocks;
    for (; next < loop_end; ++n) {
      take_next();
      // Plain runs at tile width 64 only: at the wider tiles the second copy of the loop body made ptxas
      // spill more.
      if constexpr (kMasked && Cfg::kHeadDim <= 64) {
        if (!dropout && block >= run_end && !block_needs) run_end = walk.plain_run_end(block, edge_block);
        if (block < run_end) {
          visit<true, false, false>();
          continue;
        }
      }
      visit<false, false, false>();
    }
    if constexpr (Cfg::kNarrowTail) {
      take_next();
      visit<false, false, true>();
      ++n;
    }
    const int last = stage_of(n - 1);
    mbar_wait(&bars.v_full[last], phase_of(n - 1));
    wgmma_fence();
    issue_pv<T, Cfg, Cfg::kTailBlockN>(o, prob, wg.v_smem + last * Cfg::kKVBytes);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    if (wg.warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[last]);
    wg.kv_iter += n;
    ++wg.q_iter;
  }
};

}  // namespace sm90
}  // namespace flashattn
