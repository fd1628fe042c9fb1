// Which (query, key) pairs take part in attention. Shared by the CPU and GPU paths.
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif

namespace flashattn {

// Key `key` is visible to query `query` iff it exists and, with causal masking, lies on or left of
// the diagonal key = query + causal_offset (0: top-left alignment, seqlen_k - seqlen_q: bottom-right)
// and, with a sliding window (window_span >= 0, only under causal masking: the window's right bound is
// the diagonal), at most window_span keys left of it.
FLASHATTN_HOST_DEVICE bool key_visible(int query, int key, int seqlen_k, bool is_causal, int causal_offset,
                                       int window_span = -1) {
  // Bitwise operators: a select, not a branch, inside unrolled kernel loops.
  const int diagonal = query + causal_offset;
  return (key < seqlen_k) & (!is_causal | (key <= diagonal)) & ((window_span < 0) | (key >= diagonal - window_span));
}

// One past the last key any query in [query_begin, query_end) can see (may be <= 0: none).
FLASHATTN_HOST_DEVICE int visible_key_end(int query_end, int seqlen_k, bool is_causal, int causal_offset) {
  const int causal_end = query_end - 1 + causal_offset + 1;
  return (is_causal && causal_end < seqlen_k) ? causal_end : seqlen_k;
}

// The first key query `query_begin` (and so any later query) can see under a sliding window: 0
// without one.
FLASHATTN_HOST_DEVICE int visible_key_begin(int query_begin, int causal_offset, int window_span) {
  const int first = query_begin + causal_offset - window_span;
  return (window_span >= 0 && first > 0) ? first : 0;
}

// The first query that can see key `key` under causal masking (0 without it).
FLASHATTN_HOST_DEVICE int first_query_seeing(int key, bool is_causal, int causal_offset) {
  const int first = key - causal_offset;
  return (is_causal && first > 0) ? first : 0;
}

// One past the last query that can see key `key_last` (and so any earlier key) under a sliding
// window: seqlen_q without one.
FLASHATTN_HOST_DEVICE int last_query_seeing_end(int key_last, int seqlen_q, int causal_offset, int window_span) {
  const int end = key_last - causal_offset + window_span + 1;
  return (window_span >= 0 && end < seqlen_q) ? (end > 0 ? end : 0) : seqlen_q;
}

}  // namespace flashattn
