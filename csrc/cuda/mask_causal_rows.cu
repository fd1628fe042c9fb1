// find_causal_prefix_rows: for a mask with a row per query ((Lq, Lk), (B, 1, Lq, Lk), ...), which of its
// (batch, head) slices are causal masks, alone or with right padding: query q keeps exactly its first
// clamp(min(q + o + 1, L), 0, Lk) keys, for the caller's diagonal offset o and one key length L per slice
// (as torch.tril and transformers' 4-D causal masks are built). Such a slice is causal attention over its
// first L keys, which the sm90 forward runs in its unmasked kernel; the other slices' rows are listed for
// the masked kernel.
//
// Two passes. The first reads each distinct slice once, one warp per query row: whether the row is a key
// prefix, and how its length P compares with the causal length E = clamp(q + o + 1, 0, Lk). A slice has
// the form iff every row is a prefix with P <= E, the rows with P < E (cut by the padding) all share one
// P, which is L, and every row with P = E has E <= L (L = Lk when no row is cut). The pass keeps, per
// slice, the extremes that decide this, and a warp stops reading once its row or slice is known not to
// fit (a random mask costs a row's first keys). The second pass decides per (batch, head) row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/api.h"
#include "cuda/causal_slices.h"
#include "cuda/mask_elements.h"

namespace flashattn {
namespace {

constexpr int kRowWarps = 8;
constexpr int kKeysPerStep = 128;  // per warp and step: 4 elements per lane
constexpr int kMaxCtas = 4096;     // the first pass loops over query rows beyond this many CTAs

// Slice s = b * heads + h of the distinct slices (strides are 0 on broadcast dims).
template <typename T>
__global__ void __launch_bounds__(kRowWarps * 32) causal_row_stats_kernel(const MaskParams m, int heads, int seqlen_q,
                                                                         int seqlen_k, int causal_offset,
                                                                         int* stats) {
  const int slice = blockIdx.x;
  int* st = stats + kSliceStats * slice;
  const int64_t first = static_cast<int64_t>(slice / heads) * m.batch_stride + static_cast<int64_t>(slice % heads) * m.head_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr unsigned kAll = 0xffffffffu;
  for (int q = blockIdx.y * kRowWarps + warp; q < seqlen_q; q += gridDim.y * kRowWarps) {
    // Another row did not fit (asked of every lane at once: the warp must leave as one).
    if (__any_sync(kAll, *static_cast<volatile int*>(st + kFailed) != 0)) return;
    const int64_t row = first + static_cast<int64_t>(q) * m.row_stride;
    const int causal_length = min(max(q + causal_offset + 1, 0), seqlen_k);
    // The lane's last neutral and first excluded key, whether it saw an element that is neither.
    int last_neutral = -1, first_excluded = seqlen_k, row_last_neutral = -1;
    bool mixed = false, fits = true;
    // After each step, over the warp: a prefix so far (no element that is neither, every neutral key
    // before every excluded one) that keeps no key the causal form leaves out.
    auto check = [&]() {
      row_last_neutral = __reduce_max_sync(kAll, last_neutral);
      fits = !__any_sync(kAll, mixed) && row_last_neutral < __reduce_min_sync(kAll, first_excluded) &&
             row_last_neutral < causal_length;
    };
    int c0 = 0;
    if (bool_vector_aligned(m, row)) {  // 16 keys per lane and load while the warp's 512 are in the row
      for (; c0 + 32 * kBoolVectorKeys <= seqlen_k && fits; c0 += 32 * kBoolVectorKeys) {
        const int c = c0 + lane * kBoolVectorKeys;
        const uint32_t keep = bool_keep_bits16(m, row + c);
        if (keep != 0) last_neutral = c + 31 - __clz(keep);
        if (keep != 0xffffu) first_excluded = min(first_excluded, c + __ffs(~keep) - 1);
        check();
      }
    }
    for (; c0 < seqlen_k && fits; c0 += kKeysPerStep) {
#pragma unroll
      for (int j = 0; j < kKeysPerStep / 32; ++j) {  // unrolled: the loads go out together
        const int c = c0 + j * 32 + lane;
        const MaskElement e = c < seqlen_k ? read_mask_element<T>(m, row + c * m.col_stride) : MaskElement{false, true};
        mixed |= !e.neutral && !e.excluded;
        if (e.neutral) last_neutral = c;  // c increases: the lane's last one
        if (e.excluded) first_excluded = min(first_excluded, c);
      }
      check();
    }
    if (lane != 0) continue;
    const int length = row_last_neutral + 1;  // the row keeps keys [0, length)
    if (!fits) {
      atomicExch(st + kFailed, 1);
    } else if (length == causal_length) {
      atomicMax(st + kFullMaxPlus1, causal_length + 1);
    } else {  // cut by the padding: length is the slice's L
      atomicMax(st + kLkMinusCutMin, seqlen_k - length);
      atomicMax(st + kCutMaxPlus1, length + 1);
    }
  }
}

// One thread per (batch, head) row r = b * heads_q + h; its slice is b' * slice_heads + h' (b' = 0 when the
// mask is broadcast over the batch, h' = 0 over the heads).
__global__ void causal_rows_kernel(const int* stats, int batch, int heads_q, bool per_batch, int slice_heads,
                                   int seqlen_k, int* key_end, int* masked_rows, int* masked_count) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= static_cast<int64_t>(batch) * heads_q) return;
  const int b = static_cast<int>(r / heads_q), h = static_cast<int>(r % heads_q);
  const int key_end_of_slice = causal_slice_key_end(
      stats + kSliceStats * ((per_batch ? b : 0) * slice_heads + (slice_heads > 1 ? h : 0)), seqlen_k);
  key_end[r] = key_end_of_slice;
  if (key_end_of_slice < 0) masked_rows[atomicAdd(masked_count, 1)] = static_cast<int>(r);
}

// The mask's distinct (batch, head) slices: one along a broadcast dim (stride 0).
int distinct_slices(int batch, int heads, const MaskParams& m) {
  return (m.batch_stride != 0 ? batch : 1) * (m.head_stride != 0 ? heads : 1);
}

}  // namespace

int causal_prefix_workspace_ints(int batch, int heads, const MaskParams& m) {
  return 2 * batch * heads + 1 + kSliceStats * distinct_slices(batch, heads, m);
}

cudaError_t find_causal_prefix_rows(const MaskParams& m, ElementType element_type, int batch, int heads, int seqlen_q,
                                    int seqlen_k, int causal_offset, int* workspace, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * heads;
  if (rows > 0x3fffffff || seqlen_k < 1 || seqlen_q < 1) return cudaErrorInvalidValue;
  const bool per_batch = m.batch_stride != 0;
  const int slice_heads = m.head_stride != 0 ? heads : 1;
  const int slices = distinct_slices(batch, heads, m);
  int* key_end = workspace;
  int* masked_rows = key_end + rows;
  int* masked_count = masked_rows + rows;
  int* stats = workspace + causal_prefix_stats_offset(batch, heads);
  cudaError_t err = cudaMemsetAsync(masked_count, 0, sizeof(int) * (1 + kSliceStats * slices), stream);
  if (err != cudaSuccess || rows == 0) return err;
  const int row_groups = (seqlen_q + kRowWarps - 1) / kRowWarps;
  const dim3 grid(slices, std::max(1, std::min(row_groups, std::min(kMaxCtas / slices, 65535))));
  if (m.kind == MaskKind::kBool || element_type == ElementType::kFloat16) {
    causal_row_stats_kernel<__half><<<grid, kRowWarps * 32, 0, stream>>>(m, slice_heads, seqlen_q, seqlen_k,
                                                                        causal_offset, stats);
  } else {
    causal_row_stats_kernel<__nv_bfloat16><<<grid, kRowWarps * 32, 0, stream>>>(m, slice_heads, seqlen_q, seqlen_k,
                                                                               causal_offset, stats);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kThreads = 256;
  causal_rows_kernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      stats, batch, heads, per_batch, slice_heads, seqlen_k, key_end, masked_rows, masked_count);
  return cudaGetLastError();
}

}  // namespace flashattn
