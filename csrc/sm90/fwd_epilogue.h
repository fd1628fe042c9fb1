// The epilogue of the sm90 forward: O / rowsum and the LSE of a consumer warpgroup's rows, written
// through shared memory and a TMA store, or straight from the registers.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/element_ops.h"
#include "cuda/sink.h"
#include "params.h"
#include "sm90/fwd_softmax.h"
#include "sm90/ptx.h"

namespace flashattn {
namespace sm90 {

// One 16-byte row segment of this thread's output: columns (4c + lane % 4) * 8 .. + 7 of its row
// row0 + 8 half, scaled by inv and packed (v[i]: columns + 2i, + 2i + 1). In the accumulator layout the
// four lanes of a quad hold two columns each of every 8-column group; a 4 x 4 transpose over the quad
// (two shuffle stages) gives each lane all 8 columns of one group in every 4. Every lane of the warp
// must call it (the shuffles), valid row or not.
template <typename T, int kHeadDim>
__device__ __forceinline__ void quad_row_segment(const float (&o)[kHeadDim / 2], float inv, int half, int c, int lane,
                                                 uint32_t (&v)[4]) {
  using Ops = ElementOps<T>;
  const int q = lane % 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // v[i]: columns (4c + i) * 8 + 2q, +1
    const int j = 4 * c + i;
    v[i] = Ops::pack(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
  }
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    const bool upper = (q & m) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i & m) continue;
      const uint32_t recv = __shfl_xor_sync(0xffffffff, upper ? v[i] : v[i | m], m);
      if (upper) {
        v[i] = recv;
      } else {
        v[i | m] = recv;
      }
    }
  }
}

// Stores this thread's share of two output rows (row0 and row0 + 8; valid: inside seqlen_q) in
// 16-byte row segments: a warp's store covers 8 rows x 64 contiguous bytes instead of 8 rows x 16
// bytes, with a quarter of the store instructions. Needs head_dim % 8 == 0 and 16-byte aligned rows.
template <typename T, int kHeadDim>
__device__ __forceinline__ void store_rows_16b(T* out, int64_t row_stride, const float (&o)[kHeadDim / 2],
                                               const float (&inv)[2], const bool (&valid)[2], int row0,
                                               int head_dim, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int c = 0; c < kHeadDim / 32; ++c) {
      uint32_t v[4];
      quad_row_segment<T, kHeadDim>(o, inv[half], half, c, lane, v);
      const int col = (4 * c + lane % 4) * 8;
      if (valid[half] && col < head_dim) {
        st_global_u32x4(out + static_cast<int64_t>(row0 + 8 * half) * row_stride + col, v[0], v[1], v[2], v[3]);
      }
    }
  }
}

// Where a consumer warpgroup's output goes through shared memory: its [kColBlocks][64][64] buffer
// (128-byte swizzle, the layout TMA reads) and the output tensor map; the named barrier id that its
// 128 threads synchronise on.
struct OutputStaging {
  const CUtensorMap* map = nullptr;  // null: the threads store their rows themselves
  unsigned char* buffer = nullptr;
  int barrier = 0;
};

// Writes a warpgroup's 64 output rows (from first_row) into its staging buffer and has one thread
// store them with TMA (rows past seqlen_q and columns past head_dim are not written). The buffer is
// reused once the previous tile's store has read it.
template <typename T, int kHeadDim>
__device__ __forceinline__ void store_rows_staged(const OutputStaging& staging, const float (&o)[kHeadDim / 2],
                                                  const float (&inv)[2], int row0, int first_row, int head,
                                                  int batch, int lane) {
  constexpr int kColBlocks = (kHeadDim + 63) / 64;
  const bool leader = threadIdx.x % 128 == 0;
  if (leader) bulk_wait_read();
  named_barrier_sync(staging.barrier, 128);
  const uint32_t buffer = smem_u32(staging.buffer);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 - first_row + 8 * half;  // row in the warpgroup's 64
#pragma unroll
    for (int c = 0; c < kHeadDim / 32; ++c) {
      uint32_t v[4];
      quad_row_segment<T, kHeadDim>(o, inv[half], half, c, lane, v);
      const int segment = 4 * c + lane % 4;  // 16-byte column segment of the row
      const uint32_t addr = buffer + (segment / 8) * (64 * 128) + r * 128 + (((segment % 8) ^ (r % 8)) << 4);
      st_shared_u32x4(addr, v[0], v[1], v[2], v[3]);
    }
  }
  fence_proxy_async_shared();
  named_barrier_sync(staging.barrier, 128);
  if (leader) {
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb) {
      tma_store_4d(staging.map, staging.buffer + cb * (64 * 128), cb * 64, first_row, head, batch);
    }
    bulk_commit();
  }
}

// O * out_scale / rowsum and the natural-log LSE of this thread's two rows, the sink's term (sink_log2,
// base 2; -inf: none) joined to the row sums first. The output goes through
// shared memory and TMA (store_rows_staged) where the configuration stages it and the tensor map could
// be made; else straight from the registers, in 16-byte row segments where head_dim and the output's
// alignment allow (store_rows_16b), else two elements per store.
// `sh` is the row's shape (a variable-length batch's sequence: its own seqlen_q), `out` [Lq, D] and
// `lse` [Lq] its output rows.
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void write_epilogue(const FwdParams& p, const AttentionShape& sh, T* out, float* lse,
                                               const float (&o)[kHeadDim / 2],
                                               const OnlineSoftmax<kBlockN>& softmax, int head, int batch,
                                               int row0, int first_row, int lane, float out_scale,
                                               float sink_log2, const OutputStaging& staging) {
  using Ops = ElementOps<T>;
  float inv[2];
  bool valid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = softmax.row_sum[half];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    float base = softmax.row_max[half];
    const float factor = join_sink(sink_log2, base, sum);
    const int row = row0 + half * 8;
    valid[half] = row < sh.seqlen_q;
    // A NaN score makes sum NaN, and NaN must reach out and lse: test for exactly 0 (no key).
    inv[half] = sum == 0.f ? 0.f : out_scale * factor / sum;
    if (valid[half] && lane % 4 == 0) {
      lse[row] = sum == 0.f ? -INFINITY : (base + log2f(sum)) * 0.6931471805599453f;
    }
  }
  if (staging.map != nullptr) {
    store_rows_staged<T, kHeadDim>(staging, o, inv, row0, first_row, head, batch, lane);
    return;
  }
  const bool rows_16b = sh.head_dim % 8 == 0 &&
                        ((reinterpret_cast<uintptr_t>(out) |
                          static_cast<uintptr_t>(p.out_strides.row * static_cast<int64_t>(sizeof(T)))) % 16) == 0;
  if (rows_16b) {
    store_rows_16b<T, kHeadDim>(out, p.out_strides.row, o, inv, valid, row0, sh.head_dim, lane);
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!valid[half]) continue;
    T* out_row = out + (row0 + half * 8) * p.out_strides.row;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      const float v0 = o[4 * j + 2 * half] * inv[half], v1 = o[4 * j + 2 * half + 1] * inv[half];
      if (col + 1 < sh.head_dim) {
        if (sh.head_dim % 2 == 0) {
          *reinterpret_cast<uint32_t*>(out_row + col) = Ops::pack(v0, v1);
        } else {
          out_row[col] = Ops::from_float(v0);
          out_row[col + 1] = Ops::from_float(v1);
        }
      } else if (col < sh.head_dim) {
        out_row[col] = Ops::from_float(v0);
      }
    }
  }
}

}  // namespace sm90
}  // namespace flashattn
