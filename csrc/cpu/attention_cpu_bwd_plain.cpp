// The CPU backward without dropout (attention_cpu_bwd_plain.h). One task per (batch, key/value
// head): its whole dK and dV in float32, and for each of its query heads' blocks of kPlainBlockQ rows
// the key blocks of kPlainBlockK keys they see, each block's
//   S = (scale Q) K^T (capped with softcap), P = exp(S - lse), dV += P^T dO, dP = dO V^T,
//   dS = P (dP - delta) (times 1 - tanh^2 with softcap), dQ += dS K, dK += dS^T Q
// on the calling thread (at::parallel_for runs each task there), in per-thread buffers (fresh
// tile-sized tensors per operation cost page faults). P and dS take one fused pass each
// (attention_cpu_bwd_rows.h). bfloat16 inputs multiply bfloat16 operands into float32 results (P and
// dS rounded to bfloat16 for their products, as the GPU kernels do), in the form of
// attention_cpu_bwd_bf16_products.h the CPU runs; float32 and float16 inputs multiply float32 copies
// with ATen's mm.
#include "cpu/attention_cpu_bwd_plain.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/attention_cpu_bwd_bf16_products.h"
#include "cpu/attention_cpu_bwd_rows.h"
#include "cpu/attention_cpu_gemm_bf16.h"
#include "cpu/attention_cpu_fwd_plain.h"
#include "cpu/attention_cpu_plain_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

struct BwdPlainScratch {
  at::Tensor scores;  // [rows * cols] float32  S, then P
  at::Tensor dp;      // [rows * cols] float32  dP, then dS
  at::Tensor chain;   // [rows * cols] float32  1 - tanh^2 (with softcap only)
  // bfloat16 inputs only:
  at::Tensor p16;     // [rows * cols]  P
  at::Tensor ds16;    // [rows * cols]  dS
  at::Tensor q_t;     // [D * rows]   Q^T of the query block
  at::Tensor dout_t;  // [Dv * rows]  dO^T of the query block
  at::Tensor tile_pairs;  // P's, then dS's pair layout (PairProducts only)

  BwdPlainScratch(bool softcapped, bool bf16, int64_t head_dim, int64_t head_dim_v, TileBounds t)
      : scores(at::empty({t.rows * t.cols}, at::kFloat)),
        dp(at::empty({t.rows * t.cols}, at::kFloat)),
        chain(softcapped ? at::empty({t.rows * t.cols}, at::kFloat) : at::Tensor()) {
    if (bf16) {
      p16 = at::empty({t.rows * t.cols}, at::kBFloat16);
      ds16 = at::empty({t.rows * t.cols}, at::kBFloat16);
      q_t = at::empty({head_dim * t.rows}, at::kBFloat16);
      dout_t = at::empty({head_dim_v * t.rows}, at::kBFloat16);
      if (gemm_bf16_pairs_chosen()) tile_pairs = at::empty({PairProducts::pair_tile_words(t.rows, t.cols)}, at::kInt);
    }
  }
};

// The lse of a block's rows as P's pass takes it: a row that saw no key has lse -inf, and +inf instead
// gives it P = 0 (not exp(-inf + inf)).  [rows] float32, contiguous.
at::Tensor rows_lse(const at::Tensor& lse, int64_t b, int64_t h, int64_t q0, int64_t rows) {
  const at::Tensor row_lse = lse.select(0, b).select(0, h).narrow(0, q0, rows);
  return at::where(at::isneginf(row_lse), std::numeric_limits<float>::infinity(), row_lse).contiguous();
}

// delta = rowsum(dO * O) of a block's rows.  [rows] float32, contiguous.
at::Tensor rows_delta(const at::Tensor& dout, const at::Tensor& out, int64_t b, int64_t h, int64_t q0, int64_t rows) {
  const at::Tensor do_f = dout.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat);
  return (do_f * out.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat)).sum(1).contiguous();
}

// What a score tile takes between its product and P's pass: the scale (where the product left it out),
// softcap (returning 1 - tanh^2 in `chain`), the causal mask, the attention mask (returning its tile).
// Returns the factor P's pass still applies to the scores (scale, or 1 once applied here).
float prepare_scores(const at::Tensor& p, bool scaled, double scale, double softcap, const KeyLimit& keys,
                     const at::Tensor& mask, int64_t b, int64_t h, int64_t q0, int64_t k0, at::Tensor& chain,
                     const at::Tensor& chain_buffer, at::Tensor& tile) {
  const int64_t rows = p.size(0), cols = p.size(1);
  float a = scaled ? 1.f : static_cast<float>(scale);
  // The pass takes exp(a s - lse): a masked score's -inf needs a > 0 there (a zero or negative scale
  // would make it NaN or +inf), so such a scale is applied here, before the masks.
  if (softcap != 0.0 || mask.defined() || !(a > 0.f)) {
    if (a != 1.f) p.mul_(a);
    a = 1.f;
  }
  if (softcap != 0.0) {
    chain = matrix(chain_buffer, rows, cols);
    p.div_(softcap).tanh_();
    at::mul_out(chain, p, p).neg_().add_(1.0);  // 1 - tanh^2
    p.mul_(softcap);
  }
  if (tile_needs_causal_mask(keys, q0, rows, k0, cols)) mask_causal_tile(p, keys, q0, k0);  // -inf, a > 0 from here
  if (mask.defined()) {
    tile = mask_tile(mask, b, h, q0, k0, rows, cols);
    apply_mask_tile(p, tile);
  }
  return a;
}

// What dS takes after its pass: an excluded key's dS is 0 (whatever dP is), dmask gets dS, softcap's chain.
void finish_dscores(const at::Tensor& ds, const at::Tensor& tile, const at::Tensor& dmask, const at::Tensor& chain,
                    int64_t b, int64_t h, int64_t q0, int64_t k0) {
  if (tile.defined()) {
    ds.masked_fill_(excluded(tile), 0.f);
    if (dmask.defined()) mask_tile(dmask, b, h, q0, k0, ds.size(0), ds.size(1)).copy_(ds);
  }
  if (chain.defined()) ds.mul_(chain);
}

// float32 and float16 inputs: products of float32 copies of the tiles.
void bwd_plain_kv_head(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                       const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
                       const at::Tensor& dmask, double softcap, BwdPlainScratch& s, int64_t b, int64_t kv_head) {
  const int64_t seqlen_q = q.size(1), group = q.size(2) / k.size(2);
  const at::Tensor keys_f = k.select(0, b).select(1, kv_head).to(at::kFloat);    // [Lk, D]
  const at::Tensor values_f = v.select(0, b).select(1, kv_head).to(at::kFloat);  // [Lk, Dv]
  const at::Tensor dk_acc = at::zeros_like(keys_f), dv_acc = at::zeros_like(values_f);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv_head * group + g;
    for (int64_t q0 = 0; q0 < seqlen_q; q0 += kPlainBlockQ) {
      const int64_t rows = std::min(kPlainBlockQ, seqlen_q - q0);
      const at::Tensor q_f = q.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat);     // [rows, D]
      // S as the plain forward's float32 products compute it, bit for bit: (scale Q) K^T over the same
      // tiles (where the forward's 16-bit products run on the matrix units, its S differs from this one by
      // float32 roundings: P = exp(S - lse) then sums to 1 within them).
      const at::Tensor q_scaled = q_f * scale;
      const at::Tensor do_f = dout.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat);  // [rows, Dv]
      const at::Tensor delta = rows_delta(dout, out, b, h, q0, rows);
      const at::Tensor row_lse = rows_lse(lse, b, h, q0, rows);
      const at::Tensor dq_acc = at::zeros_like(q_f);
      const int64_t key_stop = keys.key_end(q0 + rows - 1);
      for (int64_t k0 = keys.first_tile_key(q0, kPlainBlockK); k0 < key_stop; k0 += kPlainBlockK) {
        const int64_t cols = std::min(kPlainBlockK, key_stop - k0);
        const at::Tensor k_tile = keys_f.narrow(0, k0, cols), v_tile = values_f.narrow(0, k0, cols);
        at::Tensor p = matrix(s.scores, rows, cols);
        at::mm_out(p, q_scaled, k_tile.t());
        at::Tensor chain, tile;
        const float a = prepare_scores(p, /*scaled=*/true, scale, softcap, keys, mask, b, h, q0, k0, chain, s.chain, tile);
        bwd_probs_rows(p.data_ptr<float>(), rows, cols, a, row_lse.data_ptr<float>(), nullptr);
        dv_acc.narrow(0, k0, cols).addmm_(p.t(), do_f);
        at::Tensor ds = matrix(s.dp, rows, cols);
        at::mm_out(ds, do_f, v_tile.t());
        bwd_dscores_rows(ds.data_ptr<float>(), p.data_ptr<float>(), rows, cols, delta.data_ptr<float>(), nullptr);
        finish_dscores(ds, tile, dmask, chain, b, h, q0, k0);
        dq_acc.addmm_(ds, k_tile);
        dk_acc.narrow(0, k0, cols).addmm_(ds.t(), q_f);
      }
      dq.select(0, b).select(1, h).narrow(0, q0, rows).copy_(dq_acc.mul_(scale));
    }
  }
  dk.select(0, b).select(1, kv_head).copy_(dk_acc.mul_(scale));
  dv.select(0, b).select(1, kv_head).copy_(dv_acc);
}

// bfloat16 inputs: bfloat16 operands, float32 results. dK and dV accumulate transposed (dK^T += Q^T dS,
// dV^T += dO^T P), so that every product's A operand is read as rows: Q^T and dO^T are copied once per
// query block (the B operands are the products form's to lay out).
template <typename Products>
void bwd_bf16_kv_head(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                      const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
                      const at::Tensor& dmask, double softcap, BwdPlainScratch& s, Products& products, int64_t b,
                      int64_t kv_head) {
  const int64_t seqlen_q = q.size(1), seqlen_k = k.size(1), group = q.size(2) / k.size(2);
  const int64_t head_dim = q.size(3), head_dim_v = v.size(3);
  const at::Tensor dk_acc_t = at::zeros({head_dim, seqlen_k}, at::kFloat);    // [D, Lk]
  const at::Tensor dv_acc_t = at::zeros({head_dim_v, seqlen_k}, at::kFloat);  // [Dv, Lk]
  float* const dk_t_ptr = dk_acc_t.data_ptr<float>();
  float* const dv_t_ptr = dv_acc_t.data_ptr<float>();
  const uint16_t* const p16 = bits(s.p16);
  const uint16_t* const ds16 = bits(s.ds16);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv_head * group + g;
    for (int64_t q0 = 0; q0 < seqlen_q; q0 += kPlainBlockQ) {
      const int64_t rows = std::min(kPlainBlockQ, seqlen_q - q0);
      const at::Tensor q_rows = with_unit_column_stride(q.select(0, b).select(1, h).narrow(0, q0, rows));      // [rows, D]
      const at::Tensor do_rows = with_unit_column_stride(dout.select(0, b).select(1, h).narrow(0, q0, rows));  // [rows, Dv]
      matrix(s.q_t, head_dim, rows).copy_(q_rows.t());
      matrix(s.dout_t, head_dim_v, rows).copy_(do_rows.t());
      const uint16_t* const q_t = bits(s.q_t);        // [D, rows]
      const uint16_t* const do_t = bits(s.dout_t);    // [Dv, rows]
      const at::Tensor delta = rows_delta(dout, out, b, h, q0, rows);
      const at::Tensor row_lse = rows_lse(lse, b, h, q0, rows);
      const at::Tensor dq_acc = at::zeros({rows, head_dim}, at::kFloat);
      const int64_t key_stop = keys.key_end(q0 + rows - 1);
      for (int64_t k0 = keys.first_tile_key(q0, kPlainBlockK); k0 < key_stop; k0 += kPlainBlockK) {
        const int64_t cols = std::min(kPlainBlockK, key_stop - k0);
        at::Tensor p = matrix(s.scores, rows, cols);
        products.scores(rows, cols, k0, bits(q_rows), q_rows.stride(0), p.data_ptr<float>());  // Q K^T
        at::Tensor chain, tile;
        const float a = prepare_scores(p, /*scaled=*/false, scale, softcap, keys, mask, b, h, q0, k0, chain, s.chain, tile);
        bwd_probs_rows(p.data_ptr<float>(), rows, cols, a, row_lse.data_ptr<float>(), bits(s.p16));
        products.add_dv(rows, cols, k0, do_t, p16, dv_t_ptr);  // dV^T += dO^T P
        at::Tensor ds = matrix(s.dp, rows, cols);
        products.dprobs(rows, cols, k0, bits(do_rows), do_rows.stride(0), ds.data_ptr<float>());  // dP = dO V^T
        const bool more = tile.defined() || chain.defined();
        bwd_dscores_rows(ds.data_ptr<float>(), p.data_ptr<float>(), rows, cols, delta.data_ptr<float>(),
                         more ? nullptr : bits(s.ds16));
        if (more) {
          finish_dscores(ds, tile, dmask, chain, b, h, q0, k0);
          to_bf16_bits(ds.data_ptr<float>(), rows * cols, bits(s.ds16));
        }
        products.add_dq(rows, cols, k0, ds16, dq_acc.data_ptr<float>());  // dQ += dS K
        products.add_dk(rows, cols, k0, q_t, ds16, dk_t_ptr);             // dK^T += Q^T dS
      }
      dq.select(0, b).select(1, h).narrow(0, q0, rows).copy_(dq_acc.mul_(scale));
    }
  }
  dk.select(0, b).select(1, kv_head).copy_(dk_acc_t.t().mul_(scale));
  dv.select(0, b).select(1, kv_head).copy_(dv_acc_t.t());
}

// bfloat16 inputs, one (batch, key/value head): in the product form this CPU runs.
void bwd_bf16_kv_head_any(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                          const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
                          const at::Tensor& dmask, double softcap, BwdPlainScratch& s, int64_t b, int64_t kv_head) {
  const at::Tensor k_head = with_unit_column_stride(k.select(0, b).select(1, kv_head));  // [Lk, D]
  const at::Tensor v_head = with_unit_column_stride(v.select(0, b).select(1, kv_head));  // [Lk, Dv]
  if (gemm_bf16_pairs_chosen()) {
    PairProducts products(k_head, v_head, reinterpret_cast<uint32_t*>(s.tile_pairs.data_ptr<int32_t>()));
    bwd_bf16_kv_head(dout, q, k, v, out, lse, dq, dk, dv, scale, keys, mask, dmask, softcap, s, products, b, kv_head);
  } else {
    CpublasProducts products(k_head, v_head);
    bwd_bf16_kv_head(dout, q, k, v, out, lse, dq, dk, dv, scale, keys, mask, dmask, softcap, s, products, b, kv_head);
  }
}

}  // namespace

const char* bwd_bf16_products_form() {
  if (gemm_bf16_pairs_chosen()) return "avx512_bf16";
  return kHasCpublasBf16Gemm ? "cpublas" : "float32";
}

bool bwd_plain_serves(at::ScalarType dtype, const at::Tensor& lse) {
  if (!fwd_plain_serves(dtype)) return false;
  // attention_cpu_bwd.cpp's lse_too_coarse limit for float (rows the loops renormalize).
  const double limit = (1.0 / 8192) / std::numeric_limits<float>::epsilon();
  if (lse.numel() == 0) return true;
  const at::Tensor finite = at::where(at::isfinite(lse), lse, 0.f);
  return finite.abs().max().item<float>() <= limit;
}

void bwd_plain(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
               const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
               const at::Tensor& dmask, double softcap) {
  const int64_t batch = q.size(0), heads_kv = k.size(2);
  const bool bf16 = (kHasCpublasBf16Gemm || gemm_bf16_pairs_chosen()) && q.scalar_type() == at::kBFloat16;
  // Detached: the tile operations must not record autograd history when the op is called directly on
  // inputs that require grad.
  const at::Tensor dod = dout.detach(), qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
  const at::Tensor lse_f = lse.detach().to(at::kFloat);
  at::parallel_for(0, batch * heads_kv, 1, [&](int64_t begin, int64_t end) {
    BwdPlainScratch scratch(softcap != 0.0, bf16, q.size(3), v.size(3), tile_bounds(q.size(1), k.size(1)));
    for (int64_t t = begin; t < end; ++t) {
      (bf16 ? bwd_bf16_kv_head_any : bwd_plain_kv_head)(dod, qd, kd, vd, od, lse_f, dq, dk, dv, scale, keys, mask, dmask,
                                                    softcap, scratch, t / heads_kv, t % heads_kv);
    }
  });
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
