// classify_mask_tiles: one pass over an attention mask that records, per kernel tile, whether the tile
// can be skipped (every element excludes its key) and whether its elements must be read at all (some
// are not neutral). The attention kernels then skip fully masked tiles without loading K and V, and
// read no mask in tiles the mask leaves alone, so a causal-shaped or block-sparse mask costs what its
// unmasked area costs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/api.h"
#include "cuda/causal_slices.h"
#include "cuda/mask_elements.h"

namespace flashattn {
namespace {

constexpr int kClassifyThreads = 256;

// One CTA per class: out and out_key_count [batches, heads, tiles_q, class_row_stride] contiguous, in
// blockIdx.x order. Warp w reads rows w, w + 8, ... of the tile, its lanes 32 adjacent keys at a time
// (coalesced, no divisions); a row-broadcast mask (row stride 0) has one distinct row, read once.
//
// Key prefix (kTileKeyPrefix): every element is neutral or excluded, and the last neutral key of any
// row lies just before the first excluded key of any row; then every row keeps the same first keys.
template <typename T>
__global__ void __launch_bounds__(kClassifyThreads) classify_mask_tiles_kernel(const MaskParams m, int heads,
                                                                               int seqlen_q, int seqlen_k,
                                                                               int tiles_q, const int* causal_stats,
                                                                               unsigned char* out,
                                                                               unsigned char* out_key_count) {
  const int64_t tile = blockIdx.x;
  const int key_tile = static_cast<int>(tile % m.class_row_stride);
  if (key_tile >= m.tiles_k) {  // row padding
    if (threadIdx.x == 0) out[tile] = out_key_count[tile] = 0;
    return;
  }
  const int query_tile = static_cast<int>((tile / m.class_row_stride) % tiles_q);
  const int64_t batch_head = tile / m.class_row_stride / tiles_q;
  // A slice that runs as causal attention over a key prefix (find_causal_prefix_rows) is never read
  // by a masked kernel: its classes stay 0 unread.
  if (causal_stats != nullptr && causal_slice_key_end(causal_stats + kSliceStats * batch_head, seqlen_k) >= 0) {
    if (threadIdx.x == 0) out[tile] = out_key_count[tile] = 0;
    return;
  }
  const int head = static_cast<int>(batch_head % heads);
  const int64_t batch = batch_head / heads;
  const int64_t first = batch * m.batch_stride + head * m.head_stride;  // element (batch, head, 0, 0)

  const int q0 = query_tile * m.tile_q, k0 = key_tile * m.tile_k;
  const int rows = m.row_stride == 0 ? 1 : min(m.tile_q, seqlen_q - q0);
  const int cols = min(m.tile_k, seqlen_k - k0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bool visible = false, not_neutral = false;
  // Key prefix: whether some element is neither neutral nor excluded; the last neutral and the first
  // excluded key seen.
  bool mixed = false;
  int last_neutral = -1, first_excluded = cols;
  // A thread stops once the tile is known to need its elements and not to be a key prefix.
  auto settled = [&]() { return visible && not_neutral && (mixed || last_neutral > first_excluded); };
  // A boolean tile of whole 16-byte row segments: 16 elements per load, thread t reading segments t,
  // t + kClassifyThreads, ... in row-major order. Other tiles: one element per load.
  const int segments = cols / kBoolVectorKeys;
  const bool vector_rows = cols % kBoolVectorKeys == 0 && (rows == 1 || m.row_stride % 16 == 0) &&
                           bool_vector_aligned(m, first + q0 * m.row_stride + k0);
  for (int i = threadIdx.x; vector_rows && i < rows * segments && !settled(); i += kClassifyThreads) {
    const int r = i / segments, c = i % segments * kBoolVectorKeys;
    const uint32_t keep = bool_keep_bits16(m, first + (q0 + r) * m.row_stride + k0 + c);
    visible |= keep != 0;
    not_neutral |= keep != 0xffffu;
    if (keep != 0) last_neutral = max(last_neutral, c + 31 - __clz(keep));
    if (keep != 0xffffu) first_excluded = min(first_excluded, c + __ffs(~keep) - 1);
  }
  for (int r = warp; !vector_rows && r < rows && !settled(); r += kClassifyThreads / 32) {
    const int64_t row = first + (q0 + r) * m.row_stride + k0 * m.col_stride;
#pragma unroll 4
    for (int c = lane; c < cols; c += 32) {
      const auto [neutral, excluded] = read_mask_element<T>(m, row + c * m.col_stride);
      visible |= !excluded;
      not_neutral |= !neutral;
      mixed |= !neutral && !excluded;
      if (neutral) last_neutral = max(last_neutral, c);
      if (excluded) first_excluded = min(first_excluded, c);
    }
  }
  const bool any_visible = __syncthreads_or(visible);
  const bool any_not_neutral = __syncthreads_or(not_neutral);
  const bool any_mixed = __syncthreads_or(mixed);
  __shared__ int block_last_neutral, block_first_excluded;
  if (threadIdx.x == 0) {
    block_last_neutral = -1;
    block_first_excluded = cols;
  }
  __syncthreads();
  atomicMax(&block_last_neutral, last_neutral);
  atomicMin(&block_first_excluded, first_excluded);
  __syncthreads();
  if (threadIdx.x == 0) {
    // A partial tile (some key kept, some excluded) of prefix shape; the kept count is below tile_k.
    const bool prefix = any_visible && any_not_neutral && !any_mixed && block_last_neutral >= 0 &&
                        block_last_neutral + 1 == block_first_excluded;
    out[tile] = (any_visible ? kTileAnyVisible : 0) | (any_not_neutral ? kTileNeedsMask : 0) |
                (prefix ? kTileKeyPrefix : 0);
    out_key_count[tile] = prefix ? static_cast<unsigned char>(block_first_excluded) : 0;
  }
}

}  // namespace

cudaError_t classify_mask_tiles(const MaskParams& m, ElementType element_type, int batches, int heads,
                                int seqlen_q, int seqlen_k, const int* causal_stats, unsigned char* out,
                                unsigned char* out_key_count, cudaStream_t stream) {
  const int tiles_q = (seqlen_q + m.tile_q - 1) / m.tile_q;
  const int64_t tiles = static_cast<int64_t>(batches) * heads * tiles_q * m.class_row_stride;
  if (tiles == 0) return cudaSuccess;
  if (tiles > 0x7fffffff || m.tiles_k != (seqlen_k + m.tile_k - 1) / m.tile_k || m.class_row_stride < m.tiles_k ||
      m.class_row_stride % kClassWindow != 0 || m.tile_k > 256) {  // key counts are bytes
    return cudaErrorInvalidValue;
  }
  const unsigned grid = static_cast<unsigned>(tiles);
  if (m.kind == MaskKind::kBool || element_type == ElementType::kFloat16) {
    classify_mask_tiles_kernel<__half><<<grid, kClassifyThreads, 0, stream>>>(m, heads, seqlen_q, seqlen_k, tiles_q,
                                                                          causal_stats, out, out_key_count);
  } else {
    classify_mask_tiles_kernel<__nv_bfloat16>
        <<<grid, kClassifyThreads, 0, stream>>>(m, heads, seqlen_q, seqlen_k, tiles_q, causal_stats, out, out_key_count);
  }
  return cudaGetLastError();
}

}  // namespace flashattn
