// gemm_bf16_pairs and its operand packing (attention_cpu_gemm_bf16.h): register tiles of kRowsMax rows x
// kPairStrip columns of C accumulated with vdpbf16ps over the whole k, compiled with GCC/Clang target
// attributes (the extension is otherwise built for the baseline x86-64 ISA).
#include "cpu/attention_cpu_gemm_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/attention_cpu_vector_exp.h"  // FLASHATTN_CPU_X86_VECTOR, immintrin.h

#ifdef FLASHATTN_CPU_X86_VECTOR
#include <cpuid.h>
#endif

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

#ifdef FLASHATTN_CPU_X86_VECTOR
bool cpu_has_avx512_bf16_without_amx() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl")) {
    return false;  // (these checks include the OS's support of the AVX-512 state)
  }
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  const bool bf16 = eax & (1u << 5);  // AVX512_BF16
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx = edx & (1u << 22);  // AMX-BF16: cpublas's gemm runs on the tile unit there
  return bf16 && !amx;
}
#endif

bool pick_pairs() {
  const char* cap_env = std::getenv("FLASHATTN_CPU_VECTOR");
  const std::string cap = cap_env != nullptr ? cap_env : "";
  if (cap == "scalar" || cap == "avx2") return false;
#ifdef FLASHATTN_CPU_X86_VECTOR
  return cpu_has_avx512_bf16_without_amx();
#else
  return false;
#endif
}

inline uint32_t load_word(const uint16_t* p) {  // two adjacent bfloat16, any alignment
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

#ifdef FLASHATTN_CPU_X86_VECTOR
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

constexpr int kRowsMax = 12;  // 24 accumulators, two B vectors, one broadcast: 27 of 32 registers

#define FLASHATTN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

FLASHATTN_BF16_TARGET inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// C rows [0, kRows) x columns [0, 32) of the strip (mask_lo / mask_hi: its columns inside n), over the
// k_pairs whole pairs of k and, where odd, its last element.
template <int kRows>
FLASHATTN_BF16_TARGET void tile(int64_t k_pairs, bool odd, const uint16_t* a, int64_t ld_a, const uint32_t* bp,
                                int64_t ld_bp, float* c, int64_t ld_c, bool add_c, __mmask16 mask_lo,
                                __mmask16 mask_hi) {
  __m512 acc[kRows][2];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = add_c ? _mm512_maskz_loadu_ps(mask_lo, c + r * ld_c) : _mm512_setzero_ps();
    acc[r][1] = add_c ? _mm512_maskz_loadu_ps(mask_hi, c + r * ld_c + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k_pairs; ++p) {
    const __m512i b0 = _mm512_loadu_si512(bp + p * ld_bp);
    const __m512i b1 = _mm512_loadu_si512(bp + p * ld_bp + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(load_word(a + r * ld_a + 2 * p)));
      acc[r][0] = dot_pairs(acc[r][0], w, b0);
      acc[r][1] = dot_pairs(acc[r][1], w, b1);
    }
  }
  if (odd) {  // the last element of k alone: its partner in A and in B (whatever lies there) masked to 0
    const __m512i low = _mm512_set1_epi32(0xffff);
    const __m512i b0 = _mm512_and_si512(_mm512_loadu_si512(bp + k_pairs * ld_bp), low);
    const __m512i b1 = _mm512_and_si512(_mm512_loadu_si512(bp + k_pairs * ld_bp + 16), low);
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(a[r * ld_a + 2 * k_pairs]));
      acc[r][0] = dot_pairs(acc[r][0], w, b0);
      acc[r][1] = dot_pairs(acc[r][1], w, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    _mm512_mask_storeu_ps(c + r * ld_c, mask_lo, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ld_c + 16, mask_hi, acc[r][1]);
  }
}

using TileFn = void (*)(int64_t, bool, const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, bool,
                        __mmask16, __mmask16);
constexpr TileFn kTiles[kRowsMax + 1] = {nullptr,  tile<1>,  tile<2>, tile<3>, tile<4>,  tile<5>, tile<6>,
                                         tile<7>,  tile<8>,  tile<9>, tile<10>, tile<11>, tile<12>};

FLASHATTN_BF16_TARGET void gemm_pairs_avx512(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ld_a,
                                             const uint32_t* bp, int64_t ld_bp, float* c, int64_t ld_c, bool add_c) {
  const int64_t k_pairs = k / 2;
  const bool odd = k % 2 != 0;
  // Column strips outer: a strip of B (k / 2 x 32 words) stays in L1 while every row block passes.
  for (int64_t j = 0; j < n; j += kPairStrip) {
    const int64_t cols = std::min(kPairStrip, n - j);
    const __mmask16 mask_lo = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
    const __mmask16 mask_hi = static_cast<__mmask16>(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
    for (int64_t i = 0; i < m; i += kRowsMax) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowsMax, m - i));
      kTiles[rows](k_pairs, odd, a + i * ld_a, ld_a, bp + j, ld_bp, c + i * ld_c + j, ld_c, add_c, mask_lo, mask_hi);
    }
  }
}

// Two rows' 16 bfloat16 each, interleaved into 16 words.
FLASHATTN_BF16_TARGET inline __m512i interleave(__m256i even, __m256i odd) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
}

FLASHATTN_BF16_TARGET void pack_rows_avx512(const uint16_t* x, int64_t ld_x, int64_t k, int64_t n, uint32_t* bp,
                                            int64_t ld) {
  for (int64_t p = 0; p < (k + 1) / 2; ++p) {
    const uint16_t* even = x + 2 * p * ld_x;
    const uint16_t* odd = 2 * p + 1 < k ? even + ld_x : nullptr;
    uint32_t* out = bp + p * ld;
    for (int64_t j = 0; j < ld; j += 16) {
      const int64_t left = std::max<int64_t>(0, std::min<int64_t>(16, n - j));
      const __mmask16 mask = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
      const __m256i e = _mm256_maskz_loadu_epi16(mask, even + j);
      const __m256i o = odd != nullptr ? _mm256_maskz_loadu_epi16(mask, odd + j) : _mm256_setzero_si256();
      _mm512_storeu_si512(out + j, interleave(e, o));
    }
  }
}

#pragma GCC diagnostic pop
#endif  // FLASHATTN_CPU_X86_VECTOR

}  // namespace

bool gemm_bf16_pairs_chosen() {
  static const bool chosen = pick_pairs();
  return chosen;
}

void pack_pairs_of_rows(const uint16_t* x, int64_t ld_x, int64_t k, int64_t n, uint32_t* bp, int64_t ld) {
#ifdef FLASHATTN_CPU_X86_VECTOR
  if (gemm_bf16_pairs_chosen() && ld % 16 == 0) {
    pack_rows_avx512(x, ld_x, k, n, bp, ld);
    return;
  }
#endif
  for (int64_t p = 0; p < (k + 1) / 2; ++p) {
    for (int64_t j = 0; j < ld; ++j) {
      const uint32_t even = j < n ? x[2 * p * ld_x + j] : 0;
      const uint32_t odd = j < n && 2 * p + 1 < k ? x[(2 * p + 1) * ld_x + j] : 0;
      bp[p * ld + j] = even | odd << 16;
    }
  }
}

void pack_pairs_of_columns(const uint16_t* x, int64_t ld_x, int64_t n, int64_t k, uint32_t* bp, int64_t ld) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) std::fill(bp + p * ld + n, bp + (p + 1) * ld, 0u);
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = x + j * ld_x;
    for (int64_t p = 0; p < k / 2; ++p) bp[p * ld + j] = load_word(row + 2 * p);
    if (k % 2 != 0) bp[(pairs - 1) * ld + j] = row[k - 1];
  }
}

void gemm_bf16_pairs(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ld_a, const uint32_t* bp,
                     int64_t ld_bp, float* c, int64_t ld_c, bool add_c) {
#ifdef FLASHATTN_CPU_X86_VECTOR
  if (gemm_bf16_pairs_chosen()) {
    gemm_pairs_avx512(m, n, k, a, ld_a, bp, ld_bp, c, ld_c, add_c);
    return;
  }
#endif
  std::abort();  // callers check gemm_bf16_pairs_chosen()
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
