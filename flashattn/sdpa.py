"""The drop-in for torch's SDPA: :func:`scaled_dot_product_attention`, and the rule that decides when a
call falls back to torch (:func:`fallback_reason`).

It calls the same custom op as the FlashAttention-2 API (:mod:`flashattn.flash_attn_interface`),
``torch.ops.flashattn.fwd`` (backward: ``torch.ops.flashattn.bwd``), which computes exact attention
without materializing the score matrix. The two APIs differ in layout, in the alignment of the causal
mask when the query and key lengths differ, and in what they do with arguments the kernels do not
implement:

==========================  =====================================  ======================================
                            :func:`scaled_dot_product_attention`   :func:`flash_attn_func` and friends
==========================  =====================================  ======================================
layout                      ``(..., H, L, D)`` like torch          ``(B, S, H, D)`` like flash_attn
causal mask, Lq != Lk       top-left (torch's convention)          bottom-right (flash_attn's convention)
default scale               ``1 / sqrt(D)``                        ``D ** -0.5``
unsupported arguments       fall back to torch SDPA with a         raise ``NotImplementedError``
                            one-time warning
==========================  =====================================  ======================================
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Optional, Set, Tuple

import torch
import torch.nn.functional as F

from . import ops
from .ops import MAX_HEAD_DIM

__all__ = ["scaled_dot_product_attention", "fallback_reason"]

_CUDA_DTYPES = (torch.float16, torch.bfloat16)
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_warned_reasons: Set[str] = set()
_capability_cache: Dict[int, Tuple[int, int]] = {}


@torch.compiler.assume_constant_result
def _cuda_capability(device_index: int) -> Tuple[int, int]:
    # Constant for the life of the process; marked so torch.compile evaluates it once at trace time.
    if device_index not in _capability_cache:
        _capability_cache[device_index] = torch.cuda.get_device_capability(device_index)
    return _capability_cache[device_index]


def _warn_fallback_once(reason: str) -> None:
    if torch.compiler.is_compiling() or reason in _warned_reasons:
        return
    _warned_reasons.add(reason)
    warnings.warn(f"{reason}; falling back to torch SDPA", stacklevel=3)


def fallback_reason(query, key, value, attn_mask=None, dropout_p=0.0, enable_gqa=False) -> Optional[str]:
    """Why flashattn's kernels cannot serve this :func:`scaled_dot_product_attention` call (the reason
    its fallback warning names), or None when they can. Raises, as the call does, for arguments that
    torch's SDPA rejects too: a query, key, value or attn_mask that is not a tensor, and head counts
    that differ without ``enable_gqa`` (none of them 1)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):  # as torch's SDPA does, rather than an AttributeError below
            raise TypeError(f"scaled_dot_product_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        # torch returns zeros for dropout_p == 1 and raises for other values; the kernels take [0, 1).
        return "dropout_p outside [0, 1) is not supported by flashattn"
    if query.is_nested or key.is_nested or value.is_nested:
        return "nested tensors are not supported by flashattn"
    if min(query.dim(), key.dim(), value.dim()) < 2:
        return "query/key/value with fewer than 2 dims are not supported by flashattn"
    if query.dim() != key.dim() or query.dim() != value.dim():
        return "query/key/value with different numbers of dims (broadcasting) are not supported by flashattn"
    if query.shape[:-3] != key.shape[:-3] or query.shape[:-3] != value.shape[:-3]:
        return "query/key/value with different batch dims (broadcasting) are not supported by flashattn"
    head_dim = query.size(-1)
    if not (1 <= head_dim <= MAX_HEAD_DIM and 1 <= value.size(-1) <= MAX_HEAD_DIM):
        return f"head dims outside 1..{MAX_HEAD_DIM} are not supported by flashattn"
    if not enable_gqa and query.dim() >= 3:
        heads_q, heads_k, heads_v = query.size(-3), key.size(-3), value.size(-3)
        if not (heads_q == heads_k == heads_v) and not (heads_k == 1 and heads_v == 1):
            if 1 not in (heads_q, heads_k, heads_v):
                raise RuntimeError(
                    f"scaled_dot_product_attention: query has {heads_q} heads, key {heads_k} and value "
                    f"{heads_v}; they must match unless enable_gqa=True (grouped-query attention)"
                )
            return "broadcasting a size-1 head dim of query/key/value is not supported by flashattn"
    device_type = query.device.type
    if attn_mask is not None and attn_mask.device != query.device:
        return "an attn_mask on another device than query is not supported by flashattn"
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        return f"a {attn_mask.dtype} attn_mask with {query.dtype} inputs is not supported by flashattn"
    if device_type == "cuda":
        if not ops.cuda_kernels_built():
            return "flashattn was built without its CUDA kernels"
        if query.dtype not in _CUDA_DTYPES:
            return f"{query.dtype} CUDA inputs are not supported by flashattn's CUDA kernels (float16/bfloat16 only)"
        major, _ = _cuda_capability(query.device.index)
        if major < 8:
            return "CUDA GPUs older than sm_80 are not supported by flashattn"
        return None
    if device_type == "cpu":
        if query.dtype not in _CPU_DTYPES:
            return f"{query.dtype} inputs are not supported by flashattn"
        return None
    return f"{device_type} tensors are not supported by flashattn"


def _mask_for_kernels(attn_mask: torch.Tensor, lead_shape, batch: int, heads_q: int, seqlen_q: int,
                      seqlen_k: int) -> torch.Tensor:
    """attn_mask broadcast to the ``(N, Hq, L, S)`` view the op takes: an expand (stride 0 on the
    broadcast dims, no copy) except that more than one leading batch dim may need a reshape copy."""
    full = tuple(lead_shape) + (heads_q, seqlen_q, seqlen_k)
    if attn_mask.dim() > len(full):
        raise RuntimeError(
            f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} has more dims than the "
            f"attention weights {full}"
        )
    expanded = attn_mask.expand(full)  # raises torch's own error when the shapes do not broadcast
    return expanded.reshape((batch, heads_q, seqlen_q, seqlen_k))


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Drop-in replacement for :func:`torch.nn.functional.scaled_dot_product_attention`.

    Same signature, layout and semantics as torch's function:

    * ``query`` ``(..., Hq, L, E)``, ``key`` ``(..., Hk, S, E)``, ``value`` ``(..., Hk, S, Ev)``; 4-dim
      ``(B, H, L, E)`` is the usual case, 3-dim ``(H, L, E)`` and 2-dim ``(L, E)`` work, more than 4 dims
      are flattened into one batch dim (a view when the leading dims allow it, else a copy).
    * ``is_causal`` masks key j from query i unless ``j <= i`` (top-left alignment, also when
      ``L != S``, as in torch).
    * ``scale`` defaults to ``1 / sqrt(E)``.
    * ``attn_mask`` broadcastable to ``(..., Hq, L, S)``: bool (True = the key takes part) or
      floating (float32 or the query's dtype, added to the scaled scores; its gradient is computed
      when it requires grad). It is read in place through its strides, never expanded in memory, and
      on CUDA key tiles it excludes entirely are skipped. A row whose keys are all masked gives zeros
      (and zero gradients). As in torch, ``attn_mask`` together with ``is_causal=True`` is an error.
    * Different head counts need ``enable_gqa=True`` (Hq a multiple of Hk) and raise otherwise, except
      that key/value with a single head broadcast over the query heads, as they do in torch.
    * ``dropout_p`` in [0, 1): each attention probability is dropped with that probability (after the
      softmax) and the kept ones are scaled by ``1 / (1 - dropout_p)``, on every call (like torch's
      function, this one does not know about ``module.training``). The keep-mask is drawn from torch's
      default generator of the query's device (``torch.manual_seed`` reproduces it; see
      :func:`flashattn.ops.draw_rng_state`) and the backward applies the same mask. It is flashattn's
      own mask (a Philox function of the positions, the same on the CPU and on CUDA), not the one
      torch's SDPA would draw for the same seed.
    * Returns ``(..., Hq, L, Ev)`` in the query's dtype; for 4-dim inputs it is a transposed view of a
      contiguous ``(B, L, H, Ev)`` buffer, as torch's flash backend returns (with Ev != E, of its first Ev
      columns: the kernels run on copies of the narrower inputs zero-padded to the wider head dim, which
      is exact and costs what that head dim costs).

    The 4-dim inputs are passed to the kernels as transposed views (no copy); the kernels accept any
    strides except in the last dim, so an input whose last dim is not contiguous is copied first.

    Served by flashattn's kernels: CPU tensors of float16, bfloat16, float32 or float64, and CUDA
    float16/bfloat16 tensors on GPUs of compute capability 8.0 or newer, with head dims 1..256.
    Every other call is passed unchanged to ``torch.nn.functional.scaled_dot_product_attention``, with
    a warning naming the reason (once per reason, and only outside ``torch.compile``): ``dropout_p``
    outside [0, 1) (torch returns zeros for 1 and raises otherwise), an ``attn_mask`` of another dtype or
    device, float32/float64 CUDA tensors, a head dim above 256, a GPU older than sm_80, an extension
    built without CUDA kernels, broadcasting between batch dims (or of a size-1 query head dim), nested
    tensors, other devices.

    Autograd, ``torch.compile(fullgraph=True)`` and CUDA graph capture work on the flashattn path.
    The forward is bitwise reproducible; the CUDA backward is not by default (dq is summed with atomics
    in no fixed order, so its last bits can change between runs). Under
    ``torch.use_deterministic_algorithms(True)`` it is: the backward then runs in the fixed-order mode
    of :func:`flash_attn_func`'s ``deterministic=True``.
    """
    if attn_mask is not None and is_causal:
        raise RuntimeError("scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    reason = fallback_reason(query, key, value, attn_mask, dropout_p, enable_gqa)
    if reason is not None:
        _warn_fallback_once(reason)
        kwargs = {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)

    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))

    ndim = query.dim()
    if ndim == 2:  # (L, E): one head
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    lead_shape = tuple(query.shape[:-3])
    batch = 1
    for size in lead_shape:
        batch *= size
    if ndim != 4:  # (4-dim inputs are (N, H, L, E) already; a reshape costs host time even as a view)
        query, key, value = (t.reshape((batch,) + tuple(t.shape[-3:])) for t in (query, key, value))  # (N, H, L, E)
    mask = None
    if attn_mask is not None:
        mask = _mask_for_kernels(attn_mask, lead_shape, batch, query.size(-3), query.size(-2),
                                 key.size(-2))  # (N, Hq, L, S)
    # torch.use_deterministic_algorithms(True) asks every op for reproducible results: the backward
    # then adds dq in a fixed order (the FlashAttention-2 API's deterministic=True).
    deterministic = torch.are_deterministic_algorithms_enabled()
    # The transposes to the kernels' layout happen inside the op, below autograd (no view nodes).
    rng_state = ops.draw_rng_state(query.device) if dropout_p > 0.0 else None
    # A value head dim Ev other than E: the op runs on zero-padded copies (ops.common_head_dim).
    query, key, value, value_dim = ops.common_head_dim(query, key, value)
    out, _ = ops.fwd_heads_first(query, key, value, float(scale), bool(is_causal), False, mask, float(dropout_p),
                                 rng_state, deterministic)  # (N, L, Hq, max(E, Ev))
    if out.size(-1) != value_dim:
        out = out[..., :value_dim]
    out = out.transpose(1, 2)  # (N, Hq, L, Ev)
    if ndim != 4:
        out = out.reshape(lead_shape + tuple(out.shape[1:]))
    if ndim == 2:
        out = out.squeeze(0)
    return out
