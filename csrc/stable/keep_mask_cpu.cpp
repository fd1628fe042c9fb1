// The CPU writer of the stable-ABI keep-mask op (keep_mask.h).
#include "stable/keep_mask.h"

#include "common/dropout.h"

namespace flashattn {
namespace stable_ops {

void write_keep_mask_cpu(uint64_t seed, uint64_t offset, double dropout_p, int64_t batch_heads, int64_t seqlen_q,
                         int64_t seqlen_k, bool* keep) {
  const uint32_t threshold = dropout_threshold(dropout_p);
  for (int64_t t = 0; t < batch_heads * seqlen_q; ++t) {
    write_keep_mask_row(seed, offset, static_cast<uint32_t>(t / seqlen_q), static_cast<uint32_t>(t % seqlen_q),
                        seqlen_k, threshold, keep + t * seqlen_k);
  }
}

}  // namespace stable_ops
}  // namespace flashattn
