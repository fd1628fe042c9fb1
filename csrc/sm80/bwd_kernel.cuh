// Backward attention on the sm80 path (mma.sync), in three launches:
//   1. bwd_delta_kernel:   delta = rowsum(dout * out), one warp per row
//   2. bwd_kernel:         one CTA per (key block, kv head, batch); loops over every query head of the
//                          group and every query block that sees its keys, recomputing S^T = K Q^T and
//                          P^T from the saved LSE (P is never stored). dK and dV stay in registers for
//                          the whole loop; dQ partials are added into an fp32 workspace with atomics.
//   3. bwd_convert_dq_kernel: dq = scale * dq_accum, cast and laid out as [B, Lq, Hq, D].
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/mask.h"
#include "params.h"
#include "sm80/fragments.h"
#include "sm80/tile_io.h"

namespace flashattn {
namespace sm80 {

template <int kHeadDim>
struct BwdTraits {
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim tiles are multiples of 32 up to 256");
  // Above 128 columns, dK and dV of 16 keys no longer fit one warp's registers: two warps share each
  // key group, both computing its S^T and dP^T, each keeping half of the dK/dV columns.
  static constexpr int kSplitD = kHeadDim > 128 ? 2 : 1;
  static constexpr int kKeyWarps = kHeadDim > 128 ? 4 : 8;  // warps along the key dim, 16 keys each
  static constexpr int kWarps = kKeyWarps * kSplitD;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = kKeyWarps * 16;  // keys per CTA
  static constexpr int kBlockM = 64;              // queries per step
  static constexpr int kDSlice = kHeadDim / kSplitD;  // dK/dV columns per warp
  // The dQ GEMM ([kBlockM, D] = dS [kBlockM, kBlockN] K) splits rows by 16 and columns by what is left.
  static constexpr int kQueryWarps = kBlockM / 16;
  static constexpr int kDQSplit = kWarps / kQueryWarps;
  static constexpr int kDQSlice = kHeadDim / kDQSplit;
  static_assert(kDSlice % 16 == 0 && kDQSlice % 16 == 0, "column slices are whole k16/n16 steps");
  static constexpr int kStride = PaddedTile<kHeadDim>::kStride;
  static constexpr int kDSStride = PaddedTile<kBlockM>::kStride;
  static constexpr int kKVTileElems = kBlockN * kStride;
  static constexpr int kQTileElems = kBlockM * kStride;
  // K, V, Q, dO tiles, then dS^T [kBlockN][kBlockM] (elements), then LSE and delta (floats).
  static constexpr int kSmemElems = 2 * kKVTileElems + 2 * kQTileElems + kBlockN * kDSStride;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kBlockM * 4;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1) bwd_kernel(const BwdParams p) {
  using Tr = BwdTraits<kHeadDim>;
  using Ops = ElementOps<T>;
  constexpr int kStride = Tr::kStride;
  constexpr int kDSStride = Tr::kDSStride;
  constexpr int kBlockM = Tr::kBlockM;
  constexpr int kBlockN = Tr::kBlockN;
  constexpr int kSTiles = kBlockM / 8;  // n8 tiles of S^T (queries) per warp

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_smem = reinterpret_cast<T*>(smem_raw);    // [kBlockN][kStride]
  T* v_smem = k_smem + Tr::kKVTileElems;         // [kBlockN][kStride]
  T* q_smem = v_smem + Tr::kKVTileElems;         // [kBlockM][kStride]
  T* do_smem = q_smem + Tr::kQTileElems;         // [kBlockM][kStride]
  T* ds_smem = do_smem + Tr::kQTileElems;        // [kBlockN][kDSStride]: dS^T of one step
  float* lse_smem = reinterpret_cast<float*>(ds_smem + kBlockN * kDSStride);  // [kBlockM]
  float* delta_smem = lse_smem + kBlockM;                                     // [kBlockM]

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
  load_tile<kBlockN, kHeadDim, Tr::kThreads>(k_smem, k, p.k_strides.row, s.seqlen_k - n0, s.head_dim,
                                             s.rows_aligned_16);
  load_tile<kBlockN, kHeadDim, Tr::kThreads>(v_smem, v, p.v_strides.row, s.seqlen_k - n0, s.head_dim,
                                             s.rows_aligned_16);

  // Query blocks that see at least one of these keys.
  const int first_query = first_query_seeing(n0, s.is_causal, s.causal_offset);
  const int m_begin = first_query / kBlockM;
  const int num_m_total = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int num_m = first_query < s.seqlen_q ? num_m_total - m_begin : 0;
  const int num_steps = group * num_m;

  // Step i handles query head kv_head * group + i / num_m and query block m_begin + i % num_m.
  auto load_step = [&](int step) {
    const int head = kv_head * group + step / num_m;
    const int m0 = (m_begin + step % num_m) * kBlockM;
    const T* q = static_cast<const T*>(p.q) + batch * p.q_strides.batch + head * p.q_strides.head +
                 m0 * p.q_strides.row;
    const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_strides.batch +
                    head * p.dout_strides.head + m0 * p.dout_strides.row;
    load_tile<kBlockM, kHeadDim, Tr::kThreads>(q_smem, q, p.q_strides.row, s.seqlen_q - m0, s.head_dim,
                                               s.rows_aligned_16);
    load_tile<kBlockM, kHeadDim, Tr::kThreads>(do_smem, dout, p.dout_strides.row, s.seqlen_q - m0, s.head_dim,
                                               s.rows_aligned_16);
    const int64_t row_offset = (static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + m0;
    load_row_floats<kBlockM, Tr::kThreads>(lse_smem, p.lse + row_offset, s.seqlen_q - m0);
    load_row_floats<kBlockM, Tr::kThreads>(delta_smem, p.delta + row_offset, s.seqlen_q - m0);
  };
  if (num_steps > 0) load_step(0);
  cp_async_commit();

  const int key_warp = warp % Tr::kKeyWarps;  // this warp's 16 keys in phase A
  const int d_part = warp / Tr::kKeyWarps;    // which dK/dV column slice it keeps
  const int key_row0 = key_warp * 16;
  float dk_acc[Tr::kDSlice / 8][4];
  float dv_acc[Tr::kDSlice / 8][4];
  zero_accumulators(dk_acc);
  zero_accumulators(dv_acc);

  for (int step = 0; step < num_steps; ++step) {
    cp_async_wait<0>();
    __syncthreads();  // this step's Q, dO, LSE, delta have landed; last step's dQ GEMM is done
    const int head = kv_head * group + step / num_m;
    const int m0 = (m_begin + step % num_m) * kBlockM;

    // Phase A: S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and all kBlockM queries.
    float s_acc[kSTiles][4];
    float dp_acc[kSTiles][4];
    zero_accumulators(s_acc);
    zero_accumulators(dp_acc);
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t k_frag[4], v_frag[4];
      load_a<kStride>(k_frag, k_smem, key_row0, ks * 16, lane);
      load_a<kStride>(v_frag, v_smem, key_row0, ks * 16, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockM / 16; ++nn) {
        uint32_t b[4];
        load_b_from_rows_nk<kStride>(b, q_smem, nn * 16, ks * 16, lane);
        Ops::mma(s_acc[2 * nn], k_frag, b[0], b[1]);
        Ops::mma(s_acc[2 * nn + 1], k_frag, b[2], b[3]);
        load_b_from_rows_nk<kStride>(b, do_smem, nn * 16, ks * 16, lane);
        Ops::mma(dp_acc[2 * nn], v_frag, b[0], b[1]);
        Ops::mma(dp_acc[2 * nn + 1], v_frag, b[2], b[3]);
      }
    }

    // P^T = exp2(S^T * scale_log2 - LSE_log2) and dS^T = P^T (dP^T - delta), masked entries zero.
    const bool needs_mask = m0 + kBlockM > s.seqlen_q || n0 + kBlockN > s.seqlen_k ||
                            (s.is_causal && n0 + key_row0 + 15 > m0 + s.causal_offset);
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q_local = j * 8 + (lane % 4) * 2 + (e % 2);
        const float lse = lse_smem[q_local];
        // A row that saw no key has LSE -inf and P = 0 everywhere.
        const float lse_log2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        float prob = exp2f(s_acc[j][e] * s.scale_log2 - lse_log2);
        if (needs_mask) {
          const int key = n0 + key_row0 + lane / 4 + (e / 2) * 8;
          const int query = m0 + q_local;
          if (query >= s.seqlen_q || !key_visible(query, key, s.seqlen_k, s.is_causal, s.causal_offset)) prob = 0.f;
        }
        s_acc[j][e] = prob;
        dp_acc[j][e] = prob * (dp_acc[j][e] - delta_smem[q_local]);
      }
    }

    // dV += P^T dO and dK += dS^T Q over this warp's column slice.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t p_frag[4], ds_frag[4];
      accumulator_to_a<T>(p_frag, s_acc[2 * kk], s_acc[2 * kk + 1]);
      accumulator_to_a<T>(ds_frag, dp_acc[2 * kk], dp_acc[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < Tr::kDSlice / 16; ++dd) {
        const int col0 = d_part * Tr::kDSlice + dd * 16;
        uint32_t b[4];
        load_b_from_rows_kn<kStride>(b, do_smem, kk * 16, col0, lane);
        Ops::mma(dv_acc[2 * dd], p_frag, b[0], b[1]);
        Ops::mma(dv_acc[2 * dd + 1], p_frag, b[2], b[3]);
        load_b_from_rows_kn<kStride>(b, q_smem, kk * 16, col0, lane);
        Ops::mma(dk_acc[2 * dd], ds_frag, b[0], b[1]);
        Ops::mma(dk_acc[2 * dd + 1], ds_frag, b[2], b[3]);
      }
    }

    // dS^T to shared memory for the dQ GEMM (one copy per key group).
    if (d_part == 0) {
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = key_row0 + lane / 4 + half * 8;
          const int col = j * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(ds_smem + row * kDSStride + col) =
              Ops::pack(dp_acc[j][2 * half], dp_acc[j][2 * half + 1]);
        }
      }
    }
    __syncthreads();  // dS^T complete; Q, dO, LSE, delta no longer read this step

    if (step + 1 < num_steps) load_step(step + 1);  // lands while the dQ GEMM runs
    cp_async_commit();

    // Phase B: dQ[m0 + 16 rows, column slice] += dS K, added into the fp32 workspace.
    {
      const int query_warp = warp % Tr::kQueryWarps;
      const int dq_part = warp / Tr::kQueryWarps;
      float dq_acc[Tr::kDQSlice / 8][4];
      zero_accumulators(dq_acc);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        load_a_transposed<kDSStride>(a, ds_smem, query_warp * 16, kk * 16, lane);
#pragma unroll
        for (int dd = 0; dd < Tr::kDQSlice / 16; ++dd) {
          uint32_t b[4];
          load_b_from_rows_kn<kStride>(b, k_smem, kk * 16, dq_part * Tr::kDQSlice + dd * 16, lane);
          Ops::mma(dq_acc[2 * dd], a, b[0], b[1]);
          Ops::mma(dq_acc[2 * dd + 1], a, b[2], b[3]);
        }
      }
      float* dq_accum = p.dq_accum + ((static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + m0) *
                                         p.dq_accum_dim;  // [Lq - m0, dq_accum_dim]
#pragma unroll
      for (int j = 0; j < Tr::kDQSlice / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = query_warp * 16 + lane / 4 + (e / 2) * 8;
          const int col = dq_part * Tr::kDQSlice + j * 8 + (lane % 4) * 2 + (e % 2);
          if (m0 + row < s.seqlen_q && col < s.head_dim) {
            atomicAdd(dq_accum + static_cast<int64_t>(row) * p.dq_accum_dim + col, dq_acc[j][e]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // dK = scale * dS^T Q and dV, straight from the accumulators.
  T* dk = static_cast<T*>(p.dk) + batch * p.dk_strides.batch + kv_head * p.dk_strides.head;  // [Lk, D]
  T* dv = static_cast<T*>(p.dv) + batch * p.dv_strides.batch + kv_head * p.dv_strides.head;  // [Lk, D]
  const bool pair_stores = s.head_dim % 2 == 0;
#pragma unroll
  for (int j = 0; j < Tr::kDSlice / 8; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = n0 + key_row0 + lane / 4 + half * 8;
      const int col = d_part * Tr::kDSlice + j * 8 + (lane % 4) * 2;
      if (key >= s.seqlen_k || col >= s.head_dim) continue;
      const float dk0 = dk_acc[j][2 * half] * s.scale, dk1 = dk_acc[j][2 * half + 1] * s.scale;
      const float dv0 = dv_acc[j][2 * half], dv1 = dv_acc[j][2 * half + 1];
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

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d]; one warp per row, 8 columns per lane.
template <typename T>
__global__ void bwd_delta_kernel(const BwdParams p) {
  using Ops = ElementOps<T>;
  const AttentionShape& s = p.shape;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t num_rows = static_cast<int64_t>(s.batch) * s.seqlen_q * s.heads_q;
  if (row >= num_rows) return;
  const int head = static_cast<int>(row % s.heads_q);
  const int query = static_cast<int>((row / s.heads_q) % s.seqlen_q);
  const int batch = static_cast<int>(row / s.heads_q / s.seqlen_q);
  const T* out = static_cast<const T*>(p.out) + batch * p.out_strides.batch + query * p.out_strides.row +
                 head * p.out_strides.head;  // [D]
  const T* dout = static_cast<const T*>(p.dout) + batch * p.dout_strides.batch + query * p.dout_strides.row +
                  head * p.dout_strides.head;  // [D]
  const int col0 = lane * 8;
  float sum = 0.f;
  if (s.rows_aligned_16) {
    if (col0 < s.head_dim) {
      const uint4 o_vec = *reinterpret_cast<const uint4*>(out + col0);
      const uint4 do_vec = *reinterpret_cast<const uint4*>(dout + col0);
      const T* o8 = reinterpret_cast<const T*>(&o_vec);
      const T* do8 = reinterpret_cast<const T*>(&do_vec);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += Ops::to_float(o8[i]) * Ops::to_float(do8[i]);
    }
  } else {
    for (int c = col0; c < col0 + 8 && c < s.head_dim; ++c) sum += Ops::to_float(out[c]) * Ops::to_float(dout[c]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) p.delta[(static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + query] = sum;
}

// dq[b, i, h, d] = scale * dq_accum[b, h, i, d], one thread per element.
template <typename T>
__global__ void bwd_convert_dq_kernel(const BwdParams p) {
  using Ops = ElementOps<T>;
  const AttentionShape& s = p.shape;
  const int64_t total = static_cast<int64_t>(s.batch) * s.seqlen_q * s.heads_q * s.head_dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int col = static_cast<int>(idx % s.head_dim);
    const int head = static_cast<int>((idx / s.head_dim) % s.heads_q);
    const int query = static_cast<int>((idx / s.head_dim / s.heads_q) % s.seqlen_q);
    const int batch = static_cast<int>(idx / s.head_dim / s.heads_q / s.seqlen_q);
    const float value =
        p.dq_accum[((static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q + query) * p.dq_accum_dim + col];
    T* dq = static_cast<T*>(p.dq) + batch * p.dq_strides.batch + query * p.dq_strides.row +
            head * p.dq_strides.head;
    dq[col] = Ops::from_float(value * s.scale);
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Tr = BwdTraits<kHeadDim>;
  const AttentionShape& s = p.shape;

  constexpr int kDeltaWarps = 8;
  const int64_t rows = static_cast<int64_t>(s.batch) * s.seqlen_q * s.heads_q;
  const int64_t delta_blocks = (rows + kDeltaWarps - 1) / kDeltaWarps;
  const int64_t num_n_blocks = (s.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  const int64_t grid = num_n_blocks * s.heads_kv * s.batch;
  if (delta_blocks > 0x7fffffff || grid > 0x7fffffff) return cudaErrorInvalidConfiguration;

  bwd_delta_kernel<T><<<static_cast<unsigned>(delta_blocks), kDeltaWarps * 32, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  auto kernel = bwd_kernel<T, kHeadDim>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  constexpr int kConvertThreads = 256;
  const int64_t elems = rows * s.head_dim;
  const int64_t convert_blocks = std::min<int64_t>((elems + kConvertThreads - 1) / kConvertThreads, 65536);
  bwd_convert_dq_kernel<T><<<static_cast<unsigned>(convert_blocks), kConvertThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashattn
