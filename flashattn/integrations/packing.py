"""Helpers for packed and padded batches in front of :func:`flashattn.flash_attn_varlen_func`.

Shapes: S is the padded row length, B the batch, T the number of real (non-padding) tokens, N the number
of documents. Everything stays on the input's device; the one host read is named where it happens.

* :func:`cu_seqlens_from_position_ids`: ``position_ids`` ``(1, S)`` of documents packed into one row
  (positions restart inside the row) -> int32 ``cu_seqlens`` ``(N + 1,)`` and the longest document,
  with one host synchronization (a 2-element read), cached per position_ids tensor.
* :func:`unpad` / :func:`pad`: a ``(B, S)`` padding mask (True / 1 = a real token, anywhere in the row:
  left or right padding) -> the real tokens gathered to ``(T, H, D)`` with their ``cu_seqlens``, and back.
* :func:`check_cu_seqlens`: caller-given offsets (transformers' ``cu_seq_lens_q/k``) converted to int32.
"""
from __future__ import annotations

import weakref
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from .._fa2_common import check_max_seqlen

__all__ = ["Unpadded", "check_cu_seqlens", "check_max_length", "cu_seqlens_from_position_ids", "document_starts",
           "gather", "pad", "unpad"]

# id(position_ids) -> (weak reference, _version, result)
_position_cache: Dict[int, tuple] = {}
_POSITION_CACHE_SIZE = 16


def _version_of(t: torch.Tensor) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """``(S,)`` bool: True where a document starts. position_ids ``(1, S)`` or ``(S,)``: a token starts a
    new document unless its position is the previous token's plus one (the rule transformers' masks use
    for packed rows); token 0 always starts one."""
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    if pos.numel() > 1:
        starts[1:] = pos[1:] != pos[:-1] + 1
    return starts


def _derive(position_ids: torch.Tensor) -> Optional[Tuple[torch.Tensor, int]]:
    starts = document_starts(position_ids)  # (S,)
    total = starts.numel()
    index = torch.arange(total, device=starts.device)
    # Each token's offset inside its document: its index minus the index of the latest start at or before it.
    latest_start = torch.where(starts, index, torch.zeros_like(index)).cummax(0).values  # (S,)
    longest = (index - latest_start).max() + 1
    # The one host synchronization: the document count and the longest document, read together.
    count, max_len = torch.stack([starts.sum(), longest]).tolist()
    if count <= 1:
        return None
    offsets = torch.nonzero_static(starts, size=count).reshape(-1)  # (N,): no second host read
    cu_seqlens = torch.cat([offsets, offsets.new_full((1,), total)]).to(torch.int32)  # (N + 1,)
    return cu_seqlens, int(max_len)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> Optional[Tuple[torch.Tensor, int]]:
    """``(cu_seqlens int32 (N + 1,), longest document)`` for documents packed into one row, or None when
    the row holds a single document (positions that only ever go up by one).

    position_ids ``(1, S)`` (or ``(S,)``). Reads two numbers on the host (one synchronization); the answer
    is cached for as long as the same, unmodified position_ids tensor comes back (the next layers of a
    forward pass), so a forward pass pays it once, not once per layer. Not cached inside torch.compile.
    """
    if position_ids.dim() == 2 and position_ids.size(0) != 1:
        raise ValueError(f"flashattn: packed position_ids must be one row (1, S), got shape {tuple(position_ids.shape)}")
    if position_ids.dim() not in (1, 2):
        raise ValueError(f"flashattn: position_ids must be (1, S), got shape {tuple(position_ids.shape)}")
    if torch.compiler.is_compiling():
        return _derive(position_ids)
    key = id(position_ids)
    hit = _position_cache.get(key)
    if hit is not None and hit[0]() is position_ids and hit[1] == _version_of(position_ids):
        return hit[2]
    result = _derive(position_ids)
    if len(_position_cache) >= _POSITION_CACHE_SIZE:
        _position_cache.clear()
    try:
        _position_cache[key] = (weakref.ref(position_ids), _version_of(position_ids), result)
    except TypeError:
        pass
    return result


def check_cu_seqlens(name: str, cu_seqlens, device: torch.device) -> torch.Tensor:
    """Caller-given offsets ``(N + 1,)`` as int32 on ``device`` (their values are checked on the device
    by flash_attn_varlen_func). Raises ValueError / TypeError naming ``name``."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor of sequence offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"flashattn: {name} must be a 1-dim tensor of (number of sequences + 1) offsets, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"flashattn: {name} must hold integer offsets, got {cu_seqlens.dtype}")
    if cu_seqlens.device != device:
        raise ValueError(f"flashattn: {name} is on {cu_seqlens.device}, the query on {device}")
    return cu_seqlens.to(torch.int32)


# An int >= 0 or a 0-dim integer tensor (left on the device), else ValueError naming the argument: the
# varlen functions' own check of max_seqlen.
check_max_length = check_max_seqlen


class Unpadded(NamedTuple):
    indices: torch.Tensor  # (T,) int64: flat index b * S + s of each real token
    cu_seqlens: torch.Tensor  # (B + 1,) int32
    max_seqlen: torch.Tensor  # 0-dim: the longest row's real-token count (left on the device)
    batch: int
    seqlen: int


def unpad(padding_mask: torch.Tensor) -> Unpadded:
    """Where the real tokens of a ``(B, S)`` padding mask are (True / nonzero = real). One host
    synchronization: the token count, inside ``nonzero`` (the longest row stays a device tensor)."""
    if padding_mask.dim() != 2:
        raise ValueError(f"flashattn: a padding mask must be 2-dim (batch, seqlen), got shape {tuple(padding_mask.shape)}")
    keep = padding_mask.bool()  # (B, S)
    lengths = keep.sum(-1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(keep.reshape(-1)).reshape(-1)  # (T,)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # (B + 1,)
    max_seqlen = lengths.max() if lengths.numel() else torch.zeros((), dtype=torch.int32, device=keep.device)
    return Unpadded(indices, cu_seqlens, max_seqlen, keep.size(0), keep.size(1))


def gather(x: torch.Tensor, layout: Unpadded) -> torch.Tensor:
    """x ``(B, S, H, D)`` -> ``(T, H, D)``: the real tokens, row after row."""
    return x.reshape((layout.batch * layout.seqlen,) + tuple(x.shape[2:])).index_select(0, layout.indices)


def pad(x: torch.Tensor, layout: Unpadded) -> torch.Tensor:
    """x ``(T, H, D)`` -> ``(B, S, H, D)``, zeros at the padding (differentiable)."""
    out = x.new_zeros((layout.batch * layout.seqlen,) + tuple(x.shape[1:]))
    out = out.index_copy(0, layout.indices, x)
    return out.view((layout.batch, layout.seqlen) + tuple(x.shape[1:]))
