// Entry points of the device code both GPU paths share (csrc/cuda/): the attention mask's prepasses and
// the dropout keep-mask. Host-callable, free of torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"

namespace flashattn {

// A kernel's query x key tile: an attention mask's tile classes are computed on the grid of the kernel
// that reads them.
struct TileShape {
  int queries;
  int keys;
};

// Writes the class (kTileAnyVisible | kTileNeedsMask | kTileKeyPrefix bits) of every mask tile of
// tile_q x tile_k elements (mask.tile_q, mask.tile_k <= 256, mask.tiles_k = ceil(seqlen_k / tile_k) and
// mask.class_row_stride must be set) into out [batches, heads, ceil(seqlen_q / tile_q), class_row_stride]
// contiguous, zeros past tiles_k, for batches x heads distinct (batch, head) slices of the mask (1 along
// a broadcast dim), and the kept key count of each key-prefix tile (0 for the others) into
// out_key_count, indexed alike. mask.tile_class and mask.tile_key_count are not read. causal_stats
// (nullptr: none): find_causal_prefix_rows's per-slice statistics for the same slices, already computed
// on the stream; the slices they give the causal form are left as zeros (the masked kernels skip them).
cudaError_t classify_mask_tiles(const MaskParams& mask, ElementType element_type, int batches, int heads,
                                int seqlen_q, int seqlen_k, const int* causal_stats, unsigned char* out,
                                unsigned char* out_key_count, cudaStream_t stream);

// For each of the batch x heads rows r = b * heads + h of a mask whose rows are broadcast over the
// queries (the query-0 row of (b, h) is read through mask's strides, 0 on broadcast dims): key_end[r] =
// L when the row keeps exactly its first L keys (True / 0.0, the rest False / -inf; 0 <= L <= seqlen_k),
// else -1, and each row with -1 listed in masked_rows[0 .. *masked_count) in no particular order.
// masked_count is zeroed on the stream first. Arrays of batch * heads ints (masked_count: one).
cudaError_t find_key_prefix_rows(const MaskParams& mask, ElementType element_type, int batch, int heads,
                                 int seqlen_k, int* key_end, int* masked_rows, int* masked_count,
                                 cudaStream_t stream);

// The causal form of a mask with a row per query (row stride != 0): for each batch x heads row r = b *
// heads + h, key_end[r] = L when every query q of that (b, h) keeps exactly its first
// clamp(min(q + causal_offset + 1, L), 0, seqlen_k) keys (True / 0.0, the rest False / -inf: causal
// attention over the first L keys), else -1, and each row with -1 listed in masked_rows[0 ..
// *masked_count). workspace holds causal_prefix_workspace_ints ints: [key_end: batch * heads,
// masked_rows: batch * heads, masked_count: 1, per-slice statistics from causal_prefix_stats_offset on];
// each distinct mask slice (strides 0 on broadcast dims) is read once.
int causal_prefix_workspace_ints(int batch, int heads, const MaskParams& mask);
inline int causal_prefix_stats_offset(int batch, int heads) { return 2 * batch * heads + 1; }
cudaError_t find_causal_prefix_rows(const MaskParams& mask, ElementType element_type, int batch, int heads,
                                    int seqlen_q, int seqlen_k, int causal_offset, int* workspace,
                                    cudaStream_t stream);

// Writes the dropout keep-mask (common/dropout.h) of `dropout` into keep [batch_heads, seqlen_q,
// seqlen_k] contiguous (row group b * heads + h), true where the probability is kept.
cudaError_t write_dropout_keep_mask(const DropoutParams& dropout, int64_t batch_heads, int seqlen_q, int seqlen_k,
                                    bool* keep, cudaStream_t stream);

}  // namespace flashattn
