// Argument checks shared by every device's implementation of the flashattn ops.
// Each failure raises a c10::Error (a RuntimeError in Python) naming the argument and what was expected.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace flashattn {

// The largest head dim any path serves.
constexpr int64_t kMaxHeadDim = 256;

struct CheckedShape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int64_t causal_offset;  // key j visible to query i iff j <= i + causal_offset
  int64_t window_span = -1;  // with a sliding window, also iff j >= i + causal_offset - window_span (apply_window)
};

// Checks q [B, Lq, Hq, D], k and v [B, Lk, Hk, D]: ndim, dtype, device, contiguous last dim,
// matching sizes, Hq a multiple of Hk, 1 <= D <= 256. `op` names the op in messages.
CheckedShape check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       bool causal_bottom_right);

// Numbers and shapes as text for error messages. Messages are built from strings only: formatting
// integers through a C++ stream inside this library crashed one torch build (two C++ runtimes loaded
// into one process), while string insertion works everywhere.
std::string to_text(int64_t value);
std::string to_text(at::IntArrayRef values);

// Checks dout and out against q (shape, dtype, device, a contiguous last dim) and lse's device: what
// every backward op needs of them.
void check_dout_and_out(const char* op, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                        const at::Tensor& lse);

// Checks the extra backward inputs against the forward's shapes.
void check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& lse, const CheckedShape& shape);

// Checks an attn_mask against the checked shape: a 4-dim [batch, heads_q, seqlen_q, seqlen_k] tensor
// (any strides, 0 on broadcast dims), bool, float32 or q's dtype, on q's device.
void check_attn_mask(const char* op, const at::Tensor& mask, const at::Tensor& q, const CheckedShape& shape);

// Checks the dmask output of the backward: a floating attn_mask must be given, and dmask must be a
// contiguous [batch, heads_q, seqlen_q, seqlen_k] tensor of the mask's dtype on q's device.
void check_dmask(const at::Tensor& dmask, const std::optional<at::Tensor>& mask, const at::Tensor& q,
                 const CheckedShape& shape);

// Checks dropout arguments: 0 <= dropout_p < 1, and with dropout_p > 0 an rng_state that is a
// contiguous [2] int64 tensor (seed, offset) on q's device.
void check_dropout(const char* op, double dropout_p, const std::optional<at::Tensor>& rng_state, const at::Tensor& q);

// Checks the arguments of dropout_keep_mask: sizes >= 0, 0 <= dropout_p < 1, rng_state as above.
void check_keep_mask_args(const at::Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                          int64_t seqlen_k, double dropout_p);

// Checks an int32 index tensor (offsets, lengths, rows): 1-dim with numel entries, contiguous, on q's device.
void check_int32_vector(const char* op, const char* name, const at::Tensor& t, int64_t numel, const at::Tensor& q);

// Checks softcap (0: none, else the cap of every scaled score, softcap * tanh(score / softcap)): finite and
// >= 0, and not with a floating attn_mask (the CUDA backward recovers tanh from P, which an additive
// mask's term would spoil).
void check_softcap(const char* op, double softcap, const std::optional<at::Tensor>& attn_mask);

// A sliding window (FlashAttention-2's window_size: key j is visible to query i iff
// i + offset - window_left <= j <= i + offset + window_right, offset the causal alignment's diagonal,
// a negative bound unbounded; is_causal makes the right bound 0) as the kernels run it: causal masking
// at the window's right bound, causal_shift keys right of the alignment's diagonal, and `span` keys
// left of that bound besides (-1: no left bound). Bounds that cannot exclude a key within `longest`
// (the longer side: seqlen, or the packed row count) are dropped.
struct KeyWindow {
  bool is_causal = false;
  int64_t causal_shift = 0;
  int64_t span = -1;
};
KeyWindow resolve_window(const char* op, bool is_causal, int64_t window_left, int64_t window_right, int64_t longest,
                         const std::optional<at::Tensor>& attn_mask);

// The checked shape under resolve_window's window; returns the kernels' is_causal.
bool apply_window(const char* op, CheckedShape& s, bool is_causal, int64_t window_left, int64_t window_right,
                  const std::optional<at::Tensor>& attn_mask);

// Every argument check of the fwd op, in the order both devices' implementations run them: q/k/v,
// attn_mask, dropout. Returns the checked shape.
CheckedShape check_fwd_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal_bottom_right,
                            const std::optional<at::Tensor>& attn_mask, double dropout_p,
                            const std::optional<at::Tensor>& rng_state);

// Every argument check of the bwd op: q/k/v, the backward inputs, attn_mask, dmask, dropout.
CheckedShape check_bwd_args(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse, bool causal_bottom_right,
                            const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& dmask,
                            double dropout_p, const std::optional<at::Tensor>& rng_state);

}  // namespace flashattn
