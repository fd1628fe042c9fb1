// The CPU backward without dropout (attention_cpu_bwd_plain.h). One task per (batch, key/value
// head): its whole dK and dV in float32, and for each of its query heads' blocks of kPlainBlockQ rows
// the key blocks of kPlainBlockK keys they see, each block's
//   S = (scale Q) K^T (capped with softcap), P = exp(S - lse), dV += P^T dO, dP = dO V^T,
//   dS = P (dP - delta) (times 1 - tanh^2 with softcap), dQ += dS K, dK += dS^T Q
// as ATen operations on the calling thread (at::parallel_for runs each task's operations there), in
// per-thread buffers (fresh tile-sized tensors per operation cost page faults).
#include "cpu/attention_cpu_bwd_plain.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/attention_cpu_fwd_plain.h"
#include "cpu/attention_cpu_plain_tiles.h"

namespace flashattn {
namespace cpu {
namespace detail {
namespace {

struct BwdPlainScratch {
  at::Tensor scores;  // [kPlainBlockQ * kPlainBlockK]  S, then P
  at::Tensor dp;      // [kPlainBlockQ * kPlainBlockK]  dP, then dS
  at::Tensor chain;   // [kPlainBlockQ * kPlainBlockK]  1 - tanh^2 (with softcap only)

  explicit BwdPlainScratch(bool softcapped)
      : scores(at::empty({kPlainBlockQ * kPlainBlockK}, at::kFloat)),
        dp(at::empty({kPlainBlockQ * kPlainBlockK}, at::kFloat)),
        chain(softcapped ? at::empty({kPlainBlockQ * kPlainBlockK}, at::kFloat) : at::Tensor()) {}
};

void bwd_plain_kv_head(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                       const at::Tensor& dv, double scale, const KeyLimit& keys, const at::Tensor& mask,
                       const at::Tensor& dmask, double softcap, BwdPlainScratch& s, int64_t b, int64_t kv_head) {
  const int64_t seqlen_q = q.size(1), group = q.size(2) / k.size(2);
  const at::Tensor keys_f = k.select(0, b).select(1, kv_head).to(at::kFloat);    // [Lk, D]
  const at::Tensor values_f = v.select(0, b).select(1, kv_head).to(at::kFloat);  // [Lk, D]
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
      const at::Tensor do_f = dout.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat);  // [rows, D]
      const at::Tensor delta = (do_f * out.select(0, b).select(1, h).narrow(0, q0, rows).to(at::kFloat)).sum(1, true);
      // A row that saw no key has lse -inf: +inf instead gives it P = 0 (not exp(-inf + inf)).
      at::Tensor row_lse = lse.select(0, b).select(0, h).narrow(0, q0, rows).unsqueeze(1);  // [rows, 1]
      row_lse = at::where(at::isneginf(row_lse), std::numeric_limits<float>::infinity(), row_lse);
      const at::Tensor dq_acc = at::zeros_like(q_f);
      const int64_t key_stop = keys.key_end(q0 + rows - 1);
      for (int64_t k0 = keys.first_tile_key(q0, kPlainBlockK); k0 < key_stop; k0 += kPlainBlockK) {
        const int64_t cols = std::min(kPlainBlockK, key_stop - k0);
        const at::Tensor k_tile = keys_f.narrow(0, k0, cols), v_tile = values_f.narrow(0, k0, cols);
        at::Tensor p = matrix(s.scores, rows, cols);
        at::mm_out(p, q_scaled, k_tile.t());
        at::Tensor chain;
        if (softcap != 0.0) {
          chain = matrix(s.chain, rows, cols);
          p.div_(softcap).tanh_();
          at::mul_out(chain, p, p).neg_().add_(1.0);  // 1 - tanh^2
          p.mul_(softcap);
        }
        if (tile_needs_causal_mask(keys, q0, rows, k0, cols)) mask_causal_tile(p, keys, q0, k0);
        at::Tensor tile;
        if (mask.defined()) {
          tile = mask_tile(mask, b, h, q0, k0, rows, cols);
          apply_mask_tile(p, tile);
        }
        p.sub_(row_lse).exp_();
        dv_acc.narrow(0, k0, cols).addmm_(p.t(), do_f);
        at::Tensor ds = matrix(s.dp, rows, cols);
        at::mm_out(ds, do_f, v_tile.t());
        ds.sub_(delta).mul_(p);
        if (tile.defined()) {
          ds.masked_fill_(excluded(tile), 0.f);  // an excluded key's dS is 0, whatever dP is
          if (dmask.defined()) mask_tile(dmask, b, h, q0, k0, rows, cols).copy_(ds);
        }
        if (chain.defined()) ds.mul_(chain);
        dq_acc.addmm_(ds, k_tile);
        dk_acc.narrow(0, k0, cols).addmm_(ds.t(), q_f);
      }
      dq.select(0, b).select(1, h).narrow(0, q0, rows).copy_(dq_acc.mul_(scale));
    }
  }
  dk.select(0, b).select(1, kv_head).copy_(dk_acc.mul_(scale));
  dv.select(0, b).select(1, kv_head).copy_(dv_acc);
}

}  // namespace

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
  // Detached: the tile operations must not record autograd history when the op is called directly on
  // inputs that require grad.
  const at::Tensor dod = dout.detach(), qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
  const at::Tensor lse_f = lse.detach().to(at::kFloat);
  at::parallel_for(0, batch * heads_kv, 1, [&](int64_t begin, int64_t end) {
    BwdPlainScratch scratch(softcap != 0.0);
    for (int64_t t = begin; t < end; ++t) {
      bwd_plain_kv_head(dod, qd, kd, vd, od, lse_f, dq, dk, dv, scale, keys, mask, dmask, softcap, scratch,
                        t / heads_kv, t % heads_kv);
    }
  });
}

}  // namespace detail
}  // namespace cpu
}  // namespace flashattn
