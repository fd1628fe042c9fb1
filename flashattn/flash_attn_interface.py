"""The FlashAttention-2 Python API: :func:`flash_attn_func`, :func:`flash_attn_kvpacked_func` and
:func:`flash_attn_qkvpacked_func`, compatible with the flash_attn functions of the same names.

Layout ``(batch, seqlen, nheads, headdim)``, causal mask aligned to the bottom-right corner, and
arguments the kernels do not implement raise ``NotImplementedError`` (where the SDPA drop-in,
:mod:`flashattn.sdpa`, falls back to torch). The variable-length functions are in
:mod:`flashattn.varlen`, attention over a KV cache in :mod:`flashattn.kvcache`; the checks and the op
call the three modules share are in ``flashattn._fa2_common``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._fa2_common import (check_alibi, check_devices, check_sink, check_tensor, fa2_attention, op_slopes, unpack,
                          window_bounds)

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"]


def _flash_attn(q, k, v, dropout_p, softmax_scale, causal, window, softcap, deterministic, return_attn_probs,
                learnable_sink, alibi_slopes):
    check_devices(q, k, v)
    check_sink(learnable_sink, q, 2)
    slopes = check_alibi(alibi_slopes, q.size(0), q.size(2), q.device, float(softcap))
    out, softmax_lse, keep_mask = fa2_attention(q, k, v, dropout_p, softmax_scale, causal, deterministic,
                                                return_attn_probs, sink=learnable_sink, softcap=softcap,
                                                window=window, alibi_slopes=op_slopes(slopes))
    if not return_attn_probs:
        return out
    return out, softmax_lse, keep_mask


_FA2_ARGS_DOC = """
    Args (after the tensors), as in flash_attn 2:
        dropout_p: attention dropout probability in [0, 1) (other values raise the op's RuntimeError):
            each probability is dropped after the softmax with this probability and the kept ones are
            scaled by ``1 / (1 - dropout_p)``. Applied whenever it is > 0 (pass 0.0 at evaluation, as
            with flash_attn). The keep-mask comes from torch's default generator of q's device
            (``torch.manual_seed`` reproduces it) through flashattn's own Philox mask, the same on the
            CPU and on CUDA (not flash_attn's); the backward applies the same mask.
        softmax_scale: multiplies q k^T before the softmax; defaults to ``1 / sqrt(headdim)``.
        causal: causal mask aligned to the bottom-right corner: key j is visible to query i iff
            ``j <= i + seqlen_k - seqlen_q``. When ``seqlen_q > seqlen_k`` the first
            ``seqlen_q - seqlen_k`` query rows see no key; their output is 0.
        window_size: ``(left, right)``, a sliding window: query i sees only the keys j with
            ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right`` (aligned as the
            causal mask; -1: unbounded on that side; ``causal`` makes right 0). ``(-1, -1)``: none. The
            kernels skip the key blocks outside every row's window, so a window of W keys costs about
            what W keys cost.
        softcap: 0.0 (none), or a cap > 0 of every scaled score: ``softcap * tanh(score / softcap)``
            before the softmax (Gemma 2's attention soft-capping), with its exact backward.
        alibi_slopes: None, or ALiBi's float32 slopes, ``(nheads,)`` or ``(batch, nheads)``: query i's score
            for key j gets ``-slope[h] * |i + seqlen_k - seqlen_q - j|`` added after the scale (the bias of
            FlashAttention-2, whose causal form adds ``slope * j`` instead, which gives the same output and
            another LSE; the LSE returned here is the one of the bias above). The Hopper (sm90) kernels
            add it to each score themselves, beside a window, sinks or dropout; the CPU and the
            sm80 kernels run it as a float32 additive mask: with ``causal`` and no window or sinks a
            term per key (memory ``batch * nheads * seqlen_k``), otherwise ``(batch or 1, nheads,
            seqlen_q, seqlen_k)`` (quadratic in the lengths). The slopes get no gradient. Not with
            softcap (NotImplementedError).
        deterministic: make the backward bitwise reproducible. By default the CUDA backward adds
            each key block's share of dq with atomics in whatever order the blocks run, so dq's last
            bits can differ from run to run (dk and dv do not). With ``True`` the blocks add in a
            fixed order and dq, dk, dv are the same bits on every run with the same inputs, GPU and
            build; blocks then wait for their turn, which costs some backward speed (not measured
            yet). The forward is always bitwise reproducible, and so is the CPU backward (the flag
            changes nothing there).
        learnable_sink (keyword only; FlashAttention-3/4's name): attention sinks, a floating
            ``(nheads,)`` tensor of logits, or None. Query head h's rows take their softmax over
            their scores and ``learnable_sink[h]``, whose probability multiplies no value, so the
            row's probabilities sum to less than 1 (gpt-oss's sinks); ``softmax_lse`` includes it.
            Autograd reaches it when it requires grad.
        return_attn_probs: also return ``softmax_lse`` ``(batch, nheads, seqlen_q)`` float32, the
            natural-log log-sum-exp of each row of (undropped) scaled scores (-inf for a row that sees
            no key, where flash_attn reports +inf), and, where flash_attn returns its debugging
            ``S_dmask``, the dropout keep-mask: a bool ``(batch, nheads, seqlen_q, seqlen_k)`` tensor,
            True where a probability was kept, or ``None`` when ``dropout_p == 0``. This differs from
            flash_attn's ``S_dmask`` (which holds the probabilities with dropped ones negated) and,
            like it, is quadratic in memory: for tests and debugging (attention probabilities are
            never materialized here; ``attention_reference(..., dropout_mask=keep_mask)`` rebuilds
            the output from it).

    Returns:
        out ``(batch, seqlen_q, nheads, headdim_v)`` contiguous, in the inputs' dtype;
        or ``(out, softmax_lse, keep_mask)`` with ``return_attn_probs=True``.

    Supported: float16/bfloat16 CUDA tensors on GPUs of compute capability 8.0 or newer, and
    float16/bfloat16/float32/float64 CPU tensors; head dims 1..256; any strides except that the last
    dim must be contiguous (raises ValueError otherwise). Invalid shapes, dtypes or devices raise with
    a message naming the argument. Autograd flows to every input tensor; ``softmax_lse`` is not
    differentiable.
"""


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    check_tensor("k", k, 4, "(batch, seqlen_k, nheads_k, headdim)")
    check_tensor("v", v, 4, "(batch, seqlen_k, nheads_k, headdim_v)")
    return _flash_attn(q, k, v, dropout_p, softmax_scale, causal, window, softcap, deterministic, return_attn_probs,
                       learnable_sink, alibi_slopes)


flash_attn_func.__doc__ = (
    """Exact attention in the FlashAttention-2 layout: ``flash_attn.flash_attn_func`` compatible.

    q ``(batch, seqlen_q, nheads, headdim)``, k ``(batch, seqlen_k, nheads_k, headdim)`` and v
    ``(batch, seqlen_k, nheads_k, headdim_v)``; nheads must be a multiple of nheads_k (multi-query /
    grouped-query attention: query head h reads key/value head ``h // (nheads // nheads_k)``).
    headdim_v may differ from headdim (out is then ``(batch, seqlen_q, nheads, headdim_v)``): the kernels
    run on copies zero-padded to the larger of the two, exact and at that head dim's cost.
"""
    + _FA2_ARGS_DOC
)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
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
    check_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    k, v = unpack("kv", kv, 5, 2, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return _flash_attn(q, k, v, dropout_p, softmax_scale, causal, window, softcap, deterministic, return_attn_probs,
                       learnable_sink, alibi_slopes)


flash_attn_kvpacked_func.__doc__ = (
    """:func:`flash_attn_func` with k and v packed in one tensor: ``flash_attn.flash_attn_kvpacked_func`` compatible.

    q ``(batch, seqlen_q, nheads, headdim)``, kv ``(batch, seqlen_k, 2, nheads_k, headdim)``
    (k = ``kv[:, :, 0]``, v = ``kv[:, :, 1]``). k and v are read in place as strided views (no
    copy); the gradient reaches kv as one ``(batch, seqlen_k, 2, nheads_k, headdim)`` tensor.
"""
    + _FA2_ARGS_DOC
)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
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
    q, k, v = unpack("qkv", qkv, 5, 2, 3, "(batch, seqlen, 3, nheads, headdim)")
    return _flash_attn(q, k, v, dropout_p, softmax_scale, causal, window, softcap, deterministic, return_attn_probs,
                       learnable_sink, alibi_slopes)


flash_attn_qkvpacked_func.__doc__ = (
    """Self-attention on packed q, k, v: ``flash_attn.flash_attn_qkvpacked_func`` compatible.

    qkv ``(batch, seqlen, 3, nheads, headdim)`` (q = ``qkv[:, :, 0]``, k = ``qkv[:, :, 1]``,
    v = ``qkv[:, :, 2]``). q, k and v are read in place as strided views (no copy); the gradient
    reaches qkv as one ``(batch, seqlen, 3, nheads, headdim)`` tensor. With ``causal=True`` the mask is
    the usual lower triangle (seqlen_q == seqlen_k).
"""
    + _FA2_ARGS_DOC
)
