// ALiBi at the ops (the alibi_slopes argument of flashattn.fwd and flashattn.bwd): its checks, the
// kernels' fields (cuda/alibi.h), and the additive mask that the paths without the term in their
// kernels (the CPU, the sm80 kernels) run it as.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "params.h"
#include "torch/checks.h"

namespace flashattn {

// Checks alibi_slopes: a contiguous float32 (heads_q,) or (batch, heads_q) tensor on q's device, not
// with softcap or an attn_mask (the masked paths would need both terms in one mask).
void check_alibi(const char* op, const std::optional<at::Tensor>& slopes, const at::Tensor& q, const CheckedShape& s,
                 double softcap, const std::optional<at::Tensor>& attn_mask);

// Whether the kernels that run a call can add ALiBi's term themselves: the sm90 kernels, with a
// positive scale (the term goes into raw-score units as slope / scale).
bool alibi_in_kernels(bool sm90_path, double scale);

// The shape with ALiBi's fields set from the slopes; alibi_offset puts query i at key position
// i + alibi_offset (seqlen_k - seqlen_q, less a key range's first key).
AttentionShape with_alibi(AttentionShape shape, const at::Tensor& slopes, int64_t alibi_offset);

// ALiBi as a float32 additive mask for kernels without its term. With causal masking whose diagonal
// is at or left of ALiBi's (every visible key j <= i + Lk - Lq), no window's left bound and no sink,
// the mask is a term per key: the bias -slope * (p - j), p = i + Lk - Lq, is slope * (j - c) less
// slope * (p - c) for c = Lk / 2, and the second part, the same for a whole row, only moves the row's
// LSE (the softmax does not see it; a sink's logit, which does not carry it, would). The mask is then
// [B, Hq, 1, Lk] viewed as [B, Hq, Lq, Lk] with a zero query stride (a batch dim of its own, so the
// kernels never classify its tiles) and lse_shift = slope * (p - c), [1 or B, Hq, Lq]: the kernels'
// LSE exceeds the op's by it. Otherwise the whole bias, [B, Hq, Lq, Lk] (broadcast over the batch
// for (heads_q,) slopes), with -inf left of a sliding window's left bound (s.window_span, which the
// caller then drops: the kernels take no window beside a mask); lse_shift undefined.
struct AlibiMask {
  at::Tensor mask;
  at::Tensor lse_shift;
};
AlibiMask alibi_mask(const at::Tensor& slopes, const CheckedShape& s, bool is_causal, bool has_sink);

}  // namespace flashattn
