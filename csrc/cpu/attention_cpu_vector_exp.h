// The exponential of the CPU rows' vector code (the forward's online softmax, the backward's
// probabilities): one scalar rule and its AVX-512 and AVX2 forms, compiled with GCC/Clang target
// attributes (the extension is otherwise built for the baseline x86-64 ISA). Internal to csrc/cpu/.
#pragma once

#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_CPU_X86_VECTOR 1
#include <immintrin.h>
#endif

namespace flashattn {
namespace cpu {
namespace detail {

// exp(x) for x below this is under float32's normal range: taken as 0.
constexpr float kMinExpArg = -87.33654f;

// The vector exps' constants: log2 e, ln 2 split in a part exact in float and the rest (so n ln2 is
// subtracted without rounding), and exp(r)'s polynomial, highest degree first (r^6 .. r^2 terms of
// exp(r) = 1 + r + r^2 p(r)).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(x), 0 below kMinExpArg: the scalar form of the vector exps' rule.
inline float exp_or_zero(float x) { return x < kMinExpArg ? 0.f : std::exp(x); }

#ifdef FLASHATTN_CPU_X86_VECTOR
// GCC's intrinsic headers start some vectors undefined on purpose, which -Wall reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp on 16 lanes: x = n ln2 + r with n = round(x log2 e) and |r| <= ln2 / 2, exp(r) by its degree-6
// polynomial (relative error about 1e-7), times 2^n by vscalefps. Lanes below kMinExpArg give 0 (an
// ordered compare: NaN stays NaN).
__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinExpArg), _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(y, n));
}

// exp on 8 lanes, as exp_avx512 with 2^n built in the exponent bits (n >= -126 above kMinExpArg).
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.f));
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kMinExpArg), _CMP_LT_OQ);
  // n is in [-126, 0] on the lanes kept (NaN lanes: y is NaN, whatever 2^n becomes).
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

#pragma GCC diagnostic pop
#endif

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
