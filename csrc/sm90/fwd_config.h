// The tile configurations of the sm90 forward: one FwdConfig per kernel variant's tile shape, ring
// depths, warpgroups and shared-memory layout, and the named configurations each launch picks from.
#pragma once

#include <algorithm>

#include "params.h"
#include "sm90/ptx.h"

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

// The default configuration at tile width 64 (two consumer warpgroups) with prefetched scores (see
// kPrefetchScores), which launches over every row run there: a tile's first softmax then has a GEMM of
// its own warpgroup under it; the same bits as without. At width 128 the first block's scores do not
// fit beside O without the set-form GEMMs, and with them it measured slower (docs/perf-log.md).
template <int kHeadDim>
struct PrefetchScoresFwdConfig;
template <> struct PrefetchScoresFwdConfig<64> { using type = FwdConfig<64, 128, 4, 2, 1, true, true>; };

// 176 keys per step at tile width 128, so each key block's barrier waits, O rescale and GEMM issue
// cover 1.375x the work. It pays on long rows without causal masking (with the narrow tail below from
// 2k keys); on short rows a tile has few blocks to spread its prologue and epilogue over, and with causal
// masking the wider diagonal blocks cost more (the planner's rule, sm90/fwd_plan.cu; figures in
// docs/perf-log.md). The output staging (32 KB) does not fit beside two 44 KB K/V stages and Q, so the
// threads store the output.
template <int kHeadDim>
struct WideKeyFwdConfig;
template <> struct WideKeyFwdConfig<128> { using type = FwdConfig<128, 176, 2>; };
// The same with a narrow tail of kTail keys (see kTailBlockN): a row of 4096 keys ends in a block of 48,
// which the 176-wide GEMMs would compute as 176 keys, the 64-wide ones as 64.
template <int kHeadDim, int kTail>
struct WideKeyTailFwdConfig;
template <int kTail> struct WideKeyTailFwdConfig<128, kTail> {
  using type = FwdConfig<128, 176, 2, 2, 1, false, false, kTail>;
};

// The unmasked forward of long rows runs in this configuration (see uses_long_row_config): at tile
// width 64, three consumer warpgroups (192 queries per tile, 160 registers each) keep the tensor
// cores busier than two. The masked variant stays at two: at 160 registers it spills.
// Two Q buffers, so its warpgroups run staggered (see kStaggered in fwd_kernel.cuh); at two
// consumers staggering did not pay, so the default configurations keep one Q buffer (docs/perf-log.md).
template <int kHeadDim>
struct LongRowFwdConfig {
  using type = typename DefaultFwdConfig<kHeadDim>::type;
};
template <> struct LongRowFwdConfig<64> { using type = FwdConfig<64, 128, 4, 3, 2, true>; };

// Whether a shape's rows are long enough for LongRowFwdConfig: on shorter rows the taller tiles lose
// more to the causal diagonal (a 192-query tile computes more masked scores than a 128-query one) than
// they gain, and tie without causal masking at 1k (docs/perf-log.md).
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

// The variable-length forward's configurations (fwd_kernel.cuh's kVarlen): the unmasked kernel's tiles
// with the output stored by the threads, since a TMA store of a 64-row box would write past a
// sequence's last row into the next one's; at widths 64 and 128 the staging's shared memory goes to
// K/V stages instead.
template <int kHeadDim>
struct VarlenFwdConfig;
template <> struct VarlenFwdConfig<64> { using type = FwdConfig<64, 128, 4>; };
template <> struct VarlenFwdConfig<96> { using type = FwdConfig<96, 128, 2>; };
template <> struct VarlenFwdConfig<128> { using type = FwdConfig<128, 128, 3>; };
template <> struct VarlenFwdConfig<192> { using type = FwdConfig<192, 96, 2>; };
template <> struct VarlenFwdConfig<256> { using type = FwdConfig<256, 80, 2>; };

}  // namespace sm90
}  // namespace flashattn
