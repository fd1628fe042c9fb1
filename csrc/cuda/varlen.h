// A variable-length batch as the kernels see it (params.h, VarlenParams): one sequence's rows in the
// packed tensors and in the backward's workspaces.
#pragma once

#include <cstdint>

#include "common/mask.h"  // FLASHATTN_HOST_DEVICE
#include "params.h"

namespace flashattn {

// The workspace row where sequence b starts, given its first packed query row cu_b: every sequence
// starts on an `align` boundary (VarlenParams::workspace_align) and ends at least one whole block of
// its own before the next one starts ((cu_b + b * align) rounded down grows by len + align per
// sequence, so it passes the previous start + len rounded up). Sequence `batch` (cu_b = total_q) gives
// the workspace's row count.
FLASHATTN_HOST_DEVICE int64_t varlen_workspace_row(int64_t cu_b, int64_t b, int64_t align) {
  return (cu_b + b * align) / align * align;
}

#if defined(__CUDACC__)
// Item i of the schedule list (cuda/varlen_schedule.h).
__device__ __forceinline__ int2 varlen_item(const VarlenParams& v, int i) { return reinterpret_cast<const int2*>(v.tiles)[i]; }

// Sequence b of a variable-length batch.
struct SeqSpan {
  int q_begin, k_begin;  // its first packed query / key row
  int len_q, len_k;      // its rows taking part (seqused_* where given)
  int causal_offset;     // key j visible to query i iff j <= i + causal_offset, under causal masking

  __device__ __forceinline__ static SeqSpan of(const VarlenParams& v, int b) {
    SeqSpan s;
    s.q_begin = v.cu_seqlens_q[b];
    s.k_begin = v.cu_seqlens_k[b];
    s.len_q = v.seqused_q != nullptr ? v.seqused_q[b] : v.cu_seqlens_q[b + 1] - s.q_begin;
    s.len_k = v.seqused_k != nullptr ? v.seqused_k[b] : v.cu_seqlens_k[b + 1] - s.k_begin;
    s.causal_offset = (v.causal_bottom_right ? s.len_k - s.len_q : 0) + v.causal_shift;
    return s;
  }
  // The shape of this sequence alone (the batch's, with its lengths and diagonal).
  __device__ __forceinline__ AttentionShape shape(AttentionShape sh) const {
    sh.seqlen_q = len_q;
    sh.seqlen_k = len_k;
    sh.causal_offset = causal_offset;
    sh.alibi_offset = len_k - len_q;  // ALiBi's diagonal is the sequence's own bottom-right one
    return sh;
  }
};
#endif

}  // namespace flashattn
