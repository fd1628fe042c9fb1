// Which (query, key) pairs take part in attention. Shared by the CPU and GPU paths.
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif

namespace flashattn {

// Key `key` is visible to query `query` iff it exists and, with causal masking, lies on or left of
// the diagonal shifted by causal_offset (0: top-left alignment, seqlen_k - seqlen_q: bottom-right).
FLASHATTN_HOST_DEVICE bool key_visible(int query, int key, int seqlen_k, bool is_causal, int causal_offset) {
  // Bitwise operators: a select, not a branch, inside unrolled kernel loops.
  return (key < seqlen_k) & (!is_causal | (key <= query + causal_offset));
}

// One past the last key any query in [query_begin, query_end) can see (may be <= 0: none).
FLASHATTN_HOST_DEVICE int visible_key_end(int query_end, int seqlen_k, bool is_causal, int causal_offset) {
  const int causal_end = query_end - 1 + causal_offset + 1;
  return (is_causal && causal_end < seqlen_k) ? causal_end : seqlen_k;
}

// The first query that can see key `key` under causal masking (0 without it).
FLASHATTN_HOST_DEVICE int first_query_seeing(int key, bool is_causal, int causal_offset) {
  const int first = key - causal_offset;
  return (is_causal && first > 0) ? first : 0;
}

}  // namespace flashattn
