// CPU forward: the GPU kernels' tiled online-softmax algorithm in plain loops.
//
// Design: one task = one (batch, query head, block of kBlockQ queries). The task walks the key/value
// blocks its rows can see, keeping per row a running max m, a running sum l and an unnormalized output
// acc; when a new block raises m, acc and l are rescaled by exp(m_old - m_new). At the end
// out = acc / l and lse = m + log(l). Only O(kBlockQ * kBlockK) scores ever exist at once.
// An attention mask is read row by row into a small additive bias (attention_cpu_mask.h) and applied
// to the scaled scores of the keys the causal limit leaves; without a mask that step is skipped.
// With dropout, the row's keep factors (attention_cpu_dropout.h) weight the V rows after the row sum
// has taken the undropped probabilities, so l and the LSE are those of the undropped softmax.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.h"
#include "cpu/attention_cpu_dropout.h"
#include "cpu/attention_cpu_fwd_plain.h"
#include "cpu/attention_cpu_mask.h"
#include "cpu/attention_cpu_tiles.h"

namespace flashattn {
namespace cpu {
namespace {

using namespace detail;

template <typename scalar_t>
struct FwdProblem {
  using acc_t = acc_type<scalar_t>;
  RowsView<const scalar_t> q;  // [B, Lq, Hq, D]
  RowsView<const scalar_t> k;  // [B, Lk, Hk, D]
  RowsView<const scalar_t> v;  // [B, Lk, Hk, D]
  RowsView<scalar_t> out;      // [B, Lq, Hq, D]
  acc_t* lse;                  // [B, Hq, Lq] contiguous
  int64_t seqlen_q, heads_q, head_dim;
  int64_t group;  // query heads per key/value head
  acc_t scale;
  KeyLimit keys;
  MaskView<scalar_t> mask;  // [B, Hq, Lq, Lk] any strides, or none
  DropoutRows dropout;      // disabled without dropout
  const acc_t* sink;        // [Hq] logits, or nullptr
  acc_t softcap;            // scores capped to softcap * tanh(score / softcap); 0: none
};

// Working memory of one query block, allocated once per thread and reused across its tasks.
template <typename acc_t>
struct FwdScratch {
  std::vector<acc_t> q_tile;   // [kBlockQ, D]
  std::vector<acc_t> kT_tile;  // [D, kBlockK]  (transposed: see row_times_tile_transposed)
  std::vector<acc_t> v_tile;   // [kBlockK, D]
  std::vector<acc_t> out_acc;  // [kBlockQ, D]  unnormalized output, relative to row_max
  std::vector<acc_t> row_max;  // [kBlockQ]     running max of the scaled scores (m)
  std::vector<acc_t> row_sum;  // [kBlockQ]     running sum of exp(score - m) (l)
  std::vector<acc_t> probs;    // [kBlockK]     one row's scores, then their exponentials
  std::vector<acc_t> bias;     // [kBlockK]     one row's additive mask (with a mask only)
  std::vector<acc_t> drop;     // [kBlockK]     one row's dropout factors (with dropout only)

  explicit FwdScratch(int64_t head_dim)
      : q_tile(kBlockQ * head_dim),
        kT_tile(head_dim * kBlockK),
        v_tile(kBlockK * head_dim),
        out_acc(kBlockQ * head_dim),
        row_max(kBlockQ),
        row_sum(kBlockQ),
        probs(kBlockK),
        bias(kBlockK),
        drop(kBlockK) {}
};

// max that keeps a NaN (std::max drops it when it comes second): a NaN score must reach out and lse.
template <typename acc_t>
acc_t nan_propagating_max(acc_t a, acc_t b) {
  return (std::isnan(a) || a > b) ? a : b;
}

// Folds the first n keys of a K/V tile into one query row's running softmax. bias: the row's additive
// mask for those keys, or null without a mask; keys it excludes (-inf) take no part. drop: the row's
// dropout factors for those keys (1 / (1 - p) or 0), or null without dropout; they weight V only.
template <typename acc_t>
void fold_tile_into_row(const acc_t* q_row, const acc_t* kT_tile, const acc_t* v_tile, const acc_t* bias,
                        const acc_t* drop, int64_t n, int64_t head_dim, acc_t scale, acc_t softcap, acc_t* probs,
                        acc_t& row_max, acc_t& row_sum, acc_t* out_acc_row) {
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  row_times_tile_transposed(probs, q_row, kT_tile, n, head_dim);
  acc_t tile_max = kNegInf;
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      probs[j] = soft_capped(probs[j] * scale, softcap);
      tile_max = nan_propagating_max(tile_max, probs[j]);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      probs[j] = masked_score(soft_capped(probs[j] * scale, softcap), bias[j]);
      tile_max = nan_propagating_max(tile_max, probs[j]);
    }
  }
  const acc_t new_max = nan_propagating_max(row_max, tile_max);
  // Only -inf scores so far (excluded keys, infinite inputs): they add nothing, and exp(-inf - -inf)
  // would be NaN. A row whose every key the mask excludes stays empty here.
  if (new_max == kNegInf) return;
  // exp(-inf) = 0 on the row's first visible tile, which discards the empty initial acc and l.
  const acc_t rescale = std::exp(row_max - new_max);
  acc_t tile_sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    probs[j] = std::exp(probs[j] - new_max);
    tile_sum += probs[j];
  }
  row_sum = row_sum * rescale + tile_sum;
  if (drop != nullptr) {
    for (int64_t j = 0; j < n; ++j) probs[j] *= drop[j];
  }
  if (rescale != acc_t(1)) {
    for (int64_t d = 0; d < head_dim; ++d) out_acc_row[d] *= rescale;
  }
  if (bias == nullptr) {
    add_weighted_rows(out_acc_row, probs, v_tile, n, head_dim);
  } else {
    add_weighted_kept_rows(out_acc_row, probs, v_tile, bias, n, head_dim);
  }
  row_max = new_max;
}

// out = acc / l and lse = m + log(l) for the block's rows; a row that saw no key (l == 0) gets
// out = 0 and lse = -inf, the values of an empty softmax; a NaN score gives NaN in both. A sink adds
// exp(sink - m) to l first (m moving up to the sink where it is larger, so nothing overflows).
template <typename scalar_t>
void write_query_block(const FwdProblem<scalar_t>& p, FwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t h,
                       int64_t q0, int64_t rows) {
  using acc_t = acc_type<scalar_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  acc_t* lse_row = p.lse + (b * p.heads_q + h) * p.seqlen_q;  // [Lq]
  for (int64_t r = 0; r < rows; ++r) {
    acc_t l = s.row_sum[r], m = s.row_max[r], factor = 1;
    if (p.sink != nullptr) {
      const acc_t joined = nan_propagating_max(m, p.sink[h]);
      if (joined != kNegInf) {
        factor = std::exp(m - joined);  // 0 for a row that saw no key
        l = l * factor + std::exp(p.sink[h] - joined);
        m = joined;
      }
    }
    const bool saw_keys = l != acc_t(0);  // NaN (a NaN score) counts as seen: out and lse become NaN
    store_row(p.out, b, q0 + r, h, s.out_acc.data() + r * p.head_dim, saw_keys ? factor / l : acc_t(0),
              p.head_dim);
    lse_row[q0 + r] = saw_keys ? m + std::log(l) : kNegInf;
  }
}

template <typename scalar_t>
void fwd_query_block(const FwdProblem<scalar_t>& p, FwdScratch<acc_type<scalar_t>>& s, int64_t b, int64_t h,
                     int64_t q0) {
  using acc_t = acc_type<scalar_t>;
  const int64_t D = p.head_dim;
  const int64_t rows = std::min(kBlockQ, p.seqlen_q - q0);
  const int64_t kv_head = h / p.group;
  const int64_t bh = b * p.heads_q + h;  // the dropout row group

  load_rows(s.q_tile.data(), p.q, b, q0, h, rows, D);
  std::fill(s.out_acc.begin(), s.out_acc.end(), acc_t(0));
  std::fill(s.row_max.begin(), s.row_max.end(), -std::numeric_limits<acc_t>::infinity());
  std::fill(s.row_sum.begin(), s.row_sum.end(), acc_t(0));

  // Under a causal mask the block's last row sees the most keys; keys past it are never loaded, nor
  // keys before a sliding window's start for the first row.
  const int64_t key_stop = p.keys.key_end(q0 + rows - 1);
  for (int64_t k0 = p.keys.first_tile_key(q0, kBlockK); k0 < key_stop; k0 += kBlockK) {
    const int64_t cols = std::min(kBlockK, key_stop - k0);
    load_rows_transposed(s.kT_tile.data(), p.k, b, k0, kv_head, cols, D);
    load_rows(s.v_tile.data(), p.v, b, k0, kv_head, cols, D);
    for (int64_t r = 0; r < rows; ++r) {
      const KeyLimit::TileKeys seen = p.keys.visible_in_tile(q0 + r, k0, cols);
      const int64_t n = seen.count, key0 = k0 + seen.first;
      if (n == 0) continue;
      const acc_t* bias = nullptr;
      if (p.mask.present()) {
        // Keys the mask excludes take no part: a row with none left in this tile skips it.
        if (!p.mask.load_row(s.bias.data(), b, h, q0 + r, key0, n)) continue;
        bias = s.bias.data();
      }
      const acc_t* drop = nullptr;
      if (p.dropout.enabled) {
        p.dropout.factor_row(s.drop.data(), bh, q0 + r, key0, n);
        drop = s.drop.data();
      }
      // kT_tile's columns and v_tile's rows from the first key seen.
      fold_tile_into_row(s.q_tile.data() + r * D, s.kT_tile.data() + seen.first, s.v_tile.data() + seen.first * D, bias,
                         drop, n, D, p.scale, p.softcap, s.probs.data(), s.row_max[r], s.row_sum[r],
                         s.out_acc.data() + r * D);
    }
  }
  write_query_block(p, s, b, h, q0, rows);
}

template <typename scalar_t>
void run_fwd(const FwdProblem<scalar_t>& p, int64_t batch) {
  const int64_t q_blocks = (p.seqlen_q + kBlockQ - 1) / kBlockQ;
  const int64_t tasks = batch * p.heads_q * q_blocks;  // (b, h, query block), query block fastest
  // Each task writes its own rows of out and lse, so tasks need no synchronization.
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    FwdScratch<acc_type<scalar_t>> scratch(p.head_dim);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t q_block = t % q_blocks;
      const int64_t h = (t / q_blocks) % p.heads_q;
      const int64_t b = t / (q_blocks * p.heads_q);
      fwd_query_block(p, scratch, b, h, q_block * kBlockQ);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                       bool is_causal, int64_t causal_offset,
                                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                       const std::optional<at::Tensor>& rng_state,
                                       const std::optional<at::Tensor>& sink, double softcap, int64_t window_span) {
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads_q = q.size(2), head_dim = q.size(3);
  const int64_t seqlen_k = k.size(1), heads_kv = k.size(2);
  const at::ScalarType lse_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({batch, seqlen_q, heads_q, head_dim}, q.options());
  at::Tensor lse = at::empty({batch, heads_q, seqlen_q}, q.options().dtype(lse_dtype));
  if (heads_q == 0) return {out, lse};  // also the only case where heads_kv may be 0
  if (dropout_p == 0.0 && fwd_plain_serves(q.scalar_type()) && (!attn_mask.has_value() || tiles_take_mask(k, v))) {
    const at::Tensor sink_f = sink.has_value() ? sink->detach().to(at::kFloat).contiguous() : at::Tensor();
    fwd_plain(q, k, v, out, lse, scale, KeyLimit{is_causal, causal_offset, seqlen_k, window_span},
              attn_mask.has_value() ? attn_mask->detach() : at::Tensor(),
              sink_f.defined() ? sink_f.data_ptr<float>() : nullptr, softcap);
    return {out, lse};
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "flashattn_fwd_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    at::Tensor sink_acc;  // [Hq] in acc_t
    if (sink.has_value()) sink_acc = sink->detach().to(lse_dtype).contiguous();
    FwdProblem<scalar_t> p{rows_view<const scalar_t>(q),
                           rows_view<const scalar_t>(k),
                           rows_view<const scalar_t>(v),
                           rows_view<scalar_t>(out),
                           lse.data_ptr<acc_t>(),
                           seqlen_q,
                           heads_q,
                           head_dim,
                           heads_q / heads_kv,
                           static_cast<acc_t>(scale),
                           KeyLimit{is_causal, causal_offset, seqlen_k, window_span},
                           mask_view<scalar_t>(attn_mask),
                           dropout_rows(dropout_p, rng_state),
                           sink_acc.defined() ? sink_acc.data_ptr<acc_t>() : nullptr,
                           static_cast<acc_t>(softcap)};
    run_fwd(p, batch);
  });
  return {out, lse};
}

}  // namespace cpu
}  // namespace flashattn
