// CPU dropout_keep_mask: the keep-mask the kernels apply, materialised as a bool tensor (for tests and
// debugging: it is quadratic in memory). One task = one (row group, pair of query rows); each Philox
// call fills the 2 x 2 block of (query, key) it belongs to.
#include <ATen/Parallel.h>

#include <algorithm>

#include "common/dropout.h"
#include "cpu/attention_cpu.h"

namespace flashattn {
namespace cpu {

at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p) {
  at::Tensor keep = at::empty({batch, heads, seqlen_q, seqlen_k}, rng_state.options().dtype(at::kBool));
  if (keep.numel() == 0) return keep;
  if (dropout_p == 0.0) return keep.fill_(true);

  const int64_t* state = rng_state.data_ptr<int64_t>();  // [2]: seed, offset
  const uint64_t seed = static_cast<uint64_t>(state[0]), offset = static_cast<uint64_t>(state[1]);
  const uint32_t threshold = dropout_threshold(dropout_p);
  bool* out = keep.data_ptr<bool>();  // [B, H, Lq, Lk] contiguous
  const int64_t row_pairs = (seqlen_q + 1) / 2;
  at::parallel_for(0, batch * heads * row_pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / row_pairs, i0 = 2 * (t % row_pairs);
      const int64_t rows = std::min<int64_t>(2, seqlen_q - i0);
      for (int64_t j0 = 0; j0 < seqlen_k; j0 += 2) {
        const PhiloxWords words = dropout_block_words(seed, offset, static_cast<uint32_t>(bh),
                                                      static_cast<uint32_t>(i0), static_cast<uint32_t>(j0));
        const int64_t cols = std::min<int64_t>(2, seqlen_k - j0);
        for (int64_t r = 0; r < rows; ++r) {
          bool* row = out + (bh * seqlen_q + i0 + r) * seqlen_k;  // [Lk]
          for (int64_t c = 0; c < cols; ++c) {
            row[j0 + c] = dropout_word(words, static_cast<uint32_t>(i0 + r), static_cast<uint32_t>(j0 + c)) >= threshold;
          }
        }
      }
    }
  });
  return keep;
}

}  // namespace cpu
}  // namespace flashattn
