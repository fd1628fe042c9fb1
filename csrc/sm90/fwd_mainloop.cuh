// The consumer warpgroups' pieces of the sm90 forward: the QK^T and PV GEMMs, the length, causal and
// attention-mask masking of a block's scores, and the release of a tile without rows.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "common/mask.h"
#include "cuda/alibi.h"
#include "cuda/mask_view.h"
#include "params.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_key_walk.h"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_schedule.h"
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
// of the diagonal (and left of a sliding window).
template <int kBlockN>
__device__ __forceinline__ void mask_scores(float (&s)[kBlockN / 2], int n0, int row0, int lane, const AttentionShape& sh,
                                            int key_end) {
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    const int key = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
    const int query = row0 + ((i % 4) / 2) * 8;
    s[i] = key_visible(query, key, key_end, sh.is_causal, sh.causal_offset, sh.window_span) ? s[i] : -INFINITY;
  }
}

// ALiBi's term (cuda/alibi.h) on a block's scores, keys from n0, this thread's rows from row0 (the
// layout of mask_scores): element i is key n0 + 8 (i / 4) + 2 (lane % 4) + i % 2 of query
// row0 + 8 ((i % 4) / 2), so its distance is a per-thread base plus a constant per element.
template <int kBlockN>
__device__ __forceinline__ void alibi_scores(float (&s)[kBlockN / 2], int n0, int row0, int lane, float slope,
                                             int alibi_offset) {
  const float base = static_cast<float>(row0 + alibi_offset - n0 - 2 * (lane % 4));
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    s[i] = add_alibi(s[i], slope, base + static_cast<float>(8 * ((i % 4) / 2) - 8 * (i / 4) - i % 2));
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
            // made ptxas lay out the masked kernel differently. (No sliding window: the host refuses
            // one with a mask.)
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
        const bool visible = key_visible(query, key, sh.seqlen_k, sh.is_causal, sh.causal_offset, sh.window_span);
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
  for (int n = walk.next(t.first_n_block); n < t.num_n_blocks; n = walk.next(n + 1), ++visits) {
    const int stage = (kv_iter + visits) % Cfg::kStages, phase = ((kv_iter + visits) / Cfg::kStages) & 1;
    mbar_wait(&bars.k_full[stage], phase);
    if (warp_leader) release_kv_stage<kMulticast>(&bars.k_empty[stage]);
    mbar_wait(&bars.v_full[stage], phase);
    if (warp_leader) release_kv_stage<kMulticast>(&bars.v_empty[stage]);
  }
  if (warp_leader) mbar_arrive(&bars.q_empty[q_iter % Cfg::kQStages]);
  return visits;
}

}  // namespace sm90
}  // namespace flashattn
