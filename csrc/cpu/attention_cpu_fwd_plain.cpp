// The CPU forward without dropout (attention_cpu_fwd_plain.h): the online softmax of
// attention_cpu_fwd.cpp over tiles of kPlainBlockQ queries x kPlainBlockK keys, each tile's S = Q K^T,
// its exponentials and O += P V run as ATen operations (a BLAS gemm, vectorized elementwise kernels)
// on float32 copies of the tiles. The tiles are large enough (a 256 x 512 score tile is 512 KiB) that
// an operation's fixed cost is small beside its work. Called from inside at::parallel_for, where ATen
// runs each operation on the calling thread, so tasks never share threads.
#include "cpu/attention_cpu_fwd_plain.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include "cpu/attention_cpu_plain_tiles.h"

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
  at::Tensor scores;   // [kPlainBlockQ * kPlainBlockK]
  at::Tensor q_tile;   // [kPlainBlockQ * D]
  at::Tensor k_tile;   // [kPlainBlockK * D]
  at::Tensor v_tile;   // [kPlainBlockK * D]
  at::Tensor acc;      // [kPlainBlockQ * D]  unnormalized output, relative to the running max

  explicit PlainScratch(int64_t head_dim)
      : scores(at::empty({kPlainBlockQ * kPlainBlockK}, at::kFloat)),
        q_tile(at::empty({kPlainBlockQ * head_dim}, at::kFloat)),
        k_tile(at::empty({kPlainBlockK * head_dim}, at::kFloat)),
        v_tile(at::empty({kPlainBlockK * head_dim}, at::kFloat)),
        acc(at::empty({kPlainBlockQ * head_dim}, at::kFloat)) {}
};

// The 16-bit products on the CPU's 16-bit matrix units (where cpublas::could_pack says they are there:
// AMX): S = Q K^T and P V read 16-bit tiles straight into float32 results through ATen's brgemm, P rounded
// to the inputs' dtype for P V as the GPU kernels round it. Without those units the tiles are float32
// copies and at::mm.
struct Matmul16 {
  // brgemm's B operand is packed in the VNNI layout, [k / 2][ld][2] (row pairs interleaved: the inner
  // dimension is kept even, an odd tile gets a zero row), at most this many columns at a time, ld a
  // multiple of 16 (what ATen's cpublas::pack writes; packed here with ATen copies, since older torch
  // builds do not export that function).
  static constexpr int64_t kPackCols = 64;
  at::ScalarType dtype;
  at::Tensor q_tile;  // [kPlainBlockQ * D]  Q, unscaled
  at::Tensor kt;      // [D * kPlainBlockK]  K^T of a key tile
  at::Tensor v_tile;  // [kPlainBlockK * D]  V of a key tile (an even row count)
  at::Tensor p_tile;  // [kPlainBlockQ * kPlainBlockK]  P in the inputs' dtype
  at::Tensor packed;  // [max(kPlainBlockK, D) * kPackCols]  one packed block of B

  static bool serves(at::ScalarType dtype, int64_t head_dim) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
    return (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 2 == 0 && at::native::cpublas::could_pack(dtype);
#else
    return false;  // a torch whose ATen has no 16-bit brgemm
#endif
  }
  Matmul16(at::ScalarType dtype, int64_t head_dim) : dtype(dtype) {
    const at::TensorOptions o = at::TensorOptions().dtype(dtype);
    q_tile = at::empty({kPlainBlockQ * head_dim}, o);
    kt = at::empty({head_dim * kPlainBlockK}, o);
    v_tile = at::empty({kPlainBlockK * head_dim}, o);
    p_tile = at::empty({kPlainBlockQ * kPlainBlockK}, o);
    packed = at::empty({std::max(kPlainBlockK, head_dim) * kPackCols}, o);
  }
  // C [m, n] (float32, row stride ld_c) = (add_c ? C : 0) + A B: A [m, k] and B [k, n] contiguous
  // row-major 16-bit matrices.
  void gemm(int64_t m, int64_t n, int64_t k, const at::Tensor& a, const at::Tensor& b, float* c, int64_t ld_c,
            bool add_c) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
    for (int64_t n0 = 0; n0 < n; n0 += kPackCols) {
      const int64_t cols = std::min(kPackCols, n - n0), ld = (cols + 15) / 16 * 16;
      const at::Tensor vnni = packed.narrow(0, 0, k * ld).view({k / 2, ld, 2});
      vnni.narrow(1, 0, cols).copy_(b.narrow(1, n0, cols).view({k / 2, 2, cols}).transpose(1, 2));
      if (ld > cols) vnni.narrow(1, cols, ld - cols).zero_();
      if (dtype == at::kBFloat16) {
        at::native::cpublas::brgemm(m, cols, k, k, ld, ld_c, add_c, a.const_data_ptr<at::BFloat16>(),
                                    packed.const_data_ptr<at::BFloat16>(), c + n0, true);
      } else {
        at::native::cpublas::brgemm(m, cols, k, k, ld, ld_c, add_c, a.const_data_ptr<at::Half>(),
                                    packed.const_data_ptr<at::Half>(), c + n0, true);
      }
    }
#endif
  }
};

void fwd_plain_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                     const at::Tensor& lse, double scale, const KeyLimit& keys, const at::Tensor& mask,
                     const float* sink, double softcap, PlainScratch& s, Matmul16* m16, int64_t b, int64_t h,
                     int64_t q0) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t head_dim = q.size(3);
  const int64_t rows = std::min(kPlainBlockQ, q.size(1) - q0);
  const int64_t kv_head = h / (q.size(2) / k.size(2));
  const at::Tensor q_rows = q.select(0, b).select(1, h).narrow(0, q0, rows);
  const at::Tensor q_tile = m16 != nullptr ? matrix(m16->q_tile, rows, head_dim).copy_(q_rows)
                                           : matrix(s.q_tile, rows, head_dim).copy_(q_rows).mul_(scale);
  const at::Tensor keys_b = k.select(0, b).select(1, kv_head), values_b = v.select(0, b).select(1, kv_head);
  const at::Tensor acc = matrix(s.acc, rows, head_dim).zero_();
  at::Tensor row_max = at::full({rows}, kNegInf, s.acc.options());
  const at::Tensor row_sum = at::zeros({rows}, s.acc.options());
  // Under a causal mask the block's last row sees the most keys; keys past it are never loaded, nor
  // keys before a sliding window's start for the first row.
  const int64_t key_stop = keys.key_end(q0 + rows - 1);
  for (int64_t k0 = keys.first_tile_key(q0, kPlainBlockK); k0 < key_stop; k0 += kPlainBlockK) {
    const int64_t cols = std::min(kPlainBlockK, key_stop - k0);
    at::Tensor scores = matrix(s.scores, rows, cols);
    at::Tensor v_tile;  // float32 [cols, D] without m16
    if (m16 != nullptr) {
      const at::Tensor kt = matrix(m16->kt, head_dim, cols).copy_(keys_b.narrow(0, k0, cols).t());
      m16->gemm(rows, cols, head_dim, q_tile, kt, scores.data_ptr<float>(), cols, false);
      scores.mul_(scale);
    } else {
      const at::Tensor k_tile = matrix(s.k_tile, cols, head_dim).copy_(keys_b.narrow(0, k0, cols));
      v_tile = matrix(s.v_tile, cols, head_dim).copy_(values_b.narrow(0, k0, cols));
      at::mm_out(scores, q_tile, k_tile.t());
    }
    if (softcap != 0.0) scores.div_(softcap).tanh_().mul_(softcap);
    if (tile_needs_causal_mask(keys, q0, rows, k0, cols)) mask_causal_tile(scores, keys, q0, k0);
    if (mask.defined()) apply_mask_tile(scores, mask_tile(mask, b, h, q0, k0, rows, cols));
    // NaN-propagating max (amax, maximum): a NaN score reaches out and lse.
    const at::Tensor new_max = at::maximum(row_max, scores.amax(1));
    // Rows with only -inf scores so far add nothing: shift them by 0, not -inf (exp(-inf - -inf) is NaN).
    const at::Tensor shift = new_max.masked_fill(new_max == kNegInf, 0.f);
    scores.sub_(shift.unsqueeze(1)).exp_();                                  // P, relative to new_max
    const at::Tensor rescale = (row_max - shift).exp_();                    // 0 on a row's first visible tile
    row_sum.mul_(rescale).add_(scores.sum(1));
    acc.mul_(rescale.unsqueeze(1));
    if (m16 != nullptr) {
      const int64_t even = (cols + 1) / 2 * 2;
      const at::Tensor p_tile = matrix(m16->p_tile, rows, even);
      p_tile.narrow(1, 0, cols).copy_(scores);
      const at::Tensor v16 = matrix(m16->v_tile, even, head_dim);
      v16.narrow(0, 0, cols).copy_(values_b.narrow(0, k0, cols));
      if (even > cols) {
        p_tile.narrow(1, cols, 1).zero_();
        v16.narrow(0, cols, 1).zero_();
      }
      m16->gemm(rows, head_dim, even, p_tile, v16, acc.data_ptr<float>(), head_dim, true);
    } else {
      acc.addmm_(scores, v_tile);
    }
    row_max = new_max;
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
  at::parallel_for(0, batch * heads_q * q_blocks, 1, [&](int64_t begin, int64_t end) {
    PlainScratch scratch(q.size(3));
    std::optional<Matmul16> m16;
    if (use_m16) m16.emplace(q.scalar_type(), q.size(3));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t q_block = t % q_blocks, h = (t / q_blocks) % heads_q, b = t / (q_blocks * heads_q);
      fwd_plain_block(qd, kd, vd, out, lse, scale, keys, mask, sink, softcap, scratch, m16 ? &*m16 : nullptr, b, h,
                      q_block * kPlainBlockQ);
    }
    if (use_m16) at::native::cpublas::brgemm_release();  // the matrix units' state of this thread
  });
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
