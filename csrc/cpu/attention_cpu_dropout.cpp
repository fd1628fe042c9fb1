// CPU dropout_keep_mask: the keep-mask the kernels apply, materialised as a bool tensor (for tests and
// debugging: it is quadratic in memory). One task = one (row group, query row), written by
// common/dropout.h's write_keep_mask_row.
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
  at::parallel_for(0, batch * heads * seqlen_q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      write_keep_mask_row(seed, offset, static_cast<uint32_t>(t / seqlen_q), static_cast<uint32_t>(t % seqlen_q),
                          seqlen_k, threshold, out + t * seqlen_k);
    }
  });
  return keep;
}

}  // namespace cpu
}  // namespace flashattn
