"""Score soft-capping (``softcap``: scores -> softcap * tanh(score / softcap), Gemma 2's) against the oracle.

Each case runs the op through autograd and judges out, lse, dq, dk and dv against a float64 reference
(flashattn.reference with its softcap) with the FlashAttention-2 rule (GUIDE section 4): the error may be
at most a small multiple of the same math's error in the inputs' dtype. Caps are chosen so that many
scores sit in tanh's curved part (|score| around the cap), where a wrong chain factor shows. CPU cases
run everywhere; CUDA cases where a GPU is.
"""
import math

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES, assert_attention_oracle, make_qkv

from conftest import requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def reference(q, k, v, dout, scale, causal, bottom_right, softcap, mask=None, dropout_p=0.0, keep=None,
              sink=None, upcast=True):
    """(out, lse, grads of q, k, v[, sink]): float64 with upcast, else in q's dtype."""
    dtype = torch.float64 if upcast else q.dtype
    tensors = (q, k, v) + ((sink,) if sink is not None else ())
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out, lse = attention_reference(*leaves[:3], scale, causal, bottom_right, upcast=upcast, return_lse=True,
                                   attn_mask=mask, dropout_p=dropout_p, dropout_mask=keep,
                                   sink=leaves[3] if sink is not None else None, softcap=softcap)
    return out.detach(), lse.detach(), torch.autograd.grad(out, leaves, dout.to(dtype))


def check(q, k, v, scale, causal_mode, softcap, mask=None, dropout_p=0.0, sink=None, deterministic=False):
    causal, bottom_right = CAUSAL_MODES[causal_mode]
    dout = torch.randn_like(q)
    rng_state = keep = None
    if dropout_p > 0.0:
        rng_state = ops.draw_rng_state(q.device)
        keep = ops.dropout_keep_mask(rng_state, q.size(0), q.size(2), q.size(1), k.size(1), dropout_p)
    tensors = (q, k, v) + ((sink,) if sink is not None else ())
    leaves = [t.detach().requires_grad_() for t in tensors]
    out, lse = ops.attention(*leaves[:3], scale, causal, bottom_right, deterministic, mask, dropout_p, rng_state,
                             sink=leaves[3] if sink is not None else None, softcap=softcap)
    grads = torch.autograd.grad(out, leaves, dout)
    ref = reference(q, k, v, dout, scale, causal, bottom_right, softcap, mask, dropout_p, keep, sink)
    base = reference(q, k, v, dout, scale, causal, bottom_right, softcap, mask, dropout_p, keep, sink, upcast=False)
    assert_attention_oracle(out.detach(), lse, grads, ref, base)
    return out.detach(), grads


CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.bfloat16, torch.float16]

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal mode)
SHAPES = [
    (2, 37, 53, 4, 2, 16, "none"),
    (2, 53, 37, 4, 4, 24, "bottom_right"),  # Lq > Lk: rows without keys
    (1, 70, 70, 3, 1, 40, "top_left"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softcap_oracle(device, shape):
    b, lq, lk, hq, hk, d, causal_mode = shape
    for dtype in CPU_DTYPES if device == "cpu" else CUDA_DTYPES:
        q, k, v = make_qkv(b, lq, lk, hq, hk, d, dtype, device)
        # Scores scale * q.k have a spread of about 2 * sqrt(d) * 0.5: a cap of 2 bends most of them.
        check(q * 2, k, v, 0.5, causal_mode, softcap=2.0)


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_bounds_the_scores(device):
    """A huge score is capped: with one key far above the others, its weight is exp(cap) against the
    others' exp(~0), not ~1."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.zeros(1, 1, 1, 16, device=device, dtype=dtype)
    q[..., 0] = 1.0
    k = torch.zeros(1, 4, 1, 16, device=device, dtype=dtype)
    k[0, 0, 0, 0] = 100.0  # score 100 against 0 for the other three keys
    v = torch.eye(4, 16, device=device, dtype=dtype)[None, :, None, :]
    out, lse = ops.attention(q, k, v, 1.0, False, False, softcap=1.0)
    e = math.e
    torch.testing.assert_close(out[0, 0, 0, :4].float().cpu(), torch.tensor([e, 1, 1, 1]) / (e + 3), atol=4e-3, rtol=0)
    torch.testing.assert_close(lse.float().cpu(), torch.tensor([[[math.log(e + 3)]]]), atol=4e-3, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_with_a_bool_mask_dropout_and_sink(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, lq, lk, hq, hk, d = 2, 45, 70, 4, 2, 64
    q, k, v = make_qkv(b, lq, lk, hq, hk, d, dtype, device)
    keep = torch.rand(b, 1, lq, lk, device=device) > 0.3
    keep[:, :, 3] = False  # a row the mask empties
    mask = keep.expand(b, hq, lq, lk)
    sink = (torch.randn(hq, device=device) + 1).to(dtype).float()
    check(q * 2, k, v, 0.25, "bottom_right", softcap=3.0, mask=mask)
    check(q * 2, k, v, 0.25, "none", softcap=3.0, dropout_p=0.15)
    check(q * 2, k, v, 0.25, "top_left", softcap=3.0, sink=sink)


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_rejects_bad_values_and_floating_masks(device):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, torch.float32 if device == "cpu" else torch.bfloat16, device)
    with pytest.raises(RuntimeError, match="softcap must be a finite value >= 0"):
        ops.fwd(q, k, v, 0.25, False, False, softcap=-1.0)
    with pytest.raises(RuntimeError, match="softcap must be a finite value >= 0"):
        ops.fwd(q, k, v, 0.25, False, False, softcap=float("inf"))
    bias = torch.zeros(1, 2, 8, 8, device=device, dtype=q.dtype)
    with pytest.raises(RuntimeError, match="softcap with a floating"):
        ops.fwd(q, k, v, 0.25, False, False, bias, softcap=5.0)


@requires_cuda
@pytest.mark.parametrize("head_dim", [8, 40, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal_mode", ["none", "bottom_right"])
def test_softcap_every_gpu_width(kernel_path, head_dim, causal_mode):
    """Every tile width of both GPU paths (sm90 where the GPU has it, and the sm80 kernels forced)."""
    for dtype in CUDA_DTYPES:
        q, k, v = make_qkv(2, 200, 333, 4, 2, head_dim, dtype, "cuda")
        check(q * 2, k, v, 1.0 / math.sqrt(head_dim), causal_mode, softcap=2.5)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_softcap_with_dropout_and_mask_on_the_gpu(kernel_path, head_dim):
    q, k, v = make_qkv(2, 150, 260, 4, 2, head_dim, torch.bfloat16, "cuda")
    mask = (torch.rand(2, 1, 150, 260, device="cuda") > 0.2).expand(2, 4, 150, 260)
    check(q * 2, k, v, 1.0 / math.sqrt(head_dim), "none", softcap=2.5, mask=mask, dropout_p=0.1)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_softcap_deterministic_repeats_bitwise(head_dim):
    q, k, v = make_qkv(2, 300, 300, 4, 1, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    runs = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, _ = ops.attention(*leaves, 0.2, True, True, True, softcap=4.0)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_and_varlen_softcap(device):
    """The FlashAttention API's softcap (flash_attn_func and flash_attn_varlen_func) as the op's."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(1, 60, 60, 4, 2, 64, dtype, device)
    out = flashattn.flash_attn_func(q * 2, k, v, causal=True, softcap=3.0)
    ref = attention_reference(q.double() * 2, k.double(), v.double(), 0.125, True, True, softcap=3.0)
    torch.testing.assert_close(out.double(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)
    cu = torch.tensor([0, 25, 60], dtype=torch.int32, device=device)
    packed = flashattn.flash_attn_varlen_func(q[0] * 2, k[0], v[0], cu, cu, 35, 35, causal=True, softcap=3.0)
    for lo, hi in ((0, 25), (25, 60)):
        ref = attention_reference(q[:, lo:hi].double() * 2, k[:, lo:hi].double(), v[:, lo:hi].double(), 0.125, True,
                                  True, softcap=3.0)[0]
        torch.testing.assert_close(packed[lo:hi].double(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_opcheck_with_softcap():
    q = torch.randn(2, 5, 4, 8, requires_grad=True)
    k = torch.randn(2, 7, 2, 8, requires_grad=True)
    v = torch.randn(2, 7, 2, 8, requires_grad=True)
    torch.library.opcheck(ops.fwd, (q, k, v, 0.35, True, True), {"softcap": 1.5})
    with torch.no_grad():
        out, lse = ops.fwd(q, k, v, 0.35, True, True, softcap=1.5)
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.35, True,
                                    True), {"softcap": 1.5})
