// Forward attention on the sm80 path (mma.sync), one CTA per (query block, head, batch).
//
// Design: each warp owns 16 query rows. K/V blocks stream through a two-stage cp.async ring in shared
// memory; S = Q K^T stays in registers, the online softmax (running max and sum, base 2) rescales the
// output accumulator, and P goes straight from the S accumulators into the A operand of O += P V.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "common/mask.h"
#include "params.h"
#include "sm80/fragments.h"
#include "sm80/tile_io.h"

namespace flashattn {
namespace sm80 {

template <int kHeadDim>
struct FwdTraits {
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim tiles are multiples of 16 up to 256");
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16;                 // query rows per CTA, 16 per warp
  static constexpr int kBlockN = kHeadDim <= 192 ? 64 : 32;   // keys per step; 32 keeps D=256 in registers
  static constexpr bool kQInRegisters = kHeadDim <= 128;      // larger Q fragments would spill
  static constexpr int kStride = PaddedTile<kHeadDim>::kStride;
  static constexpr int kQTileElems = kBlockM * kStride;
  static constexpr int kKVTileElems = kBlockN * kStride;
  static constexpr int kStages = 2;                           // K/V double buffer
  static constexpr int kSmemElems = kQTileElems + 2 * kStages * kKVTileElems;
  static constexpr int kMinBlocksPerSM = kHeadDim <= 64 ? 2 : 1;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, FwdTraits<kHeadDim>::kMinBlocksPerSM)
    fwd_kernel(const FwdParams p) {
  using Tr = FwdTraits<kHeadDim>;
  using Ops = ElementOps<T>;
  constexpr int kStride = Tr::kStride;
  constexpr int kBlockM = Tr::kBlockM;
  constexpr int kBlockN = Tr::kBlockN;
  constexpr int kSTiles = kBlockN / 8;   // n8 tiles of S per warp
  constexpr int kOTiles = kHeadDim / 8;  // n8 tiles of O per warp

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);  // [kBlockM][kStride]; reused for O in the epilogue
  T* k_smem = q_smem + Tr::kQTileElems;        // [kStages][kBlockN][kStride]
  T* v_smem = k_smem + Tr::kStages * Tr::kKVTileElems;

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

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_tile<kBlockN, kHeadDim, Tr::kThreads>(k_smem + stage * Tr::kKVTileElems, k + n0 * p.k_strides.row,
                                               p.k_strides.row, s.seqlen_k - n0, s.head_dim, s.rows_aligned_16);
    load_tile<kBlockN, kHeadDim, Tr::kThreads>(v_smem + stage * Tr::kKVTileElems, v + n0 * p.v_strides.row,
                                               p.v_strides.row, s.seqlen_k - n0, s.head_dim, s.rows_aligned_16);
  };

  load_tile<kBlockM, kHeadDim, Tr::kThreads>(q_smem, q, p.q_strides.row, s.seqlen_q - m0, s.head_dim,
                                             s.rows_aligned_16);
  if (num_n_blocks > 0) load_kv(0, 0);
  cp_async_commit();

  const int warp_row0 = warp * 16;               // first row of this warp inside the block
  const int row_in_block[2] = {warp_row0 + lane / 4, warp_row0 + lane / 4 + 8};  // rows this lane holds
  float o_acc[kOTiles][4];
  zero_accumulators(o_acc);
  float row_max[2] = {-INFINITY, -INFINITY};     // in units of scale * log2(e) * q.k
  float row_sum[2] = {0.f, 0.f};                 // this lane's partial sums; quad-reduced at the end
  uint32_t q_frag[Tr::kQInRegisters ? kHeadDim / 16 : 1][4];

  for (int n_block = 0; n_block < num_n_blocks; ++n_block) {
    cp_async_wait<0>();
    __syncthreads();  // block n_block has landed, and every warp is done with the other stage
    if (n_block + 1 < num_n_blocks) load_kv(n_block + 1, (n_block + 1) % Tr::kStages);
    cp_async_commit();
    if constexpr (Tr::kQInRegisters) {
      if (n_block == 0) {
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) load_a<kStride>(q_frag[ks], q_smem, warp_row0, ks * 16, lane);
      }
    }
    const T* k_tile = k_smem + (n_block % Tr::kStages) * Tr::kKVTileElems;  // [kBlockN][kStride]
    const T* v_tile = v_smem + (n_block % Tr::kStages) * Tr::kKVTileElems;  // [kBlockN][kStride]
    const int n0 = n_block * kBlockN;

    // S = Q K^T for this warp's 16 rows and kBlockN keys.
    float s_acc[kSTiles][4];
    zero_accumulators(s_acc);
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t a[4];
      if constexpr (Tr::kQInRegisters) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = q_frag[ks][i];
      } else {
        load_a<kStride>(a, q_smem, warp_row0, ks * 16, lane);
      }
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        load_b_from_rows_nk<kStride>(b, k_tile, nn * 16, ks * 16, lane);
        Ops::mma(s_acc[2 * nn], a, b[0], b[1]);
        Ops::mma(s_acc[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // Scale into base-2 units, then mask keys past the end or beyond the causal diagonal.
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[j][e] *= s.scale_log2;
    }
    const bool block_needs_mask = n0 + kBlockN > s.seqlen_k ||
                                  (s.is_causal && n0 + kBlockN - 1 > m0 + warp_row0 + s.causal_offset);
    if (block_needs_mask) {
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + j * 8 + (lane % 4) * 2 + (e % 2);
          const int query = m0 + row_in_block[e / 2];
          if (!key_visible(query, key, s.seqlen_k, s.is_causal, s.causal_offset)) s_acc[j][e] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max, rescale what was accumulated, P = exp2(S - max).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = row_max[half];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) block_max = fmaxf(block_max, fmaxf(s_acc[j][2 * half], s_acc[j][2 * half + 1]));
      block_max = quad_max(block_max);
      const float base = block_max == -INFINITY ? 0.f : block_max;  // a row with nothing visible yet
      const float correction = exp2f(row_max[half] - base);
      row_max[half] = block_max;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s_acc[j][e] = exp2f(s_acc[j][e] - base);
          sum += s_acc[j][e];
        }
      }
      row_sum[half] = row_sum[half] * correction + sum;
#pragma unroll
      for (int d = 0; d < kOTiles; ++d) {
        o_acc[d][2 * half] *= correction;
        o_acc[d][2 * half + 1] *= correction;
      }
    }

    // O += P V, with P taken from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      accumulator_to_a<T>(a, s_acc[2 * kk], s_acc[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        uint32_t b[4];
        load_b_from_rows_kn<kStride>(b, v_tile, kk * 16, dd * 16, lane);
        Ops::mma(o_acc[2 * dd], a, b[0], b[1]);
        Ops::mma(o_acc[2 * dd + 1], a, b[2], b[3]);
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads();  // with no key block at all, the Q copy may still be landing in q_smem

  // Epilogue: O / rowsum into this warp's rows of q_smem, then out; LSE = ln 2 * (max + log2(sum)).
  float* lse = p.lse + (static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + m0;  // [Lq - m0]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(row_sum[half]);
    const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;
    const int row = row_in_block[half];
    if (lane % 4 == 0 && m0 + row < s.seqlen_q) {
      lse[row] = sum > 0.f ? (row_max[half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
    }
#pragma unroll
    for (int d = 0; d < kOTiles; ++d) {
      const uint32_t packed = Ops::pack(o_acc[d][2 * half] * inv_sum, o_acc[d][2 * half + 1] * inv_sum);
      *reinterpret_cast<uint32_t*>(q_smem + row * kStride + d * 8 + (lane % 4) * 2) = packed;
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out) + batch * p.out_strides.batch + head * p.out_strides.head +
           (m0 + warp_row0) * p.out_strides.row;  // [16, D] rows of this warp
  store_warp_rows<kHeadDim>(out, p.out_strides.row, q_smem + warp_row0 * kStride, s.seqlen_q - m0 - warp_row0,
                            s.head_dim, s.head_dim % 8 == 0, lane);
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Tr = FwdTraits<kHeadDim>;
  constexpr int kSmemBytes = Tr::kSmemElems * sizeof(T);
  const int64_t num_m_blocks = (p.shape.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  const int64_t grid = num_m_blocks * p.shape.heads_q * p.shape.batch;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  auto kernel = fwd_kernel<T, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), Tr::kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashattn
