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

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/dropout.h"
#include "common/env_switch.h"
#include "common/mask.h"
#include "cuda/element_ops.h"
#include "cuda/mask_view.h"
#include "params.h"
#include "sm90/class_bits.h"
#include "sm90/fast_divider.h"
#include "sm90/fragments.h"
#include "sm90/fwd_epilogue.h"
#include "sm90/fwd_schedule.h"
#include "sm90/fwd_softmax.h"
#include "sm90/fwd_tiles.h"
#include "sm90/ptx.h"
#include "sm90/tensor_map.h"
#include "sm90/wgmma.h"

namespace flashattn {
namespace sm90 {

template <int kHeadDim_, int kBlockN_, int kStages_, int kConsumers_ = 2, int kQStages_ = 1,
          bool kStagedOutput_ = false, bool kPrefetchScores_ = false,
          int kTailBlockN_ = kBlockN_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;  // tile width: the real head dim is <= this
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;  // queries per CTA: 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;         // keys per step
  static constexpr int kStages = kStages_;         // K and V ring depth
  // Q buffers: with 2, the producer loads the next tile's Q while this tile still reads its own, so
  // the consumer warpgroups need not finish a tile together (see kStaggered).
  static constexpr int kQStages = kQStages_;
  // With a staged output each consumer warpgroup writes its 64 output rows into shared memory and one
  // of its threads stores them with TMA (write_epilogue); without, the threads store them themselves.
  static constexpr bool kStagedOutput = kStagedOutput_;
  // With prefetched scores a tile issues its second key block's QK^T GEMM before its first block's
  // softmax, so that the GEMM runs under it (otherwise a tile's first softmax has no GEMM of its own
  // warpgroup to overlap); the first block's scores then take kBlockN / 2 more registers. Unmasked
  // launches only.
  static constexpr bool kPrefetchScores = kPrefetchScores_;
  // Keys of a row's last key block, when fewer than kBlockN (a narrow tail): that block's QK^T GEMM is
  // kTailBlockN wide and its PV GEMM kTailBlockN / 16 steps deep, instead of computing kBlockN - kTailBlockN
  // more keys that the length mask then drops. Launches without causal masking, a mask or key ends,
  // whose key count leaves a last block of 1 .. kTailBlockN keys after one full block or more. The
  // QK^T GEMMs then start in the set form (issue_qk's kSet): the tail leaves the rest of S holding the
  // previous block's scores, and with S an input of the next tile's first GEMM that stayed live and
  // ptxas serialised every wgmma (C7511).
  static constexpr int kTailBlockN = kTailBlockN_;
  static constexpr bool kNarrowTail = kTailBlockN < kBlockN;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // After setmaxnreg; 24 stay with the producer. Three consumers share what two would have.
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static constexpr int kProducerRegisters = 24;

  static constexpr int kColBlock = 64;  // elements of one 128-byte swizzled row
  static constexpr int kColBlocks = (kHeadDim + kColBlock - 1) / kColBlock;
  static constexpr int kQColBlockBytes = kBlockM * 128;   // one [kBlockM][64] column block
  static constexpr int kKVColBlockBytes = kBlockN * 128;  // one [kBlockN][64] column block
  static constexpr int kQBytes = kColBlocks * kQColBlockBytes;
  static constexpr int kKVBytes = kColBlocks * kKVColBlockBytes;
  static constexpr int kOutBytes = kColBlocks * 64 * 128;  // one warpgroup's [kColBlocks][64][64] output rows
  // The Q buffers, the K ring, the V ring, the output staging (one buffer per consumer warpgroup),
  // then the mbarriers; +1024 to align the base for the swizzle.
  static constexpr int kOutOffset = kQStages * kQBytes + 2 * kStages * kKVBytes;
  static constexpr int kBarriersOffset = kOutOffset + (kStagedOutput ? kConsumers * kOutBytes : 0);
  static constexpr int kSmemBytes = 1024 + kBarriersOffset + (2 * kQStages + 4 * kStages) * 8 + kQStages * 8;

  static_assert(register_split_fits(kProducerRegisters, kConsumers, kConsumerRegisters), "setmaxnreg split");
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0 && kTailBlockN % 16 == 0, "wgmma k16 steps");
  static_assert(kTailBlockN > 0 && kTailBlockN <= kBlockN, "a narrow tail is at most one key block");
  static_assert(kKVColBlockBytes % 1024 == 0, "each column block starts on a swizzle-pattern boundary");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};

template <int kHeadDim>
struct DefaultFwdConfig;
// Widths 64-128 stage the output in shared memory for a TMA store; at 128 that costs the third K/V
// stage. At 192 and 256 it does not fit beside the ring.
template <> struct DefaultFwdConfig<64> { using type = FwdConfig<64, 128, 4, 2, 1, true>; };
template <> struct DefaultFwdConfig<96> { using type = FwdConfig<96, 128, 2, 2, 1, true>; };
template <> struct DefaultFwdConfig<128> { using type = FwdConfig<128, 128, 2, 2, 1, true>; };
template <> struct DefaultFwdConfig<192> { using type = FwdConfig<192, 96, 2>; };
template <> struct DefaultFwdConfig<256> { using type = FwdConfig<256, 80, 2>; };
// Host code reads the tile shape from fwd_tiles.h; it must agree with the configurations above.
static_assert(DefaultFwdConfig<64>::type::kBlockN == fwd_keys_per_step(64) &&
                  DefaultFwdConfig<96>::type::kBlockN == fwd_keys_per_step(96) &&
                  DefaultFwdConfig<128>::type::kBlockN == fwd_keys_per_step(128) &&
                  DefaultFwdConfig<192>::type::kBlockN == fwd_keys_per_step(192) &&
                  DefaultFwdConfig<256>::type::kBlockN == fwd_keys_per_step(256) &&
                  DefaultFwdConfig<64>::type::kBlockM == kFwdQueriesPerTile,
              "sm90/fwd_tiles.h is out of date");

// The default configuration at tile width 64 (two consumer warpgroups) with prefetched scores (see
// kPrefetchScores), which unmasked launches without key ends run there: +2-4% at 1k keys, +1.5% at 2k
// causal, +1% at 512 without causal masking, level at 512 with it (H200, bf16, benchmarks/NOTES.md);
// the same bits as without. At width 128 the extra 64 registers spilled 48 bytes; with the first
// GEMM steps writing the score buffers and O instead of accumulating (no value live from the previous
// tile) it fit without spills, but measured 1-4% slower than without prefetching (95a79e8, reverted).
template <int kHeadDim>
struct PrefetchScoresFwdConfig;
template <> struct PrefetchScoresFwdConfig<64> { using type = FwdConfig<64, 128, 4, 2, 1, true, true>; };

// 176 keys per step at tile width 128, so each key block's barrier waits, O rescale and GEMM issue
// cover 1.375x the work: +2% at 8k keys and +4% at 16k without causal masking. On shorter rows a
// tile has fewer blocks to spread its prologue and epilogue over (-0.2 to -0.7% from 1k to 4k with a
// full-width last block; with the narrow tail below +3.8% at 2k and +2.1% at 4k), and with causal
// masking the wider diagonal blocks cost more (-6.5% at 2k). The output staging (32 KB)
// does not fit beside two 44 KB K/V stages and Q, so the threads store the output; Q stays in shared
// memory (the highest register is R219 of 240 without Q's 32).
template <int kHeadDim>
struct WideKeyFwdConfig;
template <> struct WideKeyFwdConfig<128> { using type = FwdConfig<128, 176, 2>; };
// The same with a narrow tail of kTail keys (see kTailBlockN): a row of 4096 keys ends in a block of 48,
// which the 176-wide GEMMs would compute as 176 (2.7% of the row's work on masked keys), the 64-wide
// ones as 64.
template <int kHeadDim, int kTail>
struct WideKeyTailFwdConfig;
template <int kTail> struct WideKeyTailFwdConfig<128, kTail> {
  using type = FwdConfig<128, 176, 2, 2, 1, false, false, kTail>;
};

// The unmasked forward of long rows runs in this configuration (see uses_long_row_config): at tile
// width 64, three consumer warpgroups (192 queries per tile, 160 registers each) keep the tensor
// cores busier than two. The masked variant stays at two: at 160 registers it spills (~1.9 KB).
// Two Q buffers, so its warpgroups run staggered (see kStaggered in fwd_kernel): +3% at N = 2k and
// 4k without causal masking, +1% at 4k with it (H200, bf16). At two consumers staggering measured
// -2% (causal, N <= 2k) to +1%, so the default configurations keep one Q buffer.
template <int kHeadDim>
struct LongRowFwdConfig {
  using type = typename DefaultFwdConfig<kHeadDim>::type;
};
template <> struct LongRowFwdConfig<64> { using type = FwdConfig<64, 128, 4, 3, 2, true>; };

// Whether a shape's rows are long enough for LongRowFwdConfig. Measured on the H200 (bf16, B * N =
// 16k): three consumers gain 5-12% without causal masking from N = 2k, and 4-8% with it from 4k; below
// that the taller tiles lose more to the causal diagonal (a 192-query tile computes more masked
// scores than a 128-query one: -8% at 2k, -13% at 1k) than they gain, and tie without it at 1k.
inline bool uses_long_row_config(const AttentionShape& sh) {
  return std::min(sh.seqlen_q, sh.seqlen_k) >= (sh.is_causal ? 4096 : 2048);
}

// The masked variant's configurations: whole multiples of 32 keys per step, the output stored by the
// threads (its registers and shared memory are as they were before the staged output).
template <int kHeadDim>
struct MaskedFwdConfig;
template <> struct MaskedFwdConfig<64> { using type = FwdConfig<64, 128, 4>; };
template <> struct MaskedFwdConfig<96> { using type = FwdConfig<96, 128, 2>; };
template <> struct MaskedFwdConfig<128> { using type = FwdConfig<128, 128, 3>; };
template <> struct MaskedFwdConfig<192> { using type = FwdConfig<192, 96, 2>; };
template <> struct MaskedFwdConfig<256> { using type = FwdConfig<256, 64, 2>; };
static_assert(MaskedFwdConfig<64>::type::kBlockN == masked_fwd_keys_per_step(64) &&
                  MaskedFwdConfig<96>::type::kBlockN == masked_fwd_keys_per_step(96) &&
                  MaskedFwdConfig<128>::type::kBlockN == masked_fwd_keys_per_step(128) &&
                  MaskedFwdConfig<192>::type::kBlockN == masked_fwd_keys_per_step(192) &&
                  MaskedFwdConfig<256>::type::kBlockN == masked_fwd_keys_per_step(256),
              "sm90/fwd_tiles.h is out of date");

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

// ---- producer ----

// Whether the variant ends its pairs in a dynamic tail (fwd_schedule.h). Not the masked one: its
// producer, which also walks the mask's tile classes, has no registers to spare for the claim loop in
// its 24 (ptxas spilled 76-168 bytes at every width).
template <bool kMasked>
constexpr bool kFwdDynamicTail = !kMasked;

// The key blocks a tile visits: from block n on, the first one the mask does not exclude entirely
// (all of them without a mask); num_n_blocks when none is left. The tile's classes are read
// kClassWindow at a time (a class read from memory between a consumer's GEMMs stalled the consumer
// for a memory round trip at every key block) and kept as two bit sets, so that finding the next
// block and whether its elements are read is a shift and a find-first-set, not a byte-by-byte scan:
// the walk runs on the consumers' critical path at every key block.
template <typename T, bool kMasked>
struct KeyBlockWalk {
  MaskView<T> mask;
  int num_n_blocks;
  ClassBits bits;  // the window of blocks last loaded

  __device__ __forceinline__ KeyBlockWalk(const FwdParams& p, const FwdTile& t, int block_m)
      : mask(kMasked ? MaskView<T>(p.mask, t.batch, t.head, t.m0 / block_m) : MaskView<T>()),
        num_n_blocks(t.num_n_blocks) {}

  // Bit i = bit `flag_bit` of byte i of the four words (16 class bytes).
  __device__ __forceinline__ static uint32_t gather_flag(const uint4& w, int flag_bit) {
    // (x & 0x01010101) * 0x01020408 puts byte i's low bit at bit 24 + i, with no carries between them.
    auto nibble = [&](uint32_t x) { return (((x >> flag_bit) & 0x01010101u) * 0x01020408u) >> 24; };
    return nibble(w.x) | nibble(w.y) << 4 | nibble(w.z) << 8 | nibble(w.w) << 12;
  }
  __device__ __forceinline__ void load_window(int first) {
    static_assert(kClassWindow == 16, "one uint4 per window");
    static_assert(kTileAnyVisible == 1 && kTileNeedsMask == 2 && kTileKeyPrefix == 4, "flag bits 0, 1 and 2");
    bits.first = first;
    const uint4 w = *reinterpret_cast<const uint4*>(mask.classes + first);
    // Class bytes past the last block are padding: never visible.
    const int blocks = num_n_blocks - first;
    const uint32_t exists = blocks >= kClassWindow ? 0xffffu : (1u << blocks) - 1;
    bits.visible = gather_flag(w, 0) & exists;
    bits.needs = gather_flag(w, 1) & exists;
    bits.prefix = gather_flag(w, 2) & exists;
  }
  __device__ __forceinline__ int next(int n) {
    if constexpr (kMasked) {
      if (mask.classes != nullptr) {
        return bits.next_visible(n, num_n_blocks, [&](int m) { load_window(m & ~(kClassWindow - 1)); });
      }
    }
    return n;
  }
  // One past the last block of the plain run that starts at block n (the last block next() returned,
  // < num_n_blocks): blocks n, n + 1, ... that are all visible, need no mask elements and lie before
  // `edge` (the first block that needs the length or causal test), within the current window. n itself
  // when it is not plain.
  __device__ __forceinline__ int plain_run_end(int n, int edge) const {
    if constexpr (kMasked) {
      if (mask.classes == nullptr) return n;  // every block reads its elements
      const uint32_t plain = (bits.visible & ~bits.needs) >> (n - bits.first);  // below bit 16
      return min(n + __ffs(~plain) - 1, edge);
    }
    return n;
  }
  // Whether the mask's elements of key block n (the last block next() returned, < num_n_blocks) must
  // be read.
  __device__ __forceinline__ bool needs_elements(int n) const {
    if constexpr (kMasked) {
      return mask.kind != MaskKind::kNone && (mask.classes == nullptr || bits.needs_elements(n));
    }
    return false;
  }
  // For key block n (as needs_elements, which it holds for): one past the last key its tile keeps when
  // the tile is a key prefix (a length test then replaces the elements), else -1. The key counts lie
  // at the classes' offset in m.tile_key_count.
  __device__ __forceinline__ int prefix_key_end(int n, int block_n, const MaskParams& m) const {
    if constexpr (kMasked) {
      if (mask.classes != nullptr && bits.is_prefix(n)) {
        return n * block_n + m.tile_key_count[(mask.classes - m.tile_class) + n];
      }
    }
    return -1;
  }
};

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
template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast>
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
    int key_end = sh.seqlen_k;
    if (tile >= 0) {
      t = FwdTile::at<Cfg::kBlockM, Cfg::kBlockN>(tile, sh, sched);
      if constexpr (kKeyEnds) {
        key_end = p.key_end[t.batch * sh.heads_q + t.head];
        t.limit_keys<Cfg::kBlockN>(key_end);
      }
    }
    KeyBlockWalk<T, kMasked> walk(p, t, Cfg::kBlockM);
    const bool has_keys = tile >= 0 && walk.next(0) < t.num_n_blocks;
    const int q_stage = q_iter % Cfg::kQStages, q_use = q_iter / Cfg::kQStages;
    if (q_use > 0) mbar_wait(&bars.q_empty[q_stage], (q_use - 1) & 1);
    ++q_iter;
    bars.q_tile[q_stage] = tile;
    if constexpr (kKeyEnds) bars.q_key_end[q_stage] = key_end;
    if (!has_keys) {
      mbar_arrive(&bars.q_full[q_stage]);
      return;
    }
    mbar_arrive_expect_tx(&bars.q_full[q_stage], Cfg::kQBytes);
    tma_load_tile<Cfg::kColBlocks>(q_smem + q_stage * Cfg::kQBytes, &maps.q, &bars.q_full[q_stage], t.m0, t.head,
                                   t.batch, Cfg::kQColBlockBytes);
    // Not unrolled: the producer has 24 registers, and the unrolled copies inlined twice (static and
    // dynamic tiles) spilled 8-20 bytes. One thread's few extra instructions per key block cost nothing.
#pragma unroll 1
    for (int n = walk.next(0); n < t.num_n_blocks; n = walk.next(n + 1), ++kv_iter) {
      const int stage = kv_iter % Cfg::kStages;
      const int use = kv_iter / Cfg::kStages;
      if (use > 0) mbar_wait(&bars.k_empty[stage], (use - 1) & 1);
      mbar_arrive_expect_tx(&bars.k_full[stage], Cfg::kKVBytes);
      load_kv_block<Cfg, kMulticast>(k_smem + stage * Cfg::kKVBytes, &maps.k, &bars.k_full[stage], n * Cfg::kBlockN,
                                     t.kv_head, t.batch);
      if (use > 0) mbar_wait(&bars.v_empty[stage], (use - 1) & 1);
      mbar_arrive_expect_tx(&bars.v_full[stage], Cfg::kKVBytes);
      load_kv_block<Cfg, kMulticast>(v_smem + stage * Cfg::kKVBytes, &maps.v, &bars.v_full[stage], n * Cfg::kBlockN,
                                     t.kv_head, t.batch);
    }
  };
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

// ---- consumer pieces ----

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

// ---- the kernel ----

template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast>
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
  if (Cfg::kStagedOutput && staged_output) {
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
    FwdTile t = FwdTile::at<kBlockM, kBlockN>(tile, sh, sched);
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
    // Masks block `block`'s scores; returns the scale the softmax must apply to them. A block whose
    // mask tile is a key prefix ending at key_end (>= 0) takes the length test up to key_end instead of
    // its mask elements.
    auto apply_masks = [&](float(&scores)[kBlockN / 2], int block, bool mask_needed, int key_end) {
      const int n0 = block * kBlockN;
      const bool needs_mask = block >= edge_block;
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
    const DropoutRow rng = dropout ? DropoutRow(p.dropout, t.batch, sh.heads_q, t.head) : DropoutRow{};
    auto apply_dropout = [&](float(&scores)[kBlockN / 2], int block) {
      if constexpr (kMasked) {
        if (dropout) drop_probabilities<kBlockN>(scores, rng, row0, block * kBlockN, lane);
      }
    };
    // Visit i (the i-th key block walked) uses ring position kv_iter + i.
    auto stage_of = [&](int i) { return (kv_iter + i) % kStages; };
    auto phase_of = [&](int i) { return ((kv_iter + i) / kStages) & 1; };

    int block = walk.next(0);
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
    write_epilogue<T, Cfg::kHeadDim, kBlockN>(p, o, softmax, t.head, t.batch, row0, first_row, lane,
                                              dropout ? p.dropout.keep_scale : 1.f, staging);
    release_next_consumer();  // a first tile without visible keys
  }
  release_next_consumer();  // no tile at all
  // The shared memory must outlive this warpgroup's last TMA store.
  if (staging.map != nullptr && threadIdx.x % 128 == 0) bulk_wait();
  if constexpr (kMulticast) cluster_sync();
#endif
}

// Whether a launch can run with K/V multicast (see kMulticast): no causal masking, no attention mask
// or key ends (the caller's variant), and query tiles that pair up within each row.
template <typename Cfg>
inline bool multicast_fits(const AttentionShape& sh) {
  const int num_m = (sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return !sh.is_causal && num_m % 2 == 0;
}

// The launch configuration of `grid` CTAs (an even number) in clusters of two; it points to `cluster`.
inline cudaLaunchConfig_t pair_cluster_config(int grid, int threads, int smem_bytes, cudaStream_t stream,
                                              cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = 2;
  cluster->val.clusterDim.y = 1;
  cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  return config;
}

// How many clusters of two CTAs of kKernel can be resident at once on `device` (0: none, or the query
// failed), asked once per kernel and device. The kernel's dynamic shared memory limit must be set first.
template <auto kKernel>
inline int max_resident_clusters(int threads, int smem_bytes, int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};  // count + 1; 0: not asked yet
  if (device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) return cache[device] - 1;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = pair_cluster_config(2, threads, smem_bytes, nullptr, &cluster);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  if (device < kCachedDevices) cache[device] = clusters + 1;
  return clusters;
}

// Whether a launch's rows end in a block that configuration Cfg's narrow tail covers (see kTailBlockN):
// no causal masking, at least one full key block, then 1 .. kTailBlockN keys.
template <typename Cfg>
inline bool narrow_tail_fits(const AttentionShape& sh) {
  const int tail = sh.seqlen_k % Cfg::kBlockN;
  return !sh.is_causal && sh.seqlen_k > Cfg::kBlockN && tail > 0 && tail <= Cfg::kTailBlockN;
}

template <typename T, typename Cfg, bool kMasked = false, bool kKeyEnds = false, bool kMulticast = false>
cudaError_t launch_fwd_with_config(const FwdParams& p, cudaStream_t stream) {
  static_assert(!kMulticast || (!kMasked && !kKeyEnds), "multicast runs rows that walk every key block");
  static_assert(!Cfg::kNarrowTail || (!kMasked && !kKeyEnds && !Cfg::kPrefetchScores),
                "a narrow tail: every row walks every key block, Q from shared memory");
  const AttentionShape& sh = p.shape;
  if constexpr (Cfg::kNarrowTail) {
    if (!narrow_tail_fits<Cfg>(sh)) return cudaErrorInvalidConfiguration;
  }
  FwdTensorMaps maps;
  // With multicast each CTA loads half of each key block.
  constexpr int kKVBoxRows = Cfg::kBlockN / kFwdClusterCtas<kMulticast>;
  cudaError_t err = make_tensor_map(&maps.q, p.q, sh, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.k, p.k, sh, sh.seqlen_k, sh.heads_kv, p.k_strides, kKVBoxRows);
  if (err == cudaSuccess) err = make_tensor_map(&maps.v, p.v, sh, sh.seqlen_k, sh.heads_kv, p.v_strides, kKVBoxRows);
  if (err != cudaSuccess) return err;
  // The staged output needs a tensor map of out (16-byte aligned rows); without one the threads store.
  // FLASHATTN_SM90_DIRECT_OUTPUT=1 has them store anyway: compute-sanitizer's initcheck does not count
  // TMA stores as writes, so scripts/sanitize.py runs it that way (read on every call, as the tests
  // switch it).
  const bool staged_output =
      Cfg::kStagedOutput && !env_switch("FLASHATTN_SM90_DIRECT_OUTPUT", false) &&
      make_tensor_map(&maps.out, p.out, sh, sh.seqlen_q, sh.heads_q, p.out_strides, 64) == cudaSuccess;
  const int64_t num_tiles = static_cast<int64_t>((sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * sh.heads_q * sh.batch;
  if (num_tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  // Persistent CTAs, at most one per SM (see FwdSchedule); tiles go in pairs unless they all fit in
  // one wave, and pairs end in a dynamic tail when there is a counter for it.
  int device = 0, num_sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int num_m = (sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  // Pairs only where tiles differ in cost (causal, or a mask): with 192-query tiles an odd number of
  // query blocks leaves one single-tile unit per head, and when the CTA count is a multiple of the
  // units per head the same CTAs get every light unit (-5% at N = 2k, D = 64).
  const int tiles_per_unit = num_tiles > num_sms && (sh.is_causal || kMasked) ? 2 : 1;
  const int64_t num_units = (tiles_per_unit == 2 ? (num_m + 1) / 2 : num_m) * static_cast<int64_t>(sh.heads_q) * sh.batch;
  int grid = static_cast<int>(num_units < num_sms ? num_units : num_sms);
  constexpr auto kernel = fwd_kernel<T, Cfg, kMasked, kKeyEnds, kMulticast>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  if constexpr (kMulticast) {  // whole clusters, no more than can be resident at once
    if (tiles_per_unit != 1 || !multicast_fits<Cfg>(sh)) return cudaErrorInvalidConfiguration;
    const int64_t resident = max_resident_clusters<kernel>(Cfg::kThreads, Cfg::kSmemBytes, device);
    // No pair of SMs for a cluster (a partitioned GPU, say): the single-CTA loads.
    if (resident < 1) return launch_fwd_with_config<T, Cfg, kMasked, kKeyEnds, false>(p, stream);
    grid = 2 * static_cast<int>(std::min<int64_t>(num_units / 2, resident));
  }
  // FLASHATTN_SM90_STATIC_SCHEDULE=1 keeps every tile in the static pairs (read on every call: the
  // tests compare the two schedules, and timing them needs no second build).
  const bool dynamic_tail = kFwdDynamicTail<kMasked> && tiles_per_unit == 2 && p.tile_counter != nullptr &&
                            !env_switch("FLASHATTN_SM90_STATIC_SCHEDULE", false);
  const int dynamic_heads = dynamic_tail ? fwd_dynamic_heads(sh, num_m, grid) : 0;
  if (dynamic_heads > 0) {
    err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  const FwdSchedule sched(sh, Cfg::kBlockM, tiles_per_unit, dynamic_heads);
  if constexpr (kMulticast) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = pair_cluster_config(grid, Cfg::kThreads, Cfg::kSmemBytes, stream, &cluster);
    return cudaLaunchKernelEx(&config, kernel, maps, p, sched, staged_output);
  } else {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p, sched, staged_output);
    return cudaGetLastError();
  }
}

// Whether to run a launch that fits (multicast_fits) with K/V multicast. FLASHATTN_SM90_MULTICAST=0 or
// 1 turns it off or on wherever it fits (read on every call: the tests compare both, and timing them
// needs no second build). Unset, tile width 128 uses it from 1024 keys on: +1.5-3.8% from 2k, level at
// 1k, and -1.5% at 512, where a tile's four key blocks leave little L2 traffic to save while the two
// CTAs of a cluster still wait for each other (benchmarks/NOTES.md). Only width 128 has multicast kernels.
inline bool wants_multicast(const AttentionShape& sh) {
  return env_switch("FLASHATTN_SM90_MULTICAST", sh.seqlen_k >= 1024);
}

// Whether an unmasked launch without key ends at tile width 128 runs WideKeyFwdConfig: without causal
// masking from 2048 keys on (with the narrow tail, 532ec64: +3.8% / +2.1% at 2k / 4k against 128-key
// blocks; it was from 8192 before the tail). FLASHATTN_SM90_WIDE_KEY_BLOCKS=0 or 1 turns it off, or on
// for every such launch (read on every call, as the tests compare both).
inline bool wants_wide_key_blocks(const AttentionShape& sh) {
  return env_switch("FLASHATTN_SM90_WIDE_KEY_BLOCKS", !sh.is_causal && sh.seqlen_k >= 2048);
}

// Whether a launch in WideKeyFwdConfig whose rows end in a short key block runs WideKeyTailFwdConfig:
// yes unless FLASHATTN_SM90_NARROW_TAIL=0 (read on every call, as the tests compare both).
inline bool wants_narrow_tail() {
  return env_switch("FLASHATTN_SM90_NARROW_TAIL", true);
}

// The width with multicast kernels: at width 64 multicast measured 0 to -3% (benchmarks/NOTES.md).
template <int kHeadDim>
constexpr bool kFwdMulticastBuilt = kHeadDim == 128;

// An unmasked launch without key ends in configuration Cfg: with K/V multicast where it fits and is
// wanted, else with single-CTA loads.
template <typename T, typename Cfg, int kHeadDim>
cudaError_t launch_fwd_every_key(const FwdParams& p, cudaStream_t stream) {
  if constexpr (kFwdMulticastBuilt<kHeadDim>) {
    if (multicast_fits<Cfg>(p.shape) && wants_multicast(p.shape)) {
      return launch_fwd_with_config<T, Cfg, false, false, true>(p, stream);
    }
  }
  return launch_fwd_with_config<T, Cfg>(p, stream);
}

// A launch in WideKeyFwdConfig: with a narrow tail of 64 or 128 keys where the rows' last block holds no
// more (rows without causal masking, past one full block), else with every block 176 keys wide.
template <typename T, int kHeadDim>
cudaError_t launch_fwd_wide_keys(const FwdParams& p, cudaStream_t stream) {
  using Tail64 = typename WideKeyTailFwdConfig<kHeadDim, 64>::type;
  using Tail128 = typename WideKeyTailFwdConfig<kHeadDim, 128>::type;
  if (wants_narrow_tail()) {
    if (narrow_tail_fits<Tail64>(p.shape)) return launch_fwd_every_key<T, Tail64, kHeadDim>(p, stream);
    if (narrow_tail_fits<Tail128>(p.shape)) return launch_fwd_every_key<T, Tail128, kHeadDim>(p, stream);
  }
  return launch_fwd_every_key<T, typename WideKeyFwdConfig<kHeadDim>::type, kHeadDim>(p, stream);
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Default = typename DefaultFwdConfig<kHeadDim>::type;
  using LongRows = typename LongRowFwdConfig<kHeadDim>::type;
  const bool key_ends = p.key_end != nullptr;
  if constexpr (!std::is_same_v<LongRows, Default>) {
    if (uses_long_row_config(p.shape)) {
      return key_ends ? launch_fwd_with_config<T, LongRows, false, true>(p, stream)
                      : launch_fwd_every_key<T, LongRows, kHeadDim>(p, stream);
    }
  }
  if constexpr (kHeadDim == 128) {
    if (!key_ends && wants_wide_key_blocks(p.shape)) return launch_fwd_wide_keys<T, kHeadDim>(p, stream);
  }
  if (key_ends) return launch_fwd_with_config<T, Default, false, true>(p, stream);
  if constexpr (kHeadDim == 64) {  // two consumer warpgroups: prefetched scores
    return launch_fwd_every_key<T, typename PrefetchScoresFwdConfig<kHeadDim>::type, kHeadDim>(p, stream);
  } else {
    return launch_fwd_every_key<T, Default, kHeadDim>(p, stream);
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd_masked(const FwdParams& p, cudaStream_t stream) {
  return launch_fwd_with_config<T, typename MaskedFwdConfig<kHeadDim>::type, true>(p, stream);
}

}  // namespace sm90
}  // namespace flashattn
