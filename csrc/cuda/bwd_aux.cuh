// The first and last launches of every backward, sm80 and sm90 alike: the preprocess (delta =
// rowsum(dout * out), the LSE in base 2, dq_accum zeroed) and the dq conversion (dq from the fp32
// workspace).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/dq_accum_layout.h"
#include "cuda/element_ops.h"
#include "cuda/saturated_rows.h"
#include "params.h"

namespace flashattn {

// The two auxiliary kernels run on a grid of (query head x chunk of rows) along x and batches along y
// (looping past the grid's limit), so no thread divides a 64-bit index. A chunk is kAuxRows rows for
// the dq conversion and kAuxThreads / lanes rows for the preprocess (lanes threads per row).
constexpr int kAuxRows = 16;
constexpr int kAuxThreads = 256;
constexpr int kAuxMaxGridY = 65535;

struct AuxTile {
  int head, row0, batch;
  __device__ __forceinline__ AuxTile(int chunks_per_head, int rows_per_chunk)
      : head(static_cast<int>(blockIdx.x) / chunks_per_head),
        row0(static_cast<int>(blockIdx.x) % chunks_per_head * rows_per_chunk),
        batch(static_cast<int>(blockIdx.y)) {}
};

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] and lse_log2 = lse * log2(e) (+inf for a
// row that saw no key, so its P = exp2(s - lse_log2) is 0). The padding rows i in [seqlen_q,
// stats_stride) get delta 0 and lse_log2 +inf. A row is summed by kLanes threads, 8 columns each at a
// time: 8 for head dims up to 64 (every thread loads), 16 above. It also zeroes the row's dq_accum (the
// main kernels add into it), which saves the backward a separate fill of that workspace. With
// params.dout_caller set (additive masks), dout is read from there and written to params.dout,
// saturated rows rebalanced (cuda/saturated_rows.h), and delta is the sum over the written values.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kAuxThreads) bwd_preprocess_kernel(const BwdParams p, int chunks_per_head) {
  using Ops = ElementOps<T>;
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row's threads share a warp");
  const AttentionShape& s = p.shape;
  const AuxTile tile(chunks_per_head, kAuxThreads / kLanes);
  const int query = tile.row0 + static_cast<int>(threadIdx.x) / kLanes;
  const int sub = static_cast<int>(threadIdx.x) % kLanes;
  const bool rebalance = p.dout_caller != nullptr;
  const void* dout_read = rebalance ? p.dout_caller : p.dout;
  const TensorStrides& dout_read_strides = rebalance ? p.dout_caller_strides : p.dout_strides;
  for (int batch = tile.batch; batch < s.batch; batch += gridDim.y) {
    const int64_t row = static_cast<int64_t>(batch) * s.heads_q + tile.head;
    float lse_log2 = INFINITY;
    if (query < s.seqlen_q) {
      const float lse = p.lse[row * s.seqlen_q + query];
      if (lse != -INFINITY) lse_log2 = lse * 1.4426950408889634f;
    }
    float rescale = 1.f;
    if (rebalance) {
      const bool saturated = query < s.seqlen_q && fabsf(lse_log2) >= kSaturatedLseLog2 && isfinite(lse_log2);
      if (__any_sync(0xffffffff, saturated)) {
        rebalance_saturated_row<T, kLanes>(p, batch, tile.head, query, saturated, sub, &lse_log2, &rescale);
      }
    }
    // dq_accum's row `query` of this head (in the tile layout not that query's elements, but every
    // element of the head's rows is zeroed by some thread all the same).
    if (query < p.dq_accum_rows()) {
      float4* accum =
          reinterpret_cast<float4*>(p.dq_accum + (row * p.dq_accum_rows() + query) * p.dq_accum_dim);  // [dq_accum_dim / 4]
      for (int c = sub; c < p.dq_accum_dim / 4; c += kLanes) accum[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float sum = 0.f;
    if (query < s.seqlen_q) {
      const T* out = static_cast<const T*>(p.out) + batch * p.out_strides.batch + query * p.out_strides.row +
                     tile.head * p.out_strides.head;  // [D]
      const T* dout = static_cast<const T*>(dout_read) + batch * dout_read_strides.batch +
                      query * dout_read_strides.row + tile.head * dout_read_strides.head;  // [D]
      // With rebalance, p.dout is the workspace this kernel fills (see BwdParams::dout_caller).
      T* dout_written = rebalance ? static_cast<T*>(const_cast<void*>(p.dout)) + batch * p.dout_strides.batch +
                                        query * p.dout_strides.row + tile.head * p.dout_strides.head
                                  : nullptr;  // [D]
      for (int col0 = sub * 8; col0 < s.head_dim; col0 += kLanes * 8) {
        if (s.rows_aligned_16 && col0 + 8 <= s.head_dim) {
          const uint4 o_vec = *reinterpret_cast<const uint4*>(out + col0);
          uint4 do_vec = *reinterpret_cast<const uint4*>(dout + col0);
          const T* o8 = reinterpret_cast<const T*>(&o_vec);
          T* do8 = reinterpret_cast<T*>(&do_vec);
          if (rebalance) {
#pragma unroll
            for (int i = 0; i < 8; ++i) do8[i] = Ops::from_float(Ops::to_float(do8[i]) * rescale);
            *reinterpret_cast<uint4*>(dout_written + col0) = do_vec;
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) sum += Ops::to_float(o8[i]) * Ops::to_float(do8[i]);
        } else {
          for (int c = col0; c < col0 + 8 && c < s.head_dim; ++c) {
            T d = dout[c];
            if (rebalance) {
              d = Ops::from_float(Ops::to_float(d) * rescale);
              dout_written[c] = d;
            }
            sum += Ops::to_float(out[c]) * Ops::to_float(d);
          }
        }
      }
    }
    sum = group_sum<kLanes>(sum);
    if (sub == 0 && query < p.stats_stride) {
      p.delta[row * p.stats_stride + query] = query < s.seqlen_q ? sum : 0.f;
      p.lse_log2[row * p.stats_stride + query] = lse_log2;
    }
  }
}

// dq[b, i, h, d] = scale * dq_accum[b, h, i, d] from the row layout: each thread converts 4 consecutive
// columns of a row.
template <typename T>
__global__ void __launch_bounds__(kAuxThreads) bwd_convert_dq_kernel(const BwdParams p, int chunks_per_head) {
  using Ops = ElementOps<T>;
  const AttentionShape& s = p.shape;
  const AuxTile tile(chunks_per_head, kAuxRows);
  const int quads = (s.head_dim + 3) / 4;
  for (int batch = tile.batch; batch < s.batch; batch += gridDim.y) {
    const float* accum = p.dq_accum + (static_cast<int64_t>(batch) * s.heads_q + tile.head) * s.seqlen_q *
                                          p.dq_accum_dim;  // [Lq, dq_accum_dim]: this head's rows
    for (int i = threadIdx.x; i < kAuxRows * quads; i += blockDim.x) {
      const int query = tile.row0 + i / quads;
      const int col = i % quads * 4;
      if (query >= s.seqlen_q) break;  // i only grows
      const float4 v = *reinterpret_cast<const float4*>(accum + static_cast<int64_t>(query) * p.dq_accum_dim + col);
      T* dq = static_cast<T*>(p.dq) + batch * p.dq_strides.batch + query * p.dq_strides.row +
              tile.head * p.dq_strides.head;  // [D]
      if (col + 4 <= s.head_dim && (reinterpret_cast<uintptr_t>(dq + col) & 7) == 0) {
        *reinterpret_cast<uint2*>(dq + col) = make_uint2(Ops::pack(v.x * s.scale, v.y * s.scale),
                                                         Ops::pack(v.z * s.scale, v.w * s.scale));
      } else {
        const float values[4] = {v.x, v.y, v.z, v.w};
        for (int c = 0; c < 4 && col + c < s.head_dim; ++c) dq[col + c] = Ops::from_float(values[c] * s.scale);
      }
    }
  }
}

// The same from the sm90 tile layout (cuda/dq_accum_layout.h), a block per 16-row slab of a 64-query
// block: the slab's elements are, per n8 column block, 512 contiguous bytes (32 consumer threads'
// fragments of four floats), so the block reads them whole float4 by float4, transposes them through
// shared memory into rows, and writes dq 8 columns (16 bytes) per thread. Reading the layout
// element by element in dq's order instead used half of every 32-byte sector it touched.
constexpr int kDqSlabRows = 16;
constexpr int kDqSlabMaxWidth = 256;
constexpr int kDqSlabPad = 4;  // floats after each row in shared memory: fragment stores 2-way, not 8-way, per bank

template <typename T>
__global__ void __launch_bounds__(kAuxThreads) bwd_convert_dq_tiled_kernel(const BwdParams p, int chunks_per_head) {
  using Ops = ElementOps<T>;
  const AttentionShape& s = p.shape;
  const AuxTile tile(chunks_per_head, kDqSlabRows);
  const int width = p.dq_accum_dim;
  const int row_stride = width + kDqSlabPad;
  __shared__ __align__(16) float slab[kDqSlabRows * (kDqSlabMaxWidth + kDqSlabPad)];  // [16][width + pad]
  const int block_row0 = tile.row0 / kDqTileRows * kDqTileRows;
  const int slab_index = tile.row0 % kDqTileRows / kDqSlabRows;  // 0..3 within the 64-query block
  for (int batch = tile.batch; batch < s.batch; batch += gridDim.y) {
    const float* block = p.dq_accum + ((static_cast<int64_t>(batch) * s.heads_q + tile.head) * p.stats_stride +
                                       block_row0) * width;  // [64 * width]: this 64-query block
    // Fragment f of n8 block nb (counted over both consumers' head dims): consumer thread
    // slab_index * 32 + f (dq_tile_fragment_offset), rows f / 4 and f / 4 + 8 of the slab, columns
    // 8 nb + 2 (f % 4) and the next.
    for (int i = threadIdx.x; i < width / 8 * 32; i += blockDim.x) {
      const int nb = i / 32, f = i % 32;
      const float4 v = *reinterpret_cast<const float4*>(block + (nb * 128 + slab_index * 32 + f) * 4);
      const int row = f / 4, col = nb * 8 + (f % 4) * 2;
      *reinterpret_cast<float2*>(slab + row * row_stride + col) = make_float2(v.x, v.y);
      *reinterpret_cast<float2*>(slab + (row + 8) * row_stride + col) = make_float2(v.z, v.w);
    }
    __syncthreads();
    const int chunks = (s.head_dim + 7) / 8;  // of 8 columns
    for (int i = threadIdx.x; i < kDqSlabRows * chunks; i += blockDim.x) {
      const int row = i / chunks, col = i % chunks * 8;
      const int query = tile.row0 + row;
      if (query >= s.seqlen_q) break;  // i only grows
      const float* src = slab + row * row_stride + col;
      T* dq = static_cast<T*>(p.dq) + batch * p.dq_strides.batch + query * p.dq_strides.row +
              tile.head * p.dq_strides.head;  // [D]
      if (col + 8 <= s.head_dim && (reinterpret_cast<uintptr_t>(dq + col) & 15) == 0) {
        const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
        *reinterpret_cast<uint4*>(dq + col) =
            make_uint4(Ops::pack(a.x * s.scale, a.y * s.scale), Ops::pack(a.z * s.scale, a.w * s.scale),
                       Ops::pack(b.x * s.scale, b.y * s.scale), Ops::pack(b.z * s.scale, b.w * s.scale));
      } else {
        for (int c = 0; c < 8 && col + c < s.head_dim; ++c) dq[col + c] = Ops::from_float(src[c] * s.scale);
      }
    }
    __syncthreads();  // the slab is rewritten for the next batch
  }
}

// Grid of an auxiliary kernel covering `rows` rows per (batch, head) in chunks of rows_per_chunk; fails
// past the grid's x limit.
inline cudaError_t aux_grid(const AttentionShape& s, int64_t rows, int rows_per_chunk, int* chunks_per_head,
                            dim3* grid) {
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  if (chunks * s.heads_q > 0x7fffffff) return cudaErrorInvalidConfiguration;
  *chunks_per_head = static_cast<int>(chunks);
  *grid = dim3(static_cast<unsigned>(chunks * s.heads_q), static_cast<unsigned>(std::min(s.batch, kAuxMaxGridY)));
  return cudaSuccess;
}

// The first launch of every backward (sm80 and sm90): delta and lse_log2, and dq_accum zeroed.
template <typename T>
cudaError_t launch_bwd_preprocess(const BwdParams& p, cudaStream_t stream) {
  if (p.dq_accum_dim % 4 != 0) return cudaErrorInvalidValue;  // rows zeroed 16 bytes at a time
  int chunks_per_head = 0;
  dim3 grid;
  // 8 threads per row load a row of up to 64 columns at once; 16 threads for wider rows.
  const bool narrow = p.shape.head_dim <= 64;
  const int lanes = narrow ? 8 : 16;
  cudaError_t err = aux_grid(p.shape, p.stats_stride, kAuxThreads / lanes, &chunks_per_head, &grid);
  if (err != cudaSuccess) return err;
  if (narrow) {
    bwd_preprocess_kernel<T, 8><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
  } else {
    bwd_preprocess_kernel<T, 16><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
  }
  return cudaGetLastError();
}

// The last launch of every backward: dq from the fp32 workspace.
template <typename T>
cudaError_t launch_bwd_convert_dq(const BwdParams& p, cudaStream_t stream) {
  int chunks_per_head = 0;
  dim3 grid;
  if (p.dq_accum_tiled) {
    if (p.dq_accum_dim % 8 != 0 || p.dq_accum_dim > kDqSlabMaxWidth) return cudaErrorInvalidValue;
    cudaError_t err = aux_grid(p.shape, p.shape.seqlen_q, kDqSlabRows, &chunks_per_head, &grid);
    if (err != cudaSuccess) return err;
    bwd_convert_dq_tiled_kernel<T><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
    return cudaGetLastError();
  }
  cudaError_t err = aux_grid(p.shape, p.shape.seqlen_q, kAuxRows, &chunks_per_head, &grid);
  if (err != cudaSuccess) return err;
  bwd_convert_dq_kernel<T><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
  return cudaGetLastError();
}

}  // namespace flashattn
