// write_dropout_keep_mask: the dropout keep-mask of common/dropout.h written out as a bool tensor, so
// tests can compare the kernels' dropout against reference attention under the same mask.
#include <algorithm>

#include "common/dropout.h"
#include "cuda/api.h"

namespace flashattn {
namespace {

constexpr int kKeepMaskThreads = 256;

// One thread per element (one Philox call each: simple, and only tests use it);
// keep [batch * heads, seqlen_q, seqlen_k].
__global__ void __launch_bounds__(kKeepMaskThreads) keep_mask_kernel(DropoutParams d, int64_t total, int seqlen_q,
                                                                     int seqlen_k, bool* keep) {
  const uint64_t seed = static_cast<uint64_t>(d.rng_state[0]);
  const uint64_t offset = static_cast<uint64_t>(d.rng_state[1]);
  for (int64_t idx = blockIdx.x * int64_t{kKeepMaskThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kKeepMaskThreads) {
    const int64_t row = idx / seqlen_k;  // (batch * heads + head) * seqlen_q + query
    const uint32_t key = static_cast<uint32_t>(idx % seqlen_k);
    const uint32_t query = static_cast<uint32_t>(row % seqlen_q);
    const uint32_t bh = static_cast<uint32_t>(row / seqlen_q);
    keep[idx] = dropout_keep(seed, offset, bh, query, key, d.threshold);
  }
}

}  // namespace

cudaError_t write_dropout_keep_mask(const DropoutParams& dropout, int64_t batch_heads, int seqlen_q, int seqlen_k,
                                    bool* keep, cudaStream_t stream) {
  const int64_t total = batch_heads * seqlen_q * seqlen_k;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kKeepMaskThreads - 1) / kKeepMaskThreads, 65536);
  keep_mask_kernel<<<static_cast<unsigned>(blocks), kKeepMaskThreads, 0, stream>>>(dropout, total, seqlen_q, seqlen_k,
                                                                                   keep);
  return cudaGetLastError();
}

}  // namespace flashattn
