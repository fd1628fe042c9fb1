// The optional attention mask of the CPU kernels, read in place: a [B, Hq, Lq, Lk] tensor with any
// element strides (0 included, as .expand() makes them), never densified. Internal to csrc/cpu/.
//
// A bool mask keeps a key where it is True; a floating mask (q's dtype) is added to the scaled score.
// Both are turned into the same thing, an additive bias row in the accumulation type (0 or -inf for
// bool), so the kernels have one masked code path. As in torch's SDPA, a key a mask excludes still
// enters the arithmetic with weight exp(-inf) = 0; only causal masking skips keys outright.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>

namespace flashattn {
namespace cpu {
namespace detail {

template <typename scalar_t>
struct MaskView {
  const bool* bool_data = nullptr;      // set for a bool mask
  const scalar_t* bias_data = nullptr;  // set for a floating (additive) mask
  int64_t batch_stride = 0, head_stride = 0, query_stride = 0, key_stride = 0;

  bool present() const { return bool_data != nullptr || bias_data != nullptr; }

  // bias[0:n] = additive mask of query i against keys [k0, k0 + n) of (batch b, query head h).
  // The dtype branch is taken once per row, outside the element loops.
  template <typename acc_t>
  void load_row(acc_t* __restrict bias, int64_t b, int64_t h, int64_t i, int64_t k0, int64_t n) const {
    const int64_t offset = b * batch_stride + h * head_stride + i * query_stride + k0 * key_stride;
    if (bool_data != nullptr) {
      constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
      const bool* keep = bool_data + offset;
      for (int64_t j = 0; j < n; ++j) bias[j] = keep[j * key_stride] ? acc_t(0) : kNegInf;
    } else {
      const scalar_t* add = bias_data + offset;
      for (int64_t j = 0; j < n; ++j) bias[j] = static_cast<acc_t>(add[j * key_stride]);
    }
  }
};

// The view of an optional mask (empty when absent). The caller has checked its shape and dtype.
template <typename scalar_t>
MaskView<scalar_t> mask_view(const std::optional<at::Tensor>& mask) {
  MaskView<scalar_t> view;
  if (!mask.has_value() || !mask->defined()) return view;
  const at::Tensor& m = *mask;
  if (m.scalar_type() == at::kBool) {
    view.bool_data = m.data_ptr<bool>();
  } else {
    view.bias_data = m.data_ptr<scalar_t>();  // checks the dtype
  }
  view.batch_stride = m.stride(0);
  view.head_stride = m.stride(1);
  view.query_stride = m.stride(2);
  view.key_stride = m.stride(3);
  return view;
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
