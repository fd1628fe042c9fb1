"""The FlashAttention-2 KV-cache API: attention of new queries over a cache of keys and values that
grows in place, for autoregressive decoding and chunked prefill.

``k_cache`` and ``v_cache`` ``(batch, seqlen_cache, nheads_k, headdim)`` hold each sequence's keys and
values at its first ``cache_seqlens[b]`` positions (v's head dim may differ: headdim_v); new ``k`` and
``v`` ``(batch, seqlen_new, nheads_k, headdim / headdim_v)``, when given, are written after them (in
place, with indices computed on the device: no host synchronization) and attended to as well. The
queries ``q`` ``(batch, seqlen_q, nheads, headdim)`` are the sequence's last ``seqlen_q`` positions: with ``causal``, query i of sequence b sees keys
``j <= L_b - seqlen_q + i``, where ``L_b`` is the sequence's length after the append.

With ``rotary_cos`` / ``rotary_sin`` the new keys, and the queries, are rotated first (rotary position
embedding at the positions they take in the cache: query i at ``cache_seqlens[b] + i`` with ``causal`` or
a window, else every query at ``cache_seqlens[b]``, as FlashAttention-2 rotates them); ``cache_batch_idx`` picks the cache rows the
sequences use; ``cache_leftpad`` makes each sequence's keys start at that index (the cache rows before it
are left-padding, never attended to).

With ``block_table`` the caches are paged: ``k_cache`` and ``v_cache`` ``(num_pages, page_size, nheads_k,
headdim)``, key j of sequence b at row ``j % page_size`` of page ``block_table[b, j // page_size]``.

How it runs: on CUDA, with float16 / bfloat16, a head dim that is a multiple of 8 up to 256 and at most
64 query rows per kv head (nheads / nheads_k times seqlen_q), the decode op (csrc/decode): each
sequence's keys split across thread blocks (``num_splits``, 0 = chosen from the shapes), the query
heads of a kv head computed together, pages read in place. Otherwise (the CPU, longer query chunks,
other head dims) the batched op over the cache with a mask of each sequence's keys (a paged cache is
first gathered into a contiguous copy); a CPU decoding step (one query) with grouped query heads and
no ALiBi runs each kv head's query heads as the rows of one call. The rotary embedding and the append
are torch operations on the device.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple, Union

import torch

from . import ops
from ._fa2_common import (alibi_mask, check_alibi, check_devices, check_tensor, fa2_attention, op_slopes, page_table_alias,
                          rows_aligned, scale_or_default, window_bounds, window_keys)

__all__ = ["flash_attn_with_kvcache", "get_scheduler_metadata"]


def _lengths(cache_seqlens, batch: int, seqlen_cache: int, device: torch.device) -> torch.Tensor:
    """cache_seqlens as an integer [batch] tensor on the device (None: the whole cache); a tensor is
    returned as given (int32 or int64), so a decoding step converts nothing."""
    if cache_seqlens is None:
        return torch.full((batch,), seqlen_cache, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(f"flashattn: cache_seqlens must be an int or a tensor, got {type(cache_seqlens).__name__}")
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= seqlen_cache:
            raise ValueError(f"flashattn: cache_seqlens={cache_seqlens} is outside the cache's 0..{seqlen_cache}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    if cache_seqlens.shape != (batch,) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"flashattn: cache_seqlens must be an int32 tensor of shape ({batch},), got {cache_seqlens.dtype} "
            f"of shape {tuple(cache_seqlens.shape)}"
        )
    if cache_seqlens.device != device:
        raise ValueError(f"flashattn: cache_seqlens must be on q's device {device}, got {cache_seqlens.device}")
    return cache_seqlens


def _append(cache: torch.Tensor, new: torch.Tensor, lengths: torch.Tensor, cache_rows: Optional[torch.Tensor],
            block_table: Optional[torch.Tensor]) -> None:
    """cache[cache_rows[b], lengths[b] + t] = new[b, t] (cache_rows None: row b), in place; with a block table, position
    lengths[b] + t of sequence b goes to its page's row."""
    seqlen_new = new.size(1)
    positions = lengths[:, None] + torch.arange(seqlen_new, device=new.device)  # [batch, seqlen_new]
    if block_table is None:
        if cache_rows is None:
            cache_rows = torch.arange(new.size(0), device=new.device)
        cache[cache_rows[:, None], positions] = new
    else:
        page_size = cache.size(1)
        pages = block_table.long().gather(1, positions // page_size)
        cache[pages, positions % page_size] = new


def check_block_table(block_table, batch: int, cache_batch_idx, device) -> None:
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.dtype != torch.int32 \
            or block_table.size(0) != batch:
        raise ValueError(f"flashattn: block_table must be an int32 tensor of shape ({batch}, pages_per_sequence), got "
                         f"{getattr(block_table, 'dtype', type(block_table).__name__)} of shape "
                         f"{tuple(getattr(block_table, 'shape', ()))}")
    if block_table.device != device:
        raise ValueError(f"flashattn: block_table must be on q's device {device}, got {block_table.device}")
    if cache_batch_idx is not None:
        raise ValueError("flashattn: block_table and cache_batch_idx cannot be given together (a block table "
                         "names each sequence's pages itself)")
    if block_table.size(1) > 0 and block_table.stride(1) != 1:
        raise ValueError("flashattn: block_table must have a contiguous last dim")


def gather_pages(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache as a contiguous (batch, pages_per_sequence * page_size, nheads_k, headdim) copy. Table
    entries outside the cache's pages (past a sequence's keys, never attended to) read as zeros, as on the
    decode op."""
    pages = block_table.long()
    valid = (pages >= 0) & (pages < cache.size(0))
    gathered = cache[torch.where(valid, pages, torch.zeros_like(pages))]  # (batch, pages, page_size, nheads_k, headdim)
    gathered = torch.where(valid[:, :, None, None, None], gathered, torch.zeros((), dtype=cache.dtype, device=cache.device))
    return gathered.flatten(1, 2)


# The decode op computes a kv head's query rows in blocks of 16, each reading the keys again: past this
# many rows a chunk of queries is prefill, which the batched kernels run better.
_DECODE_MAX_ROWS = 64

# Whether calls the decode op serves run on it (the default; FLASHATTN_DECODE_OP=0 sends them to the
# batched kernels instead); tests set it directly.
decode_op_enabled = os.environ.get("FLASHATTN_DECODE_OP", "1") != "0"


_decode_head_dims: dict = {}


# A property of the build and the GPU: traced as a constant (a plain function with its own cache: dynamo
# traces into an lru_cache wrapper and then cannot call the extension function).
@torch.compiler.assume_constant_result
def _decode_op_serves_head_dim(head_dim: int, bf16: bool, device_index: int) -> bool:
    key = (head_dim, bf16, device_index)
    if key not in _decode_head_dims:
        _decode_head_dims[key] = bool(ops._C.decode_supported(head_dim, bf16, device_index))
    return _decode_head_dims[key]


def decode_op_serves(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, queries_per_sequence: int) -> bool:
    """Whether the decode op serves a call (see the module docstring): q (..., nheads, headdim) with at
    most queries_per_sequence queries a sequence, caches (pages or batch, rows, nheads_k, headdim)."""
    if not decode_op_enabled or q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype or k_cache.size(2) == 0 or q.size(-2) % k_cache.size(2):
        return False
    if v_cache.size(-1) != q.size(-1):  # a value head dim of its own: the batched kernels (padded)
        return False
    if q.size(-2) // k_cache.size(2) * queries_per_sequence > _DECODE_MAX_ROWS:
        return False
    if not all(rows_aligned(t) for t in (q, k_cache, v_cache)):
        return False
    return _decode_op_serves_head_dim(q.size(-1), q.dtype == torch.bfloat16, q.device.index or 0)


def splits_from(num_splits, scheduler_metadata) -> int:
    """The decode op's num_splits: num_splits when it is not 0, else the count in scheduler_metadata (what
    get_scheduler_metadata returned), else 0 (chosen by the op)."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flashattn: num_splits must be an int >= 0 (0: chosen from the shapes), got {num_splits!r}")
    if scheduler_metadata is None or num_splits > 0:
        return num_splits
    if (not isinstance(scheduler_metadata, torch.Tensor) or scheduler_metadata.device.type != "cpu"
            or scheduler_metadata.dtype != torch.int32 or scheduler_metadata.shape != (1,)):
        raise ValueError("flashattn: scheduler_metadata must be what flashattn.get_scheduler_metadata returned (an "
                         f"int32 CPU tensor of one element), got {_describe(scheduler_metadata)}")
    return max(int(scheduler_metadata[0]), 0)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


def get_scheduler_metadata(batch_size: int, max_seqlen_q: int, max_seqlen_k: int, num_heads_q: int,
                           num_heads_kv: int, headdim: int, cache_seqlens: Optional[torch.Tensor] = None,
                           qkv_dtype: torch.dtype = torch.bfloat16, headdim_v: Optional[int] = None,
                           cu_seqlens_q: Optional[torch.Tensor] = None,
                           cu_seqlens_k_new: Optional[torch.Tensor] = None,
                           cache_leftpad: Optional[torch.Tensor] = None, page_size: Optional[int] = None,
                           max_seqlen_k_new: int = 0, causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           attention_chunk: int = 0, has_softcap: bool = False, num_splits: int = 0,
                           pack_gqa: Optional[bool] = None, sm_margin: int = 0) -> torch.Tensor:
    """FlashAttention-3's ``get_scheduler_metadata``: the decode op's schedule for calls of these sizes,
    worked out ahead of time (before a CUDA graph capture, say) and passed to
    :func:`flash_attn_with_kvcache` or ``flash_attn_varlen_func`` as ``scheduler_metadata``.

    flashattn's schedule depends on the sizes and the GPU only, never on the lengths on the device, so
    the metadata is one number, the key split count: an int32 CPU tensor of one element (1 without a
    CUDA device or CUDA kernels). It is chosen as ``num_splits=0`` would be for ``batch_size`` sequences
    of ``max_seqlen_q`` queries and at most ``max_seqlen_k`` keys each (the op itself counts a cache's
    capacity) on the current CUDA device, with ``sm_margin`` SMs left to other work; a ``num_splits``
    above 0 is returned as it is. The other arguments describe the call as FlashAttention-3's do and do
    not change the count (``cache_seqlens``, ``cu_seqlens_*``, ``cache_leftpad``, ``page_size``,
    ``max_seqlen_k_new``, ``causal``, ``window_size``, ``has_softcap``; the query heads of a kv head are
    always packed together, whatever ``pack_gqa`` says). A ``headdim_v`` other than ``headdim`` gives 1
    (such calls take the batched kernels, which split no keys); ``attention_chunk`` other than 0 is not
    implemented and raises NotImplementedError."""
    if attention_chunk:
        raise NotImplementedError("flashattn: attention_chunk is not implemented (only 0)")
    sizes = dict(batch_size=batch_size, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                 num_heads_q=num_heads_q, num_heads_kv=num_heads_kv, headdim=headdim, num_splits=num_splits,
                 sm_margin=sm_margin)
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"flashattn: {name} must be an int >= 0, got {value!r}")
    if num_heads_kv < 1 or num_heads_q % num_heads_kv != 0:
        raise ValueError(f"flashattn: num_heads_q ({num_heads_q}) must be a multiple of num_heads_kv ({num_heads_kv})")
    splits = num_splits
    if splits == 0:
        splits = 1
        # (A value head dim of its own takes the batched kernels: no split count.)
        if (ops.cuda_kernels_built() and torch.cuda.is_available() and batch_size >= 1 and max_seqlen_q >= 1
                and headdim >= 1 and headdim_v in (None, headdim)):
            splits = ops._C.decode_num_splits(batch_size, num_heads_q, num_heads_kv, max_seqlen_q, max_seqlen_k, headdim,
                                          qkv_dtype == torch.bfloat16, torch.cuda.current_device(), sm_margin)
    return torch.tensor([splits], dtype=torch.int32)


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
    *,
    page_table: Optional[torch.Tensor] = None,
    scheduler_metadata: Optional[torch.Tensor] = None,
):
    """Attention over a KV cache: ``flash_attn.flash_attn_with_kvcache`` compatible (a subset).

    q ``(batch, seqlen_q, nheads, headdim)``; k_cache, v_cache ``(batch, seqlen_cache, nheads_k,
    headdim)`` and ``(..., headdim_v)``; k, v (optional, both or neither) ``(batch, seqlen_new, nheads_k,
    headdim)`` and ``(..., headdim_v)``, written into the caches at positions ``cache_seqlens[b] ..`` in
    place before the attention. A headdim_v other than headdim takes the batched kernels over a copy of
    the caches zero-padded to the wider head dim (exact; the copy costs the cache's size each call).
    cache_seqlens: the cached length of each sequence before the append, an int or an int32
    ``(batch,)`` tensor on q's device; None means the whole cache (then k and v must be None).
    A sequence whose append would run past the cache is an error (raised at once on the CPU, a
    device-side assertion on CUDA). Without an append, the decode op reads a length outside
    0..capacity as clamped into it (no check: that would cost the step launches of its own); the other
    paths raise. softmax_scale and causal as in :func:`flash_attn_func`, with the causal mask aligned
    to each sequence's own length.
    block_table: int32 ``(batch, pages_per_sequence)`` on q's device for a paged cache (k_cache, v_cache
    ``(num_pages, page_size, nheads_k, headdim)``, any page_size): sequence b's key j is row
    ``j % page_size`` of page ``block_table[b, j // page_size]``; the capacity of a sequence is
    pages_per_sequence * page_size. Entries past a sequence's keys are never read; an entry outside
    0..num_pages-1 that is (a bug of the caller) reads as zero keys and values on the decode op. Not with
    cache_batch_idx. New k and v are written into the pages.
    page_table (keyword only): FlashAttention-3's name for block_table (pass one of the two).
    num_splits: how many thread blocks share each sequence's keys on the decode op (0: chosen from the
    shapes and the GPU); ignored elsewhere.
    scheduler_metadata (keyword only): what :func:`get_scheduler_metadata` returned for the call's sizes;
    with num_splits 0, its split count is taken.

    rotary_cos, rotary_sin: ``(seqlen_ro, rotary_dim / 2)``, given together and only with k and v: the
    new keys are rotated at positions ``cache_seqlens[b] + t`` (the cache rows they are written to), the
    queries at ``cache_seqlens[b] + i`` with ``causal`` or a window, else all at ``cache_seqlens[b]``; the first
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

    alibi_slopes as in :func:`flash_attn_func`, from the same diagonal positions: the decode op adds the
    term itself; calls it does not serve run an additive mask over the cache on the batched kernels.

    Returns out ``(batch, seqlen_q, nheads, headdim_v)``, and with ``return_softmax_lse=True`` also the
    log-sum-exp ``(batch, nheads, seqlen_q)`` float32 (-inf for a row that sees no key).
    """
    block_table = page_table_alias(block_table, page_table)
    window = window_bounds(window_size)
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    check_tensor("k_cache", k_cache, 4, "(batch, seqlen_cache, nheads_k, headdim)")
    check_tensor("v_cache", v_cache, 4, "(batch, seqlen_cache, nheads_k, headdim_v)")
    check_devices(q, k_cache, v_cache)
    if (k is None) != (v is None):
        raise ValueError("flashattn: k and v must be given together (or neither)")
    num_splits = splits_from(num_splits, scheduler_metadata)
    batch, seqlen_q, nheads = q.shape[:3]
    if block_table is not None:
        check_block_table(block_table, batch, cache_batch_idx, q.device)
        if k_cache.shape[:3] != v_cache.shape[:3]:
            raise ValueError(f"flashattn: k_cache and v_cache must have the same shape (num_pages, page_size, nheads_k, "
                             f"headdim; headdim_v may differ), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        seqlen_cache = block_table.size(1) * k_cache.size(1)  # each sequence's capacity
    else:
        seqlen_cache = k_cache.size(1)
        if k_cache.shape[:3] != v_cache.shape[:3] or (cache_batch_idx is None and k_cache.size(0) != batch):
            raise ValueError(
                f"flashattn: k_cache and v_cache must have the same shape (batch={batch}, seqlen_cache, nheads_k, "
                f"headdim; any batch with cache_batch_idx; headdim_v may differ), got {tuple(k_cache.shape)} and "
                f"{tuple(v_cache.shape)}"
            )
    lengths = _lengths(cache_seqlens, batch, seqlen_cache, q.device)
    cache_rows = None  # row b (made only where an append needs it)
    if cache_batch_idx is not None:
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
    slopes = check_alibi(alibi_slopes, batch, nheads, q.device, float(softcap))
    decode_op = decode_op_serves(q, k_cache, v_cache, seqlen_q)
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("flashattn: appending k and v needs cache_seqlens (where each sequence's cache ends)")
        check_tensor("k", k, 4, "(batch, seqlen_new, nheads_k, headdim)")
        check_tensor("v", v, 4, "(batch, seqlen_new, nheads_k, headdim_v)")
        expected = (batch, k.size(1)) + tuple(k_cache.shape[2:])
        expected_v = (batch, k.size(1)) + tuple(v_cache.shape[2:])
        if tuple(k.shape) != expected or tuple(v.shape) != expected_v:
            raise ValueError(
                f"flashattn: k and v must have shapes {expected} and {expected_v} (batch, seqlen_new, nheads_k, "
                f"headdim or headdim_v), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.dtype != k_cache.dtype or v.dtype != k_cache.dtype:
            raise ValueError(f"flashattn: k and v must have the caches' dtype {k_cache.dtype}, got {k.dtype} and {v.dtype}")
        torch._assert_async(((lengths >= 0) & (lengths + k.size(1) <= seqlen_cache)).all(),
                            f"flashattn: cache_seqlens + seqlen_new must be in 0..{seqlen_cache} (the cache's rows)")
        if rotary_cos is not None:
            steps = torch.arange(max(seqlen_q, k.size(1)), device=q.device)
            positions_k = lengths[:, None] + steps[:k.size(1)]
            # Causal or windowed, query i sits at position lengths[b] + i; else every query at lengths[b]
            # (FlashAttention-2's rule).
            local = causal or window != (-1, -1)
            positions_q = lengths[:, None] + (steps[:seqlen_q] if local else torch.zeros_like(steps[:seqlen_q]))
            torch._assert_async((positions_k < rotary_cos.size(0)).all() & (positions_q < rotary_cos.size(0)).all(),
                                f"flashattn: a rotary position is past rotary_cos's {rotary_cos.size(0)} rows")
            k = _rotate(k, rotary_cos, rotary_sin, positions_k, rotary_interleaved)
            q = _rotate(q, rotary_cos, rotary_sin, positions_q, rotary_interleaved)
        _append(k_cache, k, lengths, cache_rows, block_table)
        _append(v_cache, v, lengths, cache_rows, block_table)
        lengths = lengths + k.size(1)
    elif isinstance(cache_seqlens, torch.Tensor) and not decode_op:
        torch._assert_async(((lengths >= 0) & (lengths <= seqlen_cache)).all(),
                            f"flashattn: cache_seqlens must be in 0..{seqlen_cache}")

    window = (window[0], 0 if causal else window[1])
    if decode_op:
        seqlens_k = lengths.to(torch.int32).contiguous()  # an int32 tensor as given: no launch
        out, lse = torch.ops.flashattn.decode_fwd(
            q, k_cache, v_cache, seqlens_k, block_table, cache_batch_idx,
            cache_leftpad, scale_or_default(softmax_scale, q.size(-1)), bool(causal),
            window[0], window[1], float(softcap), num_splits,
            alibi_slopes=op_slopes(slopes))
        return (out, lse) if return_softmax_lse else out

    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    keys = torch.arange(seqlen_cache, device=q.device)
    # Query i of sequence b sits at diagonal position lengths[b] - seqlen_q + i (with causal: it sees the
    # keys up to there); a window bounds the keys around it, and ALiBi's bias grows with the distance.
    diagonal = lengths[:, None] - seqlen_q + torch.arange(seqlen_q, device=q.device)  # [batch, seqlen_q]
    if window != (-1, -1):
        visible = window_keys(diagonal[:, :, None], keys, window) & (keys < lengths[:, None, None])
        visible = visible[:, None]  # [batch, 1, seqlen_q, seqlen_cache]
    else:
        visible = (keys < lengths[:, None])[:, None, None, :]  # [batch, 1, 1, seqlen_cache]
    if leftpad is not None:
        visible = visible & (keys >= leftpad[:, None])[:, None, None, :]
    mask = visible.expand(batch, nheads, seqlen_q, seqlen_cache)
    if slopes is not None:
        bias = alibi_mask(slopes, diagonal, keys, (-1, -1))  # [batch, nheads, seqlen_q, seqlen_cache]
        mask = bias.masked_fill(~mask, float("-inf"))
    if cache_batch_idx is not None:
        k_cache, v_cache = k_cache.index_select(0, cache_rows), v_cache.index_select(0, cache_rows)
    heads_k = k_cache.size(2)
    group = nheads // heads_k
    if q.device.type == "cpu" and seqlen_q == 1 and group > 1 and slopes is None:
        # A CPU decoding step: each kv head's query heads as the query rows of one call over that head
        # (one pass over its keys and values instead of one per query head). They share the query's
        # position, hence its keys (`visible`); ALiBi's bias would differ per head.
        rows = q.reshape(batch, heads_k, group, q.size(-1)).transpose(1, 2)  # (batch, group, nheads_k, headdim)
        out, lse, _ = fa2_attention(rows, k_cache, v_cache, 0.0, softmax_scale, False, False, False,
                                    visible.expand(batch, heads_k, group, seqlen_cache), softcap=softcap)
        out = out.transpose(1, 2).reshape(batch, 1, nheads, out.size(-1))  # query head kv * group + g
        lse = lse.reshape(batch, nheads, 1)
        return (out, lse) if return_softmax_lse else out
    # The causal mask is in `mask`, aligned to each sequence's own length.
    out, lse, _ = fa2_attention(q, k_cache, v_cache, 0.0, softmax_scale, False, False, False, mask, softcap=softcap)
    return (out, lse) if return_softmax_lse else out
