// find_key_prefix_rows: for a mask whose rows are broadcast over the queries (a (B, 1 or H, 1, Lk)
// padding mask), which (batch, head) rows are key prefixes: the first L keys neutral (True, or 0.0)
// and the rest excluded (False, or -inf). Such a row is plain attention over its first L keys, which
// the sm90 forward runs in its unmasked kernel with L as the sequence length; the other rows are
// listed for the masked kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/api.h"
#include "cuda/mask_elements.h"

namespace flashattn {
namespace {

constexpr int kPrefixThreads = 256;

// One CTA per (batch, head) row r = b * heads + h, reading the mask's query-0 row.
template <typename T>
__global__ void __launch_bounds__(kPrefixThreads) find_key_prefix_rows_kernel(const MaskParams m, int heads,
                                                                             int seqlen_k, int* key_end,
                                                                             int* masked_rows, int* masked_count) {
  const int r = blockIdx.x;
  const int64_t first = static_cast<int64_t>(r / heads) * m.batch_stride + static_cast<int64_t>(r % heads) * m.head_stride;
  // Whether some element is neither neutral nor excluded; the last neutral and the first excluded key.
  bool mixed = false;
  int last_neutral = -1, first_excluded = seqlen_k;
  for (int c = threadIdx.x; c < seqlen_k; c += kPrefixThreads) {
    const auto [neutral, excluded] = read_mask_element<T>(m, first + c * m.col_stride);
    mixed |= !neutral && !excluded;
    if (neutral) last_neutral = c;  // c increases: the thread's last one
    if (excluded) first_excluded = min(first_excluded, c);
  }
  const bool any_mixed = __syncthreads_or(mixed);
  __shared__ int row_last_neutral, row_first_excluded;
  if (threadIdx.x == 0) {
    row_last_neutral = -1;
    row_first_excluded = seqlen_k;
  }
  __syncthreads();
  atomicMax(&row_last_neutral, last_neutral);
  atomicMin(&row_first_excluded, first_excluded);
  __syncthreads();
  if (threadIdx.x == 0) {
    // Every element neutral or excluded, and every neutral key before every excluded one.
    const bool prefix = !any_mixed && row_last_neutral < row_first_excluded;
    key_end[r] = prefix ? row_last_neutral + 1 : -1;
    if (!prefix) masked_rows[atomicAdd(masked_count, 1)] = r;
  }
}

}  // namespace

cudaError_t find_key_prefix_rows(const MaskParams& m, ElementType element_type, int batch, int heads, int seqlen_k,
                                 int* key_end, int* masked_rows, int* masked_count, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * heads;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  cudaError_t err = cudaMemsetAsync(masked_count, 0, sizeof(int), stream);
  if (err != cudaSuccess || rows == 0) return err;
  const unsigned grid = static_cast<unsigned>(rows);
  if (m.kind == MaskKind::kBool || element_type == ElementType::kFloat16) {
    find_key_prefix_rows_kernel<__half><<<grid, kPrefixThreads, 0, stream>>>(m, heads, seqlen_k, key_end, masked_rows,
                                                                             masked_count);
  } else {
    find_key_prefix_rows_kernel<__nv_bfloat16><<<grid, kPrefixThreads, 0, stream>>>(m, heads, seqlen_k, key_end,
                                                                                    masked_rows, masked_count);
  }
  return cudaGetLastError();
}

}  // namespace flashattn
