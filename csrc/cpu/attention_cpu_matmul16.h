// The 16-bit products of the CPU tiles on the CPU's 16-bit matrix units. Internal to csrc/cpu/.
#pragma once

#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>

#include "cpu/attention_cpu_plain_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

// The 16-bit products on the CPU's 16-bit matrix units (where cpublas::could_pack says they are there:
// AMX): C = A B reads 16-bit A and B straight into a float32 C through ATen's brgemm. Without those
// units the tiles are float32 copies and at::mm.
class Matmul16 {
 public:
  static bool serves(at::ScalarType dtype, int64_t head_dim) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
    return (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 2 == 0 && at::native::cpublas::could_pack(dtype);
#else
    return false;  // a torch whose ATen has no 16-bit brgemm
#endif
  }
  // For products whose inner dimension is at most max_inner.
  Matmul16(at::ScalarType dtype, int64_t max_inner)
      : dtype_(dtype), packed_(at::empty({(max_inner + 1) / 2 * 2 * kPackCols}, at::TensorOptions().dtype(dtype))) {}
  at::ScalarType dtype() const { return dtype_; }

  // C [m, n] (float32, row stride ld_c) = (add_c ? C : 0) + A B, A [m, k] and B [k, n] of the dtype, k
  // even: A with a contiguous last dim (any row stride), B any strides (a transposed view included: it
  // is read once, into the packed blocks).
  void gemm(int64_t m, int64_t n, int64_t k, const at::Tensor& a, const at::Tensor& b, float* c, int64_t ld_c,
            bool add_c) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
    for (int64_t n0 = 0; n0 < n; n0 += kPackCols) {
      const int64_t cols = std::min(kPackCols, n - n0), ld = (cols + 15) / 16 * 16;
      const at::Tensor vnni = packed_.narrow(0, 0, k * ld).view({k / 2, ld, 2});
      vnni.narrow(1, 0, cols).copy_(b.narrow(1, n0, cols).unflatten(0, {k / 2, 2}).transpose(1, 2));
      if (ld > cols) vnni.narrow(1, cols, ld - cols).zero_();
      if (dtype_ == at::kBFloat16) {
        at::native::cpublas::brgemm(m, cols, k, a.stride(0), ld, ld_c, add_c, a.const_data_ptr<at::BFloat16>(),
                                    packed_.const_data_ptr<at::BFloat16>(), c + n0, true);
      } else {
        at::native::cpublas::brgemm(m, cols, k, a.stride(0), ld, ld_c, add_c, a.const_data_ptr<at::Half>(),
                                    packed_.const_data_ptr<at::Half>(), c + n0, true);
      }
    }
#endif
  }
  // Ends this thread's use of the matrix units (their state is per thread).
  static void release() {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
    at::native::cpublas::brgemm_release();
#endif
  }

 private:
  // brgemm's B operand is packed in the VNNI layout, [k / 2][ld][2] (row pairs interleaved: the inner
  // dimension is kept even by the callers, an odd tile getting a zero row), at most this many columns at
  // a time, ld a multiple of 16 (what ATen's cpublas::pack writes; packed here with ATen copies, since
  // older torch builds do not export that function).
  static constexpr int64_t kPackCols = 64;
  at::ScalarType dtype_;
  at::Tensor packed_;  // one packed block of B
};

// The even count of at least n (rows and columns of the products' inner dimensions).
inline int64_t even(int64_t n) { return (n + 1) / 2 * 2; }

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
