// See cuda_ops.h.
#ifdef FLASHATTN_WITH_CUDA

#include "torch/cuda_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <limits>

#include "torch/checks.h"
#include "common/env_switch.h"
#include "sm80/api.h"
#include "sm90/api.h"

namespace flashattn {
namespace cuda_ops {
namespace {

// A forward pass over more keys than this runs as several passes over consecutive key ranges whose
// (out, lse) pairs are merged in float32. One fp32 accumulator summing millions of keys loses about
// 1% of the result (the tensor cores' accumulation rounds toward zero: measured in benchmarks/NOTES.md
// at 8.4M keys); ranges of 2^20 keys keep the error at the level of shorter rows.
constexpr int64_t kKeysPerPass = int64_t{1} << 20;

TensorStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// 16-byte loads need every row start 16-byte aligned and whole 16-byte chunks per row.
bool rows_aligned_16(const at::Tensor& t) {
  const int64_t elems_per_16b = 16 / t.element_size();
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  return addr % 16 == 0 && t.size(3) % elems_per_16b == 0 && t.stride(0) % elems_per_16b == 0 &&
         t.stride(1) % elems_per_16b == 0 && t.stride(2) % elems_per_16b == 0;
}

void check_cuda_device(const char* op, const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(prop->major >= 8, op, ": flashattn's CUDA kernels need a GPU of compute capability 8.0 or newer, ",
              q.device().str(), " is ", to_text(prop->major), ".", to_text(prop->minor),
              " (flashattn.scaled_dot_product_attention falls back to torch there)");
}

AttentionShape make_shape(const CheckedShape& s, const at::Tensor& q, double scale, bool is_causal) {
  AttentionShape shape;
  shape.batch = static_cast<int>(s.batch);
  shape.seqlen_q = static_cast<int>(s.seqlen_q);
  shape.seqlen_k = static_cast<int>(s.seqlen_k);
  shape.heads_q = static_cast<int>(s.heads_q);
  shape.heads_kv = static_cast<int>(s.heads_kv);
  shape.head_dim = static_cast<int>(s.head_dim);
  shape.scale = static_cast<float>(scale);
  shape.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  shape.is_causal = is_causal;
  shape.causal_offset = static_cast<int>(s.causal_offset);
  shape.element_type = q.scalar_type() == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
  shape.rows_aligned_16 = true;
  return shape;
}

bool has_work(const CheckedShape& s) { return s.batch > 0 && s.heads_q > 0 && s.seqlen_q > 0 && s.seqlen_k > 0; }

// The Hopper kernels run on compute capability 9.0 for the inputs they cover, unless the environment
// variable FLASHATTN_FORCE_SM80=1 asks for the sm80 path (read on every call: tests compare both).
bool sm90_allowed(const at::Tensor& q) {
  if (env_switch("FLASHATTN_FORCE_SM80", false)) return false;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  return prop->major == 9 && prop->minor == 0;
}

bool use_sm90_fwd(const at::Tensor& q, const FwdParams& p) { return sm90_allowed(q) && sm90::fwd_supported(p); }
// Deterministic mode runs on the sm80 backward only (the sm90 one adds dq partials in any order).
bool use_sm90_bwd(const at::Tensor& q, const BwdParams& p) {
  return !p.deterministic && sm90_allowed(q) && sm90::bwd_supported(p);
}

// DropoutParams for a checked (dropout_p, rng_state); disabled for dropout_p == 0.
DropoutParams make_dropout(double dropout_p, const std::optional<at::Tensor>& rng_state) {
  DropoutParams d;
  if (dropout_p == 0.0) return d;
  d.enabled = true;
  d.threshold = dropout_threshold(dropout_p);
  d.keep_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
  d.rng_state = rng_state->data_ptr<int64_t>();
  return d;
}

// MaskParams for `mask` ([B, Hq, Lq, Lk], checked), with tile classes on the kernel's `tile` grid when
// `classify` is set: they are computed here into `classes`, which must outlive the launch (the
// caching allocator keeps its memory for the stream's later work even after it is freed). With
// causal_stats (find_causal_prefix_rows's, on the stream already), the slices of the causal form are
// left unclassified: no masked kernel reads them.
MaskParams make_mask(const at::Tensor& mask, const CheckedShape& s, ElementType element_type, TileShape tile,
                     bool classify, at::Tensor& classes, cudaStream_t stream, const int* causal_stats = nullptr) {
  // CUDA inputs are 16-bit, so a float32 mask is never of q's own type.
  MaskParams m;
  m.kind = mask.scalar_type() == at::kBool    ? MaskKind::kBool
           : mask.scalar_type() == at::kFloat ? MaskKind::kAdditiveFloat32
                                              : MaskKind::kAdditive;
  m.data = mask.data_ptr();
  m.batch_stride = mask.stride(0);
  m.head_stride = mask.stride(1);
  m.row_stride = mask.stride(2);
  m.col_stride = mask.stride(3);
  // A broadcast dim (stride 0, or size 1) holds one distinct slice; classes are computed per slice.
  const int64_t batches = (mask.size(0) > 1 && mask.stride(0) != 0) ? s.batch : 1;
  const int64_t heads = (mask.size(1) > 1 && mask.stride(1) != 0) ? s.heads_q : 1;
  if (batches == 1) m.batch_stride = 0;
  if (heads == 1) m.head_stride = 0;
  if (!classify || tile.queries == 0) return m;
  m.tile_q = tile.queries;
  m.tile_k = tile.keys;
  m.tiles_k = static_cast<int>((s.seqlen_k + tile.keys - 1) / tile.keys);
  const int64_t tiles_q = (s.seqlen_q + tile.queries - 1) / tile.queries;
  m.class_row_stride = (m.tiles_k + kClassWindow - 1) / kClassWindow * kClassWindow;
  // [0]: the classes, [1]: the key counts of key-prefix tiles.
  classes = at::empty({2, batches, heads, tiles_q, m.class_row_stride}, mask.options().dtype(at::kByte));
  C10_CUDA_CHECK(classify_mask_tiles(m, element_type, static_cast<int>(batches), static_cast<int>(heads),
                                           static_cast<int>(s.seqlen_q), static_cast<int>(s.seqlen_k), causal_stats,
                                           classes[0].data_ptr<unsigned char>(),
                                           classes[1].data_ptr<unsigned char>(), stream));
  m.tile_class = classes[0].data_ptr<unsigned char>();
  m.tile_key_count = classes[1].data_ptr<unsigned char>();
  m.class_batch_stride = batches > 1 ? heads * tiles_q * m.class_row_stride : 0;
  m.class_head_stride = heads > 1 ? tiles_q * m.class_row_stride : 0;
  return m;
}

// Whether classifying a mask's tiles can pay: always for a boolean mask (1 byte per element); for a
// floating one only when it is broadcast over batch or heads (a dense one would be read twice).
bool worth_classifying(const at::Tensor& mask, const CheckedShape& s) {
  if (mask.scalar_type() == at::kBool) return true;
  const bool batch_broadcast = s.batch > 1 && (mask.stride(0) == 0);
  const bool head_broadcast = s.heads_q > 1 && (mask.stride(1) == 0);
  return batch_broadcast || head_broadcast;
}

// The key-length form of a padding mask m (rows broadcast over the queries; find_key_prefix_rows):
// an int32 tensor [key_end: B * Hq, masked_rows: B * Hq, masked_row_count: 1], computed on the stream.
at::Tensor find_key_prefix_rows(const MaskParams& m, const CheckedShape& s, ElementType element_type,
                                const at::Tensor& like, cudaStream_t stream) {
  const int64_t rows = s.batch * s.heads_q;
  at::Tensor key_rows = at::empty({2 * rows + 1}, like.options().dtype(at::kInt));
  int* key_end = key_rows.data_ptr<int>();
  C10_CUDA_CHECK(flashattn::find_key_prefix_rows(m, element_type, static_cast<int>(s.batch), static_cast<int>(s.heads_q),
                                            static_cast<int>(s.seqlen_k), key_end, key_end + rows, key_end + 2 * rows,
                                            stream));
  return key_rows;
}

// Whether a mask is a candidate for its key-length form: one worth classifying (classified), and its
// rows broadcast over the queries. Causal masking and dropout keep the masked kernels.
bool key_length_candidate(const MaskParams& m, const CheckedShape& s, bool classified, bool is_causal, bool dropout) {
  return classified && !is_causal && !dropout && (m.row_stride == 0 || s.seqlen_q == 1);
}

// Whether a mask is a candidate for the causal form of its key lengths (find_causal_prefix_rows):
// classified, with a row per query, and no causal masking or dropout of the call's own.
bool causal_length_candidate(const MaskParams& m, const CheckedShape& s, bool classified, bool is_causal,
                             bool dropout) {
  return classified && !is_causal && !dropout && m.row_stride != 0 && s.seqlen_q > 1;
}

// The causal form of a mask m's key lengths: an int32 tensor laid out as find_causal_prefix_rows's
// workspace ([key_end: B * Hq, masked_rows: B * Hq, masked_row_count: 1, per-slice statistics]),
// computed on the stream. m needs no classes.
at::Tensor find_causal_prefix_rows(const MaskParams& m, const CheckedShape& s, ElementType element_type,
                                   const at::Tensor& like, cudaStream_t stream) {
  const int batch = static_cast<int>(s.batch), heads = static_cast<int>(s.heads_q);
  at::Tensor key_rows = at::empty({causal_prefix_workspace_ints(batch, heads, m)}, like.options().dtype(at::kInt));
  const int seqlen_q = static_cast<int>(s.seqlen_q), seqlen_k = static_cast<int>(s.seqlen_k);
  C10_CUDA_CHECK(flashattn::find_causal_prefix_rows(m, element_type, batch, heads, seqlen_q, seqlen_k,
                                               causal_form_offset(seqlen_q, seqlen_k), key_rows.data_ptr<int>(),
                                               stream));
  return key_rows;
}

// Where the per-slice statistics lie in find_causal_prefix_rows's tensor.
const int* causal_stats_of(const at::Tensor& key_rows, const CheckedShape& s) {
  return key_rows.data_ptr<int>() + causal_prefix_stats_offset(static_cast<int>(s.batch), static_cast<int>(s.heads_q));
}

// The key-length form of mask m (its strides are enough) for a call of the sm90 kernels, computed on
// the stream: find_key_prefix_rows's tensor for a padding mask, find_causal_prefix_rows's for a mask
// with a row per query (*causal_form set), or an undefined tensor when neither candidate applies.
at::Tensor find_key_length_form(const MaskParams& m, const CheckedShape& s, ElementType element_type, bool classified,
                                bool is_causal, bool dropout, const at::Tensor& like, cudaStream_t stream,
                                bool* causal_form) {
  *causal_form = false;
  if (key_length_candidate(m, s, classified, is_causal, dropout)) {
    return find_key_prefix_rows(m, s, element_type, like, stream);
  }
  if (causal_length_candidate(m, s, classified, is_causal, dropout)) {
    *causal_form = true;
    return find_causal_prefix_rows(m, s, element_type, like, stream);
  }
  return at::Tensor();
}

// One forward pass of q over k and v (some key range of the caller's) into out and lse.
void fwd_pass(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CheckedShape& s, double scale,
              bool is_causal, const std::optional<at::Tensor>& attn_mask, const DropoutParams& dropout,
              at::Tensor& out, at::Tensor& lse) {
  FwdParams p;
  p.dropout = dropout;
  p.shape = make_shape(s, q, scale, is_causal);
  p.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor classes;
  // A mask's tile classes are computed on the grid of the kernel that reads them.
  const bool classified = attn_mask.has_value() && worth_classifying(*attn_mask, s);
  auto set_mask = [&](TileShape tile, const int* causal_stats) {
    if (attn_mask.has_value()) {
      p.mask = make_mask(*attn_mask, s, p.shape.element_type, tile, classified, classes, stream, causal_stats);
    }
  };
  if (use_sm90_fwd(q, p)) {
    const TileShape tile = sm90::fwd_tile_shape(p.shape.head_dim);
    // A classified mask whose rows are broadcast over the queries (a padding mask): its rows that keep
    // a prefix of the keys run as plain attention over that prefix (FwdParams::key_end). One with a
    // row per query: its (batch, head) slices that are causal masks, alone or with right padding, run
    // as causal attention over their key prefix (FwdParams::key_end_causal). Both forms are found from
    // the mask's strides alone, before the classes, so that the classes prepass can leave out the causal
    // form's slices.
    at::Tensor key_rows;
    if (attn_mask.has_value()) {
      set_mask({0, 0}, nullptr);  // strides only
      key_rows = find_key_length_form(p.mask, s, p.shape.element_type, classified, is_causal, dropout.enabled, q,
                                      stream, &p.key_end_causal);
    }
    set_mask({tile.queries, tile.keys}, p.key_end_causal ? causal_stats_of(key_rows, s) : nullptr);
    if (key_rows.defined()) {
      const int64_t rows = s.batch * s.heads_q;
      p.key_end = key_rows.data_ptr<int>();
      p.masked_rows = p.key_end + rows;
      p.masked_row_count = p.key_end + 2 * rows;
    }
    // The counter of the causal schedule's dynamic tail (freed on this stream after the kernel), for
    // the only launches that may use it: causal without a mask or dropout, and the causal form's.
    at::Tensor tile_counter;
    if ((is_causal && !attn_mask.has_value() && !dropout.enabled) || p.key_end_causal) {
      tile_counter = at::empty({1}, q.options().dtype(at::kInt));
      p.tile_counter = tile_counter.data_ptr<int>();
    }
    const cudaError_t err = sm90::run_fwd(p, stream);
    if (err != cudaErrorNotSupported) {
      C10_CUDA_CHECK(err);
      return;
    }
  }
  p.key_end = p.masked_rows = p.masked_row_count = nullptr;  // the sm90 forward's alone
  p.key_end_causal = false;
  set_mask(sm80::fwd_tile_shape(p.shape.head_dim), nullptr);
  C10_CUDA_CHECK(sm80::run_fwd(p, stream));
}

// The forward over more than kKeysPerPass keys: one pass per key range, merged as
// lse = log(sum_r exp(lse_r)) and out = sum_r exp(lse_r - lse) out_r, in float32.
void fwd_in_key_ranges(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CheckedShape& s,
                       double scale, bool is_causal, const std::optional<at::Tensor>& attn_mask,
                       const DropoutParams& dropout, at::Tensor& out, at::Tensor& lse) {
  at::Tensor out_sum = at::zeros(out.sizes(), out.options().dtype(at::kFloat));  // [B, Lq, Hq, D]
  at::Tensor lse_sum = at::full(lse.sizes(), -std::numeric_limits<float>::infinity(), lse.options());
  at::Tensor range_out = at::empty_like(out);
  at::Tensor range_lse = at::empty_like(lse);
  for (int64_t k0 = 0; k0 < s.seqlen_k; k0 += kKeysPerPass) {
    const int64_t keys = std::min(kKeysPerPass, s.seqlen_k - k0);
    CheckedShape range = s;
    range.seqlen_k = keys;
    range.causal_offset = s.causal_offset - k0;  // key k0 + j is visible iff k0 + j <= i + offset
    std::optional<at::Tensor> range_mask;
    if (attn_mask.has_value()) range_mask = attn_mask->narrow(3, k0, keys);
    DropoutParams range_dropout = dropout;
    range_dropout.key_base = static_cast<uint32_t>(k0);  // a multiple of 32 (kKeysPerPass), as key_base must be
    fwd_pass(q, k.narrow(1, k0, keys), v.narrow(1, k0, keys), range, scale, is_causal, range_mask, range_dropout,
             range_out, range_lse);
    // A row that saw no key so far and none in this range stays -inf with weight 0 (not NaN);
    // a NaN anywhere stays NaN.
    const at::Tensor merged = at::logaddexp(lse_sum, range_lse);
    const at::Tensor none = at::isneginf(merged);
    const at::Tensor old_weight = at::where(none, 0.f, at::exp(lse_sum - merged));    // [B, Hq, Lq]
    const at::Tensor range_weight = at::where(none, 0.f, at::exp(range_lse - merged));
    out_sum.mul_(old_weight.transpose(1, 2).unsqueeze(-1))
        .add_(range_out.to(at::kFloat) * range_weight.transpose(1, 2).unsqueeze(-1));
    lse_sum = merged;
  }
  out.copy_(out_sum);
  lse.copy_(lse_sum);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                       bool is_causal, bool causal_bottom_right,
                                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                       const std::optional<at::Tensor>& rng_state, bool /*deterministic*/) {
  const char* op = "flashattn.fwd";
  const CheckedShape s = check_fwd_args(q, k, v, causal_bottom_right, attn_mask, dropout_p, rng_state);
  const DropoutParams dropout = make_dropout(dropout_p, rng_state);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);

  at::Tensor out = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor lse = at::empty({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kFloat));
  if (!has_work(s)) {
    // No keys: every row attends to nothing, so out is 0 and lse is -inf (the empty log-sum-exp).
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
  } else if (s.seqlen_k > kKeysPerPass) {
    fwd_in_key_ranges(q, k, v, s, scale, is_causal, attn_mask, dropout, out, lse);
  } else {
    fwd_pass(q, k, v, s, scale, is_causal, attn_mask, dropout, out, lse);
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse_in,
                                                   double scale, bool is_causal, bool causal_bottom_right,
                                                   bool deterministic, const std::optional<at::Tensor>& attn_mask,
                                                   const std::optional<at::Tensor>& dmask, double dropout_p,
                                                   const std::optional<at::Tensor>& rng_state) {
  const char* op = "flashattn.bwd";
  const CheckedShape s =
      check_bwd_args(dout, q, k, v, out, lse_in, causal_bottom_right, attn_mask, dmask, dropout_p, rng_state);
  const c10::cuda::CUDAGuard device_guard(q.device());
  check_cuda_device(op, q);

  at::Tensor dq = at::empty({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, q.options());
  at::Tensor dk = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, k.options());
  at::Tensor dv = at::empty({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, v.options());
  if (!has_work(s)) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  const at::Tensor lse = lse_in.to(at::kFloat).contiguous();  // no-op for the forward's own lse
  const int accum_dim = sm80::padded_head_dim(static_cast<int>(s.head_dim));
  // Zeroed by the backward's first kernel (the preprocess), not by a fill of its own.
  at::Tensor dq_accum = at::empty({s.batch, s.heads_q, s.seqlen_q, accum_dim}, q.options().dtype(at::kFloat));
  const int64_t stats_stride = bwd_stats_stride(s.seqlen_q);
  at::Tensor delta = at::empty({s.batch, s.heads_q, stats_stride}, q.options().dtype(at::kFloat));
  at::Tensor lse_log2 = at::empty_like(delta);
  // Deterministic mode: a zeroed counter per (batch, query head, query block); one per query row is
  // enough for any query block size.
  at::Tensor dq_keys_done;
  if (deterministic) dq_keys_done = at::zeros({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kInt));

  // An additive mask can saturate a row's LSE (cuda/saturated_rows.h): the preprocess then writes the
  // dout the main kernel reads, rows rebalanced, into this workspace (rows padded to 8 elements, so
  // that its strides suit 16-byte loads and TMA whatever the head dim).
  const bool additive_mask = attn_mask.has_value() && attn_mask->scalar_type() != at::kBool;
  at::Tensor dout_rescaled;
  if (additive_mask) {
    dout_rescaled = at::empty({s.batch, s.seqlen_q, s.heads_q, (s.head_dim + 7) / 8 * 8}, dout.options())
                        .narrow(3, 0, s.head_dim);
  }
  const at::Tensor& dout_read = additive_mask ? dout_rescaled : dout;

  BwdParams p;
  p.shape = make_shape(s, q, scale, is_causal);
  p.shape.rows_aligned_16 = rows_aligned_16(q) && rows_aligned_16(k) && rows_aligned_16(v) &&
                            rows_aligned_16(out) && rows_aligned_16(dout) && rows_aligned_16(dout_read);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.dout = dout_read.data_ptr();
  if (additive_mask) {
    p.dout_caller = dout.data_ptr();
    p.dout_caller_strides = strides_of(dout);
  }
  p.lse = lse.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.stats_stride = stats_stride;
  p.dq_accum_dim = accum_dim;
  p.deterministic = deterministic;
  p.dq_keys_done = deterministic ? dq_keys_done.data_ptr<int>() : nullptr;
  p.dropout = make_dropout(dropout_p, rng_state);
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  p.dout_strides = strides_of(dout_read);
  p.dq_strides = strides_of(dq);
  p.dk_strides = strides_of(dk);
  p.dv_strides = strides_of(dv);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // A mask or dropout needs the masked variant, which the sm90 path has at some head dims only.
  const bool sm90 = use_sm90_bwd(q, p) && ((!attn_mask.has_value() && !p.dropout.enabled) ||
                                          sm90::bwd_masked_supported(p.shape.head_dim));
  at::Tensor classes, key_rows;
  if (attn_mask.has_value()) {
    // Tile classes on the grid of the kernel that reads them. Deterministic mode needs every key block
    // to take its dq turn at every query block: no skipping.
    const TileShape sm90_tile = sm90::bwd_tile_shape();
    const TileShape tile = sm90 ? TileShape{sm90_tile.queries, sm90_tile.keys}
                                      : sm80::bwd_tile_shape(p.shape.head_dim);
    const bool classified = !deterministic && worth_classifying(*attn_mask, s);
    p.mask = make_mask(*attn_mask, s, p.shape.element_type, tile, false, classes, stream);  // strides only
    if (dmask.has_value()) {
      dmask->zero_();  // tiles the kernel skips have a zero gradient
      p.dmask = dmask->data_ptr();
    }
    // The key-length form (BwdParams::key_end, padding or causal, as in the forward) where every GQA
    // group's query heads share their mask row (the mask is broadcast over heads, or there are no
    // groups) and no mask gradient is written. The causal form's slices are left out of the classes.
    if (sm90 && p.dmask == nullptr && (p.mask.head_stride == 0 || s.heads_q == s.heads_kv)) {
      key_rows = find_key_length_form(p.mask, s, p.shape.element_type, classified, is_causal, p.dropout.enabled, q,
                                      stream, &p.key_end_causal);
      if (key_rows.defined()) p.key_end = key_rows.data_ptr<int>();
    }
    p.mask = make_mask(*attn_mask, s, p.shape.element_type, tile, classified, classes, stream,
                       p.key_end_causal ? causal_stats_of(key_rows, s) : nullptr);
  }
  if (sm90) {
    const cudaError_t err = sm90::run_bwd(p, stream);
    C10_CUDA_CHECK(err);  // never cudaErrorNotSupported: bwd_supported vouched for these inputs
    return {dq, dk, dv};
  }
  C10_CUDA_CHECK(sm80::run_bwd(p, stream));
  return {dq, dk, dv};
}

at::Tensor dropout_keep_mask(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                             int64_t seqlen_k, double dropout_p) {
  check_keep_mask_args(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p);
  const c10::cuda::CUDAGuard device_guard(rng_state.device());
  at::Tensor keep = at::empty({batch, heads, seqlen_q, seqlen_k}, rng_state.options().dtype(at::kBool));
  if (keep.numel() == 0) return keep;
  DropoutParams d = make_dropout(dropout_p, rng_state);
  if (!d.enabled) return keep.fill_(true);
  C10_CUDA_CHECK(write_dropout_keep_mask(d, batch * heads, static_cast<int>(seqlen_q),
                                               static_cast<int>(seqlen_k), keep.data_ptr<bool>(),
                                               at::cuda::getCurrentCUDAStream()));
  return keep;
}

}  // namespace cuda_ops
}  // namespace flashattn

#endif  // FLASHATTN_WITH_CUDA
