"""The FlashAttention-2 KV-cache API: attention of new queries over a cache of keys and values that
grows in place, for autoregressive decoding and chunked prefill.

``k_cache`` and ``v_cache`` ``(batch, seqlen_cache, nheads_k, headdim)`` hold each sequence's keys and
values at its first ``cache_seqlens[b]`` positions; new ``k`` and ``v`` ``(batch, seqlen_new, nheads_k,
headdim)``, when given, are written after them (in place, with indices computed on the device: no
host synchronization) and attended to as well. The queries ``q`` ``(batch, seqlen_q, nheads, headdim)``
are the sequence's last ``seqlen_q`` positions: with ``causal``, query i of sequence b sees keys
``j <= L_b - seqlen_q + i``, where ``L_b`` is the sequence's length after the append.

With ``rotary_cos`` / ``rotary_sin`` the new keys, and the queries, are rotated first (rotary position
embedding at the positions they take in the cache); ``cache_batch_idx`` picks the cache rows the
sequences use; ``cache_leftpad`` makes each sequence's keys start at that index (the cache rows before it
are left-padding, never attended to).

How it runs: the batched op over the whole cache with a mask of each sequence's keys. Without
``causal``, or with one query per sequence (decoding), that mask is a key-length mask broadcast over
the queries (``(batch, 1, 1, seqlen_cache)``, which the sm90 forward runs as key lengths); with
``causal`` and several queries, or with ``cache_leftpad``, it is a ``(batch, 1, seqlen_q or 1,
seqlen_cache)`` boolean tensor. The rotary embedding and the append are torch operations on the device;
with ``cache_batch_idx`` the selected cache rows are gathered into a copy for the attention (a pass over
them). Keys are not split across thread blocks, so a decoding step of a small batch leaves most of a
large GPU idle.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._fa2_common import check_devices, check_tensor, fa2_attention, reject_alibi, window_bounds, window_keys

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


def _append(cache: torch.Tensor, new: torch.Tensor, lengths: torch.Tensor, cache_rows: torch.Tensor) -> None:
    """cache[cache_rows[b], lengths[b] + t] = new[b, t], in place."""
    seqlen_new = new.size(1)
    rows = lengths[:, None] + torch.arange(seqlen_new, device=new.device)  # [batch, seqlen_new]
    cache[cache_rows[:, None], rows] = new


def _index_tensor(name: str, t, batch: int, device: torch.device) -> torch.Tensor:
    """An int32 (batch,) tensor argument on the device, as int64."""
    if not isinstance(t, torch.Tensor) or t.shape != (batch,) or t.dtype != torch.int32:
        raise ValueError(f"flashattn: {name} must be an int32 tensor of shape ({batch},), got "
                         f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
    if t.device != device:
        raise ValueError(f"flashattn: {name} must be on q's device {device}, got {t.device}")
    return t.long()


def _check_rotary(rotary_cos, rotary_sin, head_dim: int, device: torch.device) -> None:
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flashattn: rotary_cos and rotary_sin must be given together (or neither)")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"flashattn: {name} must be a floating (seqlen_ro, rotary_dim / 2) tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
        if t.device != device:
            raise ValueError(f"flashattn: {name} must be on q's device {device}, got {t.device}")
    if rotary_cos.shape != rotary_sin.shape or not 1 <= 2 * rotary_cos.size(1) <= head_dim:
        raise ValueError(f"flashattn: rotary_cos and rotary_sin must have the same shape (seqlen_ro, rotary_dim / 2) "
                         f"with rotary_dim <= headdim {head_dim}, got {tuple(rotary_cos.shape)} and "
                         f"{tuple(rotary_sin.shape)}")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
            interleaved: bool) -> torch.Tensor:
    """x (batch, seqlen, heads, headdim) with its first rotary_dim dims rotated by the angles of row
    positions[b, t] of cos / sin (rotary position embedding), in float32, returned in x's dtype. Interleaved:
    dims (0, 1), (2, 3), ... rotate together (GPT-J); else d and d + rotary_dim / 2 (GPT-NeoX)."""
    half = cos.size(1)
    c = cos[positions].float().unsqueeze(2)  # (batch, seqlen, 1, rotary_dim / 2)
    s = sin[positions].float().unsqueeze(2)
    part = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = part[..., :half], part[..., half:]
        rotated = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rotated.to(x.dtype), x[..., 2 * half:]], dim=-1)


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

    rotary_cos, rotary_sin: ``(seqlen_ro, rotary_dim / 2)``, given together and only with k and v: the
    new keys are rotated at positions ``cache_seqlens[b] + t`` (the cache rows they are written to), the
    queries at ``cache_seqlens[b] + i`` with ``causal``, else all at ``cache_seqlens[b]``; the first
    rotary_dim dims of each head, ``rotary_interleaved`` pairing dims (0, 1), (2, 3), ... (GPT-J) or d
    and d + rotary_dim / 2 (GPT-NeoX). A position past seqlen_ro is an error (a device-side assertion
    on CUDA).
    cache_batch_idx: int32 ``(batch,)`` on q's device, the cache row of each sequence (k_cache's batch may
    be larger than q's); None: row b. Duplicate rows with k and v: the append's writes race, as in
    flash_attn.
    cache_leftpad: int32 ``(batch,)`` on q's device, the cache index where each sequence's keys start
    (0 <= cache_leftpad[b] <= cache_seqlens[b]); the rows before it are never attended to. Positions
    (rotary and the causal diagonal) stay the cache's row indices.
    softcap and window_size as in :func:`flash_attn_func`, the window around each query's diagonal
    position ``cache_seqlens[b] - seqlen_q + i`` (after the append).

    Not implemented (they raise NotImplementedError): block_table (paged caches), alibi_slopes.

    Returns out ``(batch, seqlen_q, nheads, headdim)``, and with ``return_softmax_lse=True`` also the
    log-sum-exp ``(batch, nheads, seqlen_q)`` float32 (-inf for a row that sees no key).
    """
    reject_alibi(alibi_slopes)
    window = window_bounds(window_size)
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table is not implemented yet in flash_attn_with_kvcache (only None)")
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    check_tensor("k_cache", k_cache, 4, "(batch, seqlen_cache, nheads_k, headdim)")
    check_tensor("v_cache", v_cache, 4, "(batch, seqlen_cache, nheads_k, headdim)")
    check_devices(q, k_cache, v_cache)
    if (k is None) != (v is None):
        raise ValueError("flashattn: k and v must be given together (or neither)")
    batch, seqlen_q, nheads = q.shape[:3]
    seqlen_cache = k_cache.size(1)
    if k_cache.shape != v_cache.shape or (cache_batch_idx is None and k_cache.size(0) != batch):
        raise ValueError(
            f"flashattn: k_cache and v_cache must have the same shape (batch={batch}, seqlen_cache, nheads_k, "
            f"headdim; any batch with cache_batch_idx), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    lengths = _lengths(cache_seqlens, batch, seqlen_cache, q.device)
    if cache_batch_idx is None:
        cache_rows = torch.arange(batch, device=q.device)
    else:
        cache_rows = _index_tensor("cache_batch_idx", cache_batch_idx, batch, q.device)
        torch._assert_async(((cache_rows >= 0) & (cache_rows < k_cache.size(0))).all(),
                            f"flashattn: cache_batch_idx must be in 0..{k_cache.size(0) - 1} (k_cache's rows)")
    leftpad = None
    if cache_leftpad is not None:
        leftpad = _index_tensor("cache_leftpad", cache_leftpad, batch, q.device)
        torch._assert_async(((leftpad >= 0) & (leftpad <= lengths)).all(),
                            "flashattn: cache_leftpad must be in 0..cache_seqlens[b]")
    if rotary_cos is not None:
        _check_rotary(rotary_cos, rotary_sin, q.size(-1), q.device)
        if k is None:
            raise ValueError("flashattn: rotary_cos and rotary_sin apply to new k and v: pass them too")
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
        if rotary_cos is not None:
            steps = torch.arange(max(seqlen_q, k.size(1)), device=q.device)
            positions_k = lengths[:, None] + steps[:k.size(1)]
            positions_q = lengths[:, None] + (steps[:seqlen_q] if causal else torch.zeros_like(steps[:seqlen_q]))
            torch._assert_async((positions_k < rotary_cos.size(0)).all() & (positions_q < rotary_cos.size(0)).all(),
                                f"flashattn: a rotary position is past rotary_cos's {rotary_cos.size(0)} rows")
            k = _rotate(k, rotary_cos, rotary_sin, positions_k, rotary_interleaved)
            q = _rotate(q, rotary_cos, rotary_sin, positions_q, rotary_interleaved)
        _append(k_cache, k, lengths, cache_rows)
        _append(v_cache, v, lengths, cache_rows)
        lengths = lengths + k.size(1)
    elif isinstance(cache_seqlens, torch.Tensor):
        torch._assert_async(((lengths >= 0) & (lengths <= seqlen_cache)).all(),
                            f"flashattn: cache_seqlens must be in 0..{seqlen_cache}")

    keys = torch.arange(seqlen_cache, device=q.device)
    window = (window[0], 0 if causal else window[1])
    if window != (-1, -1):
        # Query i of sequence b sits at diagonal position lengths[b] - seqlen_q + i (with causal: it sees
        # the keys up to there); the window bounds the keys around it.
        diagonal = lengths[:, None] - seqlen_q + torch.arange(seqlen_q, device=q.device)  # [batch, seqlen_q]
        visible = window_keys(diagonal[:, :, None], keys, window) & (keys < lengths[:, None, None])
        visible = visible[:, None]  # [batch, 1, seqlen_q, seqlen_cache]
    else:
        visible = (keys < lengths[:, None])[:, None, None, :]  # [batch, 1, 1, seqlen_cache]
    if leftpad is not None:
        visible = visible & (keys >= leftpad[:, None])[:, None, None, :]
    mask = visible.expand(batch, nheads, seqlen_q, seqlen_cache)
    if cache_batch_idx is not None:
        k_cache, v_cache = k_cache.index_select(0, cache_rows), v_cache.index_select(0, cache_rows)
    # The causal mask is in `mask`, aligned to each sequence's own length.
    out, lse, _ = fa2_attention(q, k_cache, v_cache, 0.0, softmax_scale, False, False, False, mask, softcap=softcap)
    return (out, lse) if return_softmax_lse else out
