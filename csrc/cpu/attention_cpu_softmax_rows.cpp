// online_softmax_rows (attention_cpu_softmax_rows.h): a scalar form, and AVX2 and AVX-512 forms compiled
// with GCC/Clang target attributes (attention_cpu_vector_exp.h), the
// widest the CPU runs picked once.
#include "cpu/attention_cpu_softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cpu/attention_cpu_vector_exp.h"

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row's update once its new max is known: shift, the rescale factor, and acc's row scaled by it.
struct RowShift {
  float shift, rescale;
};
inline RowShift row_shift(float old_max, float new_max) {
  const float shift = new_max == kNegInf ? 0.f : new_max;
  return {shift, std::exp(old_max - shift)};
}

inline void scale_acc_row(float* acc_row, int64_t head_dim, float c) {
  for (int64_t d = 0; d < head_dim; ++d) acc_row[d] *= c;
}

// NaN-propagating max of a and b (as at::maximum).
inline float max_nan(float a, float b) { return (a != a || b != b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b); }

void softmax_rows_scalar(float* scores, int64_t rows, int64_t cols, float* row_max, float* row_sum, float* acc,
                         int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * cols;
    float m = row_max[r];
    for (int64_t j = 0; j < cols; ++j) m = max_nan(m, s[j]);
    const RowShift t = row_shift(row_max[r], m);
    float sum = 0.f;
    for (int64_t j = 0; j < cols; ++j) {
      s[j] = exp_or_zero(s[j] - t.shift);
      sum += s[j];
    }
    row_sum[r] = row_sum[r] * t.rescale + sum;
    row_max[r] = m;
    scale_acc_row(acc + r * head_dim, head_dim, t.rescale);
  }
}

#ifdef FLASHATTN_CPU_X86_VECTOR
// GCC's intrinsic headers start some vectors undefined on purpose, which -Wall reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

__attribute__((target("avx512f"))) void softmax_rows_avx512(float* scores, int64_t rows, int64_t cols, float* row_max,
                                                            float* row_sum, float* acc, int64_t head_dim) {
  const int64_t whole = cols / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols - whole)) - 1u);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * cols;
    // vmaxps drops a NaN operand: NaN lanes are counted apart so that the max stays NaN-propagating.
    __m512 vmax = _mm512_set1_ps(kNegInf);
    __mmask16 nan = 0;
    for (int64_t j = 0; j < whole; j += 16) {
      const __m512 v = _mm512_loadu_ps(s + j);
      vmax = _mm512_max_ps(vmax, v);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (tail) {
      const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), tail, s + whole);
      vmax = _mm512_max_ps(vmax, v);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    const float m = nan ? std::numeric_limits<float>::quiet_NaN() : max_nan(row_max[r], _mm512_reduce_max_ps(vmax));
    const RowShift t = row_shift(row_max[r], m);
    const __m512 shift = _mm512_set1_ps(t.shift);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < whole; j += 16) {
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), shift));
      _mm512_storeu_ps(s + j, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    if (tail) {
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + whole), shift));
      _mm512_mask_storeu_ps(s + whole, tail, e);
      vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(tail, e));
    }
    row_sum[r] = row_sum[r] * t.rescale + _mm512_reduce_add_ps(vsum);
    row_max[r] = m;
    scale_acc_row(acc + r * head_dim, head_dim, t.rescale);
  }
}

__attribute__((target("avx2,fma"))) void softmax_rows_avx2(float* scores, int64_t rows, int64_t cols, float* row_max,
                                                           float* row_sum, float* acc, int64_t head_dim) {
  const int64_t whole = cols / 8 * 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * cols;
    __m256 vmax = _mm256_set1_ps(kNegInf);
    __m256 nan = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += 8) {
      const __m256 v = _mm256_loadu_ps(s + j);
      vmax = _mm256_max_ps(vmax, v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float m = row_max[r];
    for (float x : lanes) m = max_nan(m, x);
    for (int64_t j = whole; j < cols; ++j) m = max_nan(m, s[j]);
    if (_mm256_movemask_ps(nan) != 0) m = std::numeric_limits<float>::quiet_NaN();
    const RowShift t = row_shift(row_max[r], m);
    const __m256 shift = _mm256_set1_ps(t.shift);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += 8) {
      const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift));
      _mm256_storeu_ps(s + j, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    _mm256_storeu_ps(lanes, vsum);
    float sum = 0.f;
    for (float x : lanes) sum += x;
    for (int64_t j = whole; j < cols; ++j) {
      s[j] = exp_or_zero(s[j] - t.shift);
      sum += s[j];
    }
    row_sum[r] = row_sum[r] * t.rescale + sum;
    row_max[r] = m;
    scale_acc_row(acc + r * head_dim, head_dim, t.rescale);
  }
}

#pragma GCC diagnostic pop
#endif

using SoftmaxRowsFn = void (*)(float*, int64_t, int64_t, float*, float*, float*, int64_t);

// The widest form the CPU runs, or a narrower one FLASHATTN_CPU_VECTOR names (avx2 or scalar: for tests,
// and to rule the vector code out when chasing a CPU result).
SoftmaxRowsFn pick_softmax_rows() {
  const char* cap_env = std::getenv("FLASHATTN_CPU_VECTOR");
  const std::string cap = cap_env != nullptr ? cap_env : "";
  if (cap == "scalar") return softmax_rows_scalar;
#ifdef FLASHATTN_CPU_X86_VECTOR
  __builtin_cpu_init();
  if (cap != "avx2" && __builtin_cpu_supports("avx512f")) return softmax_rows_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return softmax_rows_avx2;
#endif
  return softmax_rows_scalar;
}

// Chosen once.
SoftmaxRowsFn chosen_softmax_rows() {
  static const SoftmaxRowsFn fn = pick_softmax_rows();
  return fn;
}

}  // namespace

void online_softmax_rows(float* scores, int64_t rows, int64_t cols, float* row_max, float* row_sum, float* acc,
                         int64_t head_dim) {
  chosen_softmax_rows()(scores, rows, cols, row_max, row_sum, acc, head_dim);
}

const char* online_softmax_rows_form() {
  const SoftmaxRowsFn fn = chosen_softmax_rows();
#ifdef FLASHATTN_CPU_X86_VECTOR
  if (fn == softmax_rows_avx512) return "avx512";
  if (fn == softmax_rows_avx2) return "avx2";
#endif
  return "scalar";
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
