"""The FlashAttention-2 KV-cache API: attention of new queries over a cache of keys and values that
grows in place, for autoregressive decoding and chunked prefill.

``k_cache`` and ``v_cache`` ``(batch, seqlen_cache, nheads_k, headdim)`` hold each sequence's keys and
values at its first ``cache_seqlens[b]`` positions; new ``k`` and ``v`` ``(batch, seqlen_new, nheads_k,
headdim)``, when given, are written after them (in place, with indices computed on the device: no
host synchronization) and attended to as well. The queries ``q`` ``(batch, seqlen_q, nheads, headdim)``
are the sequence's last ``seqlen_q`` positions: with ``causal``, query i of sequence b sees keys
``j <= L_b - seqlen_q + i``, where ``L_b`` is the sequence's length after the append.

How it runs: the batched op over the whole cache with a mask of each sequence's keys. Without
``causal``, or with one query per sequence (decoding), that mask is a key-length mask broadcast over
the queries (``(batch, 1, 1, seqlen_cache)``, which the sm90 forward runs as key lengths); with
``causal`` and several queries it is a ``(batch, 1, seqlen_q, seqlen_cache)`` boolean tensor. Keys are
not split across thread blocks, so a decoding step of a small batch leaves most of a large GPU idle.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._fa2_common import check_devices, check_tensor, fa2_attention, reject_unimplemented

__all__ = ["flash_attn_with_kvcache"]


def _lengths(cache_seqlens, batch: int, seqlen_cache: int, device: torch.device) -> torch.Tensor:
    """cache_seqlens as an int64 [batch] tensor on the device (None: the whole cache)."""
    if cache_seqlens is None:
        return torch.full((batch,), seqlen_cache, dtype=torch.int64, device=device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(f"flashattn: cache_seqlens must be an int or a tensor, got {type(cache_seqlens).__name__}")
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= seqlen_cache:
            raise ValueError(f"flashattn: cache_seqlens={cache_seqlens} is outside the cache's 0..{seqlen_cache}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int64, device=device)
    if cache_seqlens.shape != (batch,) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"flashattn: cache_seqlens must be an int32 tensor of shape ({batch},), got {cache_seqlens.dtype} "
            f"of shape {tuple(cache_seqlens.shape)}"
        )
    if cache_seqlens.device != device:
        raise ValueError(f"flashattn: cache_seqlens must be on q's device {device}, got {cache_seqlens.device}")
    return cache_seqlens.long()


def _append(cache: torch.Tensor, new: torch.Tensor, lengths: torch.Tensor) -> None:
    """cache[b, lengths[b] + t] = new[b, t], in place."""
    batch, seqlen_new = new.shape[:2]
    rows = lengths[:, None] + torch.arange(seqlen_new, device=new.device)  # [batch, seqlen_new]
    cache[torch.arange(batch, device=new.device)[:, None], rows] = new


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
):
    """Attention over a KV cache: ``flash_attn.flash_attn_with_kvcache`` compatible (a subset).

    q ``(batch, seqlen_q, nheads, headdim)``; k_cache, v_cache ``(batch, seqlen_cache, nheads_k,
    headdim)``; k, v (optional, both or neither) ``(batch, seqlen_new, nheads_k, headdim)``, written
    into the caches at positions ``cache_seqlens[b] ..`` in place before the attention.
    cache_seqlens: the cached length of each sequence before the append, an int or an int32
    ``(batch,)`` tensor on q's device; None means the whole cache (then k and v must be None).
    A sequence whose append would run past the cache is an error (raised at once on the CPU, a
    device-side assertion on CUDA). softmax_scale and causal as in :func:`flash_attn_func`, with
    the causal mask aligned to each sequence's own length. num_splits is accepted and ignored.

    Not implemented (they raise NotImplementedError): rotary embedding (rotary_cos, rotary_sin),
    cache_batch_idx, cache_leftpad, block_table (paged caches), window_size, alibi_slopes. softcap as in
    :func:`flash_attn_func`.

    Returns out ``(batch, seqlen_q, nheads, headdim)``, and with ``return_softmax_lse=True`` also the
    log-sum-exp ``(batch, nheads, seqlen_q)`` float32 (-inf for a row that sees no key).
    """
    reject_unimplemented(window_size, alibi_slopes)
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("block_table", block_table)):
        if value is not None:
            raise NotImplementedError(f"flashattn: {name} is not implemented yet in flash_attn_with_kvcache (only None)")
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    check_tensor("k_cache", k_cache, 4, "(batch, seqlen_cache, nheads_k, headdim)")
    check_tensor("v_cache", v_cache, 4, "(batch, seqlen_cache, nheads_k, headdim)")
    check_devices(q, k_cache, v_cache)
    if (k is None) != (v is None):
        raise ValueError("flashattn: k and v must be given together (or neither)")
    batch, seqlen_q, nheads = q.shape[:3]
    seqlen_cache = k_cache.size(1)
    if k_cache.shape != v_cache.shape or k_cache.size(0) != batch:
        raise ValueError(
            f"flashattn: k_cache and v_cache must have the same shape (batch={batch}, seqlen_cache, nheads_k, "
            f"headdim), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    lengths = _lengths(cache_seqlens, batch, seqlen_cache, q.device)
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("flashattn: appending k and v needs cache_seqlens (where each sequence's cache ends)")
        check_tensor("k", k, 4, "(batch, seqlen_new, nheads_k, headdim)")
        check_tensor("v", v, 4, "(batch, seqlen_new, nheads_k, headdim)")
        expected = (batch, k.size(1)) + tuple(k_cache.shape[2:])
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(
                f"flashattn: k and v must have shape {expected} (batch, seqlen_new, nheads_k, headdim), got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.dtype != k_cache.dtype or v.dtype != k_cache.dtype:
            raise ValueError(f"flashattn: k and v must have the caches' dtype {k_cache.dtype}, got {k.dtype} and {v.dtype}")
        torch._assert_async(((lengths >= 0) & (lengths + k.size(1) <= seqlen_cache)).all(),
                            f"flashattn: cache_seqlens + seqlen_new must be in 0..{seqlen_cache} (the cache's rows)")
        _append(k_cache, k, lengths)
        _append(v_cache, v, lengths)
        lengths = lengths + k.size(1)
    elif isinstance(cache_seqlens, torch.Tensor):
        torch._assert_async(((lengths >= 0) & (lengths <= seqlen_cache)).all(),
                            f"flashattn: cache_seqlens must be in 0..{seqlen_cache}")

    keys = torch.arange(seqlen_cache, device=q.device)
    if causal and seqlen_q > 1:
        # Query i of sequence b sees keys j <= lengths[b] - seqlen_q + i.
        last_key = lengths[:, None] - seqlen_q + torch.arange(seqlen_q, device=q.device)  # [batch, seqlen_q]
        visible = (keys <= last_key[:, :, None])[:, None]  # [batch, 1, seqlen_q, seqlen_cache]
    else:
        visible = (keys < lengths[:, None])[:, None, None, :]  # [batch, 1, 1, seqlen_cache]
    mask = visible.expand(batch, nheads, seqlen_q, seqlen_cache)
    # The causal mask is in `mask`, aligned to each sequence's own length.
    out, lse, _ = fa2_attention(q, k_cache, v_cache, 0.0, softmax_scale, False, False, False, mask, softcap=softcap)
    return (out, lse) if return_softmax_lse else out
