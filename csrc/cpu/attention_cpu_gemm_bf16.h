// A gemm with bfloat16 operands and float32 results on AVX512-BF16 (vdpbf16ps), for the CPU backward's
// products on CPUs that have that instruction set but no AMX (where cpublas's bfloat16 gemm runs at the
// float32 rate). Internal to csrc/cpu/.
//
// vdpbf16ps adds, into each float32 lane, the products of two adjacent bfloat16 pairs, so the B operand
// is kept in "pair" layout: B [k, n] as 32-bit words Bp [ceil(k / 2), ld] with
// Bp[p, j] = B[2p, j] | B[2p + 1, j] << 16 (a missing last row zero), and each row of A is read two
// elements at a time as it is stored.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cpu {
namespace detail {

// Whether gemm_bf16_pairs runs on this CPU and is the form to use: AVX512-BF16 without AMX, and
// FLASHATTN_CPU_VECTOR not capping the vector code below AVX-512. Decided once.
bool gemm_bf16_pairs_chosen();

// The column multiple of a pair-layout operand's leading dimension: gemm_bf16_pairs reads B in strips
// of this many columns, so rows of Bp are padded to it (pack_* fill the padding with zeros).
constexpr int64_t kPairStrip = 32;
inline int64_t pair_ld(int64_t n) { return (n + kPairStrip - 1) / kPairStrip * kPairStrip; }

// Bp [ceil(k / 2), ld] <- the pair layout of B [k, n] = x (bfloat16 bits, row stride ld_x): rows 2p and
// 2p + 1 of x interleaved. ld >= pair_ld(n); columns n..ld zero.
void pack_pairs_of_rows(const uint16_t* x, int64_t ld_x, int64_t k, int64_t n, uint32_t* bp, int64_t ld);

// Bp [ceil(k / 2), ld] <- the pair layout of B [k, n] = x^T for x [n, k] (bfloat16 bits, row stride
// ld_x): Bp[p, j] holds x[j, 2p] and x[j, 2p + 1], the 32-bit words of x's rows transposed.
// ld >= pair_ld(n); columns n..ld zero.
void pack_pairs_of_columns(const uint16_t* x, int64_t ld_x, int64_t n, int64_t k, uint32_t* bp, int64_t ld);

// C [m, n] (float32, row stride ld_c) = (add_c ? C : 0) + A [m, k] B [k, n]: A bfloat16 bits with row
// stride ld_a (any k: an odd k's last element is paired with zero), B in pair layout (bp, ld_bp: a
// multiple of kPairStrip, with bp's rows readable to the next multiple of kPairStrip past n). Only
// the k elements of each A row and the k rows of B count: what lies past them (a key beyond the last
// one a query sees, NaN included) does not reach C. Call only where gemm_bf16_pairs_chosen().
void gemm_bf16_pairs(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ld_a, const uint32_t* bp,
                     int64_t ld_bp, float* c, int64_t ld_c, bool add_c);

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
