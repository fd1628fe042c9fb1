// The CPU forward without dropout (attention_cpu_fwd_plain.h): the online softmax of
// attention_cpu_fwd.cpp over tiles of kPlainBlockQ queries x kPlainBlockK keys, each tile's S = Q K^T
// and O += P V as ATen operations (a BLAS gemm) on float32 copies of the tiles (or 16-bit products on
// the matrix units, or bfloat16 products on AVX512-BF16 without them), its online-softmax step (max, exponentials, sum, rescale) as one vectorized pass
// per row (attention_cpu_softmax_rows.h). The tiles are large enough (a 256 x 512 score tile is 512
// KiB) that an operation's fixed cost is small beside its work. Called from inside at::parallel_for, where ATen
// runs each operation on the calling thread, so tasks never share threads.
#include "cpu/attention_cpu_fwd_plain.h"

#include <ATen/Parallel.h>

#include "cpu/attention_cpu_bwd_rows.h"
#include "cpu/attention_cpu_gemm_bf16.h"
#include "cpu/attention_cpu_matmul16.h"
#include "cpu/attention_cpu_plain_tiles.h"
#include "cpu/attention_cpu_softmax_rows.h"

#include <algorithm>
#include <limits>
#include <optional>

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

// Float32 working memory of one thread, reused across its tasks: a fresh tensor of a tile's size per
// operation would cost page faults on every call (allocations this large are mapped and unmapped by
// the C library each time).
struct PlainScratch {
  at::Tensor scores;   // [rows * cols]
  at::Tensor q_tile;   // [rows * D]
  at::Tensor k_tile;   // [cols * D]
  at::Tensor v_tile;   // [cols * D]
  at::Tensor acc;      // [rows * D]  unnormalized output, relative to the running max

  PlainScratch(int64_t head_dim, TileBounds t)
      : scores(at::empty({t.rows * t.cols}, at::kFloat)),
        q_tile(at::empty({t.rows * head_dim}, at::kFloat)),
        k_tile(at::empty({t.cols * head_dim}, at::kFloat)),
        v_tile(at::empty({t.cols * head_dim}, at::kFloat)),
        acc(at::empty({t.rows * head_dim}, at::kFloat)) {}
};

// The forward's 16-bit tiles for Matmul16, which reads Q, K and V in place: P, rounded to the inputs'
// dtype for P V as the GPU kernels round it, and a copy of V only for a key tile of odd length (padded
// with a zero row: the products' inner dimension is even).
struct Fwd16 {
  Matmul16 matmul;
  at::Tensor v_tile;  // [(cols + 1) * D]
  at::Tensor p_tile;  // [rows * (cols + 1)]

  Fwd16(at::ScalarType dtype, int64_t head_dim, TileBounds t)
      : matmul(dtype, std::max(kPlainBlockK, head_dim)),
        v_tile(at::empty({(t.cols + 1) * head_dim}, at::TensorOptions().dtype(dtype))),
        p_tile(at::empty({t.rows * (t.cols + 1)}, v_tile.options())) {}
};

// The forward's bfloat16 products on AVX512-BF16 without AMX (attention_cpu_gemm_bf16.h): each key
// tile's K^T and V in pair layout, and P rounded to bfloat16 for P V as the GPU kernels round it.
struct FwdPairs {
  at::Tensor kt_pairs;  // [ceil(D / 2) * pair_ld(cols)] words
  at::Tensor v_pairs;   // [ceil(cols / 2) * pair_ld(D)] words
  at::Tensor p16;       // [rows * cols] bfloat16

  FwdPairs(int64_t head_dim, TileBounds t)
      : kt_pairs(at::empty({(head_dim + 1) / 2 * pair_ld(t.cols)}, at::kInt)),
        v_pairs(at::empty({(t.cols + 1) / 2 * pair_ld(head_dim)}, at::kInt)),
        p16(at::empty({t.rows * t.cols}, at::kBFloat16)) {}
};

inline uint32_t* words(const at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr<int32_t>()); }

void fwd_plain_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                     const at::Tensor& lse, double scale, const KeyLimit& keys, const at::Tensor& mask,
                     const float* sink, double softcap, PlainScratch& s, Fwd16* m16, FwdPairs* pairs, int64_t b,
                     int64_t h, int64_t q0) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t head_dim = q.size(3);
  const int64_t rows = std::min(kPlainBlockQ, q.size(1) - q0);
  const int64_t kv_head = h / (q.size(2) / k.size(2));
  const at::Tensor q_rows = q.select(0, b).select(1, h).narrow(0, q0, rows);
  // With m16 or pairs, Q unscaled and in place; else a scaled float32 copy.
  const at::Tensor q_tile = m16 != nullptr  ? q_rows
                            : pairs != nullptr ? with_unit_column_stride(q_rows)
                                               : matrix(s.q_tile, rows, head_dim).copy_(q_rows).mul_(scale);
  const at::Tensor keys_b = k.select(0, b).select(1, kv_head), values_b = v.select(0, b).select(1, kv_head);
  const at::Tensor acc = matrix(s.acc, rows, head_dim).zero_();
  at::Tensor row_max = at::full({rows}, kNegInf, s.acc.options());  // updated in place by online_softmax_rows
  const at::Tensor row_sum = at::zeros({rows}, s.acc.options());
  // Under a causal mask the block's last row sees the most keys; keys past it are never loaded, nor
  // keys before a sliding window's start for the first row.
  const int64_t key_stop = keys.key_end(q0 + rows - 1);
  for (int64_t k0 = keys.first_tile_key(q0, kPlainBlockK); k0 < key_stop; k0 += kPlainBlockK) {
    const int64_t cols = std::min(kPlainBlockK, key_stop - k0);
    at::Tensor scores = matrix(s.scores, rows, cols);
    at::Tensor v_tile;  // float32 [cols, D] without m16
    if (m16 != nullptr) {
      m16->matmul.gemm(rows, cols, head_dim, q_tile, keys_b.narrow(0, k0, cols).t(), scores.data_ptr<float>(), cols,
                       false);
      scores.mul_(scale);
    } else if (pairs != nullptr) {
      const at::Tensor k_rows = with_unit_column_stride(keys_b.narrow(0, k0, cols));  // [cols, D]
      pack_pairs_of_columns(bits(k_rows), k_rows.stride(0), cols, head_dim, words(pairs->kt_pairs), pair_ld(cols));
      gemm_bf16_pairs(rows, cols, head_dim, bits(q_tile), q_tile.stride(0), words(pairs->kt_pairs), pair_ld(cols),
                      scores.data_ptr<float>(), cols, false);
      scores.mul_(scale);
    } else {
      const at::Tensor k_tile = matrix(s.k_tile, cols, head_dim).copy_(keys_b.narrow(0, k0, cols));
      v_tile = matrix(s.v_tile, cols, head_dim).copy_(values_b.narrow(0, k0, cols));
      at::mm_out(scores, q_tile, k_tile.t());
    }
    if (softcap != 0.0) scores.div_(softcap).tanh_().mul_(softcap);
    if (tile_needs_causal_mask(keys, q0, rows, k0, cols)) mask_causal_tile(scores, keys, q0, k0);
    if (mask.defined()) apply_mask_tile(scores, mask_tile(mask, b, h, q0, k0, rows, cols));
    // P relative to the rows' new max, the running max and sum, acc rescaled: one pass per row.
    online_softmax_rows(scores.data_ptr<float>(), rows, cols, row_max.data_ptr<float>(), row_sum.data_ptr<float>(),
                        acc.data_ptr<float>(), head_dim);
    if (m16 != nullptr) {
      const int64_t inner = even(cols);
      const at::Tensor p_tile = matrix(m16->p_tile, rows, inner);
      p_tile.narrow(1, 0, cols).copy_(scores);
      at::Tensor v16 = values_b.narrow(0, k0, cols);
      if (inner > cols) {
        p_tile.narrow(1, cols, 1).zero_();
        v16 = matrix(m16->v_tile, inner, head_dim);
        v16.narrow(0, 0, cols).copy_(values_b.narrow(0, k0, cols));
        v16.narrow(0, cols, 1).zero_();
      }
      m16->matmul.gemm(rows, head_dim, inner, p_tile, v16, acc.data_ptr<float>(), head_dim, true);
    } else if (pairs != nullptr) {
      to_bf16_bits(scores.data_ptr<float>(), rows * cols, bits(pairs->p16));
      const at::Tensor v_rows = with_unit_column_stride(values_b.narrow(0, k0, cols));  // [cols, D]
      pack_pairs_of_rows(bits(v_rows), v_rows.stride(0), cols, head_dim, words(pairs->v_pairs), pair_ld(head_dim));
      gemm_bf16_pairs(rows, head_dim, cols, bits(pairs->p16), cols, words(pairs->v_pairs), pair_ld(head_dim),
                      acc.data_ptr<float>(), head_dim, true);
    } else {
      acc.addmm_(scores, v_tile);
    }
  }
  // A sink adds exp(sink - m) to l, m moving up to the sink where it is larger (nothing overflows); the
  // output, relative to the old m, is scaled by exp(m_old - m), 0 for a row that saw no key.
  at::Tensor sink_factor;
  if (sink != nullptr && sink[h] != kNegInf) {
    const at::Tensor joined = at::clamp_min(row_max, sink[h]);  // NaN stays NaN
    sink_factor = (row_max - joined).exp_();
    row_sum.mul_(sink_factor).add_((sink[h] - joined).exp_());
    row_max = joined;
  }
  // out = acc / l and lse = m + log(l); a row that saw no key (l == 0) gets out = 0 and lse = -inf.
  const at::Tensor saw_keys = row_sum != 0.f;  // NaN counts as seen
  at::Tensor inv_sum = row_sum.reciprocal();
  if (sink_factor.defined()) inv_sum.mul_(sink_factor);
  acc.mul_(at::where(saw_keys, inv_sum, 0.f).unsqueeze(1));
  out.select(0, b).select(1, h).narrow(0, q0, rows).copy_(acc);
  lse.select(0, b).select(0, h).narrow(0, q0, rows).copy_(at::where(saw_keys, row_max + row_sum.log(), kNegInf));
}

}  // namespace

bool matrix_units_serve(at::ScalarType dtype, int64_t head_dim) { return Matmul16::serves(dtype, head_dim); }

const char* fwd_bf16_products_form() {
  if (matrix_units_serve(at::kBFloat16, 64)) return "matrix_units";
  return gemm_bf16_pairs_chosen() ? "avx512_bf16" : "float32";
}

void fwd_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
               const at::Tensor& lse, double scale, const KeyLimit& keys, const at::Tensor& mask, const float* sink,
               double softcap) {
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads_q = q.size(2);
  const int64_t q_blocks = (seqlen_q + kPlainBlockQ - 1) / kPlainBlockQ;
  // Each task, a (batch, query head, query block), writes its own rows of out and lse.
  // Detached: the tile copies must not record autograd history when the op's kernel is called
  // directly on inputs that require grad.
  const at::Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
  const bool use_m16 = matrix_units_serve(q.scalar_type(), q.size(3));
  const bool use_pairs = !use_m16 && q.scalar_type() == at::kBFloat16 && gemm_bf16_pairs_chosen();
  const TileBounds tiles = tile_bounds(seqlen_q, k.size(1));
  at::parallel_for(0, batch * heads_q * q_blocks, 1, [&](int64_t begin, int64_t end) {
    PlainScratch scratch(q.size(3), tiles);
    std::optional<Fwd16> m16;
    if (use_m16) m16.emplace(q.scalar_type(), q.size(3), tiles);
    std::optional<FwdPairs> pairs;
    if (use_pairs) pairs.emplace(q.size(3), tiles);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t q_block = t % q_blocks, h = (t / q_blocks) % heads_q, b = t / (q_blocks * heads_q);
      fwd_plain_block(qd, kd, vd, out, lse, scale, keys, mask, sink, softcap, scratch, m16 ? &*m16 : nullptr,
                      pairs ? &*pairs : nullptr, b, h, q_block * kPlainBlockQ);
    }
    if (use_m16) Matmul16::release();
  });
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
