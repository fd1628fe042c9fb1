// write_dropout_keep_mask: the dropout keep-mask of common/dropout.h written out as a bool tensor, so
// tests can compare the kernels' dropout against reference attention under the same mask.
#include <algorithm>

#include "common/dropout.h"
#include "sm80/api.h"

namespace flashattn {
namespace sm80 {
namespace {

constexpr int kKeepMaskThreads = 256;

// One thread per pair of keys (2j, 2j + 1) of one row; keep [batch * heads, seqlen_q, seqlen_k].
__global__ void __launch_bounds__(kKeepMaskThreads) keep_mask_kernel(DropoutParams d, int64_t rows, int seqlen_q,
                                                                     int seqlen_k, bool* keep) {
  const int64_t key_pairs = (seqlen_k + 1) / 2;
  const int64_t total = rows * key_pairs;
  const uint64_t seed = static_cast<uint64_t>(d.rng_state[0]);
  const uint64_t offset = static_cast<uint64_t>(d.rng_state[1]);
  for (int64_t idx = blockIdx.x * int64_t{kKeepMaskThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kKeepMaskThreads) {
    const int64_t row = idx / key_pairs;  // (batch * heads + head) * seqlen_q + query
    const int key = static_cast<int>(idx % key_pairs) * 2;
    const int query = static_cast<int>(row % seqlen_q);
    const uint32_t bh = static_cast<uint32_t>(row / seqlen_q);
    const PhiloxWords words = dropout_block_words(seed, offset, bh, static_cast<uint32_t>(query), key);
    bool* out = keep + row * seqlen_k + key;
    out[0] = dropout_word(words, query, key) >= d.threshold;
    if (key + 1 < seqlen_k) out[1] = dropout_word(words, query, key + 1) >= d.threshold;
  }
}

}  // namespace

cudaError_t write_dropout_keep_mask(const DropoutParams& dropout, int64_t batch_heads, int seqlen_q, int seqlen_k,
                                    bool* keep, cudaStream_t stream) {
  const int64_t pairs = batch_heads * seqlen_q * ((seqlen_k + 1) / 2);
  if (pairs == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((pairs + kKeepMaskThreads - 1) / kKeepMaskThreads, 65536);
  keep_mask_kernel<<<static_cast<unsigned>(blocks), kKeepMaskThreads, 0, stream>>>(dropout, batch_heads, seqlen_q,
                                                                                   seqlen_k, keep);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashattn
