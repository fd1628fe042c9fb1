"""flashattn as a provider of torch's flash-attention hook (``torch.nn.attention``'s
``register_flash_attention_impl`` / ``activate_flash_attention_impl``, torch >= 2.11).

Opt-in, never on import::

    from flashattn.integrations import torch_flash_impl
    torch_flash_impl.activate()                          # register + activate "flashattn"
    torch.nn.attention.restore_flash_attention_impl()    # back to torch's own kernels

Once active, these aten ops run flashattn's kernels on CUDA tensors (the dispatcher's CUDA key):
``_scaled_dot_product_flash_attention`` and its backward (what ``F.scaled_dot_product_attention``
calls on the flash backend), ``_flash_attention_forward`` / ``_flash_attention_backward`` (batched,
or variable-length when ``cum_seq_q`` / ``cum_seq_k`` are given: ``torch.nn.attention.varlen``), and
``_flash_attention_forward_no_dropout_inplace`` where torch has it. Each keeps the aten schema and
return tuple: logsumexp float32 ``(batch, heads_q, seqlen_q)`` (``(heads_q, total_q)`` with
``cum_seq_q``), ``rng_state`` ``[2]`` uint64, ``unused`` a uint64 scalar, an empty debug mask.

Sliding windows (``window_size_left`` / ``window_size_right``, None or -1 unbounded; aligned
bottom-right like the causal mask) run on the kernels' window. Limits (each raises NotImplementedError
naming the argument): ``return_debug_mask=True``, ``alibi_slopes``, ``block_table``, ``seqused_k``, and
dropout on the variable-length path. ``num_splits`` is a
performance hint and is ignored. Dropout (batched) uses flashattn's own generator, not torch's philox
stream: the forward draws a (seed, offset) pair with ``torch.randint`` (so ``torch.manual_seed``
makes it reproducible), returns it as ``rng_state`` and the backward regenerates that mask; the masks
differ from torch's kernels' masks for the same seed. A causal mask is aligned bottom-right when the
query and key lengths differ, as aten's flash ops align it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import ops
from .. import varlen as _varlen_mod
from .._fa2_common import scale_or_default

__all__ = ["NAME", "register", "activate", "is_supported"]

NAME = "flashattn"

_HOOK_FUNCTIONS = ("register_flash_attention_impl", "activate_flash_attention_impl",
                   "restore_flash_attention_impl", "current_flash_attention_impl", "list_flash_attention_impls")


def is_supported() -> bool:
    """Whether this torch has the flash-attention provider hook."""
    import torch.nn.attention as attn
    return all(hasattr(attn, f) for f in _HOOK_FUNCTIONS)


def _require_hook():
    if not is_supported():
        raise ImportError(
            f"flashattn.integrations.torch_flash_impl needs torch.nn.attention's flash-attention provider hook "
            f"(register_flash_attention_impl, torch >= 2.11); this torch is {torch.__version__}")
    import torch.nn.attention as attn
    return attn


# ---- the implementations (plain functions: called by the dispatcher, and directly by the tests) ----

def _unsupported(op: str, what: str):
    raise NotImplementedError(f"flashattn ({op}): {what} is not supported by flashattn's provider of torch's "
                              f"flash-attention hook")


def _check_common(op, return_debug_mask=False, seqused_k=None, alibi_slopes=None, block_table=None):
    if return_debug_mask:
        _unsupported(op, "return_debug_mask=True")
    if alibi_slopes is not None:
        _unsupported(op, "alibi_slopes")
    if block_table is not None:
        _unsupported(op, "block_table (paged KV cache)")
    if seqused_k is not None:
        _unsupported(op, "seqused_k")


def _window(window_size_left, window_size_right):
    """(left, right) for the kernels: None or a negative bound unbounded (-1). (-1, 0) is the causal mask
    (torch.nn.attention.varlen passes causal so)."""
    return tuple(-1 if bound is None or bound < 0 else int(bound) for bound in (window_size_left, window_size_right))


def _aux(device):
    # rng_state [2] uint64 and the unused scalar, as aten's flash ops return them (zeros: no dropout).
    return torch.zeros((2,), dtype=torch.uint64, device=device), torch.zeros((), dtype=torch.uint64, device=device)


def _rng_from_aux(op, rng_state, dropout_p):
    """flashattn's [2] int64 (seed, offset) from the rng_state a forward of this module returned."""
    if dropout_p <= 0.0:
        return None
    if rng_state is None or rng_state.numel() != 2 or rng_state.dtype not in (torch.uint64, torch.int64):
        raise ValueError(f"flashattn ({op}): dropout_p > 0 needs the [2] rng_state its forward returned, got "
                         f"{None if rng_state is None else (rng_state.dtype, tuple(rng_state.shape))}")
    rng = rng_state.reshape(2).contiguous()
    return rng.view(torch.int64) if rng.dtype == torch.uint64 else rng


def _check_dropout(op, dropout_p):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flashattn ({op}): dropout_p must be in [0, 1), got {dropout_p}")


def _check_varlen_args(op, cum_seq_q, cum_seq_k):
    if (cum_seq_q is None) != (cum_seq_k is None):
        raise ValueError(f"flashattn ({op}): cum_seq_q and cum_seq_k must both be given (varlen) or both be None, "
                         f"got cum_seq_q={'None' if cum_seq_q is None else 'a tensor'}, "
                         f"cum_seq_k={'None' if cum_seq_k is None else 'a tensor'}")


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                            seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    """aten::_flash_attention_forward -> (output, softmax_logsumexp, rng_state, unused, debug_attn_mask).
    query (batch, seqlen_q, heads_q, D), or (total_q, heads_q, D) with cum_seq_q / cum_seq_k."""
    op = "_flash_attention_forward"
    _check_common(op, return_debug_mask, seqused_k, alibi_slopes, block_table)
    _check_varlen_args(op, cum_seq_q, cum_seq_k)
    window = _window(window_size_left, window_size_right)
    dropout_p = float(dropout_p)
    _check_dropout(op, dropout_p)
    sc = scale_or_default(scale, query.size(-1))
    seed, unused = _aux(query.device)
    if cum_seq_q is not None:
        if dropout_p > 0.0:
            _unsupported(op, "dropout_p > 0 with cum_seq_q / cum_seq_k (variable-length)")
        out, lse, _ = _varlen_mod._varlen(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, 0.0, sc,
                                          bool(is_causal), False, True, None, window=window)
    else:
        rng = ops.draw_rng_state(query.device) if dropout_p > 0.0 else None
        out, lse = ops.fwd(query, key, value, sc, bool(is_causal), True, None, dropout_p, rng, False,
                           window_left=window[0], window_right=window[1])
        if rng is not None:
            seed = rng.view(torch.uint64)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, seed, unused, debug


def flash_attention_forward_no_dropout_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                               dropout_p, is_causal, return_debug_mask, *, scale=None,
                                               window_size_left=None, window_size_right=None, seqused_k=None,
                                               alibi_slopes=None, block_table=None, num_splits=None):
    """aten::_flash_attention_forward_no_dropout_inplace: writes the output into ``out``, returns the
    logsumexp."""
    op = "_flash_attention_forward_no_dropout_inplace"
    if float(dropout_p) != 0.0:
        raise ValueError(f"flashattn ({op}): dropout_p must be 0, got {dropout_p}")
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"flashattn ({op}): out must match query's shape, dtype and device "
                         f"({tuple(query.shape)}, {query.dtype}, {query.device}), got "
                         f"({tuple(out.shape)}, {out.dtype}, {out.device})")
    result, lse, _, _, _ = flash_attention_forward(
        query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, 0.0, is_causal, return_debug_mask, scale=scale,
        window_size_left=window_size_left, window_size_right=window_size_right, seqused_k=seqused_k,
        alibi_slopes=alibi_slopes, block_table=block_table, num_splits=num_splits)
    out.copy_(result)
    return lse


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                             window_size_right=None):
    """aten::_flash_attention_backward -> (grad_query, grad_key, grad_value)."""
    op = "_flash_attention_backward"
    window = _window(window_size_left, window_size_right)
    dropout_p = float(dropout_p)
    _check_dropout(op, dropout_p)
    sc = scale_or_default(scale, query.size(-1))
    deterministic = torch.are_deterministic_algorithms_enabled()
    # aten passes undefined tensors for the batched case; they reach Python as None.
    if cum_seq_q is not None and cum_seq_q.numel() == 0:
        cum_seq_q = None
    if cum_seq_k is not None and cum_seq_k.numel() == 0:
        cum_seq_k = None
    _check_varlen_args(op, cum_seq_q, cum_seq_k)
    if cum_seq_q is not None:
        if dropout_p > 0.0:
            _unsupported(op, "dropout_p > 0 with cum_seq_q / cum_seq_k (variable-length)")
        return _varlen_mod.varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                           max_q, max_k, sc, bool(is_causal), deterministic, window)
    rng = _rng_from_aux(op, rng_state, dropout_p)
    return ops.bwd(grad_out, query, key, value, out, logsumexp, sc, bool(is_causal), True, deterministic, None, None,
                   dropout_p, rng, window_left=window[0], window_right=window[1])


def sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention, query (batch, heads_q, seqlen_q, D) -> (output,
    logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask); the output is
    (batch, heads, seqlen_q, D) over (batch, seqlen_q, heads, D) memory, as aten's is."""
    op = "_scaled_dot_product_flash_attention"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"flashattn ({op}): query, key and value must be 4-dim (batch, heads, seqlen, head_dim), "
                         f"got {query.dim()}, {key.dim()} and {value.dim()} dims")
    out, lse, seed, unused, debug = flash_attention_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, query.size(2), key.size(2),
        dropout_p, is_causal, return_debug_mask, scale=scale)
    return out.transpose(1, 2), lse, None, None, query.size(2), key.size(2), seed, unused, debug


def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                        is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward -> (grad_query, grad_key, grad_value) in the
    (batch, heads, seqlen, D) layout."""
    t = [x.transpose(1, 2) for x in (grad_out, query, key, value, out)]
    dq, dk, dv = flash_attention_backward(t[0], t[1], t[2], t[3], t[4], logsumexp, None, None, max_q, max_k,
                                          dropout_p, is_causal, philox_seed, philox_offset, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# ---- registration ----

def overridden_ops():
    """The aten ops the provider overrides on this torch, with the functions that serve them."""
    table = {
        "_scaled_dot_product_flash_attention": sdpa_flash_forward,
        "_scaled_dot_product_flash_attention_backward": sdpa_flash_backward,
        "_flash_attention_forward": flash_attention_forward,
        "_flash_attention_backward": flash_attention_backward,
        "_flash_attention_forward_no_dropout_inplace": flash_attention_forward_no_dropout_inplace,
    }
    return {name: fn for name, fn in table.items() if hasattr(torch.ops.aten, name)}


@dataclass
class _Handle:
    library: Optional[torch.library.Library]

    def remove(self) -> None:
        # Dropping the Library deregisters its kernels (torch.library finalizes it).
        lib, self.library = self.library, None
        if lib is not None:
            lib._destroy()


def _register_kernels() -> _Handle:
    lib = torch.library.Library("aten", "IMPL", "CUDA")
    for name, fn in overridden_ops().items():
        lib.impl(name, fn, "CUDA")
    return _Handle(lib)


def register() -> None:
    """Register the provider "flashattn" with torch's hook (idempotent); does not activate it."""
    attn = _require_hook()
    attn.register_flash_attention_impl(NAME, register_fn=_register_kernels)


def activate() -> None:
    """Register and activate "flashattn": aten's flash-attention ops on CUDA then run flashattn's
    kernels until ``torch.nn.attention.restore_flash_attention_impl()`` (or another provider's
    activation)."""
    register()
    import torch.nn.attention as attn
    attn.activate_flash_attention_impl(NAME)
