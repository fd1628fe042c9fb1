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
#include "cuda/varlen.h"
#include "params.h"

namespace flashattn {

// The two auxiliary kernels run on a grid of (query head x chunk of rows) along x and batches along y
// (looping past the grid's limit), so no thread divides a 64-bit index. A chunk is kAuxRows rows for
// the dq conversion and kPreprocessRowsPerThread * kAuxThreads / lanes rows for the preprocess (lanes
// threads per row): 128 rows at head dims up to 64, 64 above, which divide stats_stride.
constexpr int kAuxRows = 16;
constexpr int kAuxThreads = 256;
constexpr int kAuxMaxGridY = 65535;
// Rows each thread of the preprocess sums, their loads all in flight at once: 4 give a thread 128
// bytes of O and dO, a block 32 KB, and an SM holds 2 or 3 such blocks (their registers), where HBM
// wants about 40-64 KB in flight per SM. One row per thread, as before, kept 8 KB per block in flight.
constexpr int kPreprocessRowsPerThread = 4;

// The sequence of a variable-length batch whose workspace region (varlen_workspace_row) holds
// workspace row w: the last b with varlen_workspace_row(b) <= w (regions are at least one block long,
// so the starts increase strictly).
__device__ __forceinline__ int varlen_sequence_of_row(const VarlenParams& v, int batch, int64_t w) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (varlen_workspace_row(v.cu_seqlens_q[mid], mid, v.workspace_align) <= w) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Where an auxiliary kernel's block finds the rows of one (batch, head): the block's first query
// `first` (within its sequence), the sequence's query count, and the indices of its query 0 in lse,
// in the statistics and dq workspaces (rows), and in q-shaped tensors (packed row offset). A batched
// call's are (batch, head)'s; a variable-length batch's are those of the sequence whose workspace region
// holds the block's rows (the grid then runs over the workspace rows, batch 0 only).
struct AuxRows {
  int first, seqlen_q;
  int64_t lse0, stats0, region_rows;  // region_rows: workspace rows of (batch, head) or the sequence
  int q_row0;

  __device__ __forceinline__ AuxRows(const BwdParams& p, int batch, int head, int row0) {
    const AttentionShape& s = p.shape;
    if (p.varlen.enabled()) {
      const VarlenParams& v = p.varlen;
      const int b = varlen_sequence_of_row(v, s.batch, row0);
      const SeqSpan seq = SeqSpan::of(v, b);
      const int64_t start = varlen_workspace_row(seq.q_begin, b, v.workspace_align);
      first = static_cast<int>(row0 - start);
      seqlen_q = seq.len_q;
      lse0 = static_cast<int64_t>(head) * s.seqlen_q + seq.q_begin;
      stats0 = head * v.workspace_rows + start;
      region_rows = varlen_workspace_row(v.cu_seqlens_q[b + 1], b + 1, v.workspace_align) - start;
      q_row0 = seq.q_begin;
    } else {
      const int64_t row = static_cast<int64_t>(batch) * s.heads_q + head;
      first = row0;
      seqlen_q = s.seqlen_q;
      lse0 = row * s.seqlen_q;
      stats0 = row * p.stats_stride;
      region_rows = p.stats_stride;
      q_row0 = 0;
    }
  }
};

// Batch entries the auxiliary kernels loop over: one for a variable-length batch, whose grid runs over
// every sequence's workspace rows.
__device__ __forceinline__ int aux_batches(const BwdParams& p) { return p.varlen.enabled() ? 1 : p.shape.batch; }

struct AuxTile {
  int head, row0, batch;
  __device__ __forceinline__ AuxTile(int chunks_per_head, int rows_per_chunk)
      : head(static_cast<int>(blockIdx.x) / chunks_per_head),
        row0(static_cast<int>(blockIdx.x) % chunks_per_head * rows_per_chunk),
        batch(static_cast<int>(blockIdx.y)) {}
};

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] and lse_log2 = lse * log2(e) (+inf for a
// row that saw no key, so its P = exp2(s - lse_log2) is 0). The padding rows i in [seqlen_q,
// stats_stride) get delta 0 and lse_log2 +inf. With params.dout_caller set (kRebalance, additive
// masks), dout is read from there and written to params.dout, saturated rows rebalanced
// (cuda/saturated_rows.h), and delta is the sum over the written values.
//
// The kernel is bound by HBM, so it is laid out for bytes in flight: a row is summed by kLanes threads
// of one warp, 8 columns (16 bytes) each per pass of kLanes * 8 columns (8 lanes for head dims up to
// 64, where every thread loads, 16 above: one pass up to 128, two up to 256), and each thread sums
// kPreprocessRowsPerThread rows kAuxThreads / kLanes apart, so a warp's load covers whole consecutive
// rows. Per pass, a thread issues its rows' O and dO loads (8 independent 16-byte loads, 128 bytes)
// before it uses any of them. Rows whose starts are not 16-byte aligned take an element-wise path.
//
// It also zeroes dq_accum (the main kernels add into it), which saves the backward a separate fill of
// that workspace: a block zeroes the workspace rows of its (batch, head, rows), contiguous in either
// layout, all its threads storing consecutive 16 bytes (a warp 512 contiguous bytes), issued while
// the loads are in flight. The rows' element order (the sm90 tile layout's is not a query's row) does
// not matter to a fill.
//
// Three blocks per SM (96 KB of loads in flight) without kRebalance: left to itself ptxas took 80
// registers (three blocks as well) and spilled 4 bytes. With kRebalance the inlined saturated-row code
// takes 100-128 registers: two blocks (64 KB).
template <typename T, int kLanes, bool kRebalance>
__global__ void __launch_bounds__(kAuxThreads, kRebalance ? 2 : 3) bwd_preprocess_kernel(const BwdParams p, int chunks_per_head) {
  using Ops = ElementOps<T>;
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row's threads share a warp");
  constexpr int kRows = kPreprocessRowsPerThread;
  constexpr int kRowStep = kAuxThreads / kLanes;  // between one thread's rows
  constexpr int kPassCols = kLanes * 8;
  const AttentionShape& s = p.shape;
  const AuxTile tile(chunks_per_head, kRowStep * kRows);
  const int sub = static_cast<int>(threadIdx.x) % kLanes;
  const void* dout_read = kRebalance ? p.dout_caller : p.dout;
  const TensorStrides& dout_read_strides = kRebalance ? p.dout_caller_strides : p.dout_strides;
  for (int batch = tile.batch; batch < aux_batches(p); batch += gridDim.y) {
    const AuxRows rows_of(p, batch, tile.head, tile.row0);
    const int seqlen_q = rows_of.seqlen_q;
    // The thread's first row, within its sequence (the batched call's own query0).
    const int query0 = rows_of.first + static_cast<int>(threadIdx.x) / kLanes;
    const int64_t dq_rows = p.varlen.enabled() ? rows_of.region_rows : p.dq_accum_rows();
    const int64_t packed0 = static_cast<int64_t>(rows_of.q_row0) + query0;  // its row in q-shaped tensors
    const T* out = static_cast<const T*>(p.out) + batch * p.out_strides.batch + packed0 * p.out_strides.row +
                   tile.head * p.out_strides.head;  // [D], row i at + i * kRowStep * row stride
    const T* dout = static_cast<const T*>(dout_read) + batch * dout_read_strides.batch +
                    packed0 * dout_read_strides.row + tile.head * dout_read_strides.head;  // [D], as out
    // With kRebalance, p.dout is the workspace this kernel fills (see BwdParams::dout_caller).
    T* dout_written = kRebalance ? static_cast<T*>(const_cast<void*>(p.dout)) + batch * p.dout_strides.batch +
                                       packed0 * p.dout_strides.row + tile.head * p.dout_strides.head
                                 : nullptr;  // [D], as out

    float lse[kRows];  // -inf for the padding rows, which get lse_log2 +inf like a row that saw no key
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int query = query0 + i * kRowStep;
      lse[i] = query < seqlen_q ? p.lse[rows_of.lse0 + query] : -INFINITY;
    }

    // One pass's 8 columns from col0 of each row, zeros past seqlen_q and head_dim (so they add 0).
    const bool vector = s.rows_aligned_16 && s.head_dim % 8 == 0;
    uint4 o_vec[kRows], do_vec[kRows];
    auto load_pass = [&](int col0) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const bool live = query0 + i * kRowStep < seqlen_q && col0 < s.head_dim;
        o_vec[i] = live ? *reinterpret_cast<const uint4*>(out + i * kRowStep * p.out_strides.row + col0)
                        : make_uint4(0u, 0u, 0u, 0u);
        do_vec[i] = live ? *reinterpret_cast<const uint4*>(dout + i * kRowStep * dout_read_strides.row + col0)
                         : make_uint4(0u, 0u, 0u, 0u);
      }
    };
    if (vector) load_pass(sub * 8);

    // This block's dq_accum rows [row0, row0 + rows) of (batch, head), flat: every element of the
    // workspace belongs to exactly one block's range.
    {
      const int64_t left = dq_rows - rows_of.first;
      const int rows = left <= 0 ? 0 : left < kRowStep * kRows ? static_cast<int>(left) : kRowStep * kRows;
      const int64_t accum0 = p.varlen.enabled() ? rows_of.stats0 : (static_cast<int64_t>(batch) * s.heads_q + tile.head) * dq_rows;
      float4* accum = reinterpret_cast<float4*>(p.dq_accum + (accum0 + rows_of.first) * p.dq_accum_dim);  // [rows * dq_accum_dim / 4]
      const int count = rows * (p.dq_accum_dim / 4);
#pragma unroll 4
      for (int i = static_cast<int>(threadIdx.x); i < count; i += kAuxThreads) accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    float lse_log2[kRows], rescale[kRows], sum[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      lse_log2[i] = lse[i] != -INFINITY ? lse[i] * 1.4426950408889634f : INFINITY;
      rescale[i] = 1.f;
      sum[i] = 0.f;
      if constexpr (kRebalance) {
        const int query = query0 + i * kRowStep;
        const bool saturated =
            query < seqlen_q && fabsf(lse_log2[i]) >= kSaturatedLseLog2 && isfinite(lse_log2[i]);
        if (__any_sync(0xffffffff, saturated)) {
          rebalance_saturated_row<T, kLanes>(p, batch, tile.head, query, saturated, sub, &lse_log2[i], &rescale[i]);
        }
      }
    }

    if (vector) {
      for (int col0 = sub * 8;;) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const T* o8 = reinterpret_cast<const T*>(&o_vec[i]);
          T* do8 = reinterpret_cast<T*>(&do_vec[i]);
          if constexpr (kRebalance) {
#pragma unroll
            for (int c = 0; c < 8; ++c) do8[c] = Ops::from_float(Ops::to_float(do8[c]) * rescale[i]);
            if (query0 + i * kRowStep < seqlen_q && col0 < s.head_dim) {
              *reinterpret_cast<uint4*>(dout_written + i * kRowStep * p.dout_strides.row + col0) = do_vec[i];
            }
          }
#pragma unroll
          for (int c = 0; c < 8; ++c) sum[i] += Ops::to_float(o8[c]) * Ops::to_float(do8[c]);
        }
        col0 += kPassCols;
        if (col0 - sub * 8 >= s.head_dim) break;  // the next pass starts past the row (for the whole group)
        load_pass(col0);
      }
    } else {
      // Rows whose starts are not 16-byte aligned (or a head dim that is not a multiple of 8), element
      // by element in the same order: a fallback, not laid out for bandwidth.
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (query0 + i * kRowStep >= seqlen_q) continue;
        const T* o_row = out + i * kRowStep * p.out_strides.row;
        const T* do_row = dout + i * kRowStep * dout_read_strides.row;
#pragma unroll 1
        for (int col0 = sub * 8; col0 < s.head_dim; col0 += kPassCols) {
#pragma unroll 1
          for (int c = col0; c < col0 + 8 && c < s.head_dim; ++c) {
            T d = do_row[c];
            if constexpr (kRebalance) {
              d = Ops::from_float(Ops::to_float(d) * rescale[i]);
              dout_written[i * kRowStep * p.dout_strides.row + c] = d;
            }
            sum[i] += Ops::to_float(o_row[c]) * Ops::to_float(d);
          }
        }
      }
    }

#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int query = query0 + i * kRowStep;
      const float total = group_sum<kLanes>(sum[i]);
      if (sub == 0 && query < rows_of.region_rows) {
        p.delta[rows_of.stats0 + query] = query < seqlen_q ? total : 0.f;
        p.lse_log2[rows_of.stats0 + query] = lse_log2[i];
      }
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
  const int slab_index = tile.row0 % kDqTileRows / kDqSlabRows;  // 0..3 within the 64-query block
  for (int batch = tile.batch; batch < aux_batches(p); batch += gridDim.y) {
    const AuxRows rows_of(p, batch, tile.head, tile.row0);
    if (rows_of.first >= rows_of.seqlen_q) continue;  // a sequence's padding rows (uniform over the block)
    const int block_row0 = rows_of.first / kDqTileRows * kDqTileRows;
    const float* block = p.dq_accum + (rows_of.stats0 + block_row0) * width;  // [64 * width]: this 64-query block
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
      const int query = rows_of.first + row;
      if (query >= rows_of.seqlen_q) break;  // i only grows
      const float* src = slab + row * row_stride + col;
      T* dq = static_cast<T*>(p.dq) + batch * p.dq_strides.batch +
              (static_cast<int64_t>(rows_of.q_row0) + query) * p.dq_strides.row + tile.head * p.dq_strides.head;  // [D]
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
// (A variable-length batch's grid covers the workspace rows of its sequences, batch 0 only.)
inline cudaError_t aux_grid(const BwdParams& p, int64_t rows, int rows_per_chunk, int* chunks_per_head, dim3* grid) {
  const AttentionShape& s = p.shape;
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  if (chunks * s.heads_q > 0x7fffffff) return cudaErrorInvalidConfiguration;
  *chunks_per_head = static_cast<int>(chunks);
  const int batches = p.varlen.enabled() ? 1 : std::min(s.batch, kAuxMaxGridY);
  *grid = dim3(static_cast<unsigned>(chunks * s.heads_q), static_cast<unsigned>(batches));
  return cudaSuccess;
}

// The rows of each (batch, head) the preprocess covers: the statistics rows (of every sequence in a
// variable-length batch).
inline int64_t aux_rows(const BwdParams& p) { return p.varlen.enabled() ? p.varlen.workspace_rows : p.stats_stride; }

// The first launch of every backward (sm80 and sm90): delta and lse_log2, and dq_accum zeroed.
template <typename T>
cudaError_t launch_bwd_preprocess(const BwdParams& p, cudaStream_t stream) {
  if (p.dq_accum_dim % 4 != 0) return cudaErrorInvalidValue;  // rows zeroed 16 bytes at a time
  int chunks_per_head = 0;
  dim3 grid;
  // 8 threads per row load a row of up to 64 columns at once; 16 threads for wider rows.
  const bool narrow = p.shape.head_dim <= 64;
  const int lanes = narrow ? 8 : 16;
  const int rows_per_block = kAuxThreads / lanes * kPreprocessRowsPerThread;
  // A block's rows must lie in one sequence's workspace region (AuxRows finds the sequence of its first).
  if (p.varlen.enabled() && p.varlen.workspace_align % rows_per_block != 0) return cudaErrorInvalidValue;
  cudaError_t err = aux_grid(p, aux_rows(p), rows_per_block, &chunks_per_head, &grid);
  if (err != cudaSuccess) return err;
  const bool rebalance = p.dout_caller != nullptr;
  if (narrow) {
    auto kernel = rebalance ? bwd_preprocess_kernel<T, 8, true> : bwd_preprocess_kernel<T, 8, false>;
    kernel<<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
  } else {
    auto kernel = rebalance ? bwd_preprocess_kernel<T, 16, true> : bwd_preprocess_kernel<T, 16, false>;
    kernel<<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
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
    const int64_t rows = p.varlen.enabled() ? p.varlen.workspace_rows : p.shape.seqlen_q;
    cudaError_t err = aux_grid(p, rows, kDqSlabRows, &chunks_per_head, &grid);
    if (err != cudaSuccess) return err;
    bwd_convert_dq_tiled_kernel<T><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
    return cudaGetLastError();
  }
  if (p.varlen.enabled()) return cudaErrorInvalidValue;  // the tile layout only
  cudaError_t err = aux_grid(p, p.shape.seqlen_q, kAuxRows, &chunks_per_head, &grid);
  if (err != cudaSuccess) return err;
  bwd_convert_dq_kernel<T><<<grid, kAuxThreads, 0, stream>>>(p, chunks_per_head);
  return cudaGetLastError();
}

}  // namespace flashattn
