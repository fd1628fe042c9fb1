// CPU backward: recomputes the probabilities tile by tile from q, k and the saved lse, as the GPU
// kernels do, instead of storing P.
//
// Design: one task = one (batch, key/value head). Its query heads are exactly the group that reads
// that kv head, so the task alone writes its dk/dv rows (no cross-thread sums, deterministic) and the
// dq rows of its group. Within a task the outer loop walks key blocks, keeping the block's dk/dv in
// small accumulators, and the inner loop streams every query row of the group that sees the block:
//   P_ij  = exp(scale * q_i.k_j - lse_i)        dV_j += P_ij dO_i
//   dP_ij = dO_i.v_j                             dS_ij = P_ij (dP_ij - delta_i),  delta_i = dO_i.O_i
//   dQ_i += scale * dS_ij k_j                    dK_j += scale * dS_ij q_i
// q, dO and the dq accumulator of the group are converted/held in the accumulation type once per
// task (O(group * Lq * D) memory), since every key block revisits them.
// With an attention mask the scores are  scale * q_i.k_j + mask_ij  (the forward's masked_score), keys
// the mask excludes take no part, and dS, the gradient of the loss w.r.t. that pre-softmax score, is
// also the mask's gradient: when asked for, it is written to dmask, whose rows of a head belong to the
// one task that owns the head's group.
// With dropout (keep factor Z_ij / (1 - p), regenerated from the forward's rng_state) the forward's
// weights of V are P_ij Z_ij / (1 - p), so dV_j += P_ij Z_ij / (1 - p) dO_i and dP_ij carries the same
// factor; dS = P (dP - delta) and delta = dO_i.O_i hold as they are (O is the dropped output).
// exp(score - lse) is only as precise as lse: a row whose |lse| is huge (every key it sees carries an
// additive mask like finfo.min) gets its max score and sum recomputed instead (renormalize_row).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.h"
#include "cpu/attention_cpu_bwd_plain.h"
#include "cpu/attention_cpu_dropout.h"
#include "cpu/attention_cpu_fwd_plain.h"
#include "cpu/attention_cpu_mask.h"
#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace {

using namespace detail;

template <typename scalar_t>
struct BwdProblem {
  using acc_t = acc_type<scalar_t>;
  RowsView<const scalar_t> dout;  // [B, Lq, Hq, D]
  RowsView<const scalar_t> q;     // [B, Lq, Hq, D]
  RowsView<const scalar_t> k;     // [B, Lk, Hk, D]
  RowsView<const scalar_t> v;     // [B, Lk, Hk, D]
  RowsView<const scalar_t> out;   // [B, Lq, Hq, D]
  const acc_t* lse;               // [B, Hq, Lq] contiguous
  RowsView<scalar_t> dq;          // [B, Lq, Hq, D]
  RowsView<scalar_t> dk;          // [B, Lk, Hk, D]
  RowsView<scalar_t> dv;          // [B, Lk, Hk, D]
  int64_t seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int64_t group;  // query heads per key/value head
  acc_t scale;
  acc_t softcap;  // the forward's score cap (0: none)
  KeyLimit keys;
  MaskView<scalar_t> mask;       // [B, Hq, Lq, Lk] any strides, or none
  MaskGradView<scalar_t> dmask;  // [B, Hq, Lq, Lk] contiguous, zero-filled by the caller, or none
  DropoutRows dropout;           // the forward's; disabled without dropout
};

// Working memory of one (batch, kv head) task, allocated once per thread and reused.
template <typename acc_t>
struct BwdScratch {
  // The whole query-head group; row (g, i) lives at (g * Lq + i) * D.
  std::vector<acc_t> q_rows;     // [group, Lq, D]
  std::vector<acc_t> dout_rows;  // [group, Lq, D]
  std::vector<acc_t> dq_acc;     // [group, Lq, D]  sum_j dS_ij k_j (scale applied on store)
  // P_ij = exp(score_ij - lse_i) * prob_scale_i, with the forward's lse and prob_scale 1, except in
  // rows renormalize_row handles, where lse_i is the row's max score and prob_scale_i 1 / its sum.
  std::vector<acc_t> lse;         // [group, Lq]
  std::vector<acc_t> prob_scale;  // [group, Lq]
  std::vector<acc_t> delta;       // [group, Lq]     dO_i . O_i
  // One key block.
  std::vector<acc_t> k_tile;   // [kBlockK, D]
  std::vector<acc_t> kT_tile;  // [D, kBlockK]
  std::vector<acc_t> vT_tile;  // [D, kBlockK]
  std::vector<acc_t> dk_acc;   // [kBlockK, D]  sum_i dS_ij q_i (scale applied on store)
  std::vector<acc_t> dv_acc;   // [kBlockK, D]
  std::vector<acc_t> probs;    // [kBlockK]     P_ij of one query row
  std::vector<acc_t> dscores;  // [kBlockK]     dP_ij, then dS_ij, of one query row
  std::vector<acc_t> bias;     // [kBlockK]     one query row's additive mask (with a mask only)
  std::vector<acc_t> drop;     // [kBlockK]     one query row's dropout factors (with dropout only)
  std::vector<acc_t> kept_probs;  // [kBlockK]  P_ij times the dropout factor (with dropout only)
  std::vector<acc_t> chain;       // [kBlockK]  d capped score / d score (with a score cap only)

  BwdScratch(int64_t group, int64_t seqlen_q, int64_t head_dim)
      : q_rows(group * seqlen_q * head_dim),
        dout_rows(group * seqlen_q * head_dim),
        dq_acc(group * seqlen_q * head_dim),
        lse(group * seqlen_q),
        prob_scale(group * seqlen_q),
        delta(group * seqlen_q),
        k_tile(kBlockK * head_dim),
        kT_tile(head_dim * kBlockK),
        vT_tile(head_dim * kBlockK),
        dk_acc(kBlockK * head_dim),
        dv_acc(kBlockK * head_dim),
        probs(kBlockK),
        dscores(kBlockK),
        bias(kBlockK),
        drop(kBlockK),
        kept_probs(kBlockK),
        chain(kBlockK) {}
};

// Whether exp(score - lse) is too coarse for a row: lse is rounded to acc_t, so P carries a relative
// error of about |lse| * epsilon. Past |lse| = 2^-13 / epsilon (1024 in float, 2^39 in double), which
// only huge scores or additive masks reach (a row whose every key carries a mask value like
// finfo.min has lse = m + log(l) with log(l) lost entirely, so P would be 1 for every key), the row's
// normalizer is recomputed instead.
template <typename acc_t>
bool lse_too_coarse(acc_t lse) {
  const acc_t limit = acc_t(1.0 / 8192) / std::numeric_limits<acc_t>::epsilon();
  return std::isfinite(lse) && std::abs(lse) > limit;
}

// For such a row (query i of head h, row index `row` of the group): the max m of the scores the
// forward computed and l = sum_j exp(score_j - m), recomputed over the keys the row sees, so that
// P = exp(score - m) / l. O(Lk * D), in plain loops; only these rare rows pay it.
template <typename scalar_t>
void renormalize_row(const BwdProblem<scalar_t>& p, BwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t kv_head,
                     int64_t h, int64_t i, int64_t row) {
  using acc_t = acc_type<scalar_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  const int64_t D = p.head_dim;
  const acc_t* q_row = s.q_rows.data() + row * D;  // [D]
  acc_t* scores = s.probs.data();                  // [kBlockK], free until the key blocks start
  acc_t row_max = kNegInf, row_sum = 0;
  const int64_t key_end = p.keys.key_end(i);
  for (int64_t k0 = p.keys.key_begin(i); k0 < key_end; k0 += kBlockK) {
    const int64_t n = std::min(kBlockK, key_end - k0);
    for (int64_t j = 0; j < n; ++j) {
      const scalar_t* k_row = p.k.row(b, k0 + j, kv_head);  // [D]
      acc_t dot = 0;  // summed over d in order, as row_times_tile_transposed does
      for (int64_t d = 0; d < D; ++d) dot += q_row[d] * static_cast<acc_t>(k_row[d]);
      scores[j] = soft_capped(dot * p.scale, p.softcap);
    }
    if (p.mask.present()) {
      p.mask.load_row(s.bias.data(), b, h, i, k0, n);
      for (int64_t j = 0; j < n; ++j) scores[j] = masked_score(scores[j], s.bias[j]);
    }
    // The forward's lse is finite, so are its scores (or -inf): no NaN to keep here.
    acc_t new_max = row_max;
    for (int64_t j = 0; j < n; ++j) new_max = std::max(new_max, scores[j]);
    if (new_max == kNegInf) continue;
    acc_t tile_sum = 0;
    for (int64_t j = 0; j < n; ++j) tile_sum += std::exp(scores[j] - new_max);
    row_sum = row_sum * std::exp(row_max - new_max) + tile_sum;
    row_max = new_max;
  }
  s.lse[row] = row_max;
  s.prob_scale[row] = acc_t(1) / row_sum;
}

// Loads the group's q, dout and lse, computes delta, and clears the dq accumulator.
template <typename scalar_t>
void load_query_group(const BwdProblem<scalar_t>& p, BwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t kv_head) {
  using acc_t = acc_type<scalar_t>;
  const int64_t D = p.head_dim, Lq = p.seqlen_q;
  for (int64_t g = 0; g < p.group; ++g) {
    const int64_t h = kv_head * p.group + g;
    load_rows(s.q_rows.data() + g * Lq * D, p.q, b, 0, h, Lq, D);
    load_rows(s.dout_rows.data() + g * Lq * D, p.dout, b, 0, h, Lq, D);
    const acc_t* lse_row = p.lse + (b * p.heads_q + h) * Lq;  // [Lq]
    for (int64_t i = 0; i < Lq; ++i) {
      s.lse[g * Lq + i] = lse_row[i];
      s.prob_scale[g * Lq + i] = acc_t(1);
      if (lse_too_coarse(lse_row[i])) renormalize_row(p, s, b, kv_head, h, i, g * Lq + i);
      const acc_t* dout_row = s.dout_rows.data() + (g * Lq + i) * D;
      const scalar_t* out_row = p.out.row(b, i, h);  // [D]
      acc_t dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += dout_row[d] * static_cast<acc_t>(out_row[d]);
      s.delta[g * Lq + i] = dot;
    }
  }
  std::fill(s.dq_acc.begin(), s.dq_acc.end(), acc_t(0));
}

// One query row against the first n keys of the current key block: recomputes P and dS for the row
// and adds the row's share to dv_acc, dk_acc and its own dq accumulator; dS stays in s.dscores.
// bias: the row's additive mask for those keys, or null without a mask; keys it excludes (-inf) get
// dS = 0 and are left out of the sums. drop: the row's dropout factors (1 / (1 - p) or 0), or null
// without dropout: they weight dO into dv and scale dP, as the forward weighted V.
template <typename acc_t>
void backprop_row(BwdScratch<acc_t>& s, int64_t row, int64_t first, int64_t n, int64_t head_dim, acc_t scale,
                  acc_t softcap, const acc_t* bias, const acc_t* drop) {
  const acc_t* q_row = s.q_rows.data() + row * head_dim;        // [D]
  const acc_t* dout_row = s.dout_rows.data() + row * head_dim;  // [D]
  acc_t* dq_row = s.dq_acc.data() + row * head_dim;             // [D]
  const acc_t lse = s.lse[row], prob_scale = s.prob_scale[row], delta = s.delta[row];
  acc_t* probs = s.probs.data();
  acc_t* dscores = s.dscores.data();
  // The tile's keys [first, first + n): columns of the transposed tiles, rows of the others.
  const acc_t* kT = s.kT_tile.data() + first;
  const acc_t* vT = s.vT_tile.data() + first;
  const acc_t* k_rows = s.k_tile.data() + first * head_dim;
  acc_t* dk_rows = s.dk_acc.data() + first * head_dim;
  acc_t* dv_rows = s.dv_acc.data() + first * head_dim;

  row_times_tile_transposed(probs, q_row, kT, n, head_dim);
  const bool capped = softcap != acc_t(0);
  if (capped) {
    // The cap's chain factor 1 - tanh^2, and the capped score in place of the dot product.
    for (int64_t j = 0; j < n; ++j) {
      const acc_t t = std::tanh(probs[j] * scale / softcap);
      s.chain[j] = acc_t(1) - t * t;
      probs[j] = softcap * t;
    }
    scale = acc_t(1);
  }
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) probs[j] = std::exp(probs[j] * scale - lse);
  } else {
    // The forward's score, bit for bit; an excluded key gets P = exp(-inf) = 0.
    for (int64_t j = 0; j < n; ++j) probs[j] = std::exp(masked_score(probs[j] * scale, bias[j]) - lse);
  }
  if (prob_scale != acc_t(1)) {
    for (int64_t j = 0; j < n; ++j) probs[j] *= prob_scale;
  }
  row_times_tile_transposed(dscores, dout_row, vT, n, head_dim);
  // The weights of dO in dv: the forward's weights of V.
  const acc_t* v_weights = probs;
  if (drop != nullptr) {
    acc_t* kept = s.kept_probs.data();
    for (int64_t j = 0; j < n; ++j) {
      kept[j] = probs[j] * drop[j];
      dscores[j] *= drop[j];
    }
    v_weights = kept;
  }
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) dscores[j] = probs[j] * (dscores[j] - delta);
    if (capped) {
      for (int64_t j = 0; j < n; ++j) dscores[j] *= s.chain[j];
    }
    add_outer(dv_rows, v_weights, dout_row, n, head_dim);
    add_outer(dk_rows, dscores, q_row, n, head_dim);
    add_weighted_rows(dq_row, dscores, k_rows, n, head_dim);
  } else {
    constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
    for (int64_t j = 0; j < n; ++j) dscores[j] = bias[j] == kNegInf ? acc_t(0) : probs[j] * (dscores[j] - delta);
    if (capped) {
      for (int64_t j = 0; j < n; ++j) dscores[j] *= s.chain[j];
    }
    add_outer_kept(dv_rows, v_weights, dout_row, bias, n, head_dim);
    add_outer_kept(dk_rows, dscores, q_row, bias, n, head_dim);
    add_weighted_kept_rows(dq_row, dscores, k_rows, bias, n, head_dim);
  }
}

// Accumulates and writes dk/dv of keys [k0, k0 + cols) from every query row of the group.
template <typename scalar_t>
void bwd_key_block(const BwdProblem<scalar_t>& p, BwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t kv_head,
                   int64_t k0) {
  using acc_t = acc_type<scalar_t>;
  const int64_t D = p.head_dim, Lq = p.seqlen_q;
  const int64_t cols = std::min(kBlockK, p.seqlen_k - k0);
  load_rows(s.k_tile.data(), p.k, b, k0, kv_head, cols, D);
  load_rows_transposed(s.kT_tile.data(), p.k, b, k0, kv_head, cols, D);
  load_rows_transposed(s.vT_tile.data(), p.v, b, k0, kv_head, cols, D);
  std::fill(s.dk_acc.begin(), s.dk_acc.end(), acc_t(0));
  std::fill(s.dv_acc.begin(), s.dv_acc.end(), acc_t(0));

  const int64_t first_query = p.keys.first_query_seeing(k0, Lq);
  const int64_t query_end = p.keys.query_end_seeing(k0 + cols - 1, Lq);
  for (int64_t g = 0; g < p.group; ++g) {
    const int64_t h = kv_head * p.group + g;
    for (int64_t i = first_query; i < query_end; ++i) {
      // A row that saw no key in the forward (lse = -inf) has no probabilities to differentiate (its
      // dmask row stays zero).
      if (s.lse[g * Lq + i] == -std::numeric_limits<acc_t>::infinity()) continue;
      const KeyLimit::TileKeys seen = p.keys.visible_in_tile(i, k0, cols);
      const int64_t n = seen.count, key0 = k0 + seen.first;
      if (n == 0) continue;
      const acc_t* bias = nullptr;
      if (p.mask.present()) {
        // A row with no key kept in this block has nothing to add here (its dmask stays zero).
        if (!p.mask.load_row(s.bias.data(), b, h, i, key0, n)) continue;
        bias = s.bias.data();
      }
      const acc_t* drop = nullptr;
      if (p.dropout.enabled) {
        p.dropout.factor_row(s.drop.data(), b * p.heads_q + h, i, key0, n);
        drop = s.drop.data();
      }
      backprop_row(s, g * Lq + i, seen.first, n, D, p.scale, p.softcap, bias, drop);
      if (p.dmask.present()) p.dmask.store_row(s.dscores.data(), b, h, i, key0, n);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    store_row(p.dk, b, k0 + j, kv_head, s.dk_acc.data() + j * D, p.scale, D);
    store_row(p.dv, b, k0 + j, kv_head, s.dv_acc.data() + j * D, acc_t(1), D);
  }
}

template <typename scalar_t>
void bwd_kv_head(const BwdProblem<scalar_t>& p, BwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t kv_head) {
  const int64_t D = p.head_dim, Lq = p.seqlen_q;
  load_query_group(p, s, b, kv_head);
  for (int64_t k0 = 0; k0 < p.seqlen_k; k0 += kBlockK) bwd_key_block(p, s, b, kv_head, k0);
  // Every dq row is written, so rows that see no key (or Lk == 0) come out as zeros.
  for (int64_t g = 0; g < p.group; ++g) {
    for (int64_t i = 0; i < Lq; ++i) {
      store_row(p.dq, b, i, kv_head * p.group + g, s.dq_acc.data() + (g * Lq + i) * D, p.scale, D);
    }
  }
}

template <typename scalar_t>
void run_bwd(const BwdProblem<scalar_t>& p, int64_t batch) {
  at::parallel_for(0, batch * p.heads_kv, 1, [&](int64_t begin, int64_t end) {
    BwdScratch<acc_type<scalar_t>> scratch(p.group, p.seqlen_q, p.head_dim);
    for (int64_t t = begin; t < end; ++t) bwd_kv_head(p, scratch, t / p.heads_kv, t % p.heads_kv);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   double scale, bool is_causal, int64_t causal_offset,
                                                   const std::optional<at::Tensor>& attn_mask,
                                                   const std::optional<at::Tensor>& dmask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state, double softcap,
                                                   int64_t window_span) {
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads_q = q.size(2), head_dim = q.size(3);
  const int64_t seqlen_k = k.size(1), heads_kv = k.size(2);
  at::Tensor dq = at::empty({batch, seqlen_q, heads_q, head_dim}, q.options());
  at::Tensor dk = at::empty({batch, seqlen_k, heads_kv, head_dim}, k.options());
  at::Tensor dv = at::empty({batch, seqlen_k, heads_kv, head_dim}, v.options());
  if (heads_q == 0) {
    // No query head reads any key: the gradients of k and v (if they have heads) are zero.
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }

  if (dropout_p == 0.0 && bwd_plain_serves(q.scalar_type(), lse) &&
      (!attn_mask.has_value() || tiles_take_mask(k, v))) {
    bwd_plain(dout, q, k, v, out, lse, dq, dk, dv, scale, KeyLimit{is_causal, causal_offset, seqlen_k, window_span},
              attn_mask.has_value() ? attn_mask->detach() : at::Tensor(), dmask.has_value() ? *dmask : at::Tensor(),
              softcap);
    return {dq, dk, dv};
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "flashattn_bwd_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    // The forward's lse already has this dtype; a float32 lse for float64 inputs is accepted too.
    const at::Tensor lse_acc = lse.to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
    BwdProblem<scalar_t> p{rows_view<const scalar_t>(dout),
                           rows_view<const scalar_t>(q),
                           rows_view<const scalar_t>(k),
                           rows_view<const scalar_t>(v),
                           rows_view<const scalar_t>(out),
                           lse_acc.data_ptr<acc_t>(),
                           rows_view<scalar_t>(dq),
                           rows_view<scalar_t>(dk),
                           rows_view<scalar_t>(dv),
                           seqlen_q,
                           seqlen_k,
                           heads_q,
                           heads_kv,
                           head_dim,
                           heads_q / heads_kv,
                           static_cast<acc_t>(scale),
                           static_cast<acc_t>(softcap),
                           KeyLimit{is_causal, causal_offset, seqlen_k, window_span},
                           mask_view<scalar_t>(attn_mask),
                           mask_grad_view<scalar_t>(dmask, heads_q, seqlen_q, seqlen_k),
                           dropout_rows(dropout_p, rng_state)};
    run_bwd(p, batch);
  });
  return {dq, dk, dv};
}

}  // namespace cpu
}  // namespace flashattn
