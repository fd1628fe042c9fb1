// The wide sm90 backward: tile widths above 128 (BwdWideConfig), where a consumer warpgroup cannot hold
// dK and dV over the whole head dim for 64 keys (at 256 that alone is 256 registers a thread).
//
// The same three launches, producer warp and Q / dO ring as bwd_kernel.cuh (produce_bwd). One CTA per
// (64-key block, kv head, batch); the two consumers split the work two ways:
//   - by keys for the scores: consumer c computes S = Q K^T and dP = dO V^T for its 32 keys
//     [32c, 32c + 32) and all 64 queries of the step (wgmma from shared memory), P = exp2(S scale - LSE)
//     and dS = P (dP - delta) in registers, and writes both, rounded to T, into the step's shared
//     [64 queries][64 keys] P and dS tiles (128-byte swizzle);
//   - by head dims for the products: once both halves of P and dS are there, each consumer computes
//     its head dims (BwdWideConfig: halves at width 256, 128 and 64 at 192) of dV += P^T dO and
//     dK += dS^T Q over all 64 keys (dK and dV stay in registers for the whole CTA) and of
//     dQ_partial = dS K, which meets the other consumer's columns in an fp32 staging tile (the sm90
//     tile layout, cuda/dq_accum_layout.h) added into the dq workspace with one bulk reduction per
//     step (issued as in bwd_kernel.cuh, sm90/bwd_dq_writer.h). An uneven split costs little: both consumers' GEMMs run on the SM's one set of tensor
//     cores, so what counts is their sum.
// The kMasked variant applies params.mask (on the masked backward's 64-query x 128-key class grid: a
// 64-key block reads the classes of the 128-key tile it lies in) and writes dS to params.dmask when
// set; its kDropout form applies params.dropout too. No key-length form (the planner gives none at these
// widths). Deterministic mode as in bwd_kernel.cuh (DqTurns), in the unmasked variant and the masked
// one's kMaskedTurns form. The kVarlen form (unmasked) runs a variable-length batch as bwd_kernel.cuh's:
// the CTA takes item blockIdx.x of p.varlen's list and addresses its sequence's rows in the packed
// tensors and workspaces (BwdRows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"
#include "cuda/bwd_aux.cuh"
#include "common/dropout.h"
#include "cuda/element_ops.h"
#include "cuda/mask_view.h"
#include "cuda/alibi.h"
#include "cuda/softcap.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_kernel.cuh"
#include "sm90/fragments.h"
#include "sm90/ptx.h"
#include "sm90/tensor_map.h"
#include "sm90/wgmma.h"

namespace flashattn {
namespace sm90 {

// acc (64 queries x 32 keys) = a [64 queries][D] K-major tile times the rows of a [keys][D] K-major tile
// (32 of them, from `key_rows`), transposed. S = Q K^T and dP = dO V^T.
template <typename T, typename Cfg>
__device__ __forceinline__ void issue_queries_by_keys(float (&acc)[Cfg::kKeysPerConsumer / 2], uint32_t q_tile,
                                                      uint32_t key_rows) {
  const uint64_t desc_a0 = smem_desc_sw128(q_tile, 16, 1024), desc_b0 = smem_desc_sw128(key_rows, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < Cfg::kHeadDim / 16; ++ks) {
    const int offset = (ks % 4) * 32;
    const uint64_t desc_a = smem_desc_advance(desc_a0, (ks / 4) * Cfg::kQColBlockBytes + offset);
    const uint64_t desc_b = smem_desc_advance(desc_b0, (ks / 4) * Cfg::kKVColBlockBytes + offset);
    Wgmma<T, Cfg::kKeysPerConsumer>::ss(acc, desc_a, desc_b, ks > 0);
  }
}

// acc (64 keys x this consumer's head dims) += scores^T (the [64 queries][64 keys] tile, MN-major A)
// times `rows` (a [64 queries][D] tile from its first column block of those dims, MN-major B).
// dV += P^T dO and dK += dS^T Q.
template <typename T, typename Cfg, int kDims>
__device__ __forceinline__ void issue_keys_by_dims_ss(float (&acc)[kDims / 2], uint32_t scores, uint32_t rows) {
  const uint64_t desc_a0 = smem_desc_sw128(scores, Cfg::kScoreTileBytes, 1024);
  const uint64_t desc_b0 = smem_desc_sw128(rows, Cfg::kQColBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk) {
    const int offset = kk * 16 * 128;
    Wgmma<T, kDims>::ss_mn(acc, smem_desc_advance(desc_a0, offset), smem_desc_advance(desc_b0, offset), 1);
  }
}

// dq (64 queries x this consumer's head dims) = dS (the [64 queries][64 keys] tile, K-major A) times K
// (the [64 keys][D] tile from its first column block of those dims, MN-major B).
template <typename T, typename Cfg, int kDims>
__device__ __forceinline__ void issue_dq_wide(float (&dq)[kDims / 2], uint32_t ds_tile, uint32_t k_cols) {
  const uint64_t desc_a0 = smem_desc_sw128(ds_tile, 16, 1024);
  const uint64_t desc_b0 = smem_desc_sw128(k_cols, Cfg::kKVColBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    Wgmma<T, kDims>::ss_b_mn(dq, smem_desc_advance(desc_a0, kk * 32), smem_desc_advance(desc_b0, kk * 16 * 128),
                             kk > 0);
  }
}

// Writes this consumer's 64 queries x 32 keys of a score tile (P or dS, accumulator layout) into the
// [64 queries][64 keys] tile at `tile`, rounded to T, with the 128-byte swizzle: the 16-byte chunk c of
// row r lives at chunk c ^ (r % 8).
template <typename T, typename Cfg>
__device__ __forceinline__ void store_scores_swizzled(uint32_t tile, const float (&acc)[Cfg::kKeysPerConsumer / 2],
                                                      int consumer, int warp_in_group, int lane) {
  using Ops = ElementOps<T>;
#pragma unroll
  for (int j = 0; j < Cfg::kKeysPerConsumer / 8; ++j) {  // n8 block j: keys 32 consumer + 8j + ...
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_in_group * 16 + lane / 4 + half * 8;
      const int chunk = consumer * (Cfg::kKeysPerConsumer / 8) + j;
      const int offset = row * 128 + ((chunk ^ (row % 8)) << 4) + (lane % 4) * 4;
      st_shared_u32(tile + offset, Ops::pack(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]));
    }
  }
}

// Dropout's keep bits of this thread's 64 queries x 32 keys score tile (bit i: element i). Its layout
// is the forward's (rows = queries), so each of the two calls gives one whole keep-mask octet: word w of
// call c decides element 4w + c (query row0) and 4w + 2 + c (query row0 + 8), as drop_probabilities
// (fwd_softmax.h) applies them.
__device__ __forceinline__ uint32_t wide_keep_bits(const DropoutRow& rng, int row0, int key0, int lane) {
  uint32_t keep = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const PhiloxWords words = rng.octet_words(row0, key0 + 2 * (lane % 4) + c);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      keep |= static_cast<uint32_t>(dropout_keeps_low(words.w[w], rng.threshold)) << (4 * w + c);
      keep |= static_cast<uint32_t>(dropout_keeps_high(words.w[w], rng.threshold)) << (4 * w + 2 + c);
    }
  }
  return keep;
}

// Both consumers past this point together, their shared-memory writes before it seen by the other
// after it. When they run one copy of the step loop (an even split), one bar.sync. Otherwise their
// copies would reach that barrier from different instructions, which the aligned barrier does not
// allow: consumer 0 arrives at one barrier and waits at the second, which consumer 1 arrives at only
// after waiting at the first, so no arrival can be counted in an earlier meeting's generation.
template <typename Cfg>
__device__ __forceinline__ void wide_consumers_meet(int consumer) {
  if constexpr (Cfg::kDims0 == Cfg::kDims1) {
    named_barrier_sync(kBwdConsumerBarrier, 256);
  } else if (consumer == 0) {
    named_barrier_arrive(kBwdConsumerBarrier, 256);
    named_barrier_sync(Cfg::kSecondConsumerBarrier, 256);
  } else {
    named_barrier_sync(kBwdConsumerBarrier, 256);
    named_barrier_arrive(Cfg::kSecondConsumerBarrier, 256);
  }
}

// The step loop of consumer `consumer` (0 or 1), whose head dims for the products are [dim0, dim0 +
// kDims), and its dK and dV stores. sh: the call's shape, or (kVarlen) the CTA's sequence's; rows: where
// the CTA's rows live.
template <typename T, typename Cfg, bool kMasked, bool kDropout, bool kMaskedTurns, bool kVarlen, int kDims>
__device__ __forceinline__ void wide_consume(const BwdParams& p, const AttentionShape& sh, const BwdRows& rows,
                                             BwdBarriers<Cfg>& bars, unsigned char* base, const BwdSteps& steps,
                                             BwdStepWalk<T, kMasked> walk, const BwdKeyBlock& block, int consumer,
                                             int dim0) {
  constexpr int kBlockM = Cfg::kBlockM, kStages = Cfg::kStages;
  constexpr int kKeys = Cfg::kKeysPerConsumer;
  const int kv_head = block.kv_head, batch = block.batch, n0 = block.n0;
  const int warp_in_group = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  // The warp that issues each step's dQ reduction or hands it to the writer warp (sm90/bwd_dq_writer.h):
  // consumer 0's first.
  const bool reducer_warp = threadIdx.x / 32 == 4;
  const DqReducer reducer{dq_to_writer<kMasked, kMaskedTurns>(p)};
  const int key0 = n0 + consumer * kKeys;  // this consumer's score columns: keys [key0, key0 + 32)
  const uint32_t smem = smem_u32(base);
  const uint32_t key_rows = smem + consumer * kKeys * 128;  // its 32 rows of K in every column block
  const uint32_t value_rows = key_rows + Cfg::kVOffset;
  const uint32_t k_cols = smem + (dim0 / 64) * Cfg::kKVColBlockBytes;  // K from its first head-dim column block
  const uint32_t p_tile = smem + Cfg::kPOffset, ds_tile = smem + Cfg::kDsOffset;
  const uint32_t dq_stage_addr = smem + Cfg::kDqOffset;  // [64 * kHeadDim] fp32, tile layout
  const float* stats_ring = reinterpret_cast<const float*>(base + Cfg::kStatsOffset);
  // This thread's two query rows of every score accumulator: r0 and r0 + 8.
  const int r0 = warp_in_group * 16 + lane / 4;

  float dk[kDims / 2], dv[kDims / 2];
#pragma unroll
  for (int i = 0; i < kDims / 2; ++i) dk[i] = dv[i] = 0.f;

  int step = walk.next(0);
  int iter = 0;  // steps run so far, as in produce_bwd
  mbar_wait(&bars.kv_full, 0);
  for (; step < steps.count(); ++iter) {
    const bool mask_needed = walk.needs_elements(step);  // before next() moves the class window on
    const int next = walk.next(step + 1);
    const int stage = iter % kStages;
    const int head = steps.head(step, kv_head);
    const int m0 = steps.m0<kBlockM>(step);
    const uint32_t q_tile = smem + Cfg::kQOffset + stage * Cfg::kQBytes;
    const uint32_t do_tile = smem + Cfg::kDoOffset + stage * Cfg::kQBytes;
    const float* stats = stats_ring + stage * (Cfg::kStatsBytes / 4);  // [64] LSE (base 2), then [64] delta

    uint32_t keep = 0;  // dropout's keep bits, made while no accumulator is live
    if constexpr (kDropout) {
      keep = wide_keep_bits(DropoutRow(p.dropout, batch, sh.heads_q, head), m0 + r0, key0, lane);
    }
    float s[kKeys / 2], dp[kKeys / 2];
    mbar_wait(&bars.qdo_full[stage], (iter / kStages) & 1);
    wgmma_fence();
    issue_queries_by_keys<T, Cfg>(s, q_tile, key_rows);
    wgmma_commit();
    issue_queries_by_keys<T, Cfg>(dp, do_tile, value_rows);
    wgmma_commit();
    const float lse[2] = {stats[r0], stats[r0 + 8]};
    wgmma_wait<1>();
    fence_registers(s);
    const bool softcapped = sh.softcap_inner != 0.f;  // cuda/softcap.h
    if (softcapped) softcap_scores(s, sh.softcap_inner);
    const float alibi = alibi_slope(sh, batch, head);  // cuda/alibi.h
    if (alibi != 0.f) {
      // Element i: query m0 + accumulator_row(i), key key0 + accumulator_col(i).
      const float base = static_cast<float>(m0 + accumulator_row(0, warp_in_group, lane) + sh.alibi_offset - key0 -
                                            accumulator_col(0, lane));
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        const int shift = (accumulator_row(i, warp_in_group, lane) - accumulator_row(0, warp_in_group, lane)) -
                         (accumulator_col(i, lane) - accumulator_col(0, lane));
        s[i] = add_alibi(s[i], alibi, base + static_cast<float>(shift));
      }
    }
    if (mask_needed) {
      // With the attention mask: exp2(S scale + mask - LSE), all in base-2 units; its loads issued
      // together (MaskView::load_terms).
      const MaskView<T> mask = walk.mask(step);
      float term[kKeys / 2];
      mask.template load_terms<kKeys / 2>(
          [&](int i) -> int64_t {
            const int query = m0 + accumulator_row(i, warp_in_group, lane);
            const int key = key0 + accumulator_col(i, lane);
            return query < sh.seqlen_q && key < sh.seqlen_k ? query * mask.row_stride + key * mask.col_stride : -1;
          },
          term);
      // In the order the preprocess assumes for saturated rows (cuda/saturated_rows.h: (s scale - LSE) +
      // term, which at |LSE| ~ 1e30 is not term - LSE + s scale).
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) s[i] = exp2f(s[i] * sh.scale_log2 - lse[(i % 4) / 2] + term[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) s[i] = exp2f(fmaf(s[i], sh.scale_log2, -lse[(i % 4) / 2]));
    }
    // Keys past the end, or (causal) past a query's diagonal or left of its sliding window, get P = 0;
    // queries past the end have LSE +inf and so P = 0 already.
    if (key0 + kKeys > sh.seqlen_k || (sh.is_causal && key0 + kKeys - 1 > m0 + sh.causal_offset) ||
        (sh.window_span >= 0 && key0 < m0 + kBlockM - 1 + sh.causal_offset - sh.window_span)) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        const int key = key0 + accumulator_col(i, lane);
        const int query = m0 + accumulator_row(i, warp_in_group, lane);
        s[i] = key_visible(query, key, sh.seqlen_k, sh.is_causal, sh.causal_offset, sh.window_span) ? s[i] : 0.f;
      }
    }
    const float delta[2] = {stats[kBlockM + r0], stats[kBlockM + r0 + 8]};
    wgmma_wait<0>();
    fence_registers(dp);
    if constexpr (kDropout) {
      // P becomes what dV sees, P Z / (1 - p), and dS = P (dP Z / (1 - p) - delta), Z the keep-mask.
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        const float z = ((keep >> i) & 1u) ? p.dropout.keep_scale : 0.f;
        dp[i] = s[i] * fmaf(dp[i], z, -delta[(i % 4) / 2]);
        if (softcapped) dp[i] *= softcap_grad(s[i], lse[(i % 4) / 2], 1.f / sh.scale_log2);
        s[i] *= z;
      }
    } else if (softcapped) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {  // dS through the cap
        dp[i] = s[i] * (dp[i] - delta[(i % 4) / 2]) * softcap_grad(s[i], lse[(i % 4) / 2], 1.f / sh.scale_log2);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) dp[i] = s[i] * (dp[i] - delta[(i % 4) / 2]);  // dS
    }
    if constexpr (kMasked) {
      if (p.dmask != nullptr) write_dmask<T, kKeys / 2, false>(p, dp, batch, head, m0, key0, warp_in_group, lane);
    }

    // The previous step's products are done with P and dS (the barrier at its end).
    store_scores_swizzled<T, Cfg>(p_tile, s, consumer, warp_in_group, lane);
    store_scores_swizzled<T, Cfg>(ds_tile, dp, consumer, warp_in_group, lane);
    fence_proxy_async_shared();
    if (reducer_warp) reducer.await_stage(iter);  // the previous step's dQ reduction has left dq_stage
    wide_consumers_meet<Cfg>(consumer);  // both halves of P and dS written, dq_stage free

    float dq[kDims / 2];
    wgmma_fence();
    issue_keys_by_dims_ss<T, Cfg, kDims>(dk, ds_tile, q_tile + (dim0 / 64) * Cfg::kQColBlockBytes);
    issue_keys_by_dims_ss<T, Cfg, kDims>(dv, p_tile, do_tile + (dim0 / 64) * Cfg::kQColBlockBytes);
    wgmma_commit();
    issue_dq_wide<T, Cfg, kDims>(dq, ds_tile, k_cols);
    wgmma_commit();
    wgmma_wait<1>();  // dK and dV are done with this stage's Q and dO
    fence_registers(dk);
    fence_registers(dv);
    named_barrier_arrive(kBwdStageBarrier0 + stage, kBwdStageBarrierThreads);  // the stage is free
    wgmma_wait<0>();
    fence_registers(dq);
    store_dq_tile<kDims>(dq_stage_addr, dq, dim0, threadIdx.x % 128);
    fence_proxy_async_shared();
    // dq_stage complete; neither consumer rewrites P or dS before both consumers' products are done.
    wide_consumers_meet<Cfg>(consumer);
    if (reducer_warp) {
      reducer.send_stage<Cfg::kHeadDim, kBlockM>(p, reinterpret_cast<const float*>(base + Cfg::kDqOffset), head, m0, [&] {
        return kVarlen ? rows.stats(head) + m0 : (static_cast<int64_t>(batch) * sh.heads_q + head) * p.stats_stride + m0;
      });
    }
    step = next;
  }
  if (reducer_warp) reducer.finish(iter);

  // dK = scale * dS^T Q and dV, straight from the accumulators: keys n0 + row, head dims dim0 + col.
  store_dk_dv<T>(p, sh, rows.k_row0, dk, dv, rows.tensor_batch, kv_head, n0, dim0, warp_in_group, lane);
}

// kMaskedTurns, kVarlen: as bwd_kernel's (the masked form deterministic calls run; a variable-length
// batch's list item per CTA, in the unmasked kernel).
template <typename T, typename Cfg, bool kMasked, bool kDropout, bool kMaskedTurns = false, bool kVarlen = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_wide_kernel(const __grid_constant__ BwdTensorMaps maps,
                                                                    const BwdParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built for sm_80 too, never launched there (see sm90/api.h)
#else
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  auto& bars = *reinterpret_cast<BwdBarriers<Cfg>*>(base + Cfg::kBarriersOffset);

  static_assert(!kVarlen || !(kMasked || kDropout), "variable lengths in the unmasked kernel");
  BwdKeyBlock block;
  SeqSpan seq{};  // kVarlen: the CTA's sequence, whose own lengths and diagonal `sh` then holds
  BwdRows rows;
  if (!bwd_cta_block<kBlockN, kVarlen>(p, block, seq, rows)) return;
  const AttentionShape seq_shape = kVarlen ? seq.shape(p.shape) : AttentionShape{};
  const AttentionShape& sh = kVarlen ? seq_shape : p.shape;
  const int n_block = block.n_block, kv_head = block.kv_head, batch = block.batch, n0 = block.n0;
  const BwdSteps steps = bwd_steps<kBlockM, kBlockN>(sh, n0);
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);  // uniform, as in bwd_kernel
  // The walk over the steps whose class tile lets some key through: the tile of the class grid's
  // 128-key column holding this block.
  static_assert(kBlockN * 2 == BwdConfig<64>::kBlockN, "two 64-key blocks per class tile");
  BwdStepWalk<T, kMasked> walk{p, steps, kv_head, batch, n_block / 2};

  if (threadIdx.x == 0) init_bwd_barriers(maps, bars);
  __syncthreads();

  if (warpgroup == 0) {
    registers_decrease<Cfg::kProducerRegisters>();
    const int warp = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 32), 0);  // uniform, as in bwd_kernel
    if (warp == 1 && dq_to_writer<kMasked, kMaskedTurns>(p)) {
      using Turns = DqTurns<kBlockN>;
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
            r.row = (kVarlen ? rows : bwd_batched_rows(p, batch)).stats(head) + m0;
            Turns::ticket(r, kVarlen ? Turns::varlen_counter(p, r.row) : Turns::counter(p, batch, head, m0), sh, m0,
                          n_block);
            return r;
          });
    } else if (warp == 0) {
      // The batched rows made again from the batch index rather than kept live from the setup: the
      // compiler then allocates the batched kernel's registers as before the varlen form existed.
      produce_bwd<T, Cfg, kMasked, kVarlen>(p, maps, bars, base, n0, kv_head, batch, steps, walk,
                                            kVarlen ? rows : bwd_batched_rows(p, batch));
    }
    return;
  }
  registers_increase<Cfg::kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  if constexpr (Cfg::kDims0 == Cfg::kDims1) {
    wide_consume<T, Cfg, kMasked, kDropout, kMaskedTurns, kVarlen, Cfg::kDims0>(p, sh, rows, bars, base, steps, walk,
                                                                                block, consumer, consumer * Cfg::kDims0);
  } else if (consumer == 0) {
    wide_consume<T, Cfg, kMasked, kDropout, kMaskedTurns, kVarlen, Cfg::kDims0>(p, sh, rows, bars, base, steps, walk,
                                                                                block, 0, 0);
  } else {
    wide_consume<T, Cfg, kMasked, kDropout, kMaskedTurns, kVarlen, Cfg::kDims1>(p, sh, rows, bars, base, steps, walk,
                                                                                block, 1, Cfg::kDims0);
  }
#endif
}

template <typename T, typename Cfg, bool kMasked>
cudaError_t launch_bwd_wide(const BwdParams& p, cudaStream_t stream) {
  if (p.key_end != nullptr) return cudaErrorNotSupported;  // no key-length form at these widths
  BwdTensorMaps maps;
  cudaError_t err = start_bwd<T, Cfg>(p, &maps, stream);
  if (err != cudaSuccess) return err;
  auto kernel = bwd_wide_kernel<T, Cfg, kMasked, false>;
  if constexpr (kMasked) {
    if (p.deterministic) {
      kernel = p.dropout.enabled ? bwd_wide_kernel<T, Cfg, true, true, true> : bwd_wide_kernel<T, Cfg, true, false, true>;
    } else if (p.dropout.enabled) {
      kernel = bwd_wide_kernel<T, Cfg, true, true>;
    }
  }
  err = launch_bwd_main<Cfg>(kernel, maps, p, stream);
  if (err != cudaSuccess) return err;
  return launch_bwd_convert_dq<T>(p, stream);
}

// The variable-length backward at the wide widths (bwd_kernel.cuh's launch_bwd_varlen_kernel).
template <typename T, typename Cfg>
cudaError_t launch_bwd_wide_varlen(const BwdParams& p, cudaStream_t stream) {
  return launch_bwd_varlen_kernel<T, Cfg>(bwd_wide_kernel<T, Cfg, false, false, false, true>, p, stream);
}

}  // namespace sm90
}  // namespace flashattn
