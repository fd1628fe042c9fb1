// The CPU writer of the stable-ABI keep-mask op (keep_mask.h).
#include "stable/keep_mask.h"

#include "common/dropout.h"

namespace flashattn {
namespace stable_ops {

void write_keep_mask_cpu(uint64_t seed, uint64_t offset, double dropout_p, int64_t batch_heads, int64_t seqlen_q,
                         int64_t seqlen_k, bool* keep) {
  const uint32_t threshold = dropout_threshold(dropout_p);
  for (int64_t bh = 0; bh < batch_heads; ++bh) {
    for (int64_t i = 0; i < seqlen_q; ++i) {
      bool* row = keep + (bh * seqlen_q + i) * seqlen_k;
      for (int64_t j = 0; j < seqlen_k; ++j) {
        row[j] = dropout_keep(seed, offset, static_cast<uint32_t>(bh), static_cast<uint32_t>(i),
                              static_cast<uint32_t>(j), threshold);
      }
    }
  }
}

}  // namespace stable_ops
}  // namespace flashattn
