// The per-slice statistics of find_causal_prefix_rows's first pass and the decision they give:
// whether a distinct (batch, head) slice of a mask is a causal mask over its first L keys. Shared by that
// pass's second one (per (batch, head) row) and by classify_mask_tiles, which skips such slices.
#pragma once

namespace flashattn {

// 4 ints per slice, zeroed before the first pass; "+ 1" and "Lk -" make 0 mean "no row yet".
enum CausalSliceStat { kFailed = 0, kFullMaxPlus1 = 1, kLkMinusCutMin = 2, kCutMaxPlus1 = 3, kSliceStats = 4 };

// L when the slice whose statistics are st has the causal form, else -1: no row failed, the rows cut
// by the padding all keep the same L keys, and no row that keeps its whole causal length has one above
// L (L = Lk when no row is cut).
__device__ __forceinline__ int causal_slice_key_end(const int* st, int seqlen_k) {
  const bool cut = st[kCutMaxPlus1] > 0;
  const int length = cut ? st[kCutMaxPlus1] - 1 : seqlen_k;
  const bool causal = st[kFailed] == 0 && (!cut || seqlen_k - st[kLkMinusCutMin] == length) &&
                      st[kFullMaxPlus1] - 1 <= length;
  return causal ? length : -1;
}

}  // namespace flashattn
