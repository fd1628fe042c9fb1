"""The FlashAttention-2 variable-length API: sequences of different lengths packed along one dim.

``q`` ``(total_q, nheads, headdim)`` holds the batch's query rows one sequence after another, sequence
``b`` at rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``; ``k`` ``(total_k, nheads_k, headdim)`` and ``v``
``(total_k, nheads_k, headdim_v)`` likewise with ``cu_seqlens_k``. Each sequence attends only within
itself. (headdim_v other than headdim: every path below runs on copies zero-padded to the larger; a
paged cache's pages are gathered first.)

How it runs. In the kernels (``torch.ops.flashattn.varlen_fwd`` / ``varlen_bwd``) on the CPU and on
sm_90 GPUs at head dims 33..256 without dropout: the packed rows are read in place and each
sequence's own tiles are scheduled, longest first, from a work list the GPU builds from the offsets
(no host synchronization, no padded copy, work and memory linear in the packed rows; ``max_seqlen``
sizes nothing: it is only checked against the lengths, with the offsets, by the op that reads them, and
under ``torch.compile`` an int one becomes a symbolic int at its first change, so new batches of
lengths do not recompile after that). Elsewhere (the
sm80 path, dropout, other head dims) the rows are gathered into a padded ``(batch, max_seqlen,
nheads, headdim)`` batch on the device, the batched op runs over it with a key-padding mask and the
output rows are gathered back: exact, still no host round trip, but the work and memory of ``batch *
max_seqlen`` rows. Without ``causal`` the sequences sit at the start of their padded rows, a key-prefix
mask that the sm90 forward runs as key lengths; with ``causal`` they sit at the end, so that the
kernels' bottom-right causal alignment is each sequence's own (key j visible to query i iff ``j <= i +
len_k - len_q``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from . import _C, kvcache, ops
from ._fa2_common import (alibi_by_key, alibi_key_terms, alibi_mask, check_alibi, check_devices, check_max_seqlen,
                          check_sink, check_tensor, fa2_attention, op_slopes, page_table_alias, rows_aligned, scale_or_default,
                          unpack, window_bounds, window_keys)

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


def _check_seqused(name: str, seqused, batch: int, device: torch.device) -> None:
    if seqused is None:
        return
    _check_cu_seqlens(name, seqused, device)
    if seqused.numel() != batch:
        raise ValueError(f"flashattn: {name} must have one entry per sequence ({batch}), got {seqused.numel()}")


def _in_kernels(q, k, v, dropout_p, block_table) -> bool:
    """Whether the varlen ops serve the call (see the module docstring); else the padded batch."""
    if dropout_p > 0.0 or block_table is not None:
        return False
    if q.device.type == "cpu":
        return True
    if q.device.type != "cuda" or not ops.cuda_kernels_built() or not _C.compiled_with_sm90():
        return False
    if torch.cuda.get_device_capability(q.device) != (9, 0) or _C.plan_options()["force_sm80"]:
        return False
    return (q.dtype in (torch.float16, torch.bfloat16) and 33 <= q.size(-1) <= 256 and q.size(-1) % 8 == 0
            and all(rows_aligned(t) for t in (q, k, v)))


def _assert_offsets(name: str, max_name: str, cu_seqlens: torch.Tensor, max_seqlen: int, total: int) -> torch.Tensor:
    """The sequence lengths [batch]. The offsets are checked on the device (no host synchronization:
    on CUDA a violation is a device-side assertion): they start at 0, never decrease, end at `total`,
    and no sequence is longer than max_seqlen (its extra rows would be dropped)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    torch._assert_async(cu_seqlens[0] == 0, f"flashattn: {name}[0] must be 0")
    torch._assert_async(cu_seqlens[-1] == total, f"flashattn: {name}[-1] must be the packed row count {total}")
    if lengths.numel() > 0:
        torch._assert_async((lengths >= 0).all(), f"flashattn: {name} must not decrease")
        _assert_no_longer(name, max_name, lengths, max_seqlen)
    return lengths


def _assert_no_longer(name: str, max_name: str, lengths: torch.Tensor, max_seqlen) -> None:
    """No sequence longer than max_seqlen (an int or a 0-dim tensor), checked on the lengths' device."""
    if lengths.numel() > 0:
        limit = f"{max_name}={max_seqlen}" if isinstance(max_seqlen, int) else max_name
        torch._assert_async((lengths <= max_seqlen).all(), f"flashattn: a sequence of {name} is longer than {limit}")


def _assert_seqused(name: str, seqused, lengths: torch.Tensor) -> None:
    """seqused within each sequence's rows (checked on the device as the offsets are)."""
    if seqused is not None and lengths.numel() > 0:
        torch._assert_async(((seqused >= 0) & (seqused <= lengths)).all(),
                            f"flashattn: {name} must be in [0, the sequence's length] for every sequence")


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


class _Padded(NamedTuple):
    """A variable-length batch's padded layout (batch, max_seqlen, ...): where each sequence's rows go."""
    offset_q: torch.Tensor  # from _padding, per sequence
    valid_q: torch.Tensor  # (batch, max_seqlen_q) bool: a real query row
    offset_k: torch.Tensor
    positions_q: torch.Tensor  # (total_q,): each packed query row's flat padded row
    positions_k: torch.Tensor  # (total_k,)
    key_mask: torch.Tensor  # (batch, nheads, max_seqlen_q, max_seqlen_k) bool, True = the key takes part


def _padded_layout(cu_seqlens_q, cu_seqlens_k, lengths_q, lengths_k, max_seqlen_q: int, max_seqlen_k: int,
                   total_q: int, total_k: int, nheads: int, causal: bool) -> _Padded:
    # Padding after each sequence without causal masking (the key mask is then a key prefix), before it
    # with causal masking (the kernels' bottom-right alignment is then each sequence's own).
    pad_at_end = not causal
    offset_q, valid_q = _padding(cu_seqlens_q, lengths_q, max_seqlen_q, pad_at_end)
    offset_k, valid_k = _padding(cu_seqlens_k, lengths_k, max_seqlen_k, pad_at_end)
    batch = offset_q.size(0)
    return _Padded(offset_q, valid_q, offset_k,
                   _packed_positions(cu_seqlens_q, lengths_q, max_seqlen_q, total_q, pad_at_end),
                   _packed_positions(cu_seqlens_k, lengths_k, max_seqlen_k, total_k, pad_at_end),
                   valid_k[:, None, None, :].expand(batch, nheads, max_seqlen_q, max_seqlen_k))


def _varlen_paged(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, dropout_p, softmax_scale, causal,
                  deterministic, return_attn_probs, block_table, seqused_q, seqused_k, sink, softcap, window,
                  num_splits, alibi_slopes=None):
    """flash_attn_varlen_func over a paged cache (see its docstring): the decode op where it serves the
    call (CUDA, at most 64 query rows per kv head, no gradient or dropout; a sink without a gradient is
    taken), else the variable-length path over a padded copy of each sequence's pages."""
    check_tensor("k", k_cache, 4, "(num_pages, page_size, nheads_k, headdim) with block_table")
    check_tensor("v", v_cache, 4, "(num_pages, page_size, nheads_k, headdim_v) with block_table")
    check_devices(q, k_cache, v_cache)
    check_sink(sink, q, 1)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    batch = cu_seqlens_q.numel() - 1
    kvcache.check_block_table(block_table, batch, None, q.device)
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"flashattn: k and v must have the same (num_pages, page_size, nheads_k), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    _check_seqused("seqused_k", seqused_k, batch, q.device)
    if seqused_k is None:
        if cu_seqlens_k is None:
            raise ValueError("flashattn: with block_table, seqused_k or cu_seqlens_k must give each sequence's key count")
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
        if cu_seqlens_k.numel() != batch + 1:
            raise ValueError(f"flashattn: cu_seqlens_k must have batch + 1 = {batch + 1} entries, got {cu_seqlens_k.numel()}")
        seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    max_seqlen_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    slopes = check_alibi(alibi_slopes, batch, q.size(1), q.device, float(softcap))
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, sink))
    if (isinstance(max_seqlen_q, int) and max_seqlen_q >= 1 and float(dropout_p) == 0.0 and seqused_q is None
            and not needs_grad and kvcache.decode_op_serves(q, k_cache, v_cache, max_seqlen_q)):
        out, softmax_lse = torch.ops.flashattn.decode_fwd(
            q, k_cache, v_cache, seqused_k, block_table, None, None, scale_or_default(softmax_scale, q.size(-1)),
            bool(causal), window[0], window[1], float(softcap), num_splits, cu_seqlens_q, max_seqlen_q,
            None if sink is None else sink.detach().float().contiguous(),
            op_slopes(slopes))
        return (out, softmax_lse, None) if return_attn_probs else out
    capacity = block_table.size(1) * k_cache.size(1)
    k = kvcache.gather_pages(k_cache, block_table).flatten(0, 1)  # (batch * capacity, nheads_k, headdim)
    v = kvcache.gather_pages(v_cache, block_table).flatten(0, 1)
    cu_seqlens_rows = torch.arange(0, (batch + 1) * capacity, capacity, dtype=torch.int32, device=q.device)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_rows, max_seqlen_q, capacity, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, None, seqused_q, seqused_k, sink, softcap, window, alibi_slopes)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            deterministic, return_attn_probs, block_table, seqused_q=None, seqused_k=None, sink=None, softcap=0.0,
            window=(-1, -1), alibi_slopes=None):
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table (paged KV cache) is not implemented yet (only None)")
    check_devices(q, k, v)
    # A value head dim other than q's: every path below runs on zero-padded copies (ops.common_head_dim)
    # with the scale of q's own head dim, and out keeps the first value_dim columns.
    softmax_scale = scale_or_default(softmax_scale, q.size(-1))
    q, k, v, value_dim = ops.common_head_dim(q, k, v)
    result = _varlen_one_head_dim(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, deterministic, return_attn_probs, seqused_q, seqused_k, sink,
                                  softcap, window, alibi_slopes)
    if q.size(-1) == value_dim:
        return result
    if not return_attn_probs:
        return result[..., :value_dim].contiguous()
    return (result[0][..., :value_dim].contiguous(),) + tuple(result[1:])


def _varlen_one_head_dim(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                         causal, deterministic, return_attn_probs, seqused_q, seqused_k, sink, softcap, window,
                         alibi_slopes):
    check_sink(sink, q, 1)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"flashattn: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}"
        )
    batch = cu_seqlens_q.numel() - 1
    _check_seqused("seqused_q", seqused_q, batch, q.device)
    _check_seqused("seqused_k", seqused_k, batch, q.device)
    max_seqlen_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    total_q, nheads = q.size(0), q.size(1)
    dropout_p = float(dropout_p)
    slopes = check_alibi(alibi_slopes, batch, nheads, q.device, float(softcap))
    if _in_kernels(q, k, v, dropout_p, None):
        # The op checks the offsets where it reads them (on CUDA in the kernel that builds its schedule),
        # and an int max_seqlen with them; a tensor one is compared here, on its device.
        limits = []
        for name, max_name, cu, max_seqlen in (("cu_seqlens_q", "max_seqlen_q", cu_seqlens_q, max_seqlen_q),
                                               ("cu_seqlens_k", "max_seqlen_k", cu_seqlens_k, max_seqlen_k)):
            if isinstance(max_seqlen, torch.Tensor):
                _assert_no_longer(name, max_name, cu[1:] - cu[:-1], max_seqlen)
                max_seqlen = -1
            limits.append(max_seqlen)
        scale = scale_or_default(softmax_scale, q.size(-1))
        out, softmax_lse = ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale,
                                          bool(causal), True, bool(deterministic), *limits, sink, float(softcap),
                                          *window, op_slopes(slopes))
        return (out, softmax_lse, None) if return_attn_probs else out
    lengths_q = _assert_offsets("cu_seqlens_q", "max_seqlen_q", cu_seqlens_q, max_seqlen_q, total_q)
    lengths_k = _assert_offsets("cu_seqlens_k", "max_seqlen_k", cu_seqlens_k, max_seqlen_k, k.size(0))
    _assert_seqused("seqused_q", seqused_q, lengths_q)
    _assert_seqused("seqused_k", seqused_k, lengths_k)
    if seqused_q is not None or seqused_k is not None:
        raise NotImplementedError(
            "flashattn: seqused_q / seqused_k run only in the variable-length kernels (the CPU, and sm_90 GPUs at "
            "head dims 33..256 without dropout); this call takes the padded path")
    # The padded batch's sizes: a tensor max_seqlen is read here (a host synchronization).
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    # Padding before each sequence with causal masking, a window or ALiBi: the padded batch's bottom-right
    # diagonal is then each sequence's own.
    lay = _padded_layout(cu_seqlens_q, cu_seqlens_k, lengths_q, lengths_k, max_seqlen_q, max_seqlen_k, total_q,
                         k.size(0), nheads, causal or window != (-1, -1) or slopes is not None)
    key_mask = _window_key_mask(lay.key_mask, max_seqlen_q, max_seqlen_k, causal, window, q.device)
    lse_shift = None
    if slopes is not None:
        # ALiBi over the padded batch, from its bottom-right diagonal (each sequence's own): with causal
        # masking and no window or sinks a term per key (alibi_key_terms), else an additive mask per score.
        query_pos = torch.arange(max_seqlen_q, device=q.device)[None] + (max_seqlen_k - max_seqlen_q)
        if alibi_by_key(causal, window, sink):
            terms, lse_shift = alibi_key_terms(slopes, query_pos, lay.offset_q.size(0), max_seqlen_k)
            terms = terms.masked_fill(~key_mask[:, :1, :1, :], float("-inf"))  # the padding's keys
            key_mask = terms.expand(key_mask.shape)
        else:
            bias = alibi_mask(slopes, query_pos, torch.arange(max_seqlen_k, device=q.device), (-1, -1))
            key_mask = bias.masked_fill(~key_mask, float("-inf"))
    q_pad = _gather_padded(q, cu_seqlens_q, lay.offset_q)  # (batch, max_seqlen_q, nheads, headdim)
    k_pad = _gather_padded(k, cu_seqlens_k, lay.offset_k)  # (batch, max_seqlen_k, nheads_k, headdim)
    v_pad = _gather_padded(v, cu_seqlens_k, lay.offset_k)
    batch = lay.offset_q.size(0)
    out_pad, lse_pad, keep_mask = fa2_attention(q_pad, k_pad, v_pad, dropout_p, softmax_scale, causal, deterministic,
                                                return_attn_probs, key_mask, sink, softcap)
    positions = lay.positions_q
    out = out_pad.reshape((batch * max_seqlen_q,) + tuple(q.shape[1:])).index_select(0, positions)
    if not return_attn_probs:
        return out
    if lse_shift is not None:
        lse_pad = lse_pad - lse_shift
    # (nheads, total_q), as flash_attn's varlen functions return it.
    softmax_lse = lse_pad.transpose(0, 1).reshape(nheads, batch * max_seqlen_q).index_select(1, positions)
    return out, softmax_lse, keep_mask


def _window_key_mask(key_mask, max_seqlen_q, max_seqlen_k, causal, window, device):
    """The padded batch's key mask with the window (left, right) joined: padding before each sequence keeps
    its diagonal the padded batch's bottom-right one (the kernels take no window with a mask)."""
    if window == (-1, -1):
        return key_mask
    queries = torch.arange(max_seqlen_q, device=device)[:, None] + (max_seqlen_k - max_seqlen_q)
    keys = torch.arange(max_seqlen_k, device=device)
    return key_mask & window_keys(queries, keys, (window[0], 0 if causal else window[1]))


def varlen_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal, deterministic=False, window=(-1, -1)):
    """(dq, dk, dv) of the forward :func:`_varlen` computes without dropout (bottom-right causal mask and
    window, ``softmax_lse`` ``(nheads, total_q)``), outside autograd: ``varlen_bwd`` where the
    variable-length kernels serve the call, else over the padded batch as the forward pads it."""
    softmax_scale = scale_or_default(softmax_scale, q.size(-1))
    if _in_kernels(q, k, v, 0.0, None):
        return ops.varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, None, None,
                              float(softmax_scale), bool(causal), True, bool(deterministic), None, None, 0.0, *window)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    total_q, nheads = q.size(0), q.size(1)
    lay = _padded_layout(cu_seqlens_q, cu_seqlens_k, cu_seqlens_q[1:] - cu_seqlens_q[:-1],
                         cu_seqlens_k[1:] - cu_seqlens_k[:-1], max_seqlen_q, max_seqlen_k, total_q, k.size(0), nheads,
                         causal or window != (-1, -1))
    batch = lay.offset_q.size(0)
    q_pad, dout_pad, out_pad = (_gather_padded(x, cu_seqlens_q, lay.offset_q) for x in (q, dout, out))
    k_pad, v_pad = (_gather_padded(x, cu_seqlens_k, lay.offset_k) for x in (k, v))
    # Padded query rows: zero dout and out, and an lse of +inf (their probabilities are 0), so that
    # they add nothing to dk and dv.
    dout_pad = dout_pad * lay.valid_q[:, :, None, None]
    out_pad = out_pad * lay.valid_q[:, :, None, None]
    lse_pad = softmax_lse.new_full((nheads, batch * max_seqlen_q), float("inf"))
    lse_pad = lse_pad.index_copy(1, lay.positions_q, softmax_lse).view(nheads, batch, max_seqlen_q).transpose(0, 1)
    dq_pad, dk_pad, dv_pad = ops.bwd(dout_pad, q_pad, k_pad, v_pad, out_pad, lse_pad.contiguous(),
                                     float(softmax_scale), bool(causal), True, bool(deterministic),
                                     _window_key_mask(lay.key_mask, max_seqlen_q, max_seqlen_k, causal, window, q.device))
    dq = dq_pad.reshape((batch * max_seqlen_q,) + tuple(q.shape[1:])).index_select(0, lay.positions_q)
    dk = dk_pad.reshape((batch * max_seqlen_k,) + tuple(k.shape[1:])).index_select(0, lay.positions_k)
    dv = dv_pad.reshape((batch * max_seqlen_k,) + tuple(v.shape[1:])).index_select(0, lay.positions_k)
    return dq, dk, dv


_VARLEN_DOC = """
    cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)`` tensors on q's device, the offsets of the
        sequences in the packed rows (0 first, the packed row count last, never decreasing).
    max_seqlen_q, max_seqlen_k: at least the longest query / key sequence: ints, or 0-dim integer
        tensors. A longer sequence is an error, raised at once on the CPU and as a device-side
        assertion on CUDA, where the offsets are not read on the host. In the kernels they size
        nothing; the padded path reads a tensor's value (a host synchronization) to size its batch.

    The other arguments are :func:`flashattn.flash_attn_func`'s, per sequence: ``causal`` and
    ``window_size`` align each sequence's mask to its own bottom-right corner (key j visible to query
    i iff ``j <= i + len_k - len_q``), ``learnable_sink`` (keyword only) joins every sequence's rows of
    query head h. ``block_table`` is for :func:`flash_attn_varlen_func` only.

    Returns ``out`` ``(total_q, nheads, headdim)``; with ``return_attn_probs=True`` also
    ``softmax_lse`` ``(nheads, total_q)`` float32 (float64 for float64 CPU inputs) and the dropout
    keep-mask (None without dropout) in the padded path's coordinates, ``(batch, nheads, max_seqlen_q,
    max_seqlen_k)``, sequences at the start of their rows, or at the end with ``causal``.

    Runs in the variable-length kernels on the CPU and on sm_90 GPUs at head dims 33..256 (a multiple
    of 8) without dropout, else over a padded copy of the batch (see :mod:`flashattn.varlen`; a
    window there is a materialized mask).
"""

_SEQUSED_DOC = """
    seqused_q, seqused_k: optional int32 ``(batch,)`` tensors: only the first ``seqused_*[b]`` rows of
        sequence b take part (the rest of its rows get out 0, lse -inf and zero gradients). Served by
        the variable-length kernels only: elsewhere they raise NotImplementedError.
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
    *,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    learnable_sink: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    scheduler_metadata: Optional[torch.Tensor] = None,
):
    block_table = page_table_alias(block_table, page_table)
    num_splits = kvcache.splits_from(num_splits, scheduler_metadata)
    window = window_bounds(window_size)
    check_tensor("q", q, 3, "(total_q, nheads, headdim)")
    if out is not None:
        _check_out(out, q, v, learnable_sink)
    if block_table is not None:
        result = _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, dropout_p, softmax_scale, causal,
                               deterministic, return_attn_probs, block_table, seqused_q, seqused_k, learnable_sink,
                               softcap, window, num_splits, alibi_slopes)
    else:
        check_tensor("k", k, 3, "(total_k, nheads_k, headdim)")
        check_tensor("v", v, 3, "(total_k, nheads_k, headdim_v)")
        result = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                         causal, deterministic, return_attn_probs, block_table, seqused_q, seqused_k, learnable_sink,
                         softcap, window, alibi_slopes)
    if out is None:
        return result
    if isinstance(result, tuple):
        out.copy_(result[0])
        return (out, *result[1:])
    return out.copy_(result)


def _check_out(out, q, v, learnable_sink) -> None:
    """Raises unless out can take the result: q's device and dtype, shape (total_q, nheads, headdim_v), and no
    gradient to carry (as torch's own out= arguments, it does not support autograd)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"flashattn: out must be a torch.Tensor or None, got {type(out).__name__}")
    expected = (*q.shape[:2], v.shape[-1]) if isinstance(v, torch.Tensor) else tuple(q.shape)
    if tuple(out.shape) != expected or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"flashattn: out must be a {q.dtype} tensor of shape {expected} on {q.device} "
                         f"(total_q, nheads, headdim), got {out.dtype} {tuple(out.shape)} on {out.device}")
    inputs = [t for t in (q, v, learnable_sink) if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and (out.requires_grad or any(t.requires_grad for t in inputs)):
        raise RuntimeError("flashattn: out= does not support autograd (an input or out requires grad); call "
                           "without out= to train, or under torch.no_grad()")


flash_attn_varlen_func.__doc__ = (
    """Exact attention over sequences of different lengths: ``flash_attn.flash_attn_varlen_func`` compatible.

    q ``(total_q, nheads, headdim)``, k and v ``(total_k, nheads_k, headdim)`` (nheads a multiple of
    nheads_k), each sequence's rows one after another.

    With ``block_table`` (int32 ``(batch, pages_per_sequence)``, a paged KV cache as serving engines
    keep it), k and v are ``(num_pages, page_size, nheads_k, headdim)``: key j of sequence b is row
    ``j % page_size`` of page ``block_table[b, j // page_size]``, and ``seqused_k`` (or, without it,
    ``cu_seqlens_k``) gives each sequence's key count; ``max_seqlen_k`` is not used. On CUDA, with
    float16 / bfloat16, an int ``max_seqlen_q`` of at most 64 / (nheads / nheads_k), no gradient (the
    sink's included) and no dropout, this runs on the decode op (keys split across thread blocks, pages
    read in place); otherwise over a padded copy of each sequence's pages.

    ``alibi_slopes`` as in :func:`flashattn.flash_attn_func`, each sequence from its own diagonal (query i
    of a sequence at key position ``i + len_k - len_q``): in the variable-length kernels where they serve
    the call (on sm_90 the kernels add the term; on the CPU an additive mask per sequence), else over the
    padded copy of the batch as an additive mask; not with a paged cache.
    ``page_table`` (keyword only) is FlashAttention-3's name for ``block_table`` (pass one of the two).
    ``num_splits`` and ``scheduler_metadata`` (keyword only) set the decode op's key splits as in
    :func:`flashattn.flash_attn_with_kvcache`; other calls ignore them.
    ``out`` (keyword only): a ``(total_q, nheads, headdim)`` tensor of q's dtype and device that receives
    the output, which is then returned in its place (as serving engines pass a slice of their output
    buffer). The result is copied into it; without autograd, as torch's own ``out=`` arguments.
"""
    + _VARLEN_DOC
    + _SEQUSED_DOC
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
    *,
    learnable_sink: Optional[torch.Tensor] = None,
):
    window = window_bounds(window_size)
    check_tensor("q", q, 3, "(total_q, nheads, headdim)")
    k, v = unpack("kv", kv, 4, 1, 2, "(total_k, 2, nheads_k, headdim)")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, None, sink=learnable_sink, softcap=softcap, window=window,
                   alibi_slopes=alibi_slopes)


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
    *,
    learnable_sink: Optional[torch.Tensor] = None,
):
    window = window_bounds(window_size)
    q, k, v = unpack("qkv", qkv, 4, 1, 3, "(total, 3, nheads, headdim)")
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   deterministic, return_attn_probs, None, sink=learnable_sink, softcap=softcap, window=window,
                   alibi_slopes=alibi_slopes)


flash_attn_varlen_qkvpacked_func.__doc__ = (
    """Self-attention over packed sequences: ``flash_attn.flash_attn_varlen_qkvpacked_func`` compatible.

    qkv ``(total, 3, nheads, headdim)``; one ``cu_seqlens`` and ``max_seqlen`` for queries and keys.
"""
    + _VARLEN_DOC
)
