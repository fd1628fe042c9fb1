// Backward attention on the sm90 path: TMA, mbarriers, wgmma and warp specialisation (sm_90a only).
//
// The same three launches as the sm80 backward: the preprocess kernel (cuda/bwd_aux.cuh: delta =
// rowsum(dO * O) and the LSE in base 2), this main kernel, and the dq conversion kernel.
//
// Main kernel: one CTA per (128-key block, kv head, batch), three warpgroups.
//   Warpgroup 0, the producer: its first warp loads the CTA's K and V blocks once (TMA, one thread),
//     then for every step (query head of the GQA group x kBlockM-query block that sees these keys: 64
//     queries, or 128 in the unmasked kernel at width 64, BwdConfig) Q and dO
//     (TMA) and the step's LSE and delta (ordinary loads and shared stores, 16 bytes per lane, so no
//     stage that consumers read with ordinary loads is rewritten by the async proxy) into a ring of
//     kStages stages. Each stage is released by the consumer warps when their GEMMs are done with it,
//     through a named barrier per stage (consumers bar.arrive, the producer warp bar.syncs before
//     refilling the stage), which orders every consumer thread's reads of LSE and delta before the
//     producer's stores.
//   Warpgroups 1 and 2, the consumers: each owns 64 of the keys:
//     S^T = K Q^T and dP^T = V dO^T (wgmma from shared memory), P^T = exp2(S^T scale - LSE) and
//     dS^T = P^T (dP^T - delta) in registers; dV += P^T dO and dK += dS^T Q with P^T, dS^T as register
//     A operands (dK, dV stay in registers for the whole CTA). dS^T is also written to shared memory
//     (swizzled; two sets of tiles, alternate steps), and once both consumers' tiles are there (the
//     consumers' one meeting a step) each computes half the columns of dQ_partial = dS K over all 128
//     keys (with 128-query steps: the rows of its own 64 queries) into its part of one fp32 staging
//     tile, while its dK GEMM runs. Each consumer's first warp adds its part into the dq workspace with
//     asynchronous bulk reductions (one per 128 keys, not per 64) or, in deterministic mode, hands it to
//     the producer warpgroup's second warp, which takes the turns and adds the whole tile
//     (sm90/bwd_dq_writer.h). The masked forms and the 128-query kernel at width 64 meet a second time
//     instead (dV and dK issued together after the first meeting), and one warp adds the tile.
// The kMasked variant applies params.mask (its tile classes on this kernel's 64-query x 128-key grid):
// producer and consumers walk only the steps whose tile lets some key through (the same walk on both
// sides, so the ring stays in step), steps whose tile needs it add the mask element by element to the
// scores, and dS is written to params.dmask when that is set (the mask's gradient). Its kDropout
// form also applies params.dropout (with or without a mask; sm90/bwd_dropout.h).
// With BwdParams::key_end (a padding mask whose rows are key prefixes), the masked kernel leaves the
// (batch, kv head) groups with a key_end >= 0 to a second launch, the kKeyEnds variant (no mask), which
// runs them over their first key_end keys; each launch writes only its own groups' dK and dV.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/mask.h"
#include "params.h"
#include "cuda/bwd_aux.cuh"
#include "cuda/dq_accum_layout.h"
#include "cuda/element_ops.h"
#include "cuda/gpu_scope.h"
#include "cuda/varlen.h"
#include "cuda/varlen_schedule.h"
#include "cuda/mask_view.h"
#include "cuda/alibi.h"
#include "cuda/softcap.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_dq_writer.h"
#include "sm90/bwd_dropout.h"
#include "sm90/class_bits.h"
#include "sm90/fragments.h"
#include "sm90/ptx.h"
#include "sm90/tensor_map.h"
#include "sm90/wgmma.h"

namespace flashattn {
namespace sm90 {

struct BwdTensorMaps {
  CUtensorMap q, k, v, dout;  // [B, L, H, D] read in [rows][64] boxes, 128-byte swizzle
};

template <typename Cfg>
struct BwdBarriers {
  uint64_t kv_full;
  uint64_t qdo_full[Cfg::kStages];
};

// The steps of one CTA: every query head of the kv head's group times every query block that sees at
// least one of the CTA's keys (under causal masking the blocks above the diagonal see none).
struct BwdSteps {
  int m_begin, num_m, group;
  __device__ __forceinline__ int count() const { return group * num_m; }
  __device__ __forceinline__ int head(int step, int kv_head) const { return kv_head * group + step / num_m; }
  template <int kBlockM>
  __device__ __forceinline__ int m0(int step) const { return (m_begin + step % num_m) * kBlockM; }
};

// The key block a CTA owns (n0 = n_block * kBlockN its first key): n_block varies fastest in blockIdx.x,
// then the kv head, then the batch; n_block runs in decreasing order in deterministic mode under causal
// masking (the order of its dq turns, DqTurns).
struct BwdKeyBlock {
  int n_block, kv_head, batch, n0;
};
template <int kBlockN>
__device__ __forceinline__ BwdKeyBlock bwd_key_block(const BwdParams& p) {
  const AttentionShape& sh = p.shape;
  const int num_n_blocks = (sh.seqlen_k + kBlockN - 1) / kBlockN;
  const int n = static_cast<int>(blockIdx.x % num_n_blocks);
  BwdKeyBlock b;
  b.n_block = p.deterministic && sh.is_causal ? num_n_blocks - 1 - n : n;
  b.kv_head = static_cast<int>((blockIdx.x / num_n_blocks) % sh.heads_kv);
  b.batch = static_cast<int>(blockIdx.x / num_n_blocks / sh.heads_kv);
  b.n0 = b.n_block * kBlockN;
  return b;
}

// Where a CTA's rows live: the packed row of its sequence's first query and key and the batch index
// of the q- and k-shaped tensors, both as a TMA coordinate and in pointer arithmetic (a variable-length
// batch: the sequence's rows in the packed tensors, batch 0, not the sequence's index; else batch
// `batch` from row 0), and the statistics / dq workspace index of its query 0 for query head 0 and
// per query head.
struct BwdRows {
  int q_row0, k_row0, tensor_batch;
  int64_t stats0, stats_head_stride;
  __device__ __forceinline__ int64_t stats(int head) const { return stats0 + head * stats_head_stride; }
};
__device__ __forceinline__ BwdRows bwd_batched_rows(const BwdParams& p, int batch) {
  return BwdRows{0, 0, batch, static_cast<int64_t>(batch) * p.shape.heads_q * p.stats_stride, p.stats_stride};
}
// Sequence b of p.varlen (span `seq`).
__device__ __forceinline__ BwdRows bwd_varlen_rows(const BwdParams& p, int b, const SeqSpan& seq) {
  return BwdRows{seq.q_begin, seq.k_begin, 0, varlen_workspace_row(seq.q_begin, b, p.varlen.workspace_align),
                 p.varlen.workspace_rows};
}
// The key block of item `index` of p.varlen's list: (sequence, key block * heads_kv + kv head).
template <int kBlockN>
__device__ __forceinline__ BwdKeyBlock bwd_varlen_key_block(const BwdParams& p, int index) {
  const int2 item = varlen_item(p.varlen, index);
  BwdKeyBlock block;
  block.batch = item.x;
  block.n_block = item.y / p.shape.heads_kv;
  block.kv_head = item.y - block.n_block * p.shape.heads_kv;
  block.n0 = block.n_block * kBlockN;
  return block;
}

// The CTA's key block and where its rows live: item blockIdx.x of p.varlen's list (kVarlen; seq gets its
// sequence's span, and false comes back past the list's end, the grid being the list's capacity) or the
// batched grid's block.
template <int kBlockN, bool kVarlen>
__device__ __forceinline__ bool bwd_cta_block(const BwdParams& p, BwdKeyBlock& block, SeqSpan& seq, BwdRows& rows) {
  if constexpr (kVarlen) {
    if (static_cast<int>(blockIdx.x) >= *p.varlen.tile_count) return false;
    block = bwd_varlen_key_block<kBlockN>(p, blockIdx.x);
    seq = SeqSpan::of(p.varlen, block.batch);
    rows = bwd_varlen_rows(p, block.batch, seq);
  } else {
    block = bwd_key_block<kBlockN>(p);
    rows = bwd_batched_rows(p, block.batch);
  }
  return true;
}

// The steps of the key block of kBlockN keys starting at key n0: every query head of its GQA group times
// the kBlockM-query blocks from the first that sees key n0 to the last that sees the block's last key
// (a sliding window's; else the last block), none when no query sees the block.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ BwdSteps bwd_steps(const AttentionShape& sh, int n0) {
  BwdSteps steps;
  steps.group = sh.heads_q / sh.heads_kv;
  const int first_query = first_query_seeing(n0, sh.is_causal, sh.causal_offset);
  const int query_end =
      last_query_seeing_end(min(n0 + kBlockN, sh.seqlen_k) - 1, sh.seqlen_q, sh.causal_offset, sh.window_span);
  steps.m_begin = first_query / kBlockM;
  steps.num_m = first_query < query_end ? (query_end + kBlockM - 1) / kBlockM - steps.m_begin : 0;
  return steps;
}

// The steps a CTA runs: from step i on, the first one whose mask tile does not exclude every element
// (every step without a mask); steps.count() when none is left. The classes of kClassWindow steps
// are read at once (independent loads, one memory round trip) into bit sets: a class read between the
// GEMMs of every step stalled the consumers for a round trip each time.
template <typename T, bool kMasked>
struct BwdStepWalk {
  const BwdParams& p;
  const BwdSteps& steps;
  int kv_head, batch, n_block;
  ClassBits bits;  // the window of steps last loaded

  __device__ __forceinline__ MaskView<T> mask(int step) const {
    return MaskView<T>(p.mask, batch, steps.head(step, kv_head), steps.m_begin + step % steps.num_m);
  }
  // Fills the bit sets with steps [first, first + kClassWindow) (p.mask.tile_class set, first <
  // steps.count()); steps past the last are never visible.
  __device__ __forceinline__ void load_window(int first) {
    bits.first = first;
    bits.visible = bits.needs = bits.prefix = 0;
    const MaskParams& m = p.mask;
    const unsigned char* column = m.tile_class + batch * m.class_batch_stride + n_block;
    // Step s is query tile m_begin + s % num_m of head kv_head * group + s / num_m: walked
    // incrementally from `first` (one division per window).
    int tile = first % steps.num_m, head = steps.head(first, kv_head);
#pragma unroll
    for (int i = 0; i < kClassWindow; ++i) {
      if (first + i < steps.count()) {
        const uint32_t c = column[head * m.class_head_stride +
                                  static_cast<int64_t>(steps.m_begin + tile) * m.class_row_stride];
        bits.visible |= (c & kTileAnyVisible) << i;
        bits.needs |= ((c & kTileNeedsMask) ? 1u : 0u) << i;
        bits.prefix |= ((c & kTileKeyPrefix) ? 1u : 0u) << i;
      }
      if (++tile == steps.num_m) {
        tile = 0;
        ++head;
      }
    }
  }
  __device__ __forceinline__ int next(int step) {
    if constexpr (kMasked) {
      if (p.mask.tile_class != nullptr) {
        return bits.next_visible(step, steps.count(), [&](int s) { load_window(s); });
      }
    }
    return step;
  }
  // For step `step` (as needs_elements, which it holds for): one past the last key of the CTA's block
  // that its tile keeps when the tile is a key prefix (a length test then replaces the elements), else
  // -1.
  __device__ __forceinline__ int prefix_key_end(int step, int block_n) const {
    if constexpr (kMasked) {
      if (p.mask.tile_class != nullptr && bits.is_prefix(step)) {
        const MaskParams& m = p.mask;
        const int64_t at = batch * m.class_batch_stride + steps.head(step, kv_head) * m.class_head_stride +
                           static_cast<int64_t>(steps.m_begin + step % steps.num_m) * m.class_row_stride + n_block;
        return n_block * block_n + m.tile_key_count[at];
      }
    }
    return -1;
  }
  // Whether the mask's elements of step `step` (the last step next() returned, < steps.count()) must be
  // read.
  __device__ __forceinline__ bool needs_elements(int step) const {
    if constexpr (kMasked) {
      return p.mask.kind != MaskKind::kNone &&
             (p.mask.tile_class == nullptr || bits.needs_elements(step));
    }
    return false;
  }
};

// Run by the 32 lanes of the producer warp; lane 0 issues the TMA loads.
template <typename T, typename Cfg, bool kMasked, bool kVarlen>
__device__ void produce_bwd(const BwdParams& p, const BwdTensorMaps& maps, BwdBarriers<Cfg>& bars, unsigned char* base,
                            int n0, int kv_head, int batch, const BwdSteps& steps, BwdStepWalk<T, kMasked> walk,
                            const BwdRows& rows) {
  // A step's LSE and delta are kStatsVectors float4 per producer lane.
  constexpr int kStatsVectors = Cfg::kBlockM / 64;
  static_assert(Cfg::kBlockM % 64 == 0, "whole float4s per lane");
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    mbar_arrive_expect_tx(&bars.kv_full, 2 * Cfg::kKVBytes);
    tma_load_tile<Cfg::kColBlocks>(base, &maps.k, &bars.kv_full, rows.k_row0 + n0, kv_head, rows.tensor_batch,
                                   Cfg::kKVColBlockBytes);
    tma_load_tile<Cfg::kColBlocks>(base + Cfg::kVOffset, &maps.v, &bars.kv_full, rows.k_row0 + n0, kv_head,
                                   rows.tensor_batch, Cfg::kKVColBlockBytes);
  }
  // Lanes 0-15 carry the step's LSE (base 2), lanes 16-31 its delta (which starts kBlockM * 4 bytes
  // into the stage): entries 4 (lane % 16) + 64 v of vector v.
  const float* stats_source = lane < 16 ? p.lse_log2 : p.delta;
  const uint32_t stats_target = smem_u32(base + Cfg::kStatsOffset) + lane * 16 + (lane / 16) * (Cfg::kBlockM - 64) * 4;
  int iter = 0;  // steps run so far: picks the ring stage
  for (int step = walk.next(0); step < steps.count(); step = walk.next(step + 1), ++iter) {
    const int stage = iter % Cfg::kStages;
    const int use = iter / Cfg::kStages;
    const int head = steps.head(step, kv_head);
    const int m0 = steps.m0<Cfg::kBlockM>(step);
    // The padded statistics rows (see BwdParams) make every step's kBlockM entries whole and 16-byte
    // aligned.
    // Loaded before the wait for the stage, so the wait hides the load's latency.
    const int64_t stats_row =
        kVarlen ? rows.stats(head) + m0 : (static_cast<int64_t>(batch) * p.shape.heads_q + head) * p.stats_stride + m0;
    float4 stats[kStatsVectors];
#pragma unroll
    for (int v = 0; v < kStatsVectors; ++v) {
      stats[v] = __ldg(reinterpret_cast<const float4*>(stats_source + stats_row) + lane % 16 + 16 * v);
    }
    if (use > 0) named_barrier_sync(kBwdStageBarrier0 + stage, kBwdStageBarrierThreads);
    if (lane == 0) {
      mbar_expect_tx(&bars.qdo_full[stage], 2 * Cfg::kQBytes);
      tma_load_tile<Cfg::kColBlocks>(base + Cfg::kQOffset + stage * Cfg::kQBytes, &maps.q, &bars.qdo_full[stage],
                                     rows.q_row0 + m0, head, rows.tensor_batch, Cfg::kQColBlockBytes);
      tma_load_tile<Cfg::kColBlocks>(base + Cfg::kDoOffset + stage * Cfg::kQBytes, &maps.dout,
                                     &bars.qdo_full[stage], rows.q_row0 + m0, head, rows.tensor_batch,
                                     Cfg::kQColBlockBytes);
    }
#pragma unroll
    for (int v = 0; v < kStatsVectors; ++v) st_shared_f32x4(stats_target + stage * Cfg::kStatsBytes + v * 256, stats[v]);
    mbar_arrive(&bars.qdo_full[stage]);  // releases this lane's store
  }
  // The consumers release every stage they use, the last kStages uses included: complete those
  // barriers too, so none is left half-arrived when the CTA exits.
  for (int i = max(iter - Cfg::kStages, 0); i < iter; ++i) {
    named_barrier_sync(kBwdStageBarrier0 + i % Cfg::kStages, kBwdStageBarrierThreads);
  }
}

// X^T Y^T-shaped GEMM of one consumer: acc (64 keys x kBlockM queries) = rows of `kv` (64 keys x D, a
// K-major tile) times a [kBlockM queries][D] K-major tile, transposed. Used for S^T = K Q^T and dP^T =
// V dO^T.
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_keys_by_queries(float (&acc)[Cfg::kBlockM / 2], uint32_t kv_rows,
                                                      uint32_t q_tile) {
  const uint64_t desc_a0 = smem_desc_sw128(kv_rows, 16, 1024), desc_b0 = smem_desc_sw128(q_tile, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks) {
    const int offset = (ks % 4) * 32;
    const uint64_t desc_a = smem_desc_advance(desc_a0, (ks / 4) * Cfg::kKVColBlockBytes + offset);
    const uint64_t desc_b = smem_desc_advance(desc_b0, (ks / 4) * Cfg::kQColBlockBytes + offset);
    Wgmma<T, Cfg::kBlockM>::ss(acc, desc_a, desc_b, ks > 0);
  }
}

// acc (64 keys x D) += A (64 keys x kBlockM queries, registers) times a [kBlockM queries][D] tile
// (MN-major B). Used for dV += P^T dO and dK += dS^T Q.
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_keys_by_dims(float (&acc)[Cfg::kHeadDim / 2],
                                                   uint32_t (&a)[Cfg::kBlockM / 16][4], uint32_t q_tile) {
  const uint64_t desc_b0 = smem_desc_sw128(q_tile, Cfg::kQColBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk) {
    const uint64_t desc_b = smem_desc_advance(desc_b0, kk * 16 * 128);
    Wgmma<T, Cfg::kHeadDim>::rs(acc, a[kk], desc_b, 1);
  }
}

// A consumer's dQ columns: one piece of kCols0 from col0 (widths 64 and 128), or at width 96 two,
// [32c, 32c + 32) and [64 + 16c, 80 + 16c) for consumer c, so that both consumers run the same GEMM
// shapes and each piece lies in one 64-column block. A consumer's dQ accumulator holds piece 0, then
// piece 1. kWhole: every column, in one piece (the consumer that owns a step's whole dQ, kDqOwner).
template <typename Cfg, bool kWhole = false>
struct DqPieces {
  static constexpr bool kTwo = Cfg::kHeadDim == 96 && !Cfg::kDqByRows && !kWhole;
  static constexpr int kCols = kWhole ? Cfg::kHeadDim : Cfg::kDqCols;  // the consumer's dQ columns
  static constexpr int kCols0 = kTwo ? 32 : kCols;
  static constexpr int kCols1 = kTwo ? 16 : 0;
  static_assert(kCols0 + kCols1 == kCols, "the pieces are the consumer's columns");
  __device__ __forceinline__ static int col0(int consumer) {
    return kTwo ? 32 * consumer : (Cfg::kDqByRows || kWhole) ? 0 : consumer * Cfg::kDqCols;
  }
  __device__ __forceinline__ static int col1(int consumer) { return 64 + 16 * consumer; }
};

// The float ranges of the dQ staging tile (and of the workspace block) that a consumer's part of a
// step's partial fills: its 64-query block (kDqByRows), its pieces of columns (DqPieces; n8 blocks of
// kDqTileRows x 8 floats each in the tile layout), or (kWhole) the whole block.
template <typename Cfg, bool kWhole = false>
struct DqParts {
  using Pieces = DqPieces<Cfg, kWhole>;
  static constexpr int kCount = Pieces::kCols1 > 0 ? 2 : 1;
  int offset[kCount], count[kCount];
  __device__ __forceinline__ explicit DqParts(int consumer) {
    if constexpr (Cfg::kDqByRows) {
      offset[0] = consumer * kDqTileRows * Cfg::kHeadDim;
      count[0] = kDqTileRows * Cfg::kHeadDim;
    } else {
      offset[0] = Pieces::col0(consumer) * kDqTileRows;
      count[0] = Pieces::kCols0 * kDqTileRows;
      if constexpr (kCount > 1) {
        offset[1] = Pieces::col1(consumer) * kDqTileRows;
        count[1] = Pieces::kCols1 * kDqTileRows;
      }
    }
  }
};

// The B descriptor of K's columns from col (within one 64-column block; a piece not at the block's
// start begins (col % 64) * 2 bytes into the swizzled rows).
template <typename Cfg>
__device__ __forceinline__ uint64_t k_columns_desc(uint32_t k_tile, int col) {
  return smem_desc_sw128(k_tile + (col / 64) * Cfg::kKVColBlockBytes + (col % 64) * 2, Cfg::kKVColBlockBytes, 1024);
}

// dq (64 queries x this consumer's dQ columns, DqPieces) = dS (those 64 queries x 128 keys: one query
// block of the two consumers' dS^T tiles, from ds_queries, MN-major A) times K (the 128 keys x the
// columns, MN-major B).
template <typename T, typename Cfg, bool kWhole = false>
__device__ __forceinline__ void issue_dq(float (&dq)[DqPieces<Cfg, kWhole>::kCols / 2], uint32_t ds_queries,
                                         uint32_t k_tile, int consumer) {
  using Pieces = DqPieces<Cfg, kWhole>;
  const uint64_t desc_a0 = smem_desc_sw128(ds_queries, 64 * 128, 1024);
  const uint64_t desc_b0 = k_columns_desc<Cfg>(k_tile, Pieces::col0(consumer));
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    const uint64_t desc_a = smem_desc_advance(desc_a0, (kk / 4) * Cfg::kDsBytes + (kk % 4) * 16 * 128);
    Wgmma<T, Pieces::kCols0>::ss_mn(reinterpret_cast<float(&)[Pieces::kCols0 / 2]>(dq), desc_a,
                                    smem_desc_advance(desc_b0, kk * 16 * 128), kk > 0);
    if constexpr (Pieces::kCols1 > 0) {
      const uint64_t desc_b1 = k_columns_desc<Cfg>(k_tile, Pieces::col1(consumer));
      Wgmma<T, Pieces::kCols1>::ss_mn(reinterpret_cast<float(&)[Pieces::kCols1 / 2]>(dq[Pieces::kCols0 / 2]), desc_a,
                                      smem_desc_advance(desc_b1, kk * 16 * 128), kk > 0);
    }
  }
}

// Writes dS^T (this thread's A fragments of it, as accumulator_to_a packs them: 64 keys x 16 kFrags
// queries) into [64 keys][64 queries] tiles from shared address ds_tile, one per 64 queries, with the
// 128-byte swizzle: the 16-byte chunk c of row r lives at chunk c ^ (r % 8).
template <int kFrags>
__device__ __forceinline__ void store_ds_swizzled(uint32_t ds_tile, const uint32_t (&ds)[kFrags][4],
                                                  int warp_in_group, int lane) {
#pragma unroll
  for (int j = 0; j < 2 * kFrags; ++j) {  // n8 block j: A fragment j / 2, registers 2 (j % 2) + half
    const uint32_t tile = ds_tile + (j / 8) * 64 * 128;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_in_group * 16 + lane / 4 + half * 8;
      const int offset = row * 128 + (((j % 8) ^ (row % 8)) << 4) + (lane % 4) * 4;
      st_shared_u32(tile + offset, ds[j / 2][2 * (j % 2) + half]);
    }
  }
}

// The kCount query columns 8j + 2 (lane % 4) + {0, 1} of a step's statistics row (LSE or delta), from
// `row` = its shared address plus (lane % 4) * 8 bytes, in the order of an accumulator's columns.
template <int kCount>
__device__ __forceinline__ void load_query_columns(float (&values)[kCount], uint32_t row) {
#pragma unroll
  for (int j = 0; j < kCount / 2; ++j) {
    const float2 v = ld_shared_f32x2(row + j * 32);
    values[2 * j] = v.x;
    values[2 * j + 1] = v.y;
  }
}

// The mask's gradient: this thread's dS elements (a score accumulator: rows of keys from key0 and
// columns of queries from m0 when kKeyRows, as the narrow kernel's dS^T; rows of queries and columns of
// keys otherwise, as the wide kernel's dS) into params.dmask, [B, Hq, Lq, Lk] contiguous in the mask's
// element type (q's or float32).
template <typename T, int kCount, bool kKeyRows>
__device__ __forceinline__ void write_dmask(const BwdParams& p, const float (&ds)[kCount], int batch, int head, int m0,
                                            int key0, int warp_in_group, int lane) {
  const AttentionShape& sh = p.shape;
  const int64_t first = (static_cast<int64_t>(batch) * sh.heads_q + head) * sh.seqlen_q * sh.seqlen_k;
  const bool f32 = p.mask.kind == MaskKind::kAdditiveFloat32;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int row = accumulator_row(i, warp_in_group, lane), col = accumulator_col(i, lane);
    const int key = key0 + (kKeyRows ? row : col);
    const int query = m0 + (kKeyRows ? col : row);
    if (query >= sh.seqlen_q || key >= sh.seqlen_k) continue;
    const int64_t offset = first + static_cast<int64_t>(query) * sh.seqlen_k + key;
    if (f32) {
      static_cast<float*>(p.dmask)[offset] = ds[i];
    } else {
      static_cast<T*>(p.dmask)[offset] = ElementOps<T>::from_float(ds[i]);
    }
  }
}

// The CTA's dK = scale * dS^T Q and dV, straight from a consumer's accumulators (rows: keys from key0,
// columns: head dims from col0), into params.dk and params.dv.
// `sh` is the CTA's shape (a variable-length batch's sequence: its own seqlen_k), whose keys start at
// packed row k_row0 (0 for a batched call).
template <typename T, int kCount>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const AttentionShape& sh, int k_row0,
                                            const float (&dk)[kCount], const float (&dv)[kCount], int batch,
                                            int kv_head, int key0, int col0, int warp_in_group, int lane) {
  using Ops = ElementOps<T>;
  T* dk_out = static_cast<T*>(p.dk) + batch * p.dk_strides.batch + static_cast<int64_t>(k_row0) * p.dk_strides.row +
              kv_head * p.dk_strides.head;  // [Lk, D]
  T* dv_out = static_cast<T*>(p.dv) + batch * p.dv_strides.batch + static_cast<int64_t>(k_row0) * p.dv_strides.row +
              kv_head * p.dv_strides.head;  // [Lk, D]
#pragma unroll
  for (int i = 0; i < kCount; i += 2) {
    const int key = key0 + accumulator_row(i, warp_in_group, lane);
    const int col = col0 + accumulator_col(i, lane);
    if (key >= sh.seqlen_k) continue;
    T* dk_row = dk_out + key * p.dk_strides.row;
    T* dv_row = dv_out + key * p.dv_strides.row;
    if (col + 1 < sh.head_dim && sh.head_dim % 2 == 0) {
      *reinterpret_cast<uint32_t*>(dk_row + col) = Ops::pack(dk[i] * sh.scale, dk[i + 1] * sh.scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = Ops::pack(dv[i], dv[i + 1]);
    } else {
      if (col < sh.head_dim) {
        dk_row[col] = Ops::from_float(dk[i] * sh.scale);
        dv_row[col] = Ops::from_float(dv[i]);
      }
      if (col + 1 < sh.head_dim) {
        dk_row[col + 1] = Ops::from_float(dk[i + 1] * sh.scale);
        dv_row[col + 1] = Ops::from_float(dv[i + 1]);
      }
    }
  }
}

// Thread 0's setup of a backward CTA: the tensor maps prefetched, the K/V and Q/dO barriers set.
// dq_senders: the consumers' arrivals per step at the dq writer's hand-over (init_dq_handover).
template <typename Cfg>
__device__ __forceinline__ void init_bwd_barriers(const BwdTensorMaps& maps, BwdBarriers<Cfg>& bars,
                                                  int dq_senders = 1) {
  prefetch_tensor_map(&maps.q);
  prefetch_tensor_map(&maps.k);
  prefetch_tensor_map(&maps.v);
  prefetch_tensor_map(&maps.dout);
  mbar_init(&bars.kv_full, 1);
  for (int i = 0; i < Cfg::kStages; ++i) {
    mbar_init(&bars.qdo_full[i], 32);  // one arrival per producer lane, plus the TMA bytes
  }
  init_dq_handover(dq_senders);
  mbar_fence_init();
}

// The tensor maps of q, dout ([rows][64] boxes of kBlockM rows) and k, v (kBlockN rows).
template <typename Cfg>
cudaError_t make_bwd_tensor_maps(const BwdParams& p, BwdTensorMaps* maps) {
  const AttentionShape& sh = p.shape;
  cudaError_t err = make_tensor_map(&maps->q, p.q, sh, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps->dout, p.dout, sh, sh.seqlen_q, sh.heads_q, p.dout_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps->k, p.k, sh, sh.seqlen_k, sh.heads_kv, p.k_strides, Cfg::kBlockN);
  if (err == cudaSuccess) err = make_tensor_map(&maps->v, p.v, sh, sh.seqlen_k, sh.heads_kv, p.v_strides, Cfg::kBlockN);
  return err;
}

// Stages a consumer's dQ partial (64 queries x kCols head dims from col0, accumulator layout) in the
// fp32 staging tile at `stage` in the sm90 tile layout (cuda/dq_accum_layout.h): a warp's stores are
// 512 contiguous bytes.
template <int kCols>
__device__ __forceinline__ void store_dq_tile(uint32_t stage, const float (&dq)[kCols / 2], int col0, int thread) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    st_shared_f32x4(stage + dq_tile_fragment_offset(col0 / 8 + j, thread) * 4,
                    make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
  }
}

// kDropout (with kMasked only): the launch applies params.dropout. A form of its own, so that the
// masked kernel without dropout keeps its registers (at D=128, one kernel for both spilled 88 bytes
// against 24 without the Philox calls).
// kVarlen (the unmasked kernel only): the CTA runs item blockIdx.x of p.varlen's list, a key block of
// one sequence, whose rows it addresses in the packed tensors and workspaces.
// kMaskedTurns (with kMasked only): the form deterministic calls run, with the dq turns (DqTurns). The
// other masked forms leave them out: with them ptxas spilled 336-400 bytes at D=128 (24-28 without).
template <typename T, typename Cfg, bool kMasked, bool kDropout, bool kKeyEnds = false, bool kVarlen = false,
          bool kMaskedTurns = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_kernel(const __grid_constant__ BwdTensorMaps maps,
                                                               const BwdParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built for sm_80 too, never launched there (see sm90/api.h)
#else
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kScores = kBlockM / 2;  // a consumer's S^T (or dP^T) elements per thread
  // The unmasked kernels whose consumers split dQ by its columns (widths 96 and 128) end a step with dK
  // running while each consumer stages its part of the dQ partial and sends it on its own (no second
  // meeting of the consumers). The other forms keep the consumers' second meeting and one reduction a
  // step: the masked ones, whose mask, dropout and dmask code leaves no registers for dQ's accumulators
  // to stay live across the dK GEMM (they spill), and the 128-query kernel at width 64, whose by-rows
  // dQ partials and shorter steps gain nothing from the split and lost time to it (docs/perf-log.md).
  constexpr bool kSendApart = !(kMasked || kDropout || Cfg::kDqByRows);
  static_assert(!kSendApart || Cfg::kDsSets == 2, "a set of dS^T tiles per alternate step");
  // At width 96 the consumers do not split dQ: a step's whole dQ is one consumer's (the step's owner,
  // alternate steps each; consumer 0 every step in deterministic mode, whose writer warp reads one
  // staging tile), so the dS operand is read once a step, not by four narrow GEMMs.
  constexpr bool kDqOwner = kSendApart && Cfg::kHeadDim == 96;
  static_assert(!kDqOwner || Cfg::kDqTiles == 2, "a staging tile per consumer");
  static_assert(kBlockM == 64 || !(kMasked || kDropout || kKeyEnds), "128-query steps in the unmasked kernel only");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  auto& bars = *reinterpret_cast<BwdBarriers<Cfg>*>(base + Cfg::kBarriersOffset);

  static_assert(!kVarlen || !(kMasked || kDropout || kKeyEnds), "variable lengths in the unmasked kernel");
  BwdKeyBlock block;
  SeqSpan seq{};  // kVarlen: the CTA's sequence, whose own lengths and diagonal `sh` then holds
  BwdRows rows;
  if (!bwd_cta_block<kBlockN, kVarlen>(p, block, seq, rows)) return;
  const AttentionShape seq_shape = kVarlen ? seq.shape(p.shape) : AttentionShape{};
  const AttentionShape& sh = kVarlen ? seq_shape : p.shape;
  const int n_block = block.n_block, kv_head = block.kv_head, batch = block.batch, n0 = block.n0;
  // Keys from row_keys_end on are masked: seqlen_k, or the group's BwdParams::key_end.
  int row_keys_end = sh.seqlen_k;
  if constexpr (kMasked || kKeyEnds) {
    if (p.key_end != nullptr) {
      const int key_end = p.key_end[batch * sh.heads_q + kv_head * (sh.heads_q / sh.heads_kv)];
      if (kMasked ? key_end >= 0 : key_end < 0) return;  // the other launch's group (before any barrier)
      if constexpr (kKeyEnds) row_keys_end = key_end;
    }
  }
  BwdSteps steps = bwd_steps<kBlockM, kBlockN>(sh, n0);
  if (kKeyEnds && n0 >= row_keys_end) steps.num_m = 0;  // no key of the block is kept: dK = dV = 0
  // Broadcast from lane 0: the compiler then knows the value is the same across the warp, so what
  // derives from it (each consumer's shared-memory tile addresses, its wgmma descriptors) lives in
  // uniform registers instead of being moved there before every wgmma.
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);
  BwdStepWalk<T, kMasked> walk{p, steps, kv_head, batch, n_block};

  const bool to_writer = dq_to_writer<kMasked, kMaskedTurns>(p);
  // The dq workspace row of the step of query head `head` from query m0.
  auto dq_row = [&](int head, int m0) -> int64_t {
    return kVarlen ? rows.stats(head) + m0 : (static_cast<int64_t>(batch) * sh.heads_q + head) * p.stats_stride + m0;
  };

  if (threadIdx.x == 0) init_bwd_barriers(maps, bars, kSendApart && !kDqOwner ? Cfg::kConsumers : 1);
  __syncthreads();

  if (warpgroup == 0) {
    registers_decrease<Cfg::kProducerRegisters>();
    // Branching on a value the compiler knows is warp-uniform kept the producer within its registers.
    const int warp = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 32), 0);
    if (warp == 1 && to_writer) {
      using Turns = DqTurns<kBlockN, kBlockM>;
      // The consumers' walk over the steps, run again here.
      auto next = [&, step = walk.next(0)](int& head, int& m0) mutable {
        if (step >= steps.count()) return false;
        head = steps.head(step, kv_head);
        m0 = steps.m0<kBlockM>(step);
        step = walk.next(step + 1);
        return true;
      };
      write_dq<Cfg::kHeadDim, kBlockM, kBlockN>(
          p, reinterpret_cast<const float*>(base + Cfg::kDqOffset), next, [&](int head, int m0) {
            DqReduction r;
            r.row = dq_row(head, m0);
            Turns::ticket(r, kVarlen ? Turns::varlen_counter(p, r.row) : Turns::counter(p, batch, head, m0), sh, m0,
                          n_block);
            return r;
          });
    } else if (warp == 0) {
      produce_bwd<T, Cfg, kMasked, kVarlen>(p, maps, bars, base, n0, kv_head, batch, steps, walk, rows);
    }
    return;
  }
  registers_increase<Cfg::kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int thread_in_group = threadIdx.x % 128;
  const int warp_in_group = thread_in_group / 32;
  const int lane = threadIdx.x % 32;
  // The warp that issues each step's dQ reduction or hands it to the writer warp: each consumer's first
  // (kSendApart), or the first consumer's first.
  const bool reducer_warp = kSendApart ? warp_in_group == 0 : threadIdx.x / 32 == 4;
  const DqReducer reducer{to_writer};
  const int key0 = n0 + consumer * 64;      // this warpgroup's keys: [key0, key0 + 64)
  // The consumer's share of dQ: its 64 queries (from dq_row0, every head dim) or its kDqCols head dims
  // (DqPieces, every query of the step).
  const int dq_row0 = Cfg::kDqByRows ? consumer * kDqTileRows : 0;
  // Shared-memory addresses (the shared window's 32-bit form).
  const uint32_t smem = smem_u32(base);
  const uint32_t k_rows = smem + consumer * 64 * 128;
  const uint32_t v_rows = smem + Cfg::kVOffset + consumer * 64 * 128;
  // Set 0 of both consumers' dS^T tiles (Cfg::kDsBytes each; step iter uses set iter % 2), this
  // consumer's tile in it, and the dQ GEMM's A (its query block of both tiles).
  const uint32_t ds_tiles = smem + Cfg::kDsOffset;
  const uint32_t ds_tile0 = ds_tiles + consumer * Cfg::kDsBytes;
  const uint32_t ds_dq_queries0 = ds_tiles + (dq_row0 / 64) * Cfg::kDsQueryBlockBytes;
  // This consumer's part of the dQ staging tile ([kBlockM * kHeadDim] fp32, the tile layout): its query
  // block's when the consumers split dQ by rows.
  // (kDqOwner: this consumer's own staging tile.)
  const uint32_t dq_stage_addr =
      smem + Cfg::kDqOffset + (kDqOwner ? consumer * Cfg::kDqBytes : dq_row0 * Cfg::kHeadDim * 4);
  const float* const dq_stage = reinterpret_cast<const float*>(base + Cfg::kDqOffset) +
                                (kDqOwner ? consumer * Cfg::kDqBytes / 4 : 0);
  const uint32_t stats_addr = smem + Cfg::kStatsOffset;
  using Pieces = DqPieces<Cfg, kDqOwner>;
  float dk[Cfg::kHeadDim / 2], dv[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  int step = walk.next(0);
  int iter = 0;  // steps run so far, as in produce_bwd
  mbar_wait(&bars.kv_full, 0);
  for (; step < steps.count(); ++iter) {
    // Before next() moves the class window on: whether the step reads its mask elements, or applies
    // its key-prefix tile as a length (key_end) instead.
    const bool needs_elements = walk.needs_elements(step);
    const int key_end = needs_elements ? walk.prefix_key_end(step, kBlockN) : -1;
    const bool mask_needed = needs_elements && key_end < 0;
    const int keys_end = key_end >= 0 ? key_end : kKeyEnds ? row_keys_end : sh.seqlen_k;
    const int next = walk.next(step + 1);
    const int stage = iter % kStages;
    const int head = steps.head(step, kv_head);
    const int m0 = steps.m0<kBlockM>(step);
    const uint32_t q_tile = smem + Cfg::kQOffset + stage * Cfg::kQBytes;
    const uint32_t do_tile = smem + Cfg::kDoOffset + stage * Cfg::kQBytes;
    // Dropout's keep bits, made before the GEMMs are issued, while their accumulators are not live
    // (made under the GEMMs, the D=128 kernel spilled 112 bytes; here 28).
    uint32_t keep = 0;
    if constexpr (kDropout) {
      keep = backward_keep_bits(DropoutRow(p.dropout, batch, sh.heads_q, head), m0 + accumulator_col(0, lane),
                                key0 + accumulator_row(0, warp_in_group, lane));
    }
    float s[kScores], dp[kScores];
    mbar_wait(&bars.qdo_full[stage], (iter / kStages) & 1);
    wgmma_fence();
    issue_keys_by_queries<T, Cfg>(s, k_rows, q_tile);
    wgmma_commit();
    issue_keys_by_queries<T, Cfg>(dp, v_rows, do_tile);
    wgmma_commit();
    // This thread's kBlockM / 4 query columns 8j + 2 (lane % 4) + {0, 1}: LSE (base 2; +inf past the end, so
    // P = 0 there), then delta, from the stage.
    const uint32_t stats = stats_addr + stage * Cfg::kStatsBytes + (lane % 4) * 8;
    float lse[kBlockM / 4];
    load_query_columns(lse, stats);
    wgmma_wait<1>();  // S^T is ready; dP^T may still run while P^T is computed
    fence_registers(s);
    const bool softcapped = sh.softcap_inner != 0.f;  // cuda/softcap.h
    if (softcapped) softcap_scores(s, sh.softcap_inner);
    const float alibi = alibi_slope(sh, batch, head);  // cuda/alibi.h
    if (alibi != 0.f) {
      // Element i: key key0 + accumulator_row(i), query m0 + accumulator_col(i).
      const float base = static_cast<float>(m0 + accumulator_col(0, lane) + sh.alibi_offset - key0 -
                                            accumulator_row(0, warp_in_group, lane));
#pragma unroll
      for (int i = 0; i < kScores; ++i) {
        const int shift = (accumulator_col(i, lane) - accumulator_col(0, lane)) -
                         (accumulator_row(i, warp_in_group, lane) - accumulator_row(0, warp_in_group, lane));
        s[i] = add_alibi(s[i], alibi, base + static_cast<float>(shift));
      }
    }
    // P^T; keys this query may not see get 0 (only blocks on the causal diagonal or past the end).
    const MaskView<T> mask = kMasked ? walk.mask(step) : MaskView<T>();
    // (Under a sliding window, also blocks with keys left of the last query's window.)
    const bool needs_mask = key0 + 64 > keys_end || (sh.is_causal && key0 + 63 > m0 + sh.causal_offset) ||
                            (sh.window_span >= 0 && key0 < m0 + kBlockM - 1 + sh.causal_offset - sh.window_span);
    if (mask_needed) {
      // With the attention mask: exp2(S^T scale + mask - LSE), all in base-2 units, where visible. The
      // mask terms of kChunk elements are loaded together before any is used (MaskView::load_terms); as
      // many as the registers left beside dK and dV allow.
      constexpr int kChunk = Cfg::kHeadDim <= 64 ? 16 : 8;
#pragma unroll
      for (int chunk = 0; chunk < kScores; chunk += kChunk) {
        float term[kChunk];
        mask.template load_terms<kChunk>(
            [&](int e) -> int64_t {
              const int i = chunk + e;
              const int key = key0 + accumulator_row(i, warp_in_group, lane);
              const int query = m0 + accumulator_col(i, lane);
              return query < sh.seqlen_q && key < sh.seqlen_k ? query * mask.row_stride + key * mask.col_stride : -1;
            },
            term);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const int i = chunk + e;
          const int c = 2 * (i / 4) + i % 2;
          const int key = key0 + accumulator_row(i, warp_in_group, lane);
          const int query = m0 + accumulator_col(i, lane);
          const bool visible = (query < sh.seqlen_q) &
                               key_visible(query, key, sh.seqlen_k, sh.is_causal, sh.causal_offset, sh.window_span);
          const float x = s[i] * sh.scale_log2 - lse[c] + term[e];
          s[i] = visible ? exp2f(x) : 0.f;
        }
      }
    } else {
      // key_visible with the indices split into this thread's first row / column and per-element
      // constants: element i has key key_row + 8 ((i % 4) / 2) and query query_col + 8 (i / 4) + i % 2.
      const int key_row = key0 + accumulator_row(0, warp_in_group, lane);
      const int keys_left = keys_end - key_row;
      const int diagonal = sh.is_causal ? m0 + accumulator_col(0, lane) + sh.causal_offset - key_row : kBlockM;
      // A sliding window's left bound in the same terms (key_step - query_step >= window_floor).
      const int window_floor = sh.window_span >= 0 ? diagonal - sh.window_span : -2 * kBlockM;
#pragma unroll
      for (int i = 0; i < kScores; ++i) {
        const int c = 2 * (i / 4) + i % 2;  // index of this element's query column in lse / delta
        s[i] = exp2f(fmaf(s[i], sh.scale_log2, -lse[c]));
      }
      // A branch of its own (not a select inside the loop above): the compiler then does not compute
      // the visibility predicates of every step ahead of the S^T GEMM's issue.
      if (needs_mask) {
#pragma unroll
        for (int i = 0; i < kScores; ++i) {
          const int key_step = 8 * ((i % 4) / 2), query_step = 8 * (i / 4) + i % 2;
          s[i] = (key_step < keys_left) & (key_step - query_step <= diagonal) & (key_step - query_step >= window_floor)
                     ? s[i]
                     : 0.f;
        }
      }
    }
    float delta[kBlockM / 4];
    load_query_columns(delta, stats + kBlockM * 4);
    wgmma_wait<0>();
    fence_registers(dp);
    if constexpr (kDropout) {
      if (softcapped) {
        // The chain through the cap needs the undropped P and the LSE, read back from the stage rather
        // than kept live across the dP^T wait.
        float lse_again[kBlockM / 4];
        load_query_columns(lse_again, stats);
        const float inv_scale_log2 = 1.f / sh.scale_log2;
        apply_backward_dropout(s, dp, delta, keep, p.dropout.keep_scale, [&](int i, float prob) {
          return softcap_grad(prob, lse_again[2 * (i / 4) + i % 2], inv_scale_log2);
        });
      } else {
        apply_backward_dropout(s, dp, delta, keep, p.dropout.keep_scale);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kScores; ++i) dp[i] = s[i] * (dp[i] - delta[2 * (i / 4) + i % 2]);  // dS^T
      if (softcapped) {
        // The chain through the cap, in a pass of its own (delta is dead by then) with the LSE read back
        // from the stage: the plain kernel has no registers to keep both live across the dP^T wait.
        float lse_again[kBlockM / 4];
        load_query_columns(lse_again, stats);
        const float inv_scale_log2 = 1.f / sh.scale_log2;
#pragma unroll
        for (int i = 0; i < kScores; ++i) dp[i] *= softcap_grad(s[i], lse_again[2 * (i / 4) + i % 2], inv_scale_log2);
      }
    }

    if constexpr (kMasked) {
      if (p.dmask != nullptr) write_dmask<T, kScores, true>(p, dp, batch, head, m0, key0, warp_in_group, lane);
    }

    uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];
    accumulator_to_a<T, kBlockM>(p_frag, s);
    accumulator_to_a<T, kBlockM>(ds_frag, dp);
    const uint32_t ds_set = kSendApart ? (iter % 2) * Cfg::kDsSetBytes : 0;
    store_ds_swizzled(ds_tile0 + ds_set, ds_frag, warp_in_group, lane);
    fence_proxy_async_shared();
    float dq[Pieces::kCols / 2];
    // Stages this consumer's dQ (its part of the partial, or with kDqOwner the whole) in dq_stage.
    auto stage_dq = [&] {
      fence_registers(dq);
      // By rows, a consumer's 64 x kHeadDim partial is a whole block of the tile layout.
      store_dq_tile<Pieces::kCols0>(dq_stage_addr, reinterpret_cast<const float(&)[Pieces::kCols0 / 2]>(dq),
                                    Pieces::col0(consumer), thread_in_group);
      if constexpr (Pieces::kCols1 > 0) {
        store_dq_tile<Pieces::kCols1>(dq_stage_addr,
                                      reinterpret_cast<const float(&)[Pieces::kCols1 / 2]>(dq[Pieces::kCols0 / 2]),
                                      Pieces::col1(consumer), thread_in_group);
      }
      fence_proxy_async_shared();
    };
    if constexpr (kSendApart) {
      // dV needs this consumer's P^T only: issued before the meeting, it runs while the consumers wait
      // for each other. Then dQ, and dK last, so that the dQ partial is staged while dK runs.
      wgmma_fence();
      issue_keys_by_dims<T, Cfg>(dv, p_frag, do_tile);
      wgmma_commit();
      // Whether this consumer computes (its part of) the step's dQ: always, but with kDqOwner only on its
      // own steps.
      const bool dq_here = !kDqOwner || consumer == (to_writer ? 0 : iter % 2);
      if (reducer_warp && dq_here) reducer.await_stage(iter);  // the previous reduction has left dq_stage
      named_barrier_sync(kBwdConsumerBarrier, 256);  // both dS^T tiles complete, dq_stage free
      // Two whole paths, so that each wgmma wait is unconditional where its accumulators are read.
      if (dq_here) {
        wgmma_fence();
        issue_dq<T, Cfg, kDqOwner>(dq, ds_dq_queries0 + ds_set, smem, consumer);
        wgmma_commit();
        wgmma_wait<1>();  // dV is done with this stage's dO
        fence_registers(dv);
        fence_registers(p_frag);
        wgmma_fence();
        issue_keys_by_dims<T, Cfg>(dk, ds_frag, q_tile);
        wgmma_commit();
        wgmma_wait<1>();  // dQ is done
        stage_dq();
        // This consumer's part of dq_stage complete. (A consumer writes the next step's dS^T into the
        // other set, and the one after it only once both consumers have met at the next step, each of
        // its dQ GEMMs done by then.)
        named_barrier_sync(Cfg::kDqStagedBarrier0 + consumer, 128);
        if (reducer_warp) {
          const DqParts<Cfg, kDqOwner> parts(consumer);
          reducer.send_parts<Cfg::kHeadDim>(p, dq_stage, parts.offset, parts.count, [&] { return dq_row(head, m0); });
        }
      } else {
        wgmma_wait<0>();  // dV is done with this stage's dO
        fence_registers(dv);
        fence_registers(p_frag);
        wgmma_fence();
        issue_keys_by_dims<T, Cfg>(dk, ds_frag, q_tile);
        wgmma_commit();
      }
      wgmma_wait<0>();  // dK is done with this stage's Q
      fence_registers(dk);
      fence_registers(ds_frag);
      named_barrier_arrive(kBwdStageBarrier0 + stage, kBwdStageBarrierThreads);  // the stage is free
    } else {
      if (reducer_warp) reducer.await_stage(iter);  // the previous step's dQ reduction has left dq_stage
      named_barrier_sync(kBwdConsumerBarrier, 256);  // both dS^T tiles complete, dq_stage free
      wgmma_fence();
      issue_keys_by_dims<T, Cfg>(dv, p_frag, do_tile);
      issue_keys_by_dims<T, Cfg>(dk, ds_frag, q_tile);
      wgmma_commit();
      issue_dq<T, Cfg>(dq, ds_dq_queries0 + ds_set, smem, consumer);
      wgmma_commit();
      wgmma_wait<1>();  // dV and dK are done with this stage's Q and dO (and the next S^T, dP^T with them)
      fence_registers(dv);
      fence_registers(dk);
      fence_registers(p_frag);
      fence_registers(ds_frag);
      named_barrier_arrive(kBwdStageBarrier0 + stage, kBwdStageBarrierThreads);  // the stage is free
      wgmma_wait<0>();
      stage_dq();
      // dq_stage complete; also, neither consumer rewrites its dS^T tile before both dQ GEMMs are done.
      named_barrier_sync(kBwdConsumerBarrier, 256);
      if (reducer_warp) {
        reducer.send_stage<Cfg::kHeadDim, kBlockM>(p, reinterpret_cast<const float*>(base + Cfg::kDqOffset), head,
                                                   m0, [&] { return dq_row(head, m0); });
      }
    }
    step = next;
  }
  // (With kDqOwner in deterministic mode, consumer 1 sent nothing.)
  if (reducer_warp && !(kDqOwner && to_writer && consumer == 1)) reducer.finish(iter);

  // dK = scale * dS^T Q and dV, straight from the accumulators.
  store_dk_dv<T>(p, sh, rows.k_row0, dk, dv, rows.tensor_batch, kv_head, key0, 0, warp_in_group, lane);
#endif
}

// What every sm90 backward does before its main kernel: checks the dq workspace (the tile layout at
// the kernel's width), describes q, k, v and dout for TMA, and launches the preprocess.
template <typename T, typename Cfg>
cudaError_t start_bwd(const BwdParams& p, BwdTensorMaps* maps, cudaStream_t stream) {
  if (p.dq_accum_dim != Cfg::kHeadDim || !p.dq_accum_tiled) return cudaErrorNotSupported;
  const cudaError_t err = make_bwd_tensor_maps<Cfg>(p, maps);
  return err == cudaSuccess ? launch_bwd_preprocess<T>(p, stream) : err;
}

// One launch of a backward main kernel over the (key block, kv head, batch) grid of Cfg.
template <typename Cfg, typename Kernel>
cudaError_t launch_bwd_main(Kernel kernel, const BwdTensorMaps& maps, const BwdParams& p, cudaStream_t stream) {
  const AttentionShape& sh = p.shape;
  const int64_t grid = static_cast<int64_t>((sh.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN) * sh.heads_kv * sh.batch;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p);
  return cudaGetLastError();
}

template <typename T, typename Cfg, bool kMasked>
cudaError_t launch_bwd_with_config(const BwdParams& p, cudaStream_t stream) {
  BwdTensorMaps maps;
  cudaError_t err = start_bwd<T, Cfg>(p, &maps, stream);
  if (err != cudaSuccess) return err;
  auto kernel = bwd_kernel<T, Cfg, kMasked, false>;
  if constexpr (kMasked) {
    if (p.deterministic) {
      kernel = p.dropout.enabled ? bwd_kernel<T, Cfg, true, true, false, false, true>
                                 : bwd_kernel<T, Cfg, true, false, false, false, true>;
    } else if (p.dropout.enabled) {
      kernel = bwd_kernel<T, Cfg, true, true>;
    }
  }
  err = launch_bwd_main<Cfg>(kernel, maps, p, stream);
  if (err != cudaSuccess) return err;
  if constexpr (kMasked) {
    if (p.key_end != nullptr) {  // the groups the masked kernel left, over their key prefixes
      BwdParams key_rows = p;
      key_rows.shape = key_end_shape(p.shape, p.key_end_causal);  // causal in the causal form
      err = launch_bwd_main<Cfg>(bwd_kernel<T, Cfg, false, false, true>, maps, key_rows, stream);
      if (err != cudaSuccess) return err;
    }
  }
  return launch_bwd_convert_dq<T>(p, stream);
}

// The variable-length backward in configuration Cfg with `kernel` (an unmasked kernel's kVarlen form):
// the key-block list of p.varlen (longest first; in deterministic mode in the order of the dq turns,
// BwdKeyBlock's), the preprocess over every sequence's workspace rows, one CTA per list item (the grid
// is the list's capacity; CTAs past its length exit), the dq conversion.
template <typename T, typename Cfg, typename Kernel>
cudaError_t launch_bwd_varlen_kernel(Kernel kernel, const BwdParams& p, cudaStream_t stream) {
  const AttentionShape& sh = p.shape;
  if (p.dq_accum_dim != Cfg::kHeadDim || !p.dq_accum_tiled || !p.varlen.enabled()) return cudaErrorNotSupported;
  // Query steps never cross a sequence's workspace region.
  if (p.varlen.workspace_align % Cfg::kBlockM != 0) return cudaErrorNotSupported;
  VarlenListSpec spec;
  spec.work = VarlenWork::kBackward;
  spec.batch = sh.batch;
  spec.heads = sh.heads_kv;
  spec.block_rows = Cfg::kBlockN;
  spec.cost_rows = Cfg::kBlockM;
  spec.is_causal = sh.is_causal;
  spec.by_cost = !p.deterministic;
  // Per kv head, its group's query rows: q and dout, the fp32 dq accumulator row, the LSE and delta.
  const int64_t group = std::max(sh.heads_q / std::max(sh.heads_kv, 1), 1);
  spec.other_row_bytes = group * (int64_t{2} * sh.head_dim * static_cast<int64_t>(sizeof(T)) +
                                  int64_t{4} * p.dq_accum_dim + 2 * static_cast<int64_t>(sizeof(float)));
  cudaError_t err = build_varlen_list(p.varlen, spec, reinterpret_cast<int2*>(const_cast<int*>(p.varlen.tiles)),
                                      const_cast<int*>(p.varlen.tile_count), stream);
  if (err != cudaSuccess) return err;
  AttentionShape packed = sh;  // the packed tensors as one batch entry of total rows
  packed.batch = 1;
  BwdTensorMaps maps;
  err = make_tensor_map(&maps.q, p.q, packed, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.dout, p.dout, packed, sh.seqlen_q, sh.heads_q, p.dout_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.k, p.k, packed, sh.seqlen_k, sh.heads_kv, p.k_strides, Cfg::kBlockN);
  if (err == cudaSuccess) err = make_tensor_map(&maps.v, p.v, packed, sh.seqlen_k, sh.heads_kv, p.v_strides, Cfg::kBlockN);
  if (err == cudaSuccess) err = launch_bwd_preprocess<T>(p, stream);
  if (err != cudaSuccess) return err;
  const int64_t grid = varlen_list_capacity(spec, sh.seqlen_k);
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (grid > 0) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_bwd_convert_dq<T>(p, stream);
}

// The variable-length backward with the narrow kernel in configuration Cfg.
template <typename T, typename Cfg>
cudaError_t launch_bwd_varlen_with_config(const BwdParams& p, cudaStream_t stream) {
  return launch_bwd_varlen_kernel<T, Cfg>(bwd_kernel<T, Cfg, false, false, false, true>, p, stream);
}

}  // namespace sm90
}  // namespace flashattn
