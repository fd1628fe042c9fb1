// Forward attention on the sm80 path (mma.sync), one CTA per (query block, head, batch).
//
// Design: each warp owns kMTiles x 16 query rows. K and V blocks stream through a two-stage cp.async
// ring in shared memory, K and V in separate groups so S = Q K^T of block n starts while V(n) lands.
// S stays in registers; the online softmax (running max and sum, base 2) rescales the output
// accumulator, and P goes straight from the S accumulators into the A operand of O += P V.
//
// The kMasked variant adds an attention mask (params.mask): key blocks whose tile class says the mask
// excludes every element are skipped (K/V never loaded), and only blocks whose class needs it read
// the mask, element by element beside the score fragments. It also applies dropout (params.dropout,
// with or without a mask): after the row sums take P, each probability is kept or zeroed by the
// keep-mask of common/dropout.h, and the epilogue scales O by 1 / (1 - p).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/mask_view.h"
#include "cuda/sink.h"
#include "cuda/softcap.h"
#include "params.h"
#include "sm80/fragments.h"
#include "sm80/kernel_configs.h"
#include "sm80/tile_io.h"

namespace flashattn {
namespace sm80 {

template <typename T, typename Cfg, bool kMasked>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSM) fwd_kernel(const FwdParams p) {
  using Ops = ElementOps<T>;
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kStride = Cfg::kStride;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kSTiles = kBlockN / 8;   // n8 tiles of S per m tile
  constexpr int kOTiles = kHeadDim / 8;  // n8 tiles of O per m tile

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);  // [kBlockM][kStride]; reused for O in the epilogue
  T* k_smem = q_smem + Cfg::kQTileElems;       // [kStages][kBlockN][kStride]
  T* v_smem = k_smem + Cfg::kStages * Cfg::kKVTileElems;
  // kMasked only: [kMTiles][kThreads] dropout keep bits of the current key block, written and read by
  // the same thread (parked here rather than in registers, which the accumulators fill).
  uint64_t* keep_smem = reinterpret_cast<uint64_t*>(smem_raw + Cfg::kSmemBytes);

  const AttentionShape& s = p.shape;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  // Heaviest query blocks (last ones, under causal masking) are scheduled first.
  const int num_m_blocks = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int head = static_cast<int>((blockIdx.x / num_m_blocks) % s.heads_q);
  const int batch = static_cast<int>(blockIdx.x / num_m_blocks / s.heads_q);
  const int kv_head = head / (s.heads_q / s.heads_kv);
  const int m0 = m_block * kBlockM;

  const T* q = static_cast<const T*>(p.q) + batch * p.q_strides.batch + head * p.q_strides.head +
               m0 * p.q_strides.row;                                                    // [Lq - m0, D]
  const T* k = static_cast<const T*>(p.k) + batch * p.k_strides.batch + kv_head * p.k_strides.head;  // [Lk, D]
  const T* v = static_cast<const T*>(p.v) + batch * p.v_strides.batch + kv_head * p.v_strides.head;  // [Lk, D]

  const int key_end = visible_key_end(min(m0 + kBlockM, s.seqlen_q), s.seqlen_k, s.is_causal, s.causal_offset);
  const int num_n_blocks = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;

  // The key blocks visited are those from n_block on that the mask does not exclude entirely (all of
  // them without a mask); `iter` counts the visited ones and picks the ring stage.
  const MaskView<T> mask = kMasked ? MaskView<T>(p.mask, batch, head, m_block) : MaskView<T>();
  auto next_visited = [&](int n_block) {
    if constexpr (kMasked) {
      while (n_block < num_n_blocks && mask.skips(n_block)) ++n_block;
    }
    return n_block;
  };
  auto load_kv_block = [&](T* smem, const T* gmem, int64_t row_stride, int n_block, int iter) {
    const int n0 = n_block * kBlockN;
    load_tile<kBlockN, kHeadDim, Cfg::kThreads>(smem + (iter % Cfg::kStages) * Cfg::kKVTileElems,
                                                gmem + n0 * row_stride, row_stride, s.seqlen_k - n0, s.head_dim,
                                                s.rows_aligned_16);
  };

  // cp.async groups, in order: [Q, K0] [V0] [K1] [V1] ... so "all but the newest group" is always
  // the block about to be used.
  // The first key block a sliding window lets this block's first query see (0 without one).
  int n_block = next_visited(visible_key_begin(m0, s.causal_offset, s.window_span) / kBlockN);
  load_tile<kBlockM, kHeadDim, Cfg::kThreads>(q_smem, q, p.q_strides.row, s.seqlen_q - m0, s.head_dim,
                                              s.rows_aligned_16);
  if (n_block < num_n_blocks) load_kv_block(k_smem, k, p.k_strides.row, n_block, 0);
  cp_async_commit();
  if (n_block < num_n_blocks) load_kv_block(v_smem, v, p.v_strides.row, n_block, 0);
  cp_async_commit();

  const int warp_row0 = warp * kMTiles * 16;  // first row of this warp inside the block
  float o_acc[kMTiles][kOTiles][4];
  zero_accumulators(o_acc);
  float row_max[kMTiles][2];  // in units of scale * log2(e) * q.k
  float row_sum[kMTiles][2];  // this lane's partial sums; quad-reduced at the end
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  uint32_t q_frag[Cfg::kQInRegisters ? kMTiles : 1][Cfg::kQInRegisters ? kHeadDim / 16 : 1][4];

  for (int iter = 0; n_block < num_n_blocks; ++iter) {
    const int next_block = next_visited(n_block + 1);
    cp_async_wait<1>();
    __syncthreads();  // K(n) has landed; every warp is done with block n - 1
    if (next_block < num_n_blocks) load_kv_block(k_smem, k, p.k_strides.row, next_block, iter + 1);
    cp_async_commit();
    if constexpr (Cfg::kQInRegisters) {
      if (iter == 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int ks = 0; ks < kHeadDim / 16; ++ks) {
            load_a<kStride>(q_frag[mt][ks], q_smem, warp_row0 + mt * 16, ks * 16, lane);
          }
        }
      }
    }
    const T* k_tile = k_smem + (iter % Cfg::kStages) * Cfg::kKVTileElems;  // [kBlockN][kStride]
    const T* v_tile = v_smem + (iter % Cfg::kStages) * Cfg::kKVTileElems;  // [kBlockN][kStride]
    const int n0 = n_block * kBlockN;

    // Dropout's keep bits for this block, computed before the S accumulators are live and in a loop
    // that is not unrolled, so that the Philox calls add no registers to the GEMM's or the softmax's.
    // s_acc[mt][j][2h + c] is row r + 8h (r = warp_row0 + mt * 16 + lane / 4, r % 16 < 8), key
    // n0 + 8j + 2 (lane % 4) + c: one whole keep-mask octet per m tile, 32 keys g and c, parked in shared
    // memory at bit 16g + 8c + 2i + h of its m tile's word (for j = 4g + i).
    static_assert(kBlockN % 32 == 0 && kSTiles * 4 <= 64, "whole octets; one keep bit per score in 64 bits");
    if constexpr (kMasked) {
      if (p.dropout.enabled) {
        const DropoutRow rng(p.dropout, batch, s.heads_q, head);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          uint64_t keep = 0;
#pragma unroll 1
          for (int g = 0; g < kBlockN / 32; ++g) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint32_t octet = rng.octet(m0 + warp_row0 + mt * 16 + lane / 4, n0 + 32 * g + 2 * (lane % 4) + c);
              keep |= static_cast<uint64_t>(octet) << (16 * g + 8 * c);
            }
          }
          keep_smem[mt * Cfg::kThreads + threadIdx.x] = keep;
        }
      }
    }

    // S = Q K^T for this warp's rows and kBlockN keys.
    float s_acc[kMTiles][kSTiles][4];
    zero_accumulators(s_acc);
    warp_gemm<T, kMTiles, kSTiles, kHeadDim / 16>(
        s_acc,
        [&](uint32_t(&a)[4], int mt, int ks) {
          if constexpr (Cfg::kQInRegisters) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = q_frag[mt][ks][i];
          } else {
            load_a<kStride>(a, q_smem, warp_row0 + mt * 16, ks * 16, lane);
          }
        },
        [&](uint32_t(&b)[4], int np, int ks) { load_b_from_rows_nk<kStride>(b, k_tile, np * 16, ks * 16, lane); });

    // Scale into base-2 units (soft-capped first, cuda/softcap.h), then mask keys past the end or
    // beyond the causal diagonal (only the blocks that need it pay for the test).
    if (s.softcap_inner != 0.f) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) softcap_scores(s_acc[mt][j], s.softcap_inner);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[mt][j][e] *= s.scale_log2;
      }
    }
    const bool mask_needed = kMasked && mask.needed(n_block);
    if (mask_needed || n0 + kBlockN > s.seqlen_k ||
        (s.is_causal && n0 + kBlockN - 1 > m0 + warp_row0 + s.causal_offset) ||
        (s.window_span >= 0 && n0 < m0 + warp_row0 + kMTiles * 16 - 1 + s.causal_offset - s.window_span)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + j * 8 + (lane % 4) * 2 + (e % 2);
            const int query = m0 + warp_row0 + mt * 16 + lane / 4 + (e / 2) * 8;
            const bool visible = key_visible(query, key, s.seqlen_k, s.is_causal, s.causal_offset, s.window_span);
            float score = s_acc[mt][j][e];
            if constexpr (kMasked) {
              if (mask_needed && visible && query < s.seqlen_q) score += mask.add_log2(query, key);
            }
            s_acc[mt][j][e] = visible ? score : -INFINITY;
          }
        }
      }
    }

    // Online softmax: new running max, rescale what was accumulated, P = exp2(S - max).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float block_max = row_max[mt][half];
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
          block_max = fmaxf(block_max, fmaxf(s_acc[mt][j][2 * half], s_acc[mt][j][2 * half + 1]));
        }
        block_max = quad_max(block_max);
        const float base = block_max == -INFINITY ? 0.f : block_max;  // a row with nothing visible yet
        const float correction = exp2f(row_max[mt][half] - base);
        row_max[mt][half] = block_max;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            s_acc[mt][j][e] = exp2f(s_acc[mt][j][e] - base);
            sum += s_acc[mt][j][e];
          }
        }
        row_sum[mt][half] = row_sum[mt][half] * correction + sum;
#pragma unroll
        for (int d = 0; d < kOTiles; ++d) {
          o_acc[mt][d][2 * half] *= correction;
          o_acc[mt][d][2 * half + 1] *= correction;
        }
      }
    }

    cp_async_wait<1>();
    __syncthreads();  // V(n) has landed; every warp is done reading V(n - 1)'s stage
    if (next_block < num_n_blocks) load_kv_block(v_smem, v, p.v_strides.row, next_block, iter + 1);
    cp_async_commit();

    // O += P V, with P taken from the S accumulators.
    warp_gemm<T, kMTiles, kOTiles, kBlockN / 16>(
        o_acc,
        [&](uint32_t(&a)[4], int mt, int kk) {
          if constexpr (kMasked) {
            // Dropout zeroes the probabilities its keep bits drop (after the row sums took them).
            const uint64_t keep = p.dropout.enabled ? keep_smem[mt * Cfg::kThreads + threadIdx.x] : ~uint64_t{0};
            accumulator_to_a<T>(a, s_acc[mt][2 * kk], s_acc[mt][2 * kk + 1]);
            // a[r] packs s_acc[mt][2kk + r / 2][2 (r % 2) + c] for c = 0 (low half), 1 (high half).
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int j = 2 * kk + r / 2, h = r % 2;
              const int bit = 16 * (j / 4) + 2 * (j % 4) + h;  // + 8c
              a[r] &= (((keep >> bit) & 1) ? 0xffffu : 0u) | (((keep >> (bit + 8)) & 1) ? 0xffff0000u : 0u);
            }
          } else {
            accumulator_to_a<T>(a, s_acc[mt][2 * kk], s_acc[mt][2 * kk + 1]);
          }
        },
        [&](uint32_t(&b)[4], int np, int kk) { load_b_from_rows_kn<kStride>(b, v_tile, kk * 16, np * 16, lane); });
    n_block = next_block;
  }

  cp_async_wait<0>();
  __syncthreads();  // with no key block at all, the Q copy may still be landing in q_smem

  // Epilogue: O / rowsum into this warp's rows of q_smem, then out; LSE = ln 2 * (max + log2(sum)).
  // The sink's term (cuda/sink.h) joins the row sums first.
  float* lse = p.lse + (static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + m0;  // [Lq - m0]
  const float sink_log2 = sink_log2_of(p, head);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = quad_sum(row_sum[mt][half]);
      float base = row_max[mt][half];
      const float factor = join_sink(sink_log2, base, sum);
      // A NaN score makes sum NaN, and NaN must reach out and lse: test for exactly 0 (no key).
      const float inv_sum = sum == 0.f ? 0.f : (kMasked ? p.dropout.keep_scale : 1.f) * factor / sum;
      const int row = warp_row0 + mt * 16 + lane / 4 + half * 8;
      if (lane % 4 == 0 && m0 + row < s.seqlen_q) {
        lse[row] = sum == 0.f ? -INFINITY : (base + log2f(sum)) * 0.6931471805599453f;
      }
#pragma unroll
      for (int d = 0; d < kOTiles; ++d) {
        const uint32_t packed = Ops::pack(o_acc[mt][d][2 * half] * inv_sum, o_acc[mt][d][2 * half + 1] * inv_sum);
        *reinterpret_cast<uint32_t*>(q_smem + row * kStride + d * 8 + (lane % 4) * 2) = packed;
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out) + batch * p.out_strides.batch + head * p.out_strides.head;  // [Lq, D]
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int row0 = m0 + warp_row0 + mt * 16;
    store_warp_rows<kHeadDim>(out + row0 * p.out_strides.row, p.out_strides.row,
                              q_smem + (warp_row0 + mt * 16) * kStride, s.seqlen_q - row0, s.head_dim,
                              s.head_dim % 8 == 0, lane);
  }
}

template <typename T, typename Cfg, bool kMasked = false>
cudaError_t launch_fwd_with_config(const FwdParams& p, cudaStream_t stream) {
  const int64_t num_m_blocks = (p.shape.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t grid = num_m_blocks * p.shape.heads_q * p.shape.batch;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  auto kernel = fwd_kernel<T, Cfg, kMasked>;
  constexpr int kSmemBytes = Cfg::kSmemBytes + (kMasked ? Cfg::kKeepBitsBytes : 0);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// The configuration params.sm80_tiles names (FwdConfigs).
template <typename T, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Configs = typename FwdConfigs<kHeadDim>::type;
  if (p.sm80_tiles < 0 || p.sm80_tiles >= Configs::kCount) return cudaErrorInvalidValue;
  return with_config<Configs>(p.sm80_tiles, [&](auto cfg) {
    return launch_fwd_with_config<T, decltype(cfg), false>(p, stream);
  });
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd_masked(const FwdParams& p, cudaStream_t stream) {
  using Configs = typename FwdConfigs<kHeadDim>::type;
  if (p.sm80_tiles < 0 || p.sm80_tiles >= Configs::kCount) return cudaErrorInvalidValue;
  return with_config<Configs>(p.sm80_tiles, [&](auto cfg) {
    return launch_fwd_with_config<T, decltype(cfg), true>(p, stream);
  });
}

}  // namespace sm80
}  // namespace flashattn
