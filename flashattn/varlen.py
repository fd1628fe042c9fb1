"""The FlashAttention-2 variable-length API: sequences of different lengths packed along one dim.

``q`` ``(total_q, nheads, headdim)`` holds the batch's query rows one sequence after another, sequence
``b`` at rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``; ``k`` and ``v`` ``(total_k, nheads_k, headdim)``
likewise with ``cu_seqlens_k``. Each sequence attends only within itself.

How it runs: not natively in the kernels yet. The rows are gathered into a padded
``(batch, max_seqlen, nheads, headdim)`` batch (index_select with indices computed on the device: no
host synchronization), the batched op runs over it with a key-padding mask, and the output rows are
gathered back; autograd carries the gradients back through the gathers. So it is exact and needs no
host round trip, but it computes and stores the padded rows too: cost grows with
``batch * max_seqlen`` rather than with the packed lengths, plus a copy of q, k, v and out. Without
``causal`` the sequences sit at the start of their padded rows, a key-prefix mask that the sm90
forward runs as key lengths; with ``causal`` they sit at the end, so that the kernels' bottom-right
causal alignment is each sequence's own (key j visible to query i iff ``j <= i + len_k - len_q``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._fa2_common import check_devices, check_tensor, fa2_attention, reject_unimplemented, unpack

__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]


def _check_cu_seqlens(name: str, cu_seqlens, device: torch.device) -> None:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"flashattn: {name} must be a 1-dim tensor of batch + 1 offsets, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"flashattn: {name} must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.device != device:
        raise ValueError(f"flashattn: {name} must be on q's device {device}, got {cu_seqlens.device}")


def _check_max_seqlen(name: str, max_seqlen) -> int:
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"flashattn: {name} must be an int >= 0, got {max_seqlen!r}")
    return max_seqlen


def _assert_offsets(name: str, max_name: str, cu_seqlens: torch.Tensor, max_seqlen: int, total: int) -> torch.Tensor:
    """The sequence lengths [batch]. The offsets are checked on the device (no host synchronization:
    on CUDA a violation is a device-side assertion): they start at 0, never decrease, end at `total`,
    and no sequence is longer than max_seqlen (its extra rows would be dropped)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    torch._assert_async(cu_seqlens[0] == 0, f"flashattn: {name}[0] must be 0")
    torch._assert_async(cu_seqlens[-1] == total, f"flashattn: {name}[-1] must be the packed row count {total}")
    if lengths.numel() > 0:
        torch._assert_async((lengths >= 0).all(), f"flashattn: {name} must not decrease")
        torch._assert_async((lengths <= max_seqlen).all(),
                            f"flashattn: a sequence of {name} is longer than {max_name}={max_seqlen}")
    return lengths


def _padding(cu_seqlens: torch.Tensor, lengths: torch.Tensor, max_seqlen: int, pad_at_end: bool):
    """(offset, valid) [batch, max_seqlen]: the position within its sequence of each padded row (the
    padding after the sequence when pad_at_end, else before it) and whether that row holds one of the
    sequence's rows."""
    t = torch.arange(max_seqlen, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    offset = t[None, :].expand(lengths.numel(), max_seqlen) if pad_at_end else t[None, :] - (max_seqlen - lengths)[:, None]
    valid = (offset >= 0) & (offset < lengths[:, None])
    return offset, valid


def _gather_padded(x: torch.Tensor, cu_seqlens: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """x [total, H, D] -> [batch, max_seqlen, H, D]: padded row (b, t) is x's row cu_seqlens[b] +
    offset[b, t], clamped into x (rows outside the sequence read a neighbour's row; the key mask hides
    them as keys, and padded query rows are never gathered back, so they get no gradient)."""
    batch, max_seqlen = offset.shape
    if x.size(0) == 0:
        return x.new_zeros((batch, max_seqlen) + tuple(x.shape[1:]))
    rows = (cu_seqlens[:-1, None] + offset).clamp(0, x.size(0) - 1).reshape(-1)
    return x.index_select(0, rows.long()).view((batch, max_seqlen) + tuple(x.shape[1:]))


def _packed_positions(cu_seqlens: torch.Tensor, lengths: torch.Tensor, max_seqlen: int, total: int, pad_at_end: bool):
    """[total] int64: the padded row (b * max_seqlen + t) that holds each packed row."""
    row = torch.arange(total, device=cu_seqlens.device, dtype=torch.int64)
    batch = torch.searchsorted(cu_seqlens[1:].long(), row, right=True).clamp(max=max(lengths.numel() - 1, 0))
    t = row - cu_seqlens.long()[batch]
    if not pad_at_end:
        t = t + (max_seqlen - lengths.long())[batch]
    return batch * max_seqlen + t


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            deterministic, return_attn_probs, block_table):
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table (paged KV cache) is not implemented yet (only None)")
    check_devices(q, k, v)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"flashattn: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}"
        )
    max_seqlen_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    total_q, nheads = q.size(0), q.size(1)
    lengths_q = _assert_offsets("cu_seqlens_q", "max_seqlen_q", cu_seqlens_q, max_seqlen_q, total_q)
    lengths_k = _assert_offsets("cu_seqlens_k", "max_seqlen_k", cu_seqlens_k, max_seqlen_k, k.size(0))
    # Padding after each sequence without causal masking (the key mask is then a key prefix), before it
    # with causal masking (the kernels' bottom-right alignment is then each sequence's own).
    pad_at_end = not causal
    offset_q, _ = _padding(cu_seqlens_q, lengths_q, max_seqlen_q, pad_at_end)
    offset_k, valid_k = _padding(cu_seqlens_k, lengths_k, max_seqlen_k, pad_at_end)
    q_pad = _gather_padded(q, cu_seqlens_q, offset_q)  # (batch, max_seqlen_q, nheads, headdim)
    k_pad = _gather_padded(k, cu_seqlens_k, offset_k)  # (batch, max_seqlen_k, nheads_k, headdim)
    v_pad = _gather_padded(v, cu_seqlens_k, offset_k)
    batch = offset_q.size(0)
    key_mask = valid_k[:, None, None, :].expand(batch, nheads, max_seqlen_q, max_seqlen_k)  # True = the key takes part
    out_pad, lse_pad, keep_mask = fa2_attention(q_pad, k_pad, v_pad, dropout_p, softmax_scale, causal, deterministic,
                                                return_attn_probs, key_mask)
    positions = _packed_positions(cu_seqlens_q, lengths_q, max_seqlen_q, total_q, pad_at_end)
    out = out_pad.reshape((batch * max_seqlen_q,) + tuple(q.shape[1:])).index_select(0, positions)
    if not return_attn_probs:
        return out
    # (nheads, total_q), as flash_attn's varlen functions return it.
    softmax_lse = lse_pad.transpose(0, 1).reshape(nheads, batch * max_seqlen_q).index_select(1, positions)
    return out, softmax_lse, keep_mask


_VARLEN_DOC = """
    cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)`` tensors on q's device, the offsets of the
        sequences in the packed rows (0 first, the packed row count last, never decreasing).
    max_seqlen_q, max_seqlen_k: ints, at least the longest query / key sequence (they size the padded
        batch; a longer sequence is an error, raised at once on the CPU and as a device-side
        assertion on CUDA, where the offsets are not read on the host).

    The other arguments are :func:`flashattn.flash_attn_func`'s, per sequence: ``causal`` aligns
    each sequence's mask to its own bottom-right corner (key j visible to query i iff
    ``j <= i + len_k - len_q``). ``block_table`` must be None (no paged KV cache yet).

    Returns ``out`` ``(total_q, nheads, headdim)``; with ``return_attn_probs=True`` also
    ``softmax_lse`` ``(nheads, total_q)`` float32 and the dropout keep-mask (None without dropout) in
    this function's padded coordinates, ``(batch, nheads, max_seqlen_q, max_seqlen_k)``, sequences
    at the start of their rows, or at the end with ``causal``.

    Runs the batched kernels over a padded copy of the batch (see :mod:`flashattn.varlen`): exact,
    no host synchronization, but the work and memory of ``batch * max_seqlen`` rows.
"""


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[torch.Tensor] = None,
):
    reject_unimplemented(window_size, softcap, alibi_slopes)
    check_tensor("q", q, 3, "(total_q, nheads, headdim)")
    check_tensor("k", k, 3, "(total_k, nheads_k, headdim)")
    check_tensor("v", v, 3, "(total_k, nheads_k, headdim)")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, block_table)


flash_attn_varlen_func.__doc__ = (
    """Exact attention over sequences of different lengths: ``flash_attn.flash_attn_varlen_func`` compatible.

    q ``(total_q, nheads, headdim)``, k and v ``(total_k, nheads_k, headdim)`` (nheads a multiple of
    nheads_k), each sequence's rows one after another.
"""
    + _VARLEN_DOC
)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    reject_unimplemented(window_size, softcap, alibi_slopes)
    check_tensor("q", q, 3, "(total_q, nheads, headdim)")
    k, v = unpack("kv", kv, 4, 1, 2, "(total_k, 2, nheads_k, headdim)")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, None)


flash_attn_varlen_kvpacked_func.__doc__ = (
    """:func:`flash_attn_varlen_func` with k and v packed: ``flash_attn.flash_attn_varlen_kvpacked_func`` compatible.

    q ``(total_q, nheads, headdim)``, kv ``(total_k, 2, nheads_k, headdim)``.
"""
    + _VARLEN_DOC
)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    reject_unimplemented(window_size, softcap, alibi_slopes)
    q, k, v = unpack("qkv", qkv, 4, 1, 3, "(total, 3, nheads, headdim)")
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, None)


flash_attn_varlen_qkvpacked_func.__doc__ = (
    """Self-attention over packed sequences: ``flash_attn.flash_attn_varlen_qkvpacked_func`` compatible.

    qkv ``(total, 3, nheads, headdim)``; one ``cu_seqlens`` and ``max_seqlen`` for queries and keys.
"""
    + _VARLEN_DOC
)
