"""Sliding-window attention (``window_left`` / ``window_right``, FlashAttention-2's ``window_size``) against
the oracle.

Query i sees the keys ``i + offset - left .. i + offset + right`` (offset: the causal alignment's diagonal,
``Lk - Lq`` bottom-right or 0 top-left; -1 an unbounded side; ``is_causal`` makes right 0). Each case runs
the op through autograd and judges out, lse, dq, dk and dv against a float64 reference that applies the
window as a boolean mask, with the FlashAttention-2 rule (GUIDE section 4). Windows are narrow next to the
sequences, so that the kernels skip key blocks on both sides of each row's band and cut blocks at both of
its edges. CPU cases run everywhere; CUDA cases where a GPU is.
"""
import math

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import assert_attention_oracle, make_qkv

from conftest import requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.bfloat16, torch.float16]
# (causal, causal_bottom_right) of the ops: the alignment applies to the window even without causal.
ALIGNMENTS = {"bottom_right": (False, True), "top_left": (False, False), "causal": (True, True),
              "causal_top_left": (True, False)}


def window_mask(seqlen_q, seqlen_k, window, causal, bottom_right, device):
    """[Lq, Lk] bool: the keys each query sees, straight from the definition."""
    left, right = window
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q if bottom_right else 0
    i = torch.arange(seqlen_q, device=device)[:, None] + offset
    j = torch.arange(seqlen_k, device=device)[None, :]
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= j >= i - left
    if right >= 0:
        seen &= j <= i + right
    return seen


def reference(q, k, v, dout, scale, mask, dropout_p=0.0, keep=None, sink=None, softcap=0.0, upcast=True):
    """(out, lse, grads of q, k, v[, sink]): float64 with upcast, else in q's dtype."""
    dtype = torch.float64 if upcast else q.dtype
    tensors = (q, k, v) + ((sink,) if sink is not None else ())
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out, lse = attention_reference(*leaves[:3], scale, False, False, upcast=upcast, return_lse=True, attn_mask=mask,
                                   dropout_p=dropout_p, dropout_mask=keep,
                                   sink=leaves[3] if sink is not None else None, softcap=softcap)
    return out.detach(), lse.detach(), torch.autograd.grad(out, leaves, dout.to(dtype))


def check(q, k, v, scale, alignment, window, dropout_p=0.0, sink=None, softcap=0.0, deterministic=False):
    causal, bottom_right = ALIGNMENTS[alignment]
    b, lq, hq = q.size(0), q.size(1), q.size(2)
    lk = k.size(1)
    dout = torch.randn_like(q)
    rng_state = keep = None
    if dropout_p > 0.0:
        rng_state = ops.draw_rng_state(q.device)
        keep = ops.dropout_keep_mask(rng_state, b, hq, lq, lk, dropout_p)
    tensors = (q, k, v) + ((sink,) if sink is not None else ())
    leaves = [t.detach().requires_grad_() for t in tensors]
    out, lse = ops.attention(*leaves[:3], scale, causal, bottom_right, deterministic, None, dropout_p, rng_state,
                             sink=leaves[3] if sink is not None else None, softcap=softcap, window_left=window[0],
                             window_right=window[1])
    grads = torch.autograd.grad(out, leaves, dout)
    mask = window_mask(lq, lk, window, causal, bottom_right, q.device).expand(b, hq, lq, lk)
    ref = reference(q, k, v, dout, scale, mask, dropout_p, keep, sink, softcap)
    base = reference(q, k, v, dout, scale, mask, dropout_p, keep, sink, softcap, upcast=False)
    assert_attention_oracle(out.detach(), lse, grads, ref, base)
    return out.detach(), grads


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
SHAPES = [(2, 37, 53, 4, 2, 16), (2, 90, 41, 4, 4, 24), (1, 130, 130, 3, 1, 40)]
WINDOWS = [(5, 3), (0, 0), (12, -1), (-1, 7), (40, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("alignment", list(ALIGNMENTS))
def test_window_oracle(device, shape, alignment):
    b, lq, lk, hq, hk, d = shape
    for dtype in CPU_DTYPES if device == "cpu" else CUDA_DTYPES:
        q, k, v = make_qkv(b, lq, lk, hq, hk, d, dtype, device)
        for window in WINDOWS:
            check(q, k, v, 1.0 / math.sqrt(d), alignment, window)


@pytest.mark.parametrize("device", DEVICES)
def test_windows_wider_than_the_sequences_change_nothing(device):
    """A bound that cannot exclude a key is no bound: the result is plain (causal) attention's, bit for bit."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(2, 70, 50, 4, 2, 32, dtype, device)
    plain, plain_lse = ops.fwd(q, k, v, 0.2, True, True)
    for window in ((70, -1), (500, 0), (-1, -1), (69 + 50, 3)):
        out, lse = ops.fwd(q, k, v, 0.2, True, True, window_left=window[0], window_right=window[1])
        assert torch.equal(out, plain) and torch.equal(lse, plain_lse), window
    both, _ = ops.fwd(q, k, v, 0.2, False, True, window_left=200, window_right=200)
    assert torch.equal(both, ops.fwd(q, k, v, 0.2, False, True)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_window_with_dropout_sink_and_softcap(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(2, 150, 210, 4, 2, 64, dtype, device)
    sink = (torch.randn(4, device=device) + 1).to(dtype).float()
    check(q, k, v, 0.125, "causal", (30, 0), dropout_p=0.15)
    check(q, k, v, 0.125, "bottom_right", (20, 45), sink=sink)
    check(q * 2, k, v, 0.125, "causal_top_left", (50, -1), softcap=2.5)


@requires_cuda
@pytest.mark.parametrize("head_dim", [8, 40, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("alignment", ["causal", "bottom_right"])
def test_window_every_gpu_width(kernel_path, head_dim, alignment):
    """Every tile width of both GPU paths (sm90 where the GPU has it, and the sm80 kernels forced), with
    windows that skip whole key blocks on both sides."""
    for dtype in CUDA_DTYPES:
        q, k, v = make_qkv(2, 700, 900, 4, 2, head_dim, dtype, "cuda")
        for window in ((100, 0), (64, 130), (-1, 5)):
            check(q, k, v, 1.0 / math.sqrt(head_dim), alignment, window)
        q, k, v = make_qkv(1, 900, 400, 2, 1, head_dim, dtype, "cuda")  # Lq > Lk: rows without keys
        check(q, k, v, 1.0 / math.sqrt(head_dim), alignment, (150, 20))


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_windows_of_thousands_of_keys(head_dim):
    """Windows of 2048 keys or more (the width-128 forward's 176-key blocks), over rows longer than them."""
    q, k, v = make_qkv(1, 3000, 3300, 2, 1, head_dim, torch.bfloat16, "cuda")
    check(q, k, v, 1.0 / math.sqrt(head_dim), "causal", (2100, 0))
    check(q, k, v, 1.0 / math.sqrt(head_dim), "bottom_right", (2047, 300))


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_window_with_dropout_on_the_gpu(kernel_path, head_dim):
    q, k, v = make_qkv(2, 520, 600, 4, 2, head_dim, torch.bfloat16, "cuda")
    check(q, k, v, 1.0 / math.sqrt(head_dim), "causal", (130, 0), dropout_p=0.1)
    check(q, k, v, 1.0 / math.sqrt(head_dim), "bottom_right", (70, 200), dropout_p=0.1)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_window_deterministic_repeats_bitwise(kernel_path, head_dim):
    """Deterministic mode's dq turns start at each query block's first key block inside the window."""
    q, k, v = make_qkv(2, 1000, 1000, 4, 1, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    for window in ((200, 0), (90, 300)):
        runs = []
        for _ in range(2):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out, _ = ops.attention(*leaves, 0.1, window[1] == 0, True, True, window_left=window[0],
                                   window_right=window[1])
            runs.append(torch.autograd.grad(out, leaves, dout))
        for a, b in zip(*runs):
            assert torch.equal(a, b)
        check(q, k, v, 0.1, "bottom_right", window, deterministic=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 256])
def test_flash_attn_func_and_varlen_window(device, head_dim):
    """The FlashAttention API's window_size: flash_attn_func, and flash_attn_varlen_func with each sequence
    on its own bottom-right diagonal (the varlen kernels at head dim 64, the padded path at 256 on CUDA)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    q, k, v = make_qkv(1, 300, 300, 4, 2, head_dim, dtype, device)
    scale = head_dim ** -0.5
    for causal, window in ((True, (40, -1)), (False, (25, 10)), (False, (-1, 0))):
        out = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window)
        mask = window_mask(300, 300, window, causal, True, device)
        ref = attention_reference(q.double(), k.double(), v.double(), scale, attn_mask=mask)
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=0)
        bounds = ((0, 100, 0, 140), (100, 300, 140, 300))  # (q_lo, q_hi, k_lo, k_hi): Lq != Lk per sequence
        cu_q = torch.tensor([0, 100, 300], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, 140, 300], dtype=torch.int32, device=device)
        packed = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 200, 160, causal=causal,
                                                  window_size=window)
        for q_lo, q_hi, k_lo, k_hi in bounds:
            mask = window_mask(q_hi - q_lo, k_hi - k_lo, window, causal, True, device)
            ref = attention_reference(q[:, q_lo:q_hi].double(), k[:, k_lo:k_hi].double(), v[:, k_lo:k_hi].double(),
                                      scale, attn_mask=mask)[0]
            torch.testing.assert_close(packed[q_lo:q_hi].double(), ref, atol=tol, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_window_gradients(device):
    """flash_attn_varlen_func's window through autograd: every gradient, sequence by sequence."""
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    lengths = [(70, 90), (130, 130), (25, 10)]
    cu_q = torch.tensor([0, 70, 200, 225], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 90, 220, 230], dtype=torch.int32, device=device)
    q = torch.randn(225, 4, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(230, 2, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(230, 2, 64, device=device, dtype=dtype, requires_grad=True)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 130, causal=True, window_size=(33, 0))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    tol = 1e-9 if dtype == torch.float64 else 3e-2
    q0 = k0 = 0
    for lq, lk in lengths:
        leaves = [t.detach()[lo:lo + n].double().requires_grad_() for t, lo, n in ((q, q0, lq), (k, k0, lk), (v, k0, lk))]
        mask = window_mask(lq, lk, (33, 0), True, True, device)
        ref = attention_reference(*(x.unsqueeze(0) for x in leaves), 0.125, attn_mask=mask)[0]
        ref_grads = torch.autograd.grad(ref, leaves, dout[q0:q0 + lq].double())
        torch.testing.assert_close(out[q0:q0 + lq].detach().double(), ref.detach(), atol=tol, rtol=0)
        for g, r, lo, n in zip(grads, ref_grads, (q0, k0, k0), (lq, lk, lk)):
            torch.testing.assert_close(g[lo:lo + n].double(), r, atol=tol * 4, rtol=0)
        q0, k0 = q0 + lq, k0 + lk


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_window(device):
    """flash_attn_with_kvcache's window around each sequence's own diagonal (cache_seqlens after the append)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k_cache, v_cache = make_qkv(2, 4, 64, 4, 2, 32, dtype, device)
    lengths = torch.tensor([40, 17], dtype=torch.int32, device=device)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True,
                                            window_size=(9, -1))
    for b, n in enumerate(lengths.tolist()):
        mask = window_mask(4, n, (9, 0), True, True, device)
        ref = attention_reference(q[b:b + 1].double(), k_cache[b:b + 1, :n].double(), v_cache[b:b + 1, :n].double(),
                                  32 ** -0.5, attn_mask=mask)
        torch.testing.assert_close(out[b:b + 1].double(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_window_rejects_masks_and_bad_sizes(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, dtype, device)
    mask = torch.ones(1, 2, 8, 8, dtype=torch.bool, device=device)
    with pytest.raises(RuntimeError, match="sliding window .* with an attn_mask is not supported"):
        ops.fwd(q, k, v, 0.25, False, False, mask, window_left=2)
    # The causal mask alone (window_right 0, no left bound) is no window: it takes a mask.
    ops.fwd(q, k, v, 0.25, False, False, mask, window_right=0)
    with pytest.raises(TypeError, match="window_size must be a pair of ints"):
        flashattn.flash_attn_func(q, k, v, window_size=4)
    with pytest.raises(TypeError, match="window_size's left bound must be an int"):
        flashattn.flash_attn_func(q, k, v, window_size=(1.5, 0))
    with pytest.raises(TypeError, match="window_size's right bound must be an int"):
        flashattn.flash_attn_func(q, k, v, window_size=(1, torch.tensor(True)))
    # Integer tensors are bounds (flash_attn's own tests draw window_size with torch.randint).
    torch.testing.assert_close(flashattn.flash_attn_func(q, k, v, window_size=torch.tensor([3, 1])),
                               flashattn.flash_attn_func(q, k, v, window_size=(3, 1)), rtol=0, atol=0)


def test_opcheck_with_window():
    q = torch.randn(2, 9, 4, 8, requires_grad=True)
    k = torch.randn(2, 11, 2, 8, requires_grad=True)
    v = torch.randn(2, 11, 2, 8, requires_grad=True)
    kwargs = {"window_left": 3, "window_right": 1}
    torch.library.opcheck(ops.fwd, (q, k, v, 0.35, False, True), kwargs)
    with torch.no_grad():
        out, lse = ops.fwd(q, k, v, 0.35, False, True, **kwargs)
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.35, False,
                                    True), kwargs)
