"""What the FlashAttention-2 API functions share (:mod:`flashattn.flash_attn_interface`,
:mod:`flashattn.varlen`, :mod:`flashattn.kvcache`): their argument checks, and the op call with the
API's defaults (softmax scale, bottom-right causal mask, the dropout keep-mask returned on request).
"""
from __future__ import annotations

import operator

import torch

from . import ops

__all__ = ["alibi_by_key", "alibi_key_terms", "alibi_mask", "check_alibi", "check_devices", "check_sink", "op_slopes",
           "check_tensor", "fa2_attention", "page_table_alias", "rows_aligned", "window_bounds", "window_keys"]


def check_alibi(alibi_slopes, batch: int, nheads: int, device: torch.device, softcap: float):
    """alibi_slopes as a float32 (1 or batch, nheads) tensor (from FlashAttention-2's (nheads,) or (batch,
    nheads) float32 tensor on q's device), or None."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"flashattn: alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32 or alibi_slopes.device != device or tuple(alibi_slopes.shape) not in (
            (nheads,), (batch, nheads)):
        raise ValueError(f"flashattn: alibi_slopes must be a float32 ({nheads},) or ({batch}, {nheads}) tensor (nheads "
                         f"or batch, nheads) on {device}, got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)} on "
                         f"{alibi_slopes.device}")
    if softcap != 0.0:
        raise NotImplementedError("flashattn: alibi_slopes with softcap is not implemented")
    return alibi_slopes.detach().reshape(-1, nheads)


def op_slopes(slopes):
    """check_alibi's (1 or batch, nheads) slopes in the ops' form: contiguous (nheads,) or (batch, nheads);
    None stays None."""
    if slopes is None:
        return None
    return (slopes[0] if slopes.size(0) == 1 else slopes).contiguous()


def alibi_mask(slopes: torch.Tensor, query_pos: torch.Tensor, keys: torch.Tensor, window) -> torch.Tensor:
    """The additive mask of ALiBi, FlashAttention-2's bias ``-slope * |query_pos - key|`` (query_pos: each query's
    diagonal position, ``i + Lk - Lq``), with the keys outside the sliding window at -inf: float32 (B, nheads,
    Lq, Lk). slopes: (1 or batch, nheads); query_pos: (1 or batch, Lq) integers; keys: (Lk,) integers."""
    distance = (query_pos[:, None, :, None] - keys).abs().float()  # (B, 1, Lq, Lk)
    bias = -slopes[:, :, None, None] * distance
    if window != (-1, -1):
        bias = bias.masked_fill(~window_keys(query_pos[:, None, :, None], keys, window), float("-inf"))
    return bias


def alibi_by_key(causal: bool, window, sink) -> bool:
    """Whether a call's ALiBi can take alibi_key_terms' form: causal masking, no window, no sinks."""
    return bool(causal) and tuple(window) == (-1, -1) and sink is None


def alibi_key_terms(slopes: torch.Tensor, query_pos: torch.Tensor, batch: int, seqlen_k: int):
    """Causal ALiBi as a term per key: (terms, lse_shift).

    Under a causal mask every visible key j of query position p has j <= p, so the bias
    ``-slope * (p - j)`` is ``slope * (j - c)`` minus ``slope * (p - c)``, for any constant c. The second
    part is the same for a whole row, so the softmax does not see it: the kernels run with the first part
    alone, an additive mask broadcast over the queries (float32 (batch, nheads, 1, Lk), viewed as
    (batch, nheads, Lq, Lk) with a zero query stride: memory per key, not per score), and the row's
    LSE is then too large by ``lse_shift = slope * (p - c)``, (1 or batch, nheads, Lq). c = Lk // 2 keeps
    the terms' magnitude within ``slope * Lk / 2``, which bounds their float32 rounding. The terms take
    a batch dim of their own (not a broadcast one), so the kernels never classify the mask's tiles.
    slopes: (1 or batch, nheads); query_pos: (1 or batch, Lq) integers (each query's diagonal position).
    Only where alibi_by_key says so: not with attention sinks (a sink's logit does not carry the row's
    part) or a window (whose mask the kernels could not take beside this one)."""
    center = seqlen_k // 2
    keys = torch.arange(seqlen_k, device=slopes.device, dtype=torch.float32) - center
    nheads = slopes.size(1)
    terms = (slopes[:, :, None, None] * keys).expand(batch, nheads, 1, seqlen_k).contiguous()
    lse_shift = slopes[:, :, None] * (query_pos[:, None, :] - center).to(torch.float32)
    return terms, lse_shift


def window_bounds(window_size) -> tuple:
    """(left, right) of a FlashAttention-2 ``window_size``: two ints, a negative one unbounded (as -1)."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"flashattn: window_size must be a pair of ints (left, right), got {window_size!r}") from None
    bounds = []
    for name, bound in (("left", left), ("right", right)):
        # Anything with __index__ (an int, a numpy integer, a 0-dim integer tensor as flash_attn's own tests
        # pass) is a bound; bools and floats are not.
        try:
            if isinstance(bound, bool) or getattr(bound, "dtype", None) == torch.bool:
                raise TypeError
            bounds.append(operator.index(bound))
        except TypeError:
            raise TypeError(f"flashattn: window_size's {name} bound must be an int (-1: unbounded), "
                            f"got {bound!r}") from None
    return max(bounds[0], -1), max(bounds[1], -1)


def page_table_alias(block_table, page_table):
    """The paged cache's table from FlashAttention-2's name (block_table) or FlashAttention-3's
    (page_table); both given is an error."""
    if page_table is None:
        return block_table
    if block_table is not None:
        raise ValueError("flashattn: pass block_table or page_table (FlashAttention-3's name for it), not both")
    return page_table


def window_keys(query_pos: torch.Tensor, keys: torch.Tensor, window) -> torch.Tensor:
    """Whether each key position lies in the sliding window (left, right) of each query's diagonal
    position: ``query_pos - left <= key <= query_pos + right`` (-1: unbounded), broadcast over the two."""
    left, right = window
    inside = torch.ones_like(keys - query_pos, dtype=torch.bool)
    if left >= 0:
        inside = inside & (keys >= query_pos - left)
    if right >= 0:
        inside = inside & (keys <= query_pos + right)
    return inside


def rows_aligned(t: torch.Tensor) -> bool:
    """Whether 16-byte loads can read t's rows (2-byte elements): 16-byte aligned rows from metadata alone
    (no data pointer: this also runs on fake tensors while torch.compile traces); torch's allocations are
    16-byte aligned. While torch.compile traces, the storage offset is not read (dynamo cannot trace
    storage_offset()): a view at an unaligned offset then reaches the op, whose own check raises."""
    offset_aligned = torch.compiler.is_compiling() or t.storage_offset() % 8 == 0
    return t.stride(-1) == 1 and offset_aligned and all(st % 8 == 0 for st in t.stride()[:-1])


def check_tensor(name: str, t, ndim: int, layout: str) -> None:
    """Raises unless `t` is a tensor of `ndim` dims (`layout` names them in the message) with a contiguous
    last dim."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"flashattn: {name} must have {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.size(-1) > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"flashattn: {name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}; "
            "call .contiguous() first"
        )


def unpack(name: str, t, ndim: int, dim: int, count: int, layout: str):
    """check_tensor, then the `count` tensors packed along `dim` (size `count`) as strided views of `t`:
    autograd stacks their gradients back into one."""
    check_tensor(name, t, ndim, layout)
    if t.size(dim) != count:
        raise ValueError(f"flashattn: {name} must have shape {layout}, got {tuple(t.shape)}")
    return t.unbind(dim=dim)


def check_sink(learnable_sink, q, heads_dim: int) -> None:
    """Raises unless learnable_sink is None or a floating (nheads,) tensor on q's device (nheads:
    q.size(heads_dim))."""
    if learnable_sink is None:
        return
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"flashattn: learnable_sink must be a torch.Tensor, got {type(learnable_sink).__name__}")
    nheads = q.size(heads_dim)
    if learnable_sink.dim() != 1 or learnable_sink.size(0) != nheads or not learnable_sink.dtype.is_floating_point:
        raise ValueError(f"flashattn: learnable_sink must be a floating (nheads,) = ({nheads},) tensor, one logit per "
                         f"query head, got shape {tuple(learnable_sink.shape)} and dtype {learnable_sink.dtype}")
    if learnable_sink.device != q.device:
        raise ValueError(f"flashattn: learnable_sink must be on q's device {q.device}, got {learnable_sink.device}")


def check_devices(q, k, v) -> None:
    """What the FlashAttention-2 API checks before the op's own checks: one device, kernels for it."""
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"flashattn: q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cuda" and not ops.cuda_kernels_built():
        raise RuntimeError(
            "flashattn: q is a CUDA tensor but this build of flashattn has no CUDA kernels "
            "(reinstall with a CUDA toolkit present, or FLASHATTN_BUILD_CUDA=1)"
        )


def check_max_seqlen(name: str, max_seqlen):
    """max_seqlen as given: an int >= 0, or a 0-dim integer tensor (as transformers passes it; only
    compared on the device, never read on the host)."""
    if isinstance(max_seqlen, torch.Tensor):
        if max_seqlen.dim() != 0 or max_seqlen.dtype.is_floating_point or max_seqlen.dtype == torch.bool:
            raise ValueError(f"flashattn: {name} must be an int or a 0-dim integer tensor, got a tensor of "
                             f"shape {tuple(max_seqlen.shape)} and dtype {max_seqlen.dtype}")
        return max_seqlen
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"flashattn: {name} must be an int >= 0, got {max_seqlen!r}")
    return max_seqlen


def scale_or_default(softmax_scale, head_dim: int) -> float:
    """softmax_scale as given, else the FlashAttention-2 API's 1 / sqrt(head_dim). (A head dim of 0 gets
    any scale: the ops reject it with a message naming the head dim.)"""
    if softmax_scale is not None:
        return float(softmax_scale)
    return head_dim ** -0.5 if head_dim > 0 else 1.0


def fa2_attention(q, k, v, dropout_p, softmax_scale, causal, deterministic, with_keep_mask, attn_mask=None,
                  sink=None, softcap=0.0, window=(-1, -1), alibi_slopes=None):
    """ops.attention with the FlashAttention-2 API's defaults (scale, bottom-right causal mask):
    (out, softmax_lse, keep_mask), keep_mask the dropout keep-mask (batch, nheads, seqlen_q, seqlen_k)
    bool, True = kept, when with_keep_mask and dropout_p > 0, else None. sink: the attention sinks
    (nheads,), or None; softcap: the score cap (0.0: none); window: the sliding window (left, right),
    aligned as the causal mask (window_bounds); alibi_slopes: float32 (nheads,) or (batch, nheads), or None."""
    softmax_scale = scale_or_default(softmax_scale, q.size(-1))
    dropout_p = float(dropout_p)
    # Drawn here rather than inside ops.attention so that the keep-mask can be shown for the same state.
    rng_state = ops.draw_rng_state(q.device) if dropout_p > 0.0 else None
    out, softmax_lse = ops.attention(q, k, v, float(softmax_scale), bool(causal), True, bool(deterministic),
                                     attn_mask, dropout_p, rng_state, sink=sink, softcap=float(softcap),
                                     window_left=window[0], window_right=window[1], alibi_slopes=alibi_slopes)
    keep_mask = None
    if with_keep_mask and rng_state is not None:
        keep_mask = ops.dropout_keep_mask(rng_state, q.size(0), q.size(2), q.size(1), k.size(1), dropout_p)
    return out, softmax_lse, keep_mask
