// The five products of the CPU backward's bfloat16 path (attention_cpu_bwd_plain.cpp), bfloat16
// operands into float32 results, in two forms with the same calls:
//   CpublasProducts: cpublas's gemm (brgemm in its unpacked form), the form for CPUs with AMX (where it
//     runs on the tile unit) or without AVX512-BF16;
//   PairProducts: gemm_bf16_pairs (attention_cpu_gemm_bf16.h), with K and V packed once per key/value
//     head and each tile's P and dS packed once, for CPUs with AVX512-BF16 and no AMX.
// Both are built for one (batch, key/value head) from k_head [Lk, D] and v_head [Lk, Dv] (bfloat16,
// contiguous rows). Tiles: `rows` queries from the query block's first, `cols` keys from key k0.
// Internal to csrc/cpu/.
#pragma once

#include <ATen/ATen.h>
#include <ATen/native/CPUBlas.h>

#include <cstdint>

#include "cpu/attention_cpu_gemm_bf16.h"
#include "cpu/attention_cpu_plain_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {

#ifdef CPUBLAS_BRGEMM_BF16BF16F32
constexpr bool kHasCpublasBf16Gemm = true;
#else
constexpr bool kHasCpublasBf16Gemm = false;  // a torch whose ATen has no bfloat16 x bfloat16 -> float32 gemm
#endif

class CpublasProducts {
 public:
  CpublasProducts(const at::Tensor& k_head, const at::Tensor& v_head)
      : k_(k_head), keys_t_(k_head.t().contiguous()), values_t_(v_head.t().contiguous()) {}

  // s [rows, cols] = Q K^T; q [rows, D], row stride ld_q.
  void scores(int64_t rows, int64_t cols, int64_t k0, const uint16_t* q, int64_t ld_q, float* s) const {
    gemm(rows, cols, k_.size(1), q, ld_q, bits(keys_t_) + k0, keys_t_.stride(0), s, cols, false);
  }
  // dp [rows, cols] = dO V^T; dout [rows, Dv], row stride ld_do.
  void dprobs(int64_t rows, int64_t cols, int64_t k0, const uint16_t* dout, int64_t ld_do, float* dp) const {
    gemm(rows, cols, values_t_.size(0), dout, ld_do, bits(values_t_) + k0, values_t_.stride(0), dp, cols, false);
  }
  // dv_t [Dv, Lk] (float32) columns k0.. += dO^T P; dout_t [Dv, rows], p16 [rows, cols].
  void add_dv(int64_t rows, int64_t cols, int64_t k0, const uint16_t* dout_t, const uint16_t* p16, float* dv_t) {
    gemm(values_t_.size(0), cols, rows, dout_t, rows, p16, cols, dv_t + k0, values_t_.size(1), true);
  }
  // dq [rows, D] (float32) += dS K; ds16 [rows, cols].
  void add_dq(int64_t rows, int64_t cols, int64_t k0, const uint16_t* ds16, float* dq) const {
    gemm(rows, k_.size(1), cols, ds16, cols, bits(k_) + k0 * k_.stride(0), k_.stride(0), dq, k_.size(1), true);
  }
  // dk_t [D, Lk] (float32) columns k0.. += Q^T dS; q_t [D, rows], ds16 [rows, cols].
  void add_dk(int64_t rows, int64_t cols, int64_t k0, const uint16_t* q_t, const uint16_t* ds16, float* dk_t) {
    gemm(k_.size(1), cols, rows, q_t, rows, ds16, cols, dk_t + k0, keys_t_.size(1), true);
  }

 private:
  // c [m, n] (row stride ld_c) = (add_c ? c : 0) + a [m, k] b [k, n] (rows of strides ld_a, ld_b).
  static void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ld_a, const uint16_t* b, int64_t ld_b,
                   float* c, int64_t ld_c, bool add_c) {
#ifdef CPUBLAS_BRGEMM_BF16BF16F32
    at::native::cpublas::brgemm(m, n, k, ld_a, ld_b, ld_c, add_c, reinterpret_cast<const at::BFloat16*>(a),
                                reinterpret_cast<const at::BFloat16*>(b), c, /*is_vnni=*/false);
#endif
  }

  at::Tensor k_;         // [Lk, D]
  at::Tensor keys_t_;    // [D, Lk]
  at::Tensor values_t_;  // [Dv, Lk]
};

class PairProducts {
 public:
  // tile_pairs: a buffer of at least pair_tile_words() words (a thread's own), for P's and dS's pairs.
  PairProducts(const at::Tensor& k_head, const at::Tensor& v_head, uint32_t* tile_pairs)
      : lk_(k_head.size(0)), d_(k_head.size(1)), dv_(v_head.size(1)), ld_lk_(pair_ld(lk_)), ld_d_(pair_ld(d_)),
        tile_pairs_(tile_pairs) {
    kt_ = words((d_ + 1) / 2 * ld_lk_);
    vt_ = words((dv_ + 1) / 2 * ld_lk_);
    k_rows_ = words((lk_ + 1) / 2 * ld_d_);
    pack_pairs_of_columns(bits(k_head), k_head.stride(0), lk_, d_, ptr(kt_), ld_lk_);
    pack_pairs_of_columns(bits(v_head), v_head.stride(0), lk_, dv_, ptr(vt_), ld_lk_);
    pack_pairs_of_rows(bits(k_head), k_head.stride(0), lk_, d_, ptr(k_rows_), ld_d_);
  }
  static int64_t pair_tile_words(int64_t block_q, int64_t block_k) { return (block_q + 1) / 2 * pair_ld(block_k); }

  void scores(int64_t rows, int64_t cols, int64_t k0, const uint16_t* q, int64_t ld_q, float* s) const {
    gemm_bf16_pairs(rows, cols, d_, q, ld_q, ptr(kt_) + k0, ld_lk_, s, cols, false);
  }
  void dprobs(int64_t rows, int64_t cols, int64_t k0, const uint16_t* dout, int64_t ld_do, float* dp) const {
    gemm_bf16_pairs(rows, cols, dv_, dout, ld_do, ptr(vt_) + k0, ld_lk_, dp, cols, false);
  }
  void add_dv(int64_t rows, int64_t cols, int64_t k0, const uint16_t* dout_t, const uint16_t* p16, float* dv_t) {
    pack_pairs_of_rows(p16, cols, rows, cols, tile_pairs_, pair_ld(cols));
    gemm_bf16_pairs(dv_, cols, rows, dout_t, rows, tile_pairs_, pair_ld(cols), dv_t + k0, lk_, true);
  }
  // k0 is even (a multiple of the key block), so K's pairs from key k0 start a pair row.
  void add_dq(int64_t rows, int64_t cols, int64_t k0, const uint16_t* ds16, float* dq) const {
    gemm_bf16_pairs(rows, d_, cols, ds16, cols, ptr(k_rows_) + k0 / 2 * ld_d_, ld_d_, dq, d_, true);
  }
  void add_dk(int64_t rows, int64_t cols, int64_t k0, const uint16_t* q_t, const uint16_t* ds16, float* dk_t) {
    pack_pairs_of_rows(ds16, cols, rows, cols, tile_pairs_, pair_ld(cols));
    gemm_bf16_pairs(d_, cols, rows, q_t, rows, tile_pairs_, pair_ld(cols), dk_t + k0, lk_, true);
  }

 private:
  static at::Tensor words(int64_t n) { return at::empty({n}, at::kInt); }
  static uint32_t* ptr(const at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr<int32_t>()); }

  int64_t lk_, d_, dv_, ld_lk_, ld_d_;
  at::Tensor kt_;      // K^T's pairs [ceil(D / 2), ld_lk_]: B of S = Q K^T
  at::Tensor vt_;      // V^T's pairs [ceil(Dv / 2), ld_lk_]: B of dP = dO V^T
  at::Tensor k_rows_;  // K's pairs [ceil(Lk / 2), ld_d_]: B of dQ = dS K
  uint32_t* tile_pairs_;  // P's, then dS's pairs [ceil(rows / 2), pair_ld(cols)]
};

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
