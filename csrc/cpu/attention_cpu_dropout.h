// Attention dropout in the CPU kernels: the keep-mask of common/dropout.h (the GPU kernels' formula, so
// both devices drop the same elements) read one query row at a time. Internal to csrc/cpu/.
//
// The kernels never store the mask: the forward and the backward each regenerate the row they need,
// as a factor per key, keep_scale = 1 / (1 - p) for a kept probability and 0 for a dropped one. The
// softmax statistics (row max, row sum, LSE) are those of the undropped probabilities; only the
// weights of V (forward), and dP and the weights of dO (backward), carry the factor.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "common/dropout.h"

namespace flashattn {
namespace cpu {
namespace detail {

struct DropoutRows {
  bool enabled = false;
  uint64_t seed = 0, offset = 0;  // rng_state's two int64 values, bits unchanged
  uint32_t threshold = 0;         // keep iff the element's 16 random bits >= threshold
  double keep_scale = 1.0;        // 1 / (1 - p)

  // factor[0:n] = keep_scale for the keys [k0, k0 + n) that query i of row group bh (batch * heads_q +
  // head) keeps, 0 for those it drops. One keep-mask octet call serves four keys of the row.  factor: [n]
  template <typename acc_t>
  void factor_row(acc_t* __restrict factor, int64_t bh, int64_t i, int64_t k0, int64_t n) const {
    const acc_t kept = static_cast<acc_t>(keep_scale);
    const uint32_t group = static_cast<uint32_t>(bh), query = static_cast<uint32_t>(i);
    const uint32_t h = (query >> 3) & 1;  // which query of the octets this row is
    for (int64_t block = k0 & ~int64_t{31}; block < k0 + n; block += 32) {
      for (int64_t r = 0; r < 8; ++r) {
        const uint32_t bits = dropout_octet(seed, offset, group, query - 8 * h, static_cast<uint32_t>(block + r), threshold);
        for (int64_t ii = 0; ii < 4; ++ii) {
          const int64_t key = block + r + 8 * ii;
          if (key >= k0 && key < k0 + n) factor[key - k0] = ((bits >> (2 * ii + h)) & 1) ? kept : acc_t(0);
        }
      }
    }
  }
};

// The dropout of one call: disabled for p == 0; otherwise seeded by rng_state, a contiguous [2] int64
// CPU tensor (seed, offset), checked by the caller.
inline DropoutRows dropout_rows(double dropout_p, const std::optional<at::Tensor>& rng_state) {
  DropoutRows d;
  if (dropout_p <= 0.0 || !rng_state.has_value() || !rng_state->defined()) return d;
  const int64_t* state = rng_state->data_ptr<int64_t>();  // [2]: seed, offset
  d.enabled = true;
  d.seed = static_cast<uint64_t>(state[0]);
  d.offset = static_cast<uint64_t>(state[1]);
  d.threshold = dropout_threshold(dropout_p);
  d.keep_scale = 1.0 / (1.0 - dropout_p);
  return d;
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
