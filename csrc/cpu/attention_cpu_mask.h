// The optional attention mask of the CPU kernels, read in place: a [B, Hq, Lq, Lk] tensor with any
// element strides (0 included, as .expand() makes them), never densified. Internal to csrc/cpu/.
//
// A bool mask keeps a key where it is True; a floating mask (q's dtype or float32) is added to the
// scaled score. Both become the same thing, an additive bias row in the accumulation type (0 or -inf
// for bool), so the kernels have one masked code path. A key whose bias is -inf is excluded as causal
// masking excludes one: it takes no part at all. Its score is -inf whatever q.k is (masked_score), the
// weighted sums leave it out (add_weighted_kept_rows, add_outer_kept), and a row with no key kept in
// a tile skips the tile, so an inf/NaN in an excluded key's k or v never reaches a result.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>

namespace flashattn {
namespace cpu {
namespace detail {

// The score of a key with additive mask `bias`: scaled_score + bias, or -inf for an excluded key
// (so an inf/NaN q.k of a key the mask excludes cannot reach the row). The forward and the backward
// both compute scores through here, so the backward's recomputed P matches the forward's bit for bit.
template <typename acc_t>
inline acc_t masked_score(acc_t scaled_score, acc_t bias) {
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  return bias == kNegInf ? kNegInf : scaled_score + bias;
}

template <typename scalar_t>
struct MaskView {
  const bool* keep = nullptr;         // set for a bool mask
  const scalar_t* add = nullptr;      // set for an additive mask of q's dtype (other than float32)
  const float* add_float = nullptr;   // set for an additive float32 mask
  int64_t batch_stride = 0, head_stride = 0, query_stride = 0, key_stride = 0;

  bool present() const { return keep != nullptr || add != nullptr || add_float != nullptr; }

  // bias[0:n] = additive mask of query i against keys [k0, k0 + n) of (batch b, query head h).
  // Returns whether any of these keys is kept (bias != -inf). The dtype branch is taken once per row,
  // outside the element loops.
  template <typename acc_t>
  bool load_row(acc_t* __restrict bias, int64_t b, int64_t h, int64_t i, int64_t k0, int64_t n) const {
    constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
    const int64_t offset = b * batch_stride + h * head_stride + i * query_stride + k0 * key_stride;
    if (keep != nullptr) {
      const bool* x = keep + offset;
      for (int64_t j = 0; j < n; ++j) bias[j] = x[j * key_stride] ? acc_t(0) : kNegInf;
    } else if (add_float != nullptr) {
      const float* x = add_float + offset;
      for (int64_t j = 0; j < n; ++j) bias[j] = static_cast<acc_t>(x[j * key_stride]);
    } else {
      const scalar_t* x = add + offset;
      for (int64_t j = 0; j < n; ++j) bias[j] = static_cast<acc_t>(x[j * key_stride]);
    }
    int64_t kept = 0;
    for (int64_t j = 0; j < n; ++j) kept += bias[j] != kNegInf;
    return kept > 0;
  }
};

// The view of an optional mask (empty when absent). The caller has checked its shape and that its
// dtype is bool, float32 or q's.
template <typename scalar_t>
MaskView<scalar_t> mask_view(const std::optional<at::Tensor>& mask) {
  MaskView<scalar_t> view;
  if (!mask.has_value() || !mask->defined()) return view;
  const at::Tensor& m = *mask;
  if (m.scalar_type() == at::kBool) {
    view.keep = m.data_ptr<bool>();
  } else if (m.scalar_type() == at::kFloat) {
    view.add_float = m.data_ptr<float>();
  } else {
    view.add = m.data_ptr<scalar_t>();  // checks that it is q's dtype
  }
  view.batch_stride = m.stride(0);
  view.head_stride = m.stride(1);
  view.query_stride = m.stride(2);
  view.key_stride = m.stride(3);
  return view;
}

// Where the backward writes the mask's gradient: a contiguous [B, Hq, Lq, Lk] tensor of the mask's
// dtype (q's or float32), or nowhere.
template <typename scalar_t>
struct MaskGradView {
  scalar_t* grad = nullptr;       // q's dtype (other than float32)
  float* grad_float = nullptr;    // float32
  int64_t heads_q = 0, seqlen_q = 0, seqlen_k = 0;

  bool present() const { return grad != nullptr || grad_float != nullptr; }

  // Element (b, h, i, k0 + j) = ds[j] for j < n.
  template <typename acc_t>
  void store_row(const acc_t* __restrict ds, int64_t b, int64_t h, int64_t i, int64_t k0, int64_t n) const {
    const int64_t offset = ((b * heads_q + h) * seqlen_q + i) * seqlen_k + k0;
    if (grad_float != nullptr) {
      for (int64_t j = 0; j < n; ++j) grad_float[offset + j] = static_cast<float>(ds[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) grad[offset + j] = static_cast<scalar_t>(ds[j]);
    }
  }
};

template <typename scalar_t>
MaskGradView<scalar_t> mask_grad_view(const std::optional<at::Tensor>& dmask, int64_t heads_q, int64_t seqlen_q,
                                      int64_t seqlen_k) {
  MaskGradView<scalar_t> view;
  if (!dmask.has_value() || !dmask->defined()) return view;
  if (dmask->scalar_type() == at::kFloat) {
    view.grad_float = dmask->data_ptr<float>();
  } else {
    view.grad = dmask->data_ptr<scalar_t>();  // checks that it is q's dtype
  }
  view.heads_q = heads_q;
  view.seqlen_q = seqlen_q;
  view.seqlen_k = seqlen_k;
  return view;
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
