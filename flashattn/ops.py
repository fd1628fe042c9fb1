"""The flashattn custom ops as PyTorch sees them.

Importing this module loads the compiled extension ``flashattn._C``, whose C++ code registers three ops
in the ``flashattn`` namespace (schemas and the CPU/CUDA kernels live in ``csrc/torch/library.cpp``):

``torch.ops.flashattn.fwd(q, k, v, scale, is_causal, causal_bottom_right, attn_mask=None, dropout_p=0.0, rng_state=None, deterministic=False, sink=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None) -> (out, lse)``
    q ``[B, Lq, Hq, D]``, k and v ``[B, Lk, Hk, D]`` (any strides, contiguous last dim, Hq a multiple
    of Hk, 1 <= D <= 256). out ``[B, Lq, Hq, D]`` contiguous in q's dtype; lse ``[B, Hq, Lq]``, the
    natural-log log-sum-exp of each row's scaled (and masked) scores, float32 (float64 for float64
    inputs), -inf for a row that sees no key (whose out row is 0). With ``is_causal``, key j is visible
    to query i iff ``j <= i + offset`` where offset is 0 (top-left) or ``Lk - Lq``
    (``causal_bottom_right``). ``attn_mask``, if given, is a ``[B, Hq, Lq, Lk]`` tensor (a broadcast
    view made with ``expand`` is read in place, never copied), bool (True = the key takes part), or
    float32 or q's dtype (added to ``scale * q.k``; -inf excludes the key); it combines with ``is_causal``. On
    CUDA, tiles the mask excludes entirely are skipped without loading K and V. Additive values below
    about -6.9e29 are raised to that on CUDA, so a row whose every key carries ``finfo.min`` gets the
    uniform softmax the reference gives (only a row mixing such values differs from the reference).
    ``dropout_p`` in [0, 1) drops each probability after the softmax with probability ``dropout_p``
    and scales the kept ones by ``1 / (1 - dropout_p)``: out = (P * Z / (1 - p)) V with Z the keep-mask
    of ``csrc/common/dropout.h``, a pure function of (seed, offset, b, h, i, j) that is the same on the
    CPU and on CUDA, whatever the tiling. lse stays the log-sum-exp of the undropped scores.
    ``rng_state`` (needed when ``dropout_p > 0``) is a contiguous ``[2]`` int64 tensor (seed, offset)
    on q's device, read by the kernels from memory (see :func:`draw_rng_state`). ``deterministic`` is
    for the backward that autograd runs for this call (see ``bwd``); the forward is always bitwise
    reproducible. ``sink``, a ``(Hq,)`` floating tensor on q's device, is an attention sink per query head
    (gpt-oss's learned sinks): each row's softmax runs over its scores and ``sink[h]``, whose probability
    multiplies no value, so the row's probabilities sum to less than 1; lse includes it (a row that sees
    no key gets out 0 and lse ``sink[h]``). Autograd reaches a sink that requires grad. ``softcap`` > 0
    caps every scaled score to ``softcap * tanh(score / softcap)`` (Gemma 2) before the mask and the
    softmax; 0 leaves the scores alone. Not with a floating ``attn_mask`` (the CUDA backward recovers the
    tanh from the probability, which an additive term would spoil): boolean masks only.
    ``window_left`` / ``window_right`` (a sliding window, FlashAttention-2's ``window_size``; -1 unbounded)
    limit query i to the keys ``i + offset - window_left .. i + offset + window_right``, offset the causal
    alignment's as above; ``is_causal`` makes the right bound 0. Key blocks outside every row's window
    are skipped. Not with an ``attn_mask``. ``alibi_slopes``, a contiguous float32 ``(Hq,)`` or
    ``(B, Hq)`` tensor on q's device, adds ALiBi's bias ``-slope * |i + Lk - Lq - j|`` to ``scale * q.k``
    (FlashAttention-2's, whatever the causal alignment), and lse includes it. The sm90 kernels add it
    themselves; the CPU and the sm80 kernels run it as a float32 additive mask (csrc/torch/alibi.h: a
    term per key under causal masking on ALiBi's diagonal or left of it, without a window's left bound
    or a sink; else ``[B or 1, Hq, Lq, Lk]``). Not with ``softcap`` or an ``attn_mask``; the slopes
    get no gradient.

``torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, causal_bottom_right, deterministic=False, attn_mask=None, dmask=None, dropout_p=0.0, rng_state=None, sink=None, dsink=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None) -> (dq, dk, dv)``
    Gradients of fwd's out; dq like q, dk/dv like k (summed over each group of query heads). With
    dropout, ``dropout_p`` and ``rng_state`` must be the forward's: the keep-mask is regenerated, never
    stored. With a
    floating ``attn_mask``, ``dmask`` (a contiguous ``[B, Hq, Lq, Lk]`` tensor of the mask's dtype) is
    overwritten with the mask's gradient (dS, zero where the key takes no part). The CUDA
    kernel adds each key block's share of dq into an fp32 buffer with atomics, in whatever order the
    blocks happen to run, so dq's last bits can differ between runs (dk and dv cannot: each key block
    owns its rows). ``deterministic=True`` makes the key blocks add in a fixed order (increasing key
    position), so dq, dk, dv are bitwise reproducible, at the cost of blocks waiting for their turn.
    The CPU implementation is always deterministic; it accepts the flag and ignores it. ``fwd`` is
    bitwise reproducible on both. With the forward's ``sink``, ``dsink`` (a contiguous ``(Hq,)`` float32
    tensor) is overwritten with the sink's gradient, ``-sum over h's rows of exp(sink[h] - lse) *
    rowsum(dout * out)``. ``softcap``, the window and ``alibi_slopes`` must be the forward's.

``torch.ops.flashattn.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal, causal_bottom_right, deterministic=False, max_seqlen_q=-1, max_seqlen_k=-1, sink=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None) -> (out, lse)``
``torch.ops.flashattn.varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal, causal_bottom_right, deterministic=False, sink=None, dsink=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None) -> (dq, dk, dv)``
    A variable-length batch (:mod:`flashattn.varlen`): q ``(total_q, Hq, D)``, k/v ``(total_k, Hk, D)``,
    int32 offsets ``(batch + 1,)`` and optional used lengths ``(batch,)`` on q's device; out like q,
    lse ``(Hq, total_q)``; ``sink`` / ``dsink``, ``softcap``, the window and ``alibi_slopes`` (``(Hq,)`` or ``(batch, Hq)``) as in fwd / bwd (each sequence on its own diagonal; ALiBi's term added by the sm90 kernels, an additive mask per sequence on the CPU). On CUDA, sm_90 GPUs at head dims 33..256 only. varlen_fwd has autograd (csrc/torch/varlen_autograd.cpp).
    The offsets must start at 0, never decrease and end at the packed row count, seqused within each
    sequence, and no sequence longer than ``max_seqlen_q`` / ``max_seqlen_k`` where given (-1: any):
    checked where the op reads them, at once on the CPU, on CUDA by the kernel that builds the
    schedule (a device-side assertion with the argument's name, no host synchronization).

``torch.ops.flashattn.dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p) -> keep``
    The keep-mask ``fwd`` and ``bwd`` apply for that ``rng_state`` and ``dropout_p``, as a bool
    ``[batch, heads, seqlen_q, seqlen_k]`` tensor on rng_state's device (True = kept; all True for
    ``dropout_p == 0``). ``heads`` counts query heads. For tests and debugging: it is quadratic in memory.

``fwd``'s autograd kernel is C++ (``csrc/torch/autograd.cpp``): its backward calls ``bwd`` with the
forward's ``deterministic``, ``dropout_p`` and ``rng_state``. This module adds the fake (meta) kernels, so
the ops can be traced by ``torch.compile`` and ``torch.export``. :func:`attention` is ``fwd`` that draws
an ``rng_state`` for dropout; :func:`draw_rng_state` and :func:`dropout_keep_mask` are the dropout
helpers.
"""
from __future__ import annotations

import math

import torch


def _built_for_another_torch(error: ImportError):
    """An ImportError that says, in one line, that flashattn._C was built against another torch than
    this one (flashattn/build_record.py, written by setup.py), or None when that is not the cause."""
    try:
        from . import build_record
    except ImportError:
        return None  # a build from before the record existed: nothing to compare
    if build_record.TORCH == torch.__version__:
        return None
    said = str(error).splitlines()[0] if str(error) else type(error).__name__
    return ImportError(f"flashattn: its compiled extension was built against torch {build_record.TORCH} but this is "
                       f"torch {torch.__version__}; rebuild flashattn with this torch (pip install "
                       f"--no-build-isolation -e . in its checkout) (loading it said: {said})")


try:
    from . import _C  # noqa: F401  (loading the library registers torch.ops.flashattn.*)
except ImportError as _error:
    _mismatch = _built_for_another_torch(_error)
    if _mismatch is None:
        raise
    raise _mismatch from _error

__all__ = ["MAX_HEAD_DIM", "fwd", "fwd_heads_first", "bwd", "attention", "cuda_kernels_built", "draw_rng_state",
           "dropout_keep_mask"]

fwd = torch.ops.flashattn.fwd.default
# fwd with q, k, v in (B, H, L, E) (SDPA's layout), transposed for the kernels below autograd; out and lse
# as fwd returns them. Its autograd is fwd's.
fwd_heads_first = torch.ops.flashattn.fwd_heads_first.default
bwd = torch.ops.flashattn.bwd.default
_keep_mask_op = torch.ops.flashattn.dropout_keep_mask.default
varlen_fwd = torch.ops.flashattn.varlen_fwd.default
varlen_bwd = torch.ops.flashattn.varlen_bwd.default

# rng_state values are drawn uniformly from [0, 2^62): any int64 works, this range keeps torch.randint's
# bounds simple. The kernels use all 64 bits of the seed and the low 32 bits of the offset.
_RNG_STATE_HIGH = 2 ** 62

# The largest head dim the kernels take (csrc/torch/checks.h, where the ops check it); the SDPA drop-in
# falls back to torch above it.
MAX_HEAD_DIM = int(_C.MAX_HEAD_DIM)


# Read once at import: it is fixed for the life of the process, and a call into the extension module from
# inside torch.compile would break the graph (the attention functions ask cuda_kernels_built() while traced).
_CUDA_KERNELS_BUILT = bool(_C.compiled_with_cuda())


def cuda_kernels_built() -> bool:
    """True when the extension was compiled with its CUDA kernels."""
    return _CUDA_KERNELS_BUILT


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_qkv_meta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    # The same checks as csrc/torch/checks.cpp, expressed on metadata only, so tracing fails where running would.
    torch._check(q.dim() == 4, lambda: f"flashattn.fwd: q must have 4 dims [batch, seqlen_q, heads_q, head_dim], got {tuple(q.shape)}")
    torch._check(k.dim() == 4, lambda: f"flashattn.fwd: k must have 4 dims [batch, seqlen_k, heads_kv, head_dim], got {tuple(k.shape)}")
    torch._check(v.dim() == 4, lambda: f"flashattn.fwd: v must have 4 dims [batch, seqlen_k, heads_kv, head_dim], got {tuple(v.shape)}")
    torch._check(
        k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: f"flashattn.fwd: q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    torch._check(
        k.device == q.device and v.device == q.device,
        lambda: f"flashattn.fwd: q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}",
    )
    if q.device.type == "cuda":
        torch._check(
            q.dtype in (torch.float16, torch.bfloat16),
            lambda: f"flashattn.fwd: CUDA inputs must be float16 or bfloat16, got {q.dtype}",
        )
    batch, _, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    torch._check(k.size(0) == batch and v.size(0) == batch, lambda: "flashattn.fwd: q, k and v must have the same batch size")
    torch._check(v.size(1) == seqlen_k, lambda: "flashattn.fwd: k and v must have the same seqlen")
    torch._check(v.size(2) == heads_kv, lambda: "flashattn.fwd: k and v must have the same number of heads")
    torch._check(
        k.size(3) == head_dim and v.size(3) == head_dim,
        lambda: "flashattn.fwd: q, k and v must have the same head dim",
    )
    torch._check(
        1 <= head_dim <= MAX_HEAD_DIM,
        lambda: f"flashattn.fwd: head dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}",
    )
    torch._check(heads_kv >= 1 or heads_q == 0, lambda: "flashattn.fwd: k and v must have at least one head")
    torch._check(
        heads_q % heads_kv == 0 if heads_kv >= 1 else True,
        lambda: f"flashattn.fwd: heads_q={heads_q} must be a multiple of heads_kv={heads_kv}",
    )


def _check_mask_meta(op, q, k, attn_mask):
    if attn_mask is None:
        return
    expected = (q.size(0), q.size(2), q.size(1), k.size(1))
    torch._check(
        tuple(attn_mask.shape) == expected,
        lambda: f"{op}: attn_mask must have shape [batch, heads_q, seqlen_q, seqlen_k] = {list(expected)}, got {tuple(attn_mask.shape)}",
    )
    torch._check(
        attn_mask.dtype in (torch.bool, torch.float32, q.dtype),
        lambda: f"{op}: attn_mask must be bool, float32 or q's dtype {q.dtype}, got {attn_mask.dtype}",
    )


def _check_rng_state_meta(op, rng_state):
    torch._check(
        rng_state.dtype == torch.int64 and rng_state.dim() == 1 and rng_state.size(0) == 2 and rng_state.is_contiguous(),
        lambda: f"{op}: rng_state must be a contiguous [2] int64 tensor (seed, offset), got dtype {rng_state.dtype} "
                f"and shape {list(rng_state.shape)}",
    )


def _check_sink_meta(op, q, heads_q, sink, dsink=None):
    if sink is not None:
        torch._check(sink.dim() == 1 and sink.size(0) == heads_q,
                     lambda: f"{op}: sink must have shape (heads_q,) = ({heads_q},), one logit per query head, got "
                             f"{tuple(sink.shape)}")
        torch._check(sink.dtype.is_floating_point, lambda: f"{op}: sink must be a floating tensor, got {sink.dtype}")
    if dsink is not None:
        torch._check(sink is not None, lambda: f"{op}: dsink (the gradient of sink) needs a sink")
        torch._check(dsink.dim() == 1 and dsink.size(0) == heads_q and dsink.dtype == torch.float32,
                     lambda: f"{op}: dsink must be a contiguous float32 tensor of shape ({heads_q},), got dtype "
                             f"{dsink.dtype} and shape {tuple(dsink.shape)}")


def _check_softcap_meta(op, softcap, attn_mask=None):
    torch._check(math.isfinite(softcap) and softcap >= 0.0,
                 lambda: f"{op}: softcap must be a finite value >= 0 (0: no cap), got {softcap}")
    torch._check(softcap == 0.0 or attn_mask is None or attn_mask.dtype == torch.bool,
                 lambda: f"{op}: softcap with a floating (additive) attn_mask is not supported; pass a boolean mask")


def _check_alibi_meta(op, q, batch, heads_q, alibi_slopes, softcap, attn_mask=None):
    # batch: q's, or a variable-length batch's sequences.
    if alibi_slopes is None:
        return
    torch._check(tuple(alibi_slopes.shape) in ((heads_q,), (batch, heads_q)),
                 lambda: f"{op}: alibi_slopes must have shape (heads_q,) = ({heads_q},) or (batch, heads_q) = "
                         f"({batch}, {heads_q}), got {list(alibi_slopes.shape)}")
    torch._check(alibi_slopes.dtype == torch.float32,
                 lambda: f"{op}: alibi_slopes must be float32, got {alibi_slopes.dtype}")
    torch._check(alibi_slopes.device == q.device,
                 lambda: f"{op}: alibi_slopes must be on q's device {q.device}, got {alibi_slopes.device}")
    torch._check(softcap == 0.0, lambda: f"{op}: alibi_slopes with softcap is not supported")
    torch._check(attn_mask is None,
                 lambda: f"{op}: alibi_slopes with an attn_mask is not supported; add ALiBi's bias to the mask instead")


def _check_window_meta(op, window_left, window_right, attn_mask=None):
    # checks.cpp's resolve_window on metadata alone: a window with a mask is refused whatever the lengths.
    torch._check(attn_mask is None or (window_left < 0 and window_right <= 0),
                 lambda: f"{op}: a sliding window (window_left={window_left}, window_right={window_right}) with an "
                         f"attn_mask is not supported")


def _check_dropout_meta(op, q, dropout_p, rng_state):
    torch._check(0.0 <= dropout_p < 1.0, lambda: f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return
    torch._check(rng_state is not None,
                 lambda: f"{op}: dropout_p > 0 needs rng_state (a [2] int64 tensor: seed, offset)")
    _check_rng_state_meta(op, rng_state)
    torch._check(rng_state.device == q.device,
                 lambda: f"{op}: rng_state must be on q's device {q.device}, got {rng_state.device}")


@torch.library.register_fake("flashattn::fwd")
def _fwd_fake(q, k, v, scale, is_causal, causal_bottom_right, attn_mask=None, dropout_p=0.0, rng_state=None,
              deterministic=False, sink=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None):
    _check_qkv_meta(q, k, v)
    _check_mask_meta("flashattn.fwd", q, k, attn_mask)
    _check_dropout_meta("flashattn.fwd", q, dropout_p, rng_state)
    _check_sink_meta("flashattn.fwd", q, q.size(2), sink)
    _check_softcap_meta("flashattn.fwd", softcap, attn_mask)
    _check_alibi_meta("flashattn.fwd", q, q.size(0), q.size(2), alibi_slopes, softcap, attn_mask)
    _check_window_meta("flashattn.fwd", window_left, window_right, attn_mask)
    batch, seqlen_q, heads_q, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, heads_q, head_dim))
    lse = q.new_empty((batch, heads_q, seqlen_q), dtype=_lse_dtype(q.dtype))
    return out, lse


@torch.library.register_fake("flashattn::fwd_heads_first")
def _fwd_heads_first_fake(q, k, v, scale, is_causal, causal_bottom_right, attn_mask=None, dropout_p=0.0,
                          rng_state=None, deterministic=False, sink=None, softcap=0.0, window_left=-1,
                          window_right=-1, alibi_slopes=None):
    torch._check(
        q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
        lambda: f"flashattn.fwd_heads_first: q, k and v must be 4-D (B, H, L, E), got {q.dim()}, {k.dim()} and "
                f"{v.dim()} dims",
    )
    return _fwd_fake(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, is_causal, causal_bottom_right,
                     attn_mask, dropout_p, rng_state, deterministic, sink, softcap, window_left, window_right,
                     alibi_slopes)


@torch.library.register_fake("flashattn::bwd")
def _bwd_fake(dout, q, k, v, out, lse, scale, is_causal, causal_bottom_right, deterministic=False, attn_mask=None,
              dmask=None, dropout_p=0.0, rng_state=None, sink=None, dsink=None, softcap=0.0, window_left=-1,
              window_right=-1, alibi_slopes=None):
    _check_qkv_meta(q, k, v)
    _check_mask_meta("flashattn.bwd", q, k, attn_mask)
    _check_dropout_meta("flashattn.bwd", q, dropout_p, rng_state)
    _check_sink_meta("flashattn.bwd", q, q.size(2), sink, dsink)
    _check_softcap_meta("flashattn.bwd", softcap, attn_mask)
    _check_alibi_meta("flashattn.bwd", q, q.size(0), q.size(2), alibi_slopes, softcap, attn_mask)
    _check_window_meta("flashattn.bwd", window_left, window_right, attn_mask)
    if dmask is not None:
        torch._check(
            attn_mask is not None and attn_mask.dtype != torch.bool,
            lambda: "flashattn.bwd: dmask (the gradient of attn_mask) needs a floating attn_mask",
        )
    torch._check(dout.shape == q.shape, lambda: f"flashattn.bwd: dout must have q's shape {tuple(q.shape)}, got {tuple(dout.shape)}")
    torch._check(out.shape == q.shape, lambda: f"flashattn.bwd: out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    torch._check(
        dout.dtype == q.dtype and out.dtype == q.dtype,
        lambda: f"flashattn.bwd: dout and out must have q's dtype {q.dtype}, got {dout.dtype} and {out.dtype}",
    )
    torch._check(
        lse.dim() == 3 and tuple(lse.shape) == (q.size(0), q.size(2), q.size(1)),
        lambda: f"flashattn.bwd: lse must have shape [batch, heads_q, seqlen_q], got {tuple(lse.shape)}",
    )
    torch._check(
        lse.dtype in (torch.float32, torch.float64),
        lambda: f"flashattn.bwd: lse must be float32 (float64 for float64 inputs), got {lse.dtype}",
    )
    dq = q.new_empty(q.shape)
    dk = k.new_empty(k.shape)
    dv = v.new_empty(v.shape)
    return dq, dk, dv


@torch.library.register_fake("flashattn::dropout_keep_mask")
def _dropout_keep_mask_fake(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
    op = "flashattn.dropout_keep_mask"
    torch._check(
        batch >= 0 and heads >= 0 and seqlen_q >= 0 and seqlen_k >= 0,
        lambda: f"{op}: batch, heads, seqlen_q and seqlen_k must be >= 0, got {[batch, heads, seqlen_q, seqlen_k]}",
    )
    torch._check(0.0 <= dropout_p < 1.0, lambda: f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    _check_rng_state_meta(op, rng_state)
    return rng_state.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool)


def _check_varlen_meta(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    # csrc/torch/varlen_ops.cpp's checks on metadata only.
    torch._check(q.dim() == 3, lambda: f"{op}: q must be (total_q, heads_q, head_dim), got shape {tuple(q.shape)}")
    torch._check(k.dim() == 3, lambda: f"{op}: k must be (total_k, heads_kv, head_dim), got shape {tuple(k.shape)}")
    torch._check(v.dim() == 3, lambda: f"{op}: v must be (total_k, heads_kv, head_dim), got shape {tuple(v.shape)}")
    _check_qkv_meta(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
    torch._check(cu_seqlens_q.dim() == 1 and cu_seqlens_q.numel() >= 1,
                 lambda: f"{op}: cu_seqlens_q must be a 1-dim tensor of batch + 1 offsets, got {tuple(cu_seqlens_q.shape)}")
    batch = cu_seqlens_q.numel() - 1
    for name, t, n in (("cu_seqlens_q", cu_seqlens_q, batch + 1), ("cu_seqlens_k", cu_seqlens_k, batch + 1),
                       ("seqused_q", seqused_q, batch), ("seqused_k", seqused_k, batch)):
        if t is None:
            continue
        torch._check(t.dim() == 1 and t.numel() == n, lambda: f"{op}: {name} must be a 1-dim tensor of {n} int32 values")
        torch._check(t.dtype == torch.int32, lambda: f"{op}: {name} must be int32, got {t.dtype}")
        torch._check(t.device == q.device, lambda: f"{op}: {name} must be on q's device {q.device}, got {t.device}")


@torch.library.register_fake("flashattn::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal, causal_bottom_right,
                     deterministic=False, max_seqlen_q=-1, max_seqlen_k=-1, sink=None, softcap=0.0, window_left=-1,
                     window_right=-1, alibi_slopes=None):
    _check_varlen_meta("flashattn.varlen_fwd", q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    _check_sink_meta("flashattn.varlen_fwd", q, q.size(1), sink)
    _check_softcap_meta("flashattn.varlen_fwd", softcap)
    _check_alibi_meta("flashattn.varlen_fwd", q, cu_seqlens_q.numel() - 1, q.size(1), alibi_slopes, softcap)
    return q.new_empty(q.shape), q.new_empty((q.size(1), q.size(0)), dtype=_lse_dtype(q.dtype))


@torch.library.register_fake("flashattn::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, scale, is_causal,
                     causal_bottom_right, deterministic=False, sink=None, dsink=None, softcap=0.0, window_left=-1,
                     window_right=-1, alibi_slopes=None):
    op = "flashattn.varlen_bwd"
    _check_varlen_meta(op, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    _check_sink_meta(op, q, q.size(1), sink, dsink)
    _check_softcap_meta(op, softcap)
    _check_alibi_meta(op, q, cu_seqlens_q.numel() - 1, q.size(1), alibi_slopes, softcap)
    torch._check(dout.shape == q.shape, lambda: f"{op}: dout must have q's shape {tuple(q.shape)}, got {tuple(dout.shape)}")
    torch._check(out.shape == q.shape, lambda: f"{op}: out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    torch._check(tuple(lse.shape) == (q.size(1), q.size(0)),
                 lambda: f"{op}: lse must be (heads_q, total_q), got {tuple(lse.shape)}")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flashattn::decode_fwd")
def _decode_fwd_fake(q, k_cache, v_cache, seqlens_k, block_table, cache_batch_idx, leftpad, scale, is_causal,
                     window_left=-1, window_right=-1, softcap=0.0, num_splits=0, cu_seqlens_q=None, max_seqlen_q=0,
                     sink=None, alibi_slopes=None):
    op = "flashattn.decode_fwd"
    q_dims = 4 if cu_seqlens_q is None else 3
    torch._check(q.dim() == q_dims and k_cache.dim() == 4 and v_cache.dim() == 4,
                 lambda: f"{op}: q must be {q_dims}-D, k_cache and v_cache 4-D, got {q.dim()}, {k_cache.dim()} and "
                         f"{v_cache.dim()} dims")
    torch._check(k_cache.shape == v_cache.shape,
                 lambda: f"{op}: v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    torch._check(num_splits >= 0, lambda: f"{op}: num_splits must be >= 0, got {num_splits}")
    _check_alibi_meta(op, q, q.size(0) if cu_seqlens_q is None else cu_seqlens_q.numel() - 1, q.size(-2), alibi_slopes,
                      softcap)
    if cu_seqlens_q is not None:
        total_q, heads_q, head_dim = q.shape
        return q.new_empty((total_q, heads_q, head_dim)), q.new_empty((heads_q, total_q), dtype=torch.float32)
    batch, seqlen_q, heads_q, head_dim = q.shape
    return q.new_empty((batch, seqlen_q, heads_q, head_dim)), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


def draw_rng_state(device, generator=None) -> torch.Tensor:
    """A fresh dropout ``rng_state``: a ``[2]`` int64 tensor (seed, offset) drawn with ``torch.randint``
    on ``device`` from ``generator`` (torch's default generator of that device when None, so
    ``torch.manual_seed`` reproduces it). It is drawn on the device itself: no host synchronization,
    and CUDA graph capture records the draw like any torch random op, so each replay gets a new state."""
    return torch.randint(0, _RNG_STATE_HIGH, (2,), dtype=torch.int64, device=device, generator=generator)


def dropout_keep_mask(rng_state: torch.Tensor, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
                      dropout_p: float) -> torch.Tensor:
    """The keep-mask ``fwd``/``bwd`` apply for ``rng_state`` and ``dropout_p``: bool
    ``[batch, heads, seqlen_q, seqlen_k]`` on rng_state's device, True where a probability is kept
    (``heads`` counts query heads). Quadratic in memory: for tests and debugging."""
    return _keep_mask_op(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p)


def common_head_dim(q, k, v):
    """``(q, k, v, value_dim)``: for a value head dim different from the query/key one, the three zero-padded
    in their last dim to the larger of the two (a copy of the narrower ones), so that the kernels of one
    head dim serve the call; else the tensors unchanged. Exact: zero columns add nothing to ``q . k`` and
    make zero columns of ``p v`` (and of the gradients), so ``out[..., :value_dim]`` is the attention and
    the gradients of the padded copies' first columns are the inputs'. The caller passes the scale of the
    query's own head dim. With a key head dim other than the query's nothing is padded (the op then
    raises, naming the head dims)."""
    head_dim, value_dim = q.size(-1), v.size(-1)
    if value_dim == head_dim or k.size(-1) != head_dim:
        return q, k, v, value_dim
    width = max(head_dim, value_dim)
    q, k, v = (t if t.size(-1) == width else torch.nn.functional.pad(t, (0, width - t.size(-1))) for t in (q, k, v))
    return q, k, v, value_dim


def attention(q, k, v, scale: float, is_causal: bool, causal_bottom_right: bool, deterministic: bool = False,
              attn_mask=None, dropout_p: float = 0.0, rng_state=None, generator=None, sink=None, softcap: float = 0.0,
              window_left: int = -1, window_right: int = -1, alibi_slopes=None):
    """``fwd(q, k, v, scale, is_causal, causal_bottom_right, attn_mask, dropout_p, rng_state, deterministic,
    sink, softcap, window_left, window_right, alibi_slopes) -> (out, lse)``, with autograd (a floating ``attn_mask`` or a ``sink`` that requires grad
    gets one).

    With ``deterministic=True`` the backward runs ``bwd(..., deterministic=True)`` (bitwise reproducible
    gradients on CUDA). With ``dropout_p > 0`` and no ``rng_state``, one is drawn with
    :func:`draw_rng_state` on q's device from ``generator``; the backward reuses it, so it applies the
    forward's keep-mask. Pass an ``rng_state`` to choose the mask (the same one gives the same mask: see
    :func:`dropout_keep_mask`).

    v may have another head dim than q and k (``[B, Lk, Hk, Dv]``; out is then ``[B, Lq, Hq, Dv]``): the
    op runs on copies zero-padded to the larger of the two (:func:`common_head_dim`), which costs what
    that head dim costs, and out is its first Dv columns (copied, so contiguous as always).
    """
    dropout_p = float(dropout_p)
    if dropout_p == 0.0:
        rng_state = None
    elif rng_state is None:
        rng_state = draw_rng_state(q.device, generator)
    q, k, v, value_dim = common_head_dim(q, k, v)
    out, lse = fwd(q, k, v, scale, is_causal, causal_bottom_right, attn_mask, dropout_p, rng_state,
                   bool(deterministic), sink, float(softcap), int(window_left), int(window_right), alibi_slopes)
    return (out if out.size(-1) == value_dim else out[..., :value_dim].contiguous()), lse
