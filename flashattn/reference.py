"""Plain-PyTorch attention with exactly the semantics of the flashattn ops.

It materializes the full ``[B, H, Lq, Lk]`` score matrix, so it is for tests and documentation, not
for speed or long sequences. Autograd works through it, which makes it the gradient reference too.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

__all__ = ["attention_reference", "causal_visibility"]


def causal_visibility(seqlen_q: int, seqlen_k: int, bottom_right: bool, device=None) -> torch.Tensor:
    """Boolean ``[Lq, Lk]`` mask, True where key j is visible to query i under causal masking.

    Key j is visible to query i iff ``j <= i + offset``, offset 0 for top-left alignment (the
    convention of ``torch.nn.functional.scaled_dot_product_attention``) or ``Lk - Lq`` for
    bottom-right alignment (the FlashAttention-2 convention, where the last query sees every key).
    """
    offset = seqlen_k - seqlen_q if bottom_right else 0
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + offset


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: Optional[float] = None,
    is_causal: bool = False,
    causal_bottom_right: bool = False,
    upcast: bool = True,
    return_lse: bool = False,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    dropout_mask: Optional[torch.Tensor] = None,
    sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
):
    """softmax(q k^T * scale) v in the ``(B, S, H, D)`` layout of the flashattn ops.

    Args:
        q: ``[B, Lq, Hq, D]``.
        k, v: ``[B, Lk, Hk, D]``; Hq must be a multiple of Hk (grouped-query attention: query head h
            reads key/value head ``h // (Hq // Hk)``).
        scale: multiplies the scores; defaults to ``1 / sqrt(D)``.
        is_causal: mask key j from query i unless ``j <= i + offset``.
        causal_bottom_right: offset ``Lk - Lq`` instead of 0 (see :func:`causal_visibility`).
        upcast: compute in float32 (float64 stays float64) and return the result in that precision;
            ``False`` runs the same math in the inputs' dtype (the "baseline" of the test oracle).
        return_lse: also return the natural-log log-sum-exp of each row's scaled (and masked) scores,
            ``[B, Hq, Lq]`` in the compute dtype.
        attn_mask: broadcastable to ``[B, Hq, Lq, Lk]``; bool (True = the key takes part) or floating
            (added to the scaled scores, in the compute dtype; -inf excludes the key). It combines with
            ``is_causal``. Autograd reaches a floating mask that requires grad.
        dropout_p: attention dropout probability in [0, 1): after the softmax the probabilities
            become ``P * dropout_mask / (1 - dropout_p)``. The lse stays that of the undropped scores.
        dropout_mask: bool, broadcastable to ``[B, Hq, Lq, Lk]``, True where a probability is kept;
            required when ``dropout_p > 0`` (the reference draws nothing itself: pass the kernels'
            mask, ``flashattn.ops.dropout_keep_mask(rng_state, B, Hq, Lq, Lk, dropout_p)``).
        sink: ``[Hq]`` attention-sink logits: each row's softmax runs over its scores and ``sink[h]``, as
            an extra column whose probability is then dropped (it multiplies no value). The lse
            includes it, and a row that sees no key gets out 0 and lse ``sink[h]``. Autograd reaches it.
        softcap: > 0 caps the scaled scores to ``softcap * tanh(score / softcap)`` before the mask and
            the softmax (0: no cap).

    A query row that sees no key (bottom-right causal with Lq > Lk, Lk == 0, or every key masked)
    gets a zero output row and an lse of -inf, with zero gradients; no NaN is produced.

    Returns:
        out ``[B, Lq, Hq, D]`` contiguous, or ``(out, lse)`` with ``return_lse``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-dim [B, S, H, D] tensors, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"heads_q={heads_q} must be a multiple of heads_kv={heads_kv}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0.0 and dropout_mask is None:
        raise ValueError("dropout_p > 0 needs dropout_mask (bool, True = kept)")

    compute_dtype = q.dtype
    if upcast and q.dtype != torch.float64:
        compute_dtype = torch.float32
    q_, k_, v_ = (t.to(compute_dtype) for t in (q, k, v))
    group = heads_q // heads_kv
    if group > 1:
        k_ = k_.repeat_interleave(group, dim=2)
        v_ = v_.repeat_interleave(group, dim=2)

    scores = torch.einsum("bqhd,bkhd->bhqk", q_, k_) * scale  # [B, Hq, Lq, Lk]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        visible = causal_visibility(seqlen_q, seqlen_k, causal_bottom_right, device=q.device)
    else:
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    additive = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask
        else:
            additive = attn_mask.to(compute_dtype)
            visible = visible & (additive != float("-inf"))
    row_empty = ~visible.any(dim=-1, keepdim=True)  # [..., Lq, 1]
    if sink is not None:
        # The sink's column is always visible: no row is empty; rows without keys are all sink.
        row_empty = torch.zeros_like(row_empty)
    if additive is not None:
        # Leave the -inf out of rows that end up empty (they are zeroed below) so softmax stays finite.
        scores = scores + additive.masked_fill(row_empty & (additive == float("-inf")), 0.0)
    # Leave empty rows unmasked so softmax stays finite (no NaN in values or gradients), then zero them.
    scores = scores.masked_fill(~(visible | row_empty), float("-inf"))
    if sink is not None:
        sink_column = sink.to(compute_dtype).view(1, heads_q, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    probs = torch.softmax(scores, dim=-1).masked_fill(row_empty, 0.0)
    if sink is not None:
        probs = probs[..., :seqlen_k]
    if dropout_p > 0.0:
        probs = probs.masked_fill(~dropout_mask, 0.0) * (1.0 / (1.0 - dropout_p))
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v_).contiguous()
    if not return_lse:
        return out
    lse = torch.logsumexp(scores.detach(), dim=-1).masked_fill(row_empty.squeeze(-1), float("-inf"))
    return out, lse
