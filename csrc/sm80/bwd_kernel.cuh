// Backward attention on the sm80 path (mma.sync), in three launches:
//   1. bwd_preprocess_kernel (cuda/bwd_aux.cuh): delta = rowsum(dout * out) and the LSE in base 2
//   2. bwd_kernel:         one CTA per (key block, kv head, batch); loops over every query head of the
//                          group and every query block that sees its keys, recomputing S^T = K Q^T and
//                          P^T from the saved LSE (P is never written to global memory). dK and dV stay
//                          in registers for the whole loop; dQ partials are added into an fp32
//                          workspace with atomics, in any order (the default) or, with
//                          params.deterministic, in increasing key-block order (dq_keys_done counters).
//                          Q/dO blocks are double-buffered with cp.async (single-buffered in the
//                          configurations for GPUs with less shared memory, BwdConfig::kQStages).
//   3. bwd_convert_dq_kernel (cuda/bwd_aux.cuh): dq = scale * dq_accum, cast and laid out as [B, Lq, Hq, D].
// The kMasked variant of bwd_kernel applies params.mask as the forward did (skipping the steps whose
// tile the mask excludes entirely), and writes dS into params.dmask when that is set. It also applies
// the forward's dropout (params.dropout): the keep-mask Z is regenerated from the seed, dV takes
// P^T Z / (1 - p) and dP^T is multiplied by Z / (1 - p) before dS^T = P^T (dP^T - delta).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/bwd_aux.cuh"
#include "cuda/gpu_scope.h"
#include "cuda/mask_view.h"
#include "cuda/softcap.h"
#include "params.h"
#include "sm80/fragments.h"
#include "sm80/kernel_configs.h"
#include "sm80/tile_io.h"

namespace flashattn {
namespace sm80 {

// Deterministic mode. The key blocks that add into one query block's dQ rows are always key blocks
// 0 .. K-1 of its (batch, kv head), for some K >= 0 (see "Query blocks that see at least one of these
// keys" in bwd_kernel). Each such query block has a counter of the keys whose dQ partials are already
// in, in whole key blocks: the key block starting at key n0 waits until the counter reads n0, adds its
// partial, then adds kBlockN to the counter. The counter walks 0, kBlockN, ..., K * kBlockN, so every
// dq_accum element receives its partials in increasing key-block order, the same order on every run.
//
// No deadlock: key block n waits only on key blocks 0 .. n-1 of the same (batch, kv head). Those have
// lower blockIdx.x (n_block varies fastest), so they were dispatched before it, and a dispatched CTA
// keeps its SM until it finishes (the in-order dispatch FlashAttention-2's deterministic mode relies on
// too). Key block 0 never waits, and every key block visits its (head, query block) steps in the same
// order, so by induction on n, blocks 0 .. n-1 each reach and pass any step that block n waits at.
__device__ __forceinline__ void wait_for_dq_turn(const int* keys_done, int n0) {
  if (threadIdx.x == 0) {
    while (ld_acquire_gpu(keys_done) != n0) {
    }
  }
  __syncthreads();  // the rest of the CTA waits here
}

// The release add of thread 0 after the barrier also publishes the adds the other threads made before
// the barrier (a release is cumulative; CUTLASS's inter-CTA semaphore relies on the same). A
// __threadfence() in every thread is not needed, and would cost the default path: ptxas then turns
// every dq_accum reduction (RED) into an atomic that returns its old value (ATOM), deterministic or not.
__device__ __forceinline__ void pass_dq_turn(int* keys_done, int block_keys) {
  __syncthreads();
  if (threadIdx.x == 0) red_add_release_gpu(keys_done, block_keys);
}

template <typename T, typename Cfg, bool kMasked>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_kernel(const BwdParams p) {
  using Ops = ElementOps<T>;
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kStride = Cfg::kStride;
  constexpr int kPStride = Cfg::kPStride;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_smem = reinterpret_cast<T*>(smem_raw);               // [kBlockN][kStride]
  T* v_smem = k_smem + Cfg::kKVTileElems;                   // [kBlockN][kStride]
  T* q_smem = v_smem + Cfg::kKVTileElems;                   // [kQStages][kBlockM][kStride]
  T* do_smem = q_smem + Cfg::kQStages * Cfg::kQTileElems;   // [kQStages][kBlockM][kStride]
  T* p_smem = do_smem + Cfg::kQStages * Cfg::kQTileElems;   // [kBlockN][kPStride]: P^T of one step
  T* ds_smem = p_smem + Cfg::kPTileElems;                   // [kBlockN][kPStride]: dS^T of one step
  float* lse_smem = reinterpret_cast<float*>(ds_smem + Cfg::kPTileElems);  // [kQStages][kBlockM], base 2
  float* delta_smem = lse_smem + Cfg::kQStages * kBlockM;                  // [kQStages][kBlockM]

  const AttentionShape& s = p.shape;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_n_blocks = (s.seqlen_k + kBlockN - 1) / kBlockN;
  const int n_block = static_cast<int>(blockIdx.x % num_n_blocks);
  const int kv_head = static_cast<int>((blockIdx.x / num_n_blocks) % s.heads_kv);
  const int batch = static_cast<int>(blockIdx.x / num_n_blocks / s.heads_kv);
  const int group = s.heads_q / s.heads_kv;
  const int n0 = n_block * kBlockN;

  const T* k = static_cast<const T*>(p.k) + batch * p.k_strides.batch + kv_head * p.k_strides.head +
               n0 * p.k_strides.row;  // [Lk - n0, D]
  const T* v = static_cast<const T*>(p.v) + batch * p.v_strides.batch + kv_head * p.v_strides.head +
               n0 * p.v_strides.row;  // [Lk - n0, D]
  load_tile<kBlockN, kHeadDim, Cfg::kThreads>(k_smem, k, p.k_strides.row, s.seqlen_k - n0, s.head_dim,
                                              s.rows_aligned_16);
  load_tile<kBlockN, kHeadDim, Cfg::kThreads>(v_smem, v, p.v_strides.row, s.seqlen_k - n0, s.head_dim,
                                              s.rows_aligned_16);

  // Query blocks that see at least one of these keys: m_begin .. (query_end - 1) / kBlockM (query_end:
  // seqlen_q but under a sliding window), none when first_query >= query_end. Both bounds do not
  // decrease as n_block grows, so the key blocks that visit a given query block are a run F .. K-1 of
  // the key blocks, F = 0 but under a sliding window (what deterministic mode needs).
  const int first_query = first_query_seeing(n0, s.is_causal, s.causal_offset);
  const int query_end =
      last_query_seeing_end(min(n0 + kBlockN, s.seqlen_k) - 1, s.seqlen_q, s.causal_offset, s.window_span);
  const int m_begin = first_query / kBlockM;
  const int num_m_total = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int num_m = first_query < query_end ? (query_end + kBlockM - 1) / kBlockM - m_begin : 0;
  const int num_steps = group * num_m;

  // Step i handles query head kv_head * group + i / num_m and query block m_begin + i % num_m. The
  // steps run are those the mask does not exclude entirely (all without a mask; the host gives no
  // tile classes in deterministic mode, whose dq turns need every step); `iter` counts the steps run
  // and picks the ring stage.
  auto step_mask = [&](int step) {
    return MaskView<T>(p.mask, batch, kv_head * group + step / num_m, m_begin + step % num_m);
  };
  auto next_run = [&](int step) {
    if constexpr (kMasked) {
      while (step < num_steps && step_mask(step).skips(n_block)) ++step;
    }
    return step;
  };
  auto load_step = [&](int step, int iter) {
    const int head = kv_head * group + step / num_m;
    const int m0 = (m_begin + step % num_m) * kBlockM;
    const int stage = iter % Cfg::kQStages;
    const T* q = static_cast<const T*>(p.q) + batch * p.q_strides.batch + head * p.q_strides.head +
                 m0 * p.q_strides.row;
    const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_strides.batch +
                    head * p.dout_strides.head + m0 * p.dout_strides.row;
    load_tile<kBlockM, kHeadDim, Cfg::kThreads>(q_smem + stage * Cfg::kQTileElems, q, p.q_strides.row,
                                                s.seqlen_q - m0, s.head_dim, s.rows_aligned_16);
    load_tile<kBlockM, kHeadDim, Cfg::kThreads>(do_smem + stage * Cfg::kQTileElems, dout, p.dout_strides.row,
                                                s.seqlen_q - m0, s.head_dim, s.rows_aligned_16);
    const int64_t row_offset = (static_cast<int64_t>(batch) * s.heads_q + head) * p.stats_stride + m0;
    load_row_floats<kBlockM, Cfg::kThreads>(lse_smem + stage * kBlockM, p.lse_log2 + row_offset, s.seqlen_q - m0);
    load_row_floats<kBlockM, Cfg::kThreads>(delta_smem + stage * kBlockM, p.delta + row_offset, s.seqlen_q - m0);
  };
  int step = next_run(0);
  if (step < num_steps) load_step(step, 0);
  cp_async_commit();

  // Warp tiles of the three stages.
  constexpr int kSQueryWarps = Cfg::kWarps / (kBlockN / Cfg::kSKeys);
  const int s_key0 = (warp / kSQueryWarps) * Cfg::kSKeys;        // S^T rows (keys) of this warp
  const int s_query0 = (warp % kSQueryWarps) * Cfg::kSQueries;   // S^T columns (queries)
  constexpr int kKVColWarps = kHeadDim / Cfg::kKVCols;
  const int kv_key0 = (warp / kKVColWarps) * Cfg::kKVKeys;       // dK/dV rows (keys)
  const int kv_col0 = (warp % kKVColWarps) * Cfg::kKVCols;       // dK/dV columns
  constexpr int kQColWarps = kHeadDim / Cfg::kQCols;
  const int dq_query0 = (warp / kQColWarps) * Cfg::kQQueries;    // dQ rows (queries)
  const int dq_col0 = (warp % kQColWarps) * Cfg::kQCols;         // dQ columns

  constexpr int kSMTiles = Cfg::kSKeys / 16, kSNTiles = Cfg::kSQueries / 8;
  constexpr int kKVMTiles = Cfg::kKVKeys / 16, kKVNTiles = Cfg::kKVCols / 8;
  constexpr int kQMTiles = Cfg::kQQueries / 16, kQNTiles = Cfg::kQCols / 8;
  float dk_acc[kKVMTiles][kKVNTiles][4];
  float dv_acc[kKVMTiles][kKVNTiles][4];
  zero_accumulators(dk_acc);
  zero_accumulators(dv_acc);

  for (int iter = 0; step < num_steps; ++iter) {
    const int next_step = next_run(step + 1);
    cp_async_wait<0>();
    __syncthreads();  // this step's Q, dO, LSE, delta have landed; the previous step is done everywhere
    if constexpr (Cfg::kQStages == 2) {
      if (next_step < num_steps) load_step(next_step, iter + 1);  // lands during this step
      cp_async_commit();
    }
    const int head = kv_head * group + step / num_m;
    const int m0 = (m_begin + step % num_m) * kBlockM;
    const int stage = iter % Cfg::kQStages;
    const MaskView<T> mask = kMasked ? step_mask(step) : MaskView<T>();
    const bool mask_needed = kMasked && mask.needed(n_block);
    const T* q_tile = q_smem + stage * Cfg::kQTileElems;    // [kBlockM][kStride]
    const T* do_tile = do_smem + stage * Cfg::kQTileElems;  // [kBlockM][kStride]
    const float* lse_tile = lse_smem + stage * kBlockM;
    const float* delta_tile = delta_smem + stage * kBlockM;

    // Stage 1: S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T = P^T (dP^T - delta) into shared memory.
    {
      float s_acc[kSMTiles][kSNTiles][4];
      float dp_acc[kSMTiles][kSNTiles][4];
      zero_accumulators(s_acc);
      zero_accumulators(dp_acc);
      warp_gemm<T, kSMTiles, kSNTiles, kHeadDim / 16>(
          s_acc, [&](uint32_t(&a)[4], int mt, int ks) { load_a<kStride>(a, k_smem, s_key0 + mt * 16, ks * 16, lane); },
          [&](uint32_t(&b)[4], int np, int ks) {
            load_b_from_rows_nk<kStride>(b, q_tile, s_query0 + np * 16, ks * 16, lane);
          });
      warp_gemm<T, kSMTiles, kSNTiles, kHeadDim / 16>(
          dp_acc, [&](uint32_t(&a)[4], int mt, int ks) { load_a<kStride>(a, v_smem, s_key0 + mt * 16, ks * 16, lane); },
          [&](uint32_t(&b)[4], int np, int ks) {
            load_b_from_rows_nk<kStride>(b, do_tile, s_query0 + np * 16, ks * 16, lane);
          });
      // This lane's query columns: LSE (base 2) and delta, read once per step.
      float lse_log2[kSNTiles][2], delta[kSNTiles][2];
#pragma unroll
      for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int q_local = s_query0 + j * 8 + (lane % 4) * 2 + c;
          lse_log2[j][c] = lse_tile[q_local];
          delta[j][c] = delta_tile[q_local];
        }
      }
      const bool softcapped = s.softcap_inner != 0.f;  // cuda/softcap.h
      if (softcapped) {
#pragma unroll
        for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kSNTiles; ++j) softcap_scores(s_acc[mt][j], s.softcap_inner);
        }
      }
      if (mask_needed) {
        // P^T = exp2(S^T + mask - LSE) where the key is visible, else 0.
#pragma unroll
        for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + s_key0 + mt * 16 + lane / 4 + (e / 2) * 8;
              const int query = m0 + s_query0 + j * 8 + (lane % 4) * 2 + (e % 2);
              const bool visible = (query < s.seqlen_q) & key_visible(query, key, s.seqlen_k, s.is_causal,
                                                                      s.causal_offset, s.window_span);
              float x = s_acc[mt][j][e] * s.scale_log2 - lse_log2[j][e % 2];
              if (visible) x += mask.add_log2(query, key);
              s_acc[mt][j][e] = visible ? exp2f(x) : 0.f;
            }
          }
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s_acc[mt][j][e] = exp2f(s_acc[mt][j][e] * s.scale_log2 - lse_log2[j][e % 2]);
          }
        }
        // Only blocks on the causal diagonal, a sliding window's edge or past either sequence end pay for
        // the mask.
        if (m0 + kBlockM > s.seqlen_q || n0 + kBlockN > s.seqlen_k ||
            (s.is_causal && n0 + s_key0 + Cfg::kSKeys - 1 > m0 + s_query0 + s.causal_offset) ||
            (s.window_span >= 0 &&
             n0 + s_key0 < m0 + s_query0 + Cfg::kSQueries - 1 + s.causal_offset - s.window_span)) {
#pragma unroll
          for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
            for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int key = n0 + s_key0 + mt * 16 + lane / 4 + (e / 2) * 8;
                const int query = m0 + s_query0 + j * 8 + (lane % 4) * 2 + (e % 2);
                const bool visible = (query < s.seqlen_q) & key_visible(query, key, s.seqlen_k, s.is_causal,
                                                                        s.causal_offset, s.window_span);
                s_acc[mt][j][e] = visible ? s_acc[mt][j][e] : 0.f;
              }
            }
          }
        }
      }
      // Dropout's keep bits. Element [mt][j][2 half + c] is key k0 + 16 mt + 8 half (k0 = n0 + s_key0 +
      // lane / 4, k0 % 32 < 8), query q0 + 8j + c (q0 = m0 + s_query0 + 2 (lane % 4)): each pair of query
      // tiles jj and each c hold one whole keep-mask octet, whose bit 2i + h (key k0 + 8i, query tile
      // 2jj + h) lands at bit 16jj + 8c + 2i + h of `keep`. The calls run in a loop that is not unrolled,
      // so that they add no registers to this stage's.
      static_assert(Cfg::kSKeys == 32 && kSNTiles % 2 == 0 && kSNTiles * 8 <= 64, "whole octets in 64 bits");
      const bool dropout = kMasked && p.dropout.enabled;
      uint64_t keep = ~uint64_t{0};
      if (dropout) {
        const DropoutRow rng(p.dropout, batch, s.heads_q, head);
        keep = 0;
#pragma unroll 1
        for (int jj = 0; jj < kSNTiles / 2; ++jj) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const uint32_t octet = rng.octet(m0 + s_query0 + 16 * jj + 2 * (lane % 4) + c, n0 + s_key0 + lane / 4);
            keep |= static_cast<uint64_t>(octet) << (16 * jj + 8 * c);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < kSNTiles; ++j) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = s_key0 + mt * 16 + lane / 4 + half * 8;
            const int col = s_query0 + j * 8 + (lane % 4) * 2;
            const float p0 = s_acc[mt][j][2 * half], p1 = s_acc[mt][j][2 * half + 1];
            float dp0 = dp_acc[mt][j][2 * half], dp1 = dp_acc[mt][j][2 * half + 1];
            float kept0 = p0, kept1 = p1;  // the probabilities dV sees: P Z / (1 - p) under dropout
            if (dropout) {
              const int bit = 16 * (j / 2) + 2 * (2 * mt + half) + j % 2;  // + 8c
              const bool keep0 = (keep >> bit) & 1, keep1 = (keep >> (bit + 8)) & 1;
              const float z0 = keep0 ? p.dropout.keep_scale : 0.f, z1 = keep1 ? p.dropout.keep_scale : 0.f;
              kept0 *= z0;
              kept1 *= z1;
              dp0 *= z0;
              dp1 *= z1;
            }
            float ds0 = p0 * (dp0 - delta[j][0]);
            float ds1 = p1 * (dp1 - delta[j][1]);
            if (softcapped) {  // the chain through cap * tanh
              ds0 *= softcap_grad(p0, lse_log2[j][0], 1.f / s.scale_log2);
              ds1 *= softcap_grad(p1, lse_log2[j][1], 1.f / s.scale_log2);
            }
            *reinterpret_cast<uint32_t*>(p_smem + row * kPStride + col) = Ops::pack(kept0, kept1);
            *reinterpret_cast<uint32_t*>(ds_smem + row * kPStride + col) = Ops::pack(ds0, ds1);
          }
        }
      }
    }
    __syncthreads();  // P^T and dS^T complete
    if constexpr (kMasked) {
      if (p.dmask != nullptr) {
        // The mask's gradient is dS itself: copy this step's dS^T tile out, transposed, so that
        // consecutive threads write consecutive keys of a dmask row.
        const int64_t first = (static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q * s.seqlen_k;
        T* dmask = static_cast<T*>(p.dmask) + first;                   // [Lq, Lk] (a mask of q's type)
        float* dmask_f32 = static_cast<float*>(p.dmask) + first;       // [Lq, Lk] (a float32 mask)
        const bool f32 = p.mask.kind == MaskKind::kAdditiveFloat32;
        for (int idx = threadIdx.x; idx < kBlockM * kBlockN; idx += Cfg::kThreads) {
          const int key = idx % kBlockN, query = idx / kBlockN;
          if (m0 + query < s.seqlen_q && n0 + key < s.seqlen_k) {
            const int64_t offset = static_cast<int64_t>(m0 + query) * s.seqlen_k + n0 + key;
            const T ds = ds_smem[key * kPStride + query];
            if (f32) {
              dmask_f32[offset] = Ops::to_float(ds);
            } else {
              dmask[offset] = ds;
            }
          }
        }
      }
    }

    // Stage 2: dV += P^T dO and dK += dS^T Q (unscaled; scale applied at the end).
    warp_gemm<T, kKVMTiles, kKVNTiles, kBlockM / 16>(
        dv_acc, [&](uint32_t(&a)[4], int mt, int kk) { load_a<kPStride>(a, p_smem, kv_key0 + mt * 16, kk * 16, lane); },
        [&](uint32_t(&b)[4], int np, int kk) { load_b_from_rows_kn<kStride>(b, do_tile, kk * 16, kv_col0 + np * 16, lane); });
    warp_gemm<T, kKVMTiles, kKVNTiles, kBlockM / 16>(
        dk_acc, [&](uint32_t(&a)[4], int mt, int kk) { load_a<kPStride>(a, ds_smem, kv_key0 + mt * 16, kk * 16, lane); },
        [&](uint32_t(&b)[4], int np, int kk) { load_b_from_rows_kn<kStride>(b, q_tile, kk * 16, kv_col0 + np * 16, lane); });

    if constexpr (Cfg::kQStages == 1) {
      __syncthreads();  // every warp is done with this step's Q, dO, LSE and delta
      if (next_step < num_steps) load_step(next_step, iter + 1);  // lands during the dQ GEMM
      cp_async_commit();
    }

    // Stage 3: dQ[m0 + rows, cols] += dS K, added into the fp32 workspace.
    {
      // Deterministic mode: this query block's counter (see wait_for_dq_turn). Waiting here, before the
      // dQ GEMM rather than after it, keeps register pressure (and so the default path) as it was.
      auto dq_keys_done = [&]() {
        return p.dq_keys_done + (static_cast<int64_t>(batch) * s.heads_q + head) * num_m_total + m0 / kBlockM;
      };
      // The first key block that visits the query block (F above) takes the first turn.
      if (p.deterministic) {
        wait_for_dq_turn(dq_keys_done(), n0 - visible_key_begin(m0, s.causal_offset, s.window_span) / kBlockN * kBlockN);
      }
      float dq_acc[kQMTiles][kQNTiles][4];
      zero_accumulators(dq_acc);
      warp_gemm<T, kQMTiles, kQNTiles, kBlockN / 16>(
          dq_acc,
          [&](uint32_t(&a)[4], int mt, int kk) {
            load_a_transposed<kPStride>(a, ds_smem, dq_query0 + mt * 16, kk * 16, lane);
          },
          [&](uint32_t(&b)[4], int np, int kk) { load_b_from_rows_kn<kStride>(b, k_smem, kk * 16, dq_col0 + np * 16, lane); });
      // The workspace rows are kHeadDim wide (the host sizes them with padded_head_dim), so every
      // element's offset from this lane's first one is a compile-time constant.
      float* dq_accum = p.dq_accum +
                        ((static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + m0 + dq_query0 + lane / 4) *
                            kHeadDim +
                        dq_col0 + (lane % 4) * 2;  // [rows of this lane, kHeadDim]
      if (m0 + kBlockM <= s.seqlen_q && s.head_dim == kHeadDim) {
#pragma unroll
        for (int mt = 0; mt < kQMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kQNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              atomicAdd(dq_accum + (mt * 16 + (e / 2) * 8) * kHeadDim + j * 8 + (e % 2), dq_acc[mt][j][e]);
            }
          }
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < kQMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kQNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = m0 + dq_query0 + mt * 16 + lane / 4 + (e / 2) * 8;
              const int col = dq_col0 + j * 8 + (lane % 4) * 2 + (e % 2);
              if (row < s.seqlen_q && col < s.head_dim) {
                atomicAdd(dq_accum + (mt * 16 + (e / 2) * 8) * kHeadDim + j * 8 + (e % 2), dq_acc[mt][j][e]);
              }
            }
          }
        }
      }
      if (p.deterministic) pass_dq_turn(dq_keys_done(), kBlockN);
    }
    step = next_step;
  }
  cp_async_wait<0>();

  // dK = scale * dS^T Q and dV, straight from the accumulators.
  T* dk = static_cast<T*>(p.dk) + batch * p.dk_strides.batch + kv_head * p.dk_strides.head;  // [Lk, D]
  T* dv = static_cast<T*>(p.dv) + batch * p.dv_strides.batch + kv_head * p.dv_strides.head;  // [Lk, D]
  const bool pair_stores = s.head_dim % 2 == 0;
#pragma unroll
  for (int mt = 0; mt < kKVMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < kKVNTiles; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = n0 + kv_key0 + mt * 16 + lane / 4 + half * 8;
        const int col = kv_col0 + j * 8 + (lane % 4) * 2;
        if (key >= s.seqlen_k || col >= s.head_dim) continue;
        const float dk0 = dk_acc[mt][j][2 * half] * s.scale, dk1 = dk_acc[mt][j][2 * half + 1] * s.scale;
        const float dv0 = dv_acc[mt][j][2 * half], dv1 = dv_acc[mt][j][2 * half + 1];
        T* dk_row = dk + key * p.dk_strides.row;
        T* dv_row = dv + key * p.dv_strides.row;
        if (pair_stores) {
          *reinterpret_cast<uint32_t*>(dk_row + col) = Ops::pack(dk0, dk1);
          *reinterpret_cast<uint32_t*>(dv_row + col) = Ops::pack(dv0, dv1);
        } else {
          dk_row[col] = Ops::from_float(dk0);
          dv_row[col] = Ops::from_float(dv0);
          if (col + 1 < s.head_dim) {
            dk_row[col + 1] = Ops::from_float(dk1);
            dv_row[col + 1] = Ops::from_float(dv1);
          }
        }
      }
    }
  }
}

template <typename T, typename Cfg, bool kMasked = false>
cudaError_t launch_bwd_with_config(const BwdParams& p, cudaStream_t stream) {
  const AttentionShape& s = p.shape;
  const int64_t num_n_blocks = (s.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t grid = num_n_blocks * s.heads_kv * s.batch;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;

  cudaError_t err = launch_bwd_preprocess<T>(p, stream);
  if (err != cudaSuccess) return err;
  auto kernel = bwd_kernel<T, Cfg, kMasked>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return launch_bwd_convert_dq<T>(p, stream);
}

// The configuration params.sm80_tiles names (BwdConfigs).
template <typename T, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Configs = typename BwdConfigs<kHeadDim>::type;
  if (p.sm80_tiles < 0 || p.sm80_tiles >= Configs::kCount) return cudaErrorInvalidValue;
  return with_config<Configs>(p.sm80_tiles, [&](auto cfg) {
    return launch_bwd_with_config<T, decltype(cfg), false>(p, stream);
  });
}

template <typename T, int kHeadDim>
cudaError_t launch_bwd_masked(const BwdParams& p, cudaStream_t stream) {
  using Configs = typename BwdConfigs<kHeadDim>::type;
  if (p.sm80_tiles < 0 || p.sm80_tiles >= Configs::kCount) return cudaErrorInvalidValue;
  return with_config<Configs>(p.sm80_tiles, [&](auto cfg) {
    return launch_bwd_with_config<T, decltype(cfg), true>(p, stream);
  });
}

}  // namespace sm80
}  // namespace flashattn
