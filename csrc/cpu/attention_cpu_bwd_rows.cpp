// bwd_probs_rows, bwd_dscores_rows and to_bf16_bits (attention_cpu_bwd_rows.h): a scalar form, and AVX2
// and AVX-512 forms compiled with GCC/Clang target attributes (attention_cpu_vector_exp.h), in the form
// online_softmax_rows_form() names (one choice for the forward's rows and these).
#include "cpu/attention_cpu_bwd_rows.h"

#include <cmath>
#include <cstring>
#include <string>

#include "cpu/attention_cpu_softmax_rows.h"
#include "cpu/attention_cpu_vector_exp.h"

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

// float -> bfloat16 bits, rounding to nearest even; NaN -> the quiet NaN 0x7fc0 (c10::BFloat16's rule).
inline uint16_t bf16_bits(float x) {
  if (std::isnan(x)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct ScalarForm {
  static void probs(float* s, int64_t rows, int64_t cols, float a, const float* lse, uint16_t* p16) {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * cols;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] = exp_or_zero(std::fma(a, row[j], -lse[r]));
        if (p16 != nullptr) p16[r * cols + j] = bf16_bits(row[j]);
      }
    }
  }
  static void dscores(float* dp, const float* p, int64_t rows, int64_t cols, const float* delta, uint16_t* ds16) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = r * cols + j;
        dp[i] = p[i] * (dp[i] - delta[r]);
        if (ds16 != nullptr) ds16[i] = bf16_bits(dp[i]);
      }
    }
  }
  static void to_bf16(const float* x, int64_t n, uint16_t* bits) {
    for (int64_t i = 0; i < n; ++i) bits[i] = bf16_bits(x[i]);
  }
};

#ifdef FLASHATTN_CPU_X86_VECTOR
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The rows below loop over whole vectors and finish each row's tail with the scalar rule, so that every
// element is computed the same way whatever its position (the exponential aside: the vector and scalar
// exps differ in the last bits).
struct Avx512Form {
  __attribute__((target("avx512f"))) static void store_bf16(uint16_t* dst, __m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
  }
  __attribute__((target("avx512f"))) static void probs(float* s, int64_t rows, int64_t cols, float a,
                                                       const float* lse, uint16_t* p16) {
    const int64_t whole = cols / 16 * 16;
    const __m512 va = _mm512_set1_ps(a);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * cols;
      uint16_t* row16 = p16 != nullptr ? p16 + r * cols : nullptr;
      const __m512 vl = _mm512_set1_ps(lse[r]);
      for (int64_t j = 0; j < whole; j += 16) {
        const __m512 e = exp_avx512(_mm512_fmsub_ps(va, _mm512_loadu_ps(row + j), vl));
        _mm512_storeu_ps(row + j, e);
        if (row16 != nullptr) store_bf16(row16 + j, e);
      }
      for (int64_t j = whole; j < cols; ++j) {
        row[j] = exp_or_zero(std::fma(a, row[j], -lse[r]));
        if (row16 != nullptr) row16[j] = bf16_bits(row[j]);
      }
    }
  }
  __attribute__((target("avx512f"))) static void dscores(float* dp, const float* p, int64_t rows, int64_t cols,
                                                         const float* delta, uint16_t* ds16) {
    const int64_t whole = cols / 16 * 16;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = dp + r * cols;
      const float* prow = p + r * cols;
      uint16_t* row16 = ds16 != nullptr ? ds16 + r * cols : nullptr;
      const __m512 vd = _mm512_set1_ps(delta[r]);
      for (int64_t j = 0; j < whole; j += 16) {
        const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(prow + j), _mm512_sub_ps(_mm512_loadu_ps(row + j), vd));
        _mm512_storeu_ps(row + j, d);
        if (row16 != nullptr) store_bf16(row16 + j, d);
      }
      for (int64_t j = whole; j < cols; ++j) {
        row[j] = prow[j] * (row[j] - delta[r]);
        if (row16 != nullptr) row16[j] = bf16_bits(row[j]);
      }
    }
  }
  __attribute__((target("avx512f"))) static void to_bf16(const float* x, int64_t n, uint16_t* bits) {
    const int64_t whole = n / 16 * 16;
    for (int64_t i = 0; i < whole; i += 16) store_bf16(bits + i, _mm512_loadu_ps(x + i));
    for (int64_t i = whole; i < n; ++i) bits[i] = bf16_bits(x[i]);
  }
};

struct Avx2Form {
  __attribute__((target("avx2,fma"))) static void store_bf16(uint16_t* dst, __m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    // packus works per 128-bit half ([r0..3 r0..3 | r4..7 r4..7]); the permute puts r0..7 in the low half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
  }
  __attribute__((target("avx2,fma"))) static void probs(float* s, int64_t rows, int64_t cols, float a,
                                                        const float* lse, uint16_t* p16) {
    const int64_t whole = cols / 8 * 8;
    const __m256 va = _mm256_set1_ps(a);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * cols;
      uint16_t* row16 = p16 != nullptr ? p16 + r * cols : nullptr;
      const __m256 vl = _mm256_set1_ps(lse[r]);
      for (int64_t j = 0; j < whole; j += 8) {
        const __m256 e = exp_avx2(_mm256_fmsub_ps(va, _mm256_loadu_ps(row + j), vl));
        _mm256_storeu_ps(row + j, e);
        if (row16 != nullptr) store_bf16(row16 + j, e);
      }
      for (int64_t j = whole; j < cols; ++j) {
        row[j] = exp_or_zero(std::fma(a, row[j], -lse[r]));
        if (row16 != nullptr) row16[j] = bf16_bits(row[j]);
      }
    }
  }
  __attribute__((target("avx2,fma"))) static void dscores(float* dp, const float* p, int64_t rows, int64_t cols,
                                                          const float* delta, uint16_t* ds16) {
    const int64_t whole = cols / 8 * 8;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = dp + r * cols;
      const float* prow = p + r * cols;
      uint16_t* row16 = ds16 != nullptr ? ds16 + r * cols : nullptr;
      const __m256 vd = _mm256_set1_ps(delta[r]);
      for (int64_t j = 0; j < whole; j += 8) {
        const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(prow + j), _mm256_sub_ps(_mm256_loadu_ps(row + j), vd));
        _mm256_storeu_ps(row + j, d);
        if (row16 != nullptr) store_bf16(row16 + j, d);
      }
      for (int64_t j = whole; j < cols; ++j) {
        row[j] = prow[j] * (row[j] - delta[r]);
        if (row16 != nullptr) row16[j] = bf16_bits(row[j]);
      }
    }
  }
  __attribute__((target("avx2,fma"))) static void to_bf16(const float* x, int64_t n, uint16_t* bits) {
    const int64_t whole = n / 8 * 8;
    for (int64_t i = 0; i < whole; i += 8) store_bf16(bits + i, _mm256_loadu_ps(x + i));
    for (int64_t i = whole; i < n; ++i) bits[i] = bf16_bits(x[i]);
  }
};

#pragma GCC diagnostic pop
#endif

enum class Form { kScalar, kAvx2, kAvx512 };

Form chosen_form() {
  static const Form form = [] {
    const std::string name = online_softmax_rows_form();
    return name == "avx512" ? Form::kAvx512 : name == "avx2" ? Form::kAvx2 : Form::kScalar;
  }();
  return form;
}

}  // namespace

void bwd_probs_rows(float* s, int64_t rows, int64_t cols, float a, const float* lse, uint16_t* p16) {
  switch (chosen_form()) {
#ifdef FLASHATTN_CPU_X86_VECTOR
    case Form::kAvx512: return Avx512Form::probs(s, rows, cols, a, lse, p16);
    case Form::kAvx2: return Avx2Form::probs(s, rows, cols, a, lse, p16);
#endif
    default: return ScalarForm::probs(s, rows, cols, a, lse, p16);
  }
}

void bwd_dscores_rows(float* dp, const float* p, int64_t rows, int64_t cols, const float* delta, uint16_t* ds16) {
  switch (chosen_form()) {
#ifdef FLASHATTN_CPU_X86_VECTOR
    case Form::kAvx512: return Avx512Form::dscores(dp, p, rows, cols, delta, ds16);
    case Form::kAvx2: return Avx2Form::dscores(dp, p, rows, cols, delta, ds16);
#endif
    default: return ScalarForm::dscores(dp, p, rows, cols, delta, ds16);
  }
}

void to_bf16_bits(const float* x, int64_t n, uint16_t* bits) {
  switch (chosen_form()) {
#ifdef FLASHATTN_CPU_X86_VECTOR
    case Form::kAvx512: return Avx512Form::to_bf16(x, n, bits);
    case Form::kAvx2: return Avx2Form::to_bf16(x, n, bits);
#endif
    default: return ScalarForm::to_bf16(x, n, bits);
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
