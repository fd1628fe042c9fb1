// Plain structs that carry one attention call from the host code (csrc/torch/) to the kernels.
// This is the only boundary between them: no torch types cross it.
//
// Layout convention of every tensor: [batch, seqlen, heads, head_dim] with arbitrary element strides
// for the first three dims and a contiguous last dim. A query head h reads key/value head
// h / (heads_q / heads_kv) (grouped-query attention).
#pragma once

#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

enum class ElementType : int { kFloat16 = 0, kBFloat16 = 1 };

// Strides in elements of one [batch, seqlen, heads, head_dim] tensor.
struct TensorStrides {
  int64_t batch;
  int64_t row;   // one step along seqlen
  int64_t head;
};

struct AttentionShape {
  int batch;
  int seqlen_q;
  int seqlen_k;
  int heads_q;
  int heads_kv;
  int head_dim;      // the real head dim, 1..256; kernels pad it up to their tile width inside
  float scale;       // multiplies q.k before the softmax
  float scale_log2;  // scale * log2(e): kernels work in base 2
  bool is_causal;
  // With is_causal, key j is visible to query i iff j <= i + causal_offset
  // (0 = top-left alignment, seqlen_k - seqlen_q = bottom-right alignment).
  int causal_offset;
  // A sliding window (with is_causal only): key j is visible to query i only if also
  // j >= i + causal_offset - window_span; -1: no left bound (common/mask.h, key_visible).
  int window_span = -1;
  ElementType element_type;
  // True when every row start of q/k/v (and do/o in the backward) is 16-byte aligned, so tiles
  // can be loaded with 16-byte copies; false selects the element-wise load path.
  bool rows_aligned_16;
  // Score soft-capping (cuda/softcap.h), 0 without: scale / cap, with scale_log2 then cap * log2 e
  // (scale stays the caller's: the backward's dq and dk are scaled by it).
  float softcap_inner = 0.f;
  // ALiBi (cuda/alibi.h), nullptr without: float32 slopes [1 or batch, heads_q] (batch stride
  // alibi_batch_stride, 0 for one row), adding -slope * |i + alibi_offset - j| to query i's score
  // for key j after the scale. alibi_unit turns a slope into the units of the kernels' raw scores
  // (1 / scale, or 1 / cap under soft-capping): the kernels add slope * alibi_unit * distance to
  // q.k before they scale it. (A variable-length batch's kernels take each sequence's own len_k - len_q
  // as alibi_offset, cuda/varlen.h, and its index as the batch.)
  const float* alibi_slopes = nullptr;
  int alibi_batch_stride = 0;
  int alibi_offset = 0;
  float alibi_unit = 0.f;
};

// The diagonal a mask's causal form is tested on (find_causal_prefix_rows, cuda/api.h) and run at: bottom-right
// (query q sees keys up to q + Lk - Lq, as a mask over a key cache is built) when Lq <= Lk, else top-left
// (torch.tril of an Lq x Lk matrix).
inline int causal_form_offset(int seqlen_q, int seqlen_k) { return seqlen_q <= seqlen_k ? seqlen_k - seqlen_q : 0; }

// The shape the unmasked kernels run a key-length form's rows with: sh itself for the padding form, with
// causal masking at causal_form_offset for the causal form.
inline AttentionShape key_end_shape(AttentionShape sh, bool causal_form) {
  if (causal_form) {
    sh.is_causal = true;
    sh.causal_offset = causal_form_offset(sh.seqlen_q, sh.seqlen_k);
  }
  return sh;
}

// An attention mask read in place through its strides (0 on broadcast dims): element (b, h, i, j) of
// a [B, Hq, Lq, Lk] view, at data + b * batch_stride + h * head_stride + i * row_stride + j * col_stride.
enum class MaskKind : int {
  kNone = 0,
  kBool = 1,      // 1 byte per element: nonzero = the key takes part
  kAdditive = 2,         // q's element type, added to scale * q.k before the softmax (-inf excludes the key)
  kAdditiveFloat32 = 3,  // the same in float32
};

// Bits of a tile class (classify_mask_tiles, cuda/api.h): what a kernel tile of the mask holds.
constexpr unsigned char kTileAnyVisible = 1;  // some element lets its key take part (else: skip the tile)
constexpr unsigned char kTileNeedsMask = 2;   // some element is not neutral (False, or a value != 0)
// With kTileNeedsMask: every row of the tile keeps the same first keys of the tile (True, or 0) and
// excludes the others (False, or -inf), as a padding mask does; MaskParams::tile_key_count holds how
// many it keeps, so a kernel can apply it as a sequence length instead of reading the elements.
constexpr unsigned char kTileKeyPrefix = 4;
// Classes a kernel reads at once (16 bytes); the class rows are padded to a multiple of it.
constexpr int kClassWindow = 16;

struct MaskParams {
  MaskKind kind = MaskKind::kNone;
  const void* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, col_stride = 0;  // in elements
  // Optional per-tile summary: class of query tile tq, key tile tk of (b, h) at
  // tile_class[b * class_batch_stride + h * class_head_stride + tq * class_row_stride + tk], for tiles
  // of tile_q x tile_k (the kernel's own tile shape). nullptr: every tile is read element by element.
  // A row holds tiles_k classes and is padded with zeros (skip) to class_row_stride, a multiple of
  // kClassWindow, so that a kernel can read a row kClassWindow classes at a time with one aligned load.
  const unsigned char* tile_class = nullptr;
  // The kept keys of each kTileKeyPrefix tile (1..tile_k - 1; 0 for other tiles), indexed as tile_class.
  const unsigned char* tile_key_count = nullptr;
  int64_t class_batch_stride = 0, class_head_stride = 0;
  int tile_q = 0, tile_k = 0, tiles_k = 0, class_row_stride = 0;
};

// Rows of the backward's statistics workspaces are padded to a multiple of this many queries: the
// largest query block of any backward kernel.
constexpr int kBwdStatsAlign = 128;

// A variable-length batch (all pointers nullptr: a batched call). Sequence b's queries are rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q and out, seen as [1, total_q, H, D] tensors (their batch
// strides unused), its keys rows cu_seqlens_k[b] .. of k and v; AttentionShape::batch counts the
// sequences and seqlen_q / seqlen_k are total_q / total_k (what the tensor maps describe). With
// seqused_q / seqused_k, only the first seqused_*[b] rows of sequence b take part. The LSE is [Hq,
// total_q] (lse_head_stride = total_q). Under causal masking each sequence has its own diagonal:
// causal_offset len_k - len_q when causal_bottom_right, else 0 (plus causal_shift).
//
// The kernels walk the work items of a schedule list (cuda/varlen_schedule.h) built on the device
// from the offsets: tiles[i] for i < *tile_count, no item for the padding of a sequence.
struct VarlenParams {
  const int* cu_seqlens_q = nullptr;  // [batch + 1]
  const int* cu_seqlens_k = nullptr;  // [batch + 1]
  const int* seqused_q = nullptr;     // [batch] or nullptr
  const int* seqused_k = nullptr;     // [batch] or nullptr
  bool causal_bottom_right = true;
  // Added to every sequence's causal_offset: a sliding window's right bound (0 for plain causal masking).
  int causal_shift = 0;
  // What the offsets must agree with, checked on the device by the list build (cuda/varlen_schedule.cu):
  // the packed row counts, and the longest sequence allowed (-1: not checked).
  int total_q = 0, total_k = 0;
  int max_seqlen_q = -1, max_seqlen_k = -1;
  const int* tiles = nullptr;       // the schedule list: item i is (tiles[2i], tiles[2i + 1])
  const int* tile_count = nullptr;  // its length, on the device
  // The backward's statistics and dq workspaces: sequence b's rows start at workspace row
  // varlen_workspace_row(b) (cuda/varlen.h), every sequence padded to whole blocks of workspace_align
  // rows (kBwdStatsAlign, or 64 where no step or auxiliary block covers more: half the padding);
  // workspace_rows per query head.
  int64_t workspace_rows = 0;
  int workspace_align = kBwdStatsAlign;
  FLASHATTN_HOST_DEVICE bool enabled() const { return cu_seqlens_q != nullptr; }
};

struct FwdParams {
  AttentionShape shape;
  const void* q;  // [B, Lq, Hq, D]
  const void* k;  // [B, Lk, Hk, D]
  const void* v;  // [B, Lk, Hk, D]
  void* out;      // [B, Lq, Hq, D]
  float* lse;     // [B, Hq, Lq] contiguous, natural log; -inf for a row that sees no key
  TensorStrides q_strides, k_strides, v_strides, out_strides;
  MaskParams mask;
  DropoutParams dropout;  // applied to the probabilities after the softmax (the LSE is unchanged)
  // Attention sinks, [Hq] float32 (nullptr: none): query head h's sink logit joins every one of its rows'
  // softmax denominators as exp(sink[h]) and carries no value (cuda/sink.h), so out's probabilities sum to
  // less than 1 and the LSE includes it. The backward needs no change: its P = exp(score - LSE).
  const float* sink = nullptr;
  // The key-length form of a padding mask (sm90 forward only; nullptr: none). key_end[b * heads_q + h]
  // >= 0: row (b, h)'s mask keeps exactly its first key_end keys, and the unmasked kernel runs the row
  // with that length in place of seqlen_k, mask ignored; -1: the masked kernel runs the row. The masked
  // kernel then runs only the rows listed in masked_rows[0 .. *masked_row_count) (same numbering).
  const int* key_end = nullptr;
  const int* masked_rows = nullptr;
  const int* masked_row_count = nullptr;
  // The causal form of key_end (a causal mask, alone or with right padding): the unmasked kernel runs
  // the rows with key_end >= 0 with causal masking as well (key_end_shape).
  bool key_end_causal = false;
  // One int32 of device memory the sm90 forward may use to hand out tiles (it zeroes it on the launch's
  // stream before use); nullptr: a static schedule only.
  int* tile_counter = nullptr;
  // The sm80 kernels' tile configuration (FwdPlan::sm80_tiles; sm80/kernel_configs.h's FwdConfigs).
  int sm80_tiles = 0;
  VarlenParams varlen;
};

// BwdParams::stats_stride for seqlen_q queries.
constexpr int64_t bwd_stats_stride(int64_t seqlen_q) { return (seqlen_q + kBwdStatsAlign - 1) / kBwdStatsAlign * kBwdStatsAlign; }

struct BwdParams {
  AttentionShape shape;
  const void* q;     // [B, Lq, Hq, D]
  const void* k;     // [B, Lk, Hk, D]
  const void* v;     // [B, Lk, Hk, D]
  const void* out;   // [B, Lq, Hq, D]
  const void* dout;  // [B, Lq, Hq, D], as the main kernel reads it (see dout_caller)
  const float* lse;  // [B, Hq, Lq] contiguous, as written by the forward
  void* dq;          // [B, Lq, Hq, D]
  void* dk;          // [B, Lk, Hk, D]
  void* dv;          // [B, Lk, Hk, D]
  // fp32 workspace, zeroed by the backward's preprocess: [B, Hq, dq_accum_rows(), dq_accum_dim] in the
  // layout dq_accum_tiled names (cuda/dq_accum_layout.h).
  float* dq_accum;
  // Per-row statistics, [B, Hq, stats_stride] contiguous fp32 workspaces. stats_stride is seqlen_q
  // rounded up to kBwdStatsAlign, and the padding rows hold delta 0 and lse_log2 +inf (P = 0 there),
  // so a kernel can copy whole, aligned query blocks of them without bounds checks.
  float* delta;      // rowsum(dout * out)
  float* lse_log2;   // lse * log2(e), +inf where lse is -inf
  int64_t stats_stride;
  int dq_accum_dim;  // head dim padded to the kernel's tile width (BwdPlan::dq_accum_dim)
  bool dq_accum_tiled = false;  // the sm90 tile layout; the row layout when false
  // Rows of dq_accum per (batch, query head): whole 64-query blocks (stats_stride) in the tile layout.
  FLASHATTN_HOST_DEVICE int64_t dq_accum_rows() const { return dq_accum_tiled ? stats_stride : shape.seqlen_q; }
  // Deterministic mode: the key blocks that add into one query block's dq_accum rows take turns in
  // increasing key-block order, so every dq element sums its terms in the same order on every run.
  // dq_keys_done holds one zeroed int32 counter per (batch, query head, query block) when deterministic
  // is set ([B, Hq, seqlen_q] contiguous is enough for any query block size); unused otherwise.
  // Initialized here so that code filling BwdParams without knowing these fields gets the default path.
  bool deterministic = false;
  int* dq_keys_done = nullptr;
  TensorStrides q_strides, k_strides, v_strides, out_strides, dout_strides;
  TensorStrides dq_strides, dk_strides, dv_strides;
  MaskParams mask;
  // With an additive mask: its gradient dS (d loss / d (scale * q.k + mask)) for every element,
  // [B, Hq, Lq, Lk] contiguous in the mask's element type, zeroed by the host (skipped tiles stay 0).
  void* dmask = nullptr;
  DropoutParams dropout;  // the forward's: the keep-mask is regenerated, never stored
  // The key-length form of a padding mask (sm90 backward only, as FwdParams::key_end; nullptr: none),
  // equal over each GQA group's query heads: the masked kernel runs the (batch, kv head) groups whose
  // key_end is -1, the unmasked kernel the others over their first key_end keys (causal as well with
  // key_end_causal: the causal form, as in FwdParams).
  const int* key_end = nullptr;
  bool key_end_causal = false;
  // With an additive mask (cuda/saturated_rows.h): the preprocess reads the caller's dout from
  // dout_caller, scales the rows whose LSE is saturated, and writes all rows to `dout`, then a
  // [B, Lq, Hq, D] workspace. nullptr: `dout` is the caller's, read as is.
  const void* dout_caller = nullptr;
  TensorStrides dout_caller_strides{};
  // The sm80 kernels' tile configuration (BwdPlan::sm80_tiles; sm80/kernel_configs.h's BwdConfigs).
  int sm80_tiles = 0;
  // Queries per step of the sm90 backward (BwdPlan::sm90_block_m): 64, or 128 in the unmasked kernel
  // at tile width 64.
  int sm90_block_m = 64;
  VarlenParams varlen;
};

// A decoding step over a key/value cache (csrc/decode/): a few queries per sequence, each sequence's keys
// split across thread blocks. The cache is read through pages: key j of sequence b sits at row
// j % page_size of page block_table[b][j / page_size]; without a block table, the whole of cache row
// cache_row(b) is one page (page_size = the cache's length). Query head h reads kv head h / group.
struct DecodeParams {
  const void* q;  // [batch, seqlen_q, heads_q, head_dim]
  const void* k;  // [num_pages, page_size, heads_kv, head_dim]
  const void* v;  // [num_pages, page_size, heads_kv, head_dim]
  void* out;      // [batch, seqlen_q, heads_q, head_dim]
  float* lse;     // [batch, heads_q, seqlen_q] contiguous (see cu_seqlens_q), natural log; -inf for a row that sees no key
  TensorStrides q_strides, k_strides, v_strides, out_strides;  // k/v: batch = the page stride
  const int* seqlens_k;        // [batch]: keys of sequence b (clamped to 0..capacity)
  const int* leftpad;          // [batch] or nullptr: sequence b's keys start there (clamped to 0..seqlens_k[b])
  const int* block_table;      // [batch, pages_per_seq] (row stride block_table_stride) or nullptr
  const int* cache_batch_idx;  // [batch] or nullptr (no block table): the cache row of sequence b
  int64_t block_table_stride;
  int pages_per_seq;  // with a block table; capacity = pages_per_seq * page_size, else page_size
  int num_pages;      // pages (or cache rows) in k / v: a table entry outside 0..num_pages-1 reads zeros
  int page_size;
  int batch, seqlen_q, heads_q, heads_kv, head_dim;
  ElementType element_type;
  float scale_log2;     // softmax scale * log2 e (with softcap: cap * log2 e)
  float softcap_inner;  // scale / cap with soft-capping, 0 without
  bool is_causal;       // query i of sequence b sees keys j <= seqlens_k[b] - seqlen_q + i
  int window_left, window_right;  // around that diagonal; -1: unbounded
  // Queries of different counts per sequence (nullptr: seqlen_q each): sequence b's are rows
  // cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q and out (their batch strides 0), at most seqlen_q of them
  // (more are dropped); lse is then [heads_q, total_q].
  const int* cu_seqlens_q = nullptr;
  int total_q = 0;
  // Split-KV: with num_splits > 1 every thread block writes its normalised partial output and LSE
  // here and a combine kernel merges them into out and lse.
  int num_splits;
  float* partial_out;  // [num_splits, batch * heads_kv, rows, head_dim], rows = seqlen_q * group
  float* partial_lse;  // [num_splits, batch * heads_kv, rows]
  // Attention sinks (nullptr: none): [heads_q] float32 logits, natural log, whose exp joins each row's
  // softmax denominator once (in the merge of a single split, else in the combine kernel).
  const float* sink = nullptr;
  // ALiBi (nullptr: none): float32 slopes [1 or batch, heads_q] (batch stride alibi_batch_stride, 0 for
  // one row), adding -slope * |d - j| to the score of key j for the query at diagonal position d
  // (seqlens_k[b] - the sequence's queries + its query index, the causal mask's), after the scale.
  const float* alibi_slopes = nullptr;
  int alibi_batch_stride = 0;
};

}  // namespace flashattn
