"""The public API and op registration, exercised on CPU (these run in CI, where there is no GPU).

Gradients are checked with torch.autograd.gradcheck in float64 through both public APIs; the ops'
registration with torch.library.opcheck and FakeTensorMode; results against torch's SDPA; argument
errors; the SDPA drop-in's fallbacks; the packed APIs; torch.compile.
"""
import math
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import flashattn
from flashattn import sdpa as fa_sdpa
from flashattn.reference import attention_reference, causal_visibility
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle, make_qkv, reference_and_baseline

from conftest import CUDA_SKIP_REASON


def _rand(*shape, dtype=torch.float64, requires_grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


def _torch_sdpa(q, k, v, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.fixture
def fresh_fallback_warnings():
    """Forget which fallback reasons were already warned about, so each test sees its warning."""
    fa_sdpa._warned_reasons.clear()
    yield
    fa_sdpa._warned_reasons.clear()


class _OpLog(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher below autograd."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


COPY_OPS = ("aten.clone", "aten.copy_", "aten._to_copy", "aten.contiguous", "aten.cat", "aten.stack")


# --------------------------------------------------------------------------------------------------
# Gradients: gradcheck in float64 through both public APIs
# --------------------------------------------------------------------------------------------------

GRADCHECK_FA2 = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
    (2, 4, 4, 2, 2, 3, False),
    (1, 4, 4, 2, 2, 5, True),
    (1, 3, 6, 4, 2, 4, True),  # bottom-right causal, Lq < Lk, GQA
    (1, 6, 3, 2, 1, 4, True),  # bottom-right causal, Lq > Lk: the first 3 rows see no key
    (2, 5, 2, 2, 2, 1, False),  # head dim 1
]


@pytest.mark.parametrize("case", GRADCHECK_FA2, ids=lambda c: "b{}-{}x{}-h{}kv{}-d{}-causal{}".format(*c))
def test_gradcheck_flash_attn_func(case):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal = case
    q = _rand(batch, seqlen_q, heads_q, head_dim, requires_grad=True)
    k = _rand(batch, seqlen_k, heads_kv, head_dim, requires_grad=True)
    v = _rand(batch, seqlen_k, heads_kv, head_dim, requires_grad=True)
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, softmax_scale=0.7)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_flash_attn_func_strided_inputs():
    # q from a [B, H, S, D] tensor transposed; k and v sliced out of wider tensors with a storage offset.
    q_bhsd = _rand(1, 2, 4, 3, requires_grad=True)
    k_wide = _rand(1, 6, 2, 5, requires_grad=True)
    v_wide = _rand(1, 7, 2, 4, requires_grad=True)

    def fn(q_bhsd, k_wide, v_wide):
        q, k, v = q_bhsd.transpose(1, 2), k_wide[:, 1:, :, 1:4], v_wide[:, 2:, :, :3]
        assert not q.is_contiguous() and k.storage_offset() > 0 and v.storage_offset() > 0
        return flashattn.flash_attn_func(q, k, v, causal=True)

    assert torch.autograd.gradcheck(fn, (q_bhsd, k_wide, v_wide))


GRADCHECK_SDPA = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa)
    (1, 2, 2, 4, 4, 3, True, False),
    (1, 2, 2, 3, 5, 4, True, False),  # top-left causal, Lq < Lk
    (1, 2, 2, 5, 3, 4, True, False),  # top-left causal, Lq > Lk
    (2, 4, 2, 3, 4, 2, True, True),  # GQA
    (1, 4, 1, 3, 4, 2, False, True),  # MQA
]


@pytest.mark.parametrize("case", GRADCHECK_SDPA, ids=lambda c: "b{}h{}kv{}-{}x{}-d{}-causal{}-gqa{}".format(*c))
def test_gradcheck_sdpa(case):
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa = case
    q = _rand(batch, heads_q, seqlen_q, head_dim, requires_grad=True)
    k = _rand(batch, heads_kv, seqlen_k, head_dim, requires_grad=True)
    v = _rand(batch, heads_kv, seqlen_k, head_dim, requires_grad=True)

    def fn(q, k, v):
        return flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_sdpa_strided_inputs():
    # (B, S, H, D) storage viewed as (B, H, S, D): the layout models produce after a fused qkv projection.
    qkv = _rand(1, 4, 3, 2, 3, requires_grad=True)  # [B, S, 3, H, D]

    def fn(qkv):
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # three (B, H, S, D) views
        return flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert torch.autograd.gradcheck(fn, (qkv,))


# --------------------------------------------------------------------------------------------------
# Registration: opcheck and fake tensors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal, bottom_right", [(False, False), (True, False), (True, True)])
def test_opcheck_cpu(dtype, causal, bottom_right):
    q = _rand(2, 5, 4, 8, dtype=dtype, requires_grad=True)
    k = _rand(2, 7, 2, 8, dtype=dtype, requires_grad=True)
    v = _rand(2, 7, 2, 8, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.35, causal, bottom_right))
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.35, causal, bottom_right)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.35, causal, bottom_right),
    )


@pytest.mark.parametrize("slopes_shape", [(4,), (2, 4)])
def test_opcheck_cpu_alibi(slopes_shape):
    q = _rand(2, 5, 4, 8, dtype=torch.float64, requires_grad=True)
    k = _rand(2, 7, 2, 8, dtype=torch.float64, requires_grad=True)
    v = _rand(2, 7, 2, 8, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(slopes_shape)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.35, True, True),
                          {"window_left": 3, "alibi_slopes": slopes})
    torch.library.opcheck(torch.ops.flashattn.fwd_heads_first.default,
                          (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.35, False, True),
                          {"alibi_slopes": slopes})
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.35, True, True, alibi_slopes=slopes)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.35, True, True),
        {"alibi_slopes": slopes},
    )



@pytest.mark.parametrize("slopes_shape", [(4,), (2, 4)])
def test_opcheck_cpu_varlen_alibi(slopes_shape):
    q = _rand(12, 4, 8, dtype=torch.float64, requires_grad=True)
    k = _rand(15, 2, 8, dtype=torch.float64, requires_grad=True)
    v = _rand(15, 2, 8, dtype=torch.float64, requires_grad=True)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 15], dtype=torch.int32)
    slopes = torch.rand(slopes_shape)
    torch.library.opcheck(torch.ops.flashattn.varlen_fwd.default, (q, k, v, cu_q, cu_k, None, None, 0.35, True, True),
                          {"alibi_slopes": slopes})
    with torch.no_grad():
        out, lse = torch.ops.flashattn.varlen_fwd(q, k, v, cu_q, cu_k, None, None, 0.35, False, True,
                                                  alibi_slopes=slopes)
    torch.library.opcheck(
        torch.ops.flashattn.varlen_bwd.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, cu_q, cu_k, None, None, 0.35, False,
         True),
        {"alibi_slopes": slopes},
    )
    with pytest.raises(RuntimeError, match=r"alibi_slopes must have shape \(heads_q,\) = \(4,\) or \(batch, "
                                           r"heads_q\) = \(2, 4\)"):
        torch.ops.flashattn.varlen_fwd(q, k, v, cu_q, cu_k, None, None, 0.35, False, True,
                                       alibi_slopes=torch.rand(12, 4))

# fwd_heads_first: fwd with q, k, v in (B, H, L, E), the transposes made inside the op.
@pytest.mark.parametrize("mask", [None, "float"])
@pytest.mark.parametrize("causal, bottom_right", [(False, False), (True, True)])
def test_opcheck_fwd_heads_first(causal, bottom_right, mask):
    q = _rand(2, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    k = _rand(2, 2, 7, 8, dtype=torch.float64, requires_grad=True)
    v = _rand(2, 2, 7, 8, dtype=torch.float64, requires_grad=True)
    attn_mask = None
    if mask is not None and not causal:
        attn_mask = torch.randn(2, 1, 1, 7, dtype=torch.float64, requires_grad=True).expand(2, 4, 5, 7)
    torch.library.opcheck(torch.ops.flashattn.fwd_heads_first.default, (q, k, v, 0.35, causal, bottom_right, attn_mask))


@pytest.mark.parametrize("last_dim_strided", [False, True])
def test_fwd_heads_first_matches_fwd(last_dim_strided):
    """Values and gradients (q, k, v and a floating mask) equal fwd's on the transposed inputs, also for
    inputs whose last dim is strided (copied inside the op); with dropout, the same keep-mask."""
    shapes = [(2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)]
    if last_dim_strided:
        q, k, v = (_rand(*s[:-1], 2 * s[-1])[..., ::2].requires_grad_() for s in shapes)
    else:
        q, k, v = (_rand(*s, requires_grad=True) for s in shapes)
    mask = torch.randn(2, 1, 5, 7, requires_grad=True)
    rng_state = torch.tensor([123, 4], dtype=torch.int64)
    args = (0.35, False, False, mask.expand(2, 4, 5, 7), 0.25, rng_state)
    out, lse = torch.ops.flashattn.fwd_heads_first(q, k, v, *args)
    # fwd needs a contiguous last dim (its callers copy): .contiguous() on the transposed views.
    ref_out, ref_lse = torch.ops.flashattn.fwd(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), *args)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, mask), dout)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v, mask), dout)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and torch.equal(got, want)


def test_fwd_heads_first_without_autograd():
    """Under inference mode the op runs its CPU kernel (no autograd kernel): the same out and lse."""
    q, k, v = (_rand(1, 2, 6, 8) for _ in range(3))
    with torch.inference_mode():
        out, lse = torch.ops.flashattn.fwd_heads_first(q, k, v, 0.35, True, False)
    ref_out, ref_lse = torch.ops.flashattn.fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.35, True,
                                               False)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_fwd_heads_first_rejects_other_ranks():
    q = _rand(2, 5, 8)
    for context in (torch.inference_mode(), torch.enable_grad()):
        with context, pytest.raises(RuntimeError, match="fwd_heads_first: q, k and v must be 4-D"):
            torch.ops.flashattn.fwd_heads_first(q, q, q, 0.35, False, False)


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@pytest.mark.parametrize(
    "device, dtype, lse_dtype",
    [
        ("cpu", torch.float32, torch.float32),
        ("cpu", torch.float64, torch.float64),
        ("cpu", torch.bfloat16, torch.float32),
        ("cuda", torch.float16, torch.float32),
        ("cuda", torch.bfloat16, torch.float32),
    ],
)
def test_fake_tensor_shapes(device, dtype, lse_dtype):
    try:
        with _fake_mode():
            torch.empty(1, device=device)
    except Exception as exc:  # some torch versions need a real GPU for device='cuda' fakes
        pytest.skip(f"FakeTensorMode cannot make {device} tensors here: {exc}")
    with _fake_mode():
        q = torch.empty(3, 11, 8, 40, dtype=dtype, device=device)
        k = torch.empty(3, 13, 2, 40, dtype=dtype, device=device)
        v = torch.empty(3, 13, 2, 40, dtype=dtype, device=device)
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.1, True, True)
        assert out.shape == (3, 11, 8, 40) and out.dtype == dtype and out.device == q.device
        assert out.is_contiguous()
        assert lse.shape == (3, 8, 11) and lse.dtype == lse_dtype and lse.device == q.device
        dq, dk, dv = torch.ops.flashattn.bwd(out, q, k, v, out, lse, 0.1, True, True)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        assert dq.dtype == dk.dtype == dv.dtype == dtype
        assert dq.is_contiguous() and dk.is_contiguous() and dv.is_contiguous()

        # The public APIs trace through the fake kernels with their own layouts (on CUDA only where they
        # would run: the FA2 API needs the CUDA kernels built, the SDPA drop-in also asks the GPU its capability).
        if device == "cpu" or flashattn.cuda_kernels_built():
            qkv = torch.empty(3, 11, 3, 8, 40, dtype=dtype, device=device)
            out, lse, probs = flashattn.flash_attn_qkvpacked_func(qkv, return_attn_probs=True)
            assert out.shape == (3, 11, 8, 40) and lse.shape == (3, 8, 11) and probs is None
        if device == "cpu" or CUDA_SKIP_REASON is None:
            q_bhsd = torch.empty(3, 8, 11, 40, dtype=dtype, device=device)
            kv_bhsd = torch.empty(3, 2, 13, 40, dtype=dtype, device=device)
            out = flashattn.scaled_dot_product_attention(q_bhsd, kv_bhsd, kv_bhsd, enable_gqa=True)
            assert out.shape == (3, 8, 11, 40)


def test_fake_kernel_rejects_bad_shapes():
    with _fake_mode():
        q = torch.empty(2, 5, 6, 16)
        k = torch.empty(2, 7, 4, 16)
        with pytest.raises(Exception, match="multiple"):
            torch.ops.flashattn.fwd(q, k, k, 0.1, False, False)
        with pytest.raises(Exception, match="head dim"):
            big = torch.empty(2, 5, 4, 300)
            torch.ops.flashattn.fwd(big, big, big, 0.1, False, False)


# --------------------------------------------------------------------------------------------------
# Results against torch SDPA on CPU
# --------------------------------------------------------------------------------------------------

TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-9)}

SDPA_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa)
    (2, 4, 4, 33, 33, 16, False, False),
    (2, 4, 4, 33, 33, 16, True, False),
    (1, 2, 2, 17, 45, 24, True, False),  # top-left causal, Lq < Lk
    (1, 2, 2, 45, 17, 24, True, False),  # top-left causal, Lq > Lk
    (3, 8, 2, 20, 31, 40, True, True),  # GQA
    (2, 4, 1, 9, 64, 8, False, False),  # a single kv head broadcasts without enable_gqa, as in torch
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "b{}h{}kv{}-{}x{}-d{}-causal{}-gqa{}".format(*c))
def test_sdpa_matches_torch_cpu(case, dtype):
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa = case
    q = _rand(batch, heads_q, seqlen_q, head_dim, dtype=dtype, requires_grad=True)
    k = _rand(batch, heads_kv, seqlen_k, head_dim, dtype=dtype, requires_grad=True)
    v = _rand(batch, heads_kv, seqlen_k, head_dim, dtype=dtype, requires_grad=True)
    dout = torch.randn(batch, heads_q, seqlen_q, head_dim, dtype=dtype)
    gqa_kwargs = {"enable_gqa": True} if enable_gqa else {}

    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **gqa_kwargs)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = _torch_sdpa(q, k, v, is_causal=is_causal, **gqa_kwargs)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)

    assert out.shape == ref.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOLERANCES[dtype])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOLERANCES[dtype])


FA2_CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
    (2, 33, 33, 4, 4, 16, False),
    (2, 33, 33, 4, 4, 16, True),
    (1, 17, 45, 4, 2, 24, True),  # bottom-right causal, Lq < Lk
    (2, 1, 40, 2, 1, 8, True),  # a single query sees every key
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", FA2_CASES, ids=lambda c: "b{}-{}x{}-h{}kv{}-d{}-causal{}".format(*c))
def test_flash_attn_func_matches_torch_cpu(case, dtype):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal = case
    q = _rand(batch, seqlen_q, heads_q, head_dim, dtype=dtype, requires_grad=True)
    k = _rand(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, requires_grad=True)
    v = _rand(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, requires_grad=True)
    dout = torch.randn_like(q)

    out, lse, probs = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert probs is None and not lse.requires_grad
    grads = torch.autograd.grad(out, (q, k, v), dout)

    mask = causal_visibility(seqlen_q, seqlen_k, bottom_right=True) if causal else None
    ref = _torch_sdpa(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=heads_q != heads_kv
    ).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    _, ref_lse = attention_reference(q, k, v, is_causal=causal, causal_bottom_right=True, return_lse=True)

    torch.testing.assert_close(out, ref, **TOLERANCES[dtype])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOLERANCES[dtype])
    assert lse.shape == (batch, heads_q, seqlen_q)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(lse, ref_lse.to(lse.dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal_mode", [(False, False), (True, False), (True, True)], ids=["none", "top_left", "bottom_right"])
def test_low_precision_cpu_oracle(dtype, causal_mode):
    """float16/bfloat16 on CPU pass the same oracle as the GPU kernels."""
    is_causal, bottom_right = causal_mode
    for seqlen_q, seqlen_k in [(17, 17), (13, 29), (29, 13)]:
        q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, 24, dtype, "cpu")
        for t in (q, k, v):
            t.requires_grad_()
        dout = torch.randn_like(q)
        out, _ = torch.ops.flashattn.fwd(q, k, v, 0.2, is_causal, bottom_right)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        (ref_out, ref_grads, _), (base_out, base_grads) = reference_and_baseline(q, k, v, dout, 0.2, is_causal, bottom_right)
        assert out.dtype == dtype
        assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
        for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            assert_oracle(name, g, r, b, GRAD_FACTOR)


def test_rows_without_keys():
    # Bottom-right causal with Lq > Lk: the first Lq - Lk query rows see no key.
    q = _rand(1, 6, 2, 8, requires_grad=True)
    k = _rand(1, 2, 2, 8, requires_grad=True)
    v = _rand(1, 2, 2, 8, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))
    assert torch.isneginf(lse[:, :, :4]).all() and torch.isfinite(lse[:, :, 4:]).all()
    torch.testing.assert_close(out, attention_reference(q, k, v, is_causal=True, causal_bottom_right=True))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("shape", ["no_keys", "no_batch", "no_queries"])
def test_empty_inputs_cpu(shape):
    batch, seqlen_q, seqlen_k = {"no_keys": (2, 5, 0), "no_batch": (0, 5, 5), "no_queries": (2, 0, 5)}[shape]
    q = _rand(batch, seqlen_q, 4, 8, requires_grad=True)
    k = _rand(batch, seqlen_k, 2, 8, requires_grad=True)
    v = _rand(batch, seqlen_k, 2, 8, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)
    if seqlen_k == 0:
        assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and torch.equal(g, torch.zeros_like(g))
    sdpa_out = flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    assert sdpa_out.shape == (batch, 4, seqlen_q, 8)


# --------------------------------------------------------------------------------------------------
# The SDPA drop-in: shapes, views, fallbacks
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape_q, shape_kv", [
    ((13, 8), (21, 8)),  # (L, E)
    ((3, 13, 8), (3, 21, 8)),  # (H, L, E)
    ((2, 3, 4, 13, 8), (2, 3, 4, 21, 8)),  # two batch dims
])
def test_sdpa_other_ranks(shape_q, shape_kv):
    q, k, v = _rand(*shape_q), _rand(*shape_kv), _rand(*shape_kv)
    for is_causal in (False, True):
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(out, _torch_sdpa(q, k, v, is_causal=is_causal))


def test_sdpa_passes_views_without_copies():
    q, k, v = (_rand(2, 4, 9, 8) for _ in range(3))
    with _OpLog() as log:
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert "flashattn.fwd.default" in log.names
    assert not [n for n in log.names if n.startswith(COPY_OPS)], log.names
    assert out.shape == (2, 4, 9, 8) and out.transpose(1, 2).is_contiguous()  # a view of the op's output


def test_sdpa_copies_a_non_contiguous_last_dim():
    q = _rand(1, 2, 5, 16)[..., ::2]  # last-dim stride 2
    k, v = _rand(1, 2, 7, 8), _rand(1, 2, 7, 8)
    out = flashattn.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, _torch_sdpa(q, k, v))


def test_sdpa_scale_argument():
    q, k, v = _rand(1, 2, 5, 8), _rand(1, 2, 7, 8), _rand(1, 2, 7, 8)
    out = flashattn.scaled_dot_product_attention(q, k, v, scale=0.05)
    torch.testing.assert_close(out, _torch_sdpa(q, k, v, scale=0.05))


def test_sdpa_head_mismatch_without_gqa_raises():
    q, kv = _rand(1, 8, 5, 8), _rand(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match="enable_gqa"):
        flashattn.scaled_dot_product_attention(q, kv, kv)
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv)  # torch raises too


def _fallback_cases():
    q, k, v = _rand(2, 4, 9, 8), _rand(2, 4, 11, 8), _rand(2, 4, 11, 8)
    mask = torch.rand(9, 11) > 0.3
    return {
        "torch.int64 attn_mask": ((q, k, v), {"attn_mask": mask.long()}),
        "dropout_p outside": ((q, k, v), {"dropout_p": 1.0}),  # dropout_p in [0, 1) runs on the kernels
        "head dims outside": ((_rand(1, 2, 5, 300), _rand(1, 2, 5, 300), _rand(1, 2, 5, 300)), {}),
        "batch dims": ((q, k[:1], v[:1]), {}),
        "int": ((q.long(), k.long(), v.long()), {}),
    }


@pytest.mark.parametrize("reason", list(_fallback_cases()))
def test_sdpa_fallback_warns_once_and_matches_torch(reason, fresh_fallback_warnings):
    (q, k, v), kwargs = _fallback_cases()[reason]
    if reason in ("int", "torch.int64 attn_mask"):
        # torch itself rejects integer attention; the fallback must surface torch's error after warning.
        with pytest.warns(UserWarning, match="falling back to torch SDPA"), pytest.raises(RuntimeError):
            flashattn.scaled_dot_product_attention(q, k, v, **kwargs)
        return
    with pytest.warns(UserWarning, match=reason) as record:
        out = flashattn.scaled_dot_product_attention(q, k, v, **kwargs)
    assert any("falling back to torch SDPA" in str(w.message) for w in record)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, **kwargs))
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        flashattn.scaled_dot_product_attention(q, k, v, **kwargs)
    assert not [w for w in again if "falling back" in str(w.message)], "the same reason warned twice"


# --------------------------------------------------------------------------------------------------
# The FlashAttention-2 API: bad inputs, unimplemented arguments, packed variants
# --------------------------------------------------------------------------------------------------


def _qkv(dtype=torch.float32):
    return _rand(2, 5, 4, 8, dtype=dtype), _rand(2, 7, 2, 8, dtype=dtype), _rand(2, 7, 2, 8, dtype=dtype)


BAD_INPUTS = {
    "dtype mismatch": (lambda q, k, v: (q, k.double(), v), RuntimeError, "same dtype"),
    "batch mismatch": (lambda q, k, v: (q, k[:1], v[:1]), RuntimeError, "batch"),
    "heads not a multiple": (lambda q, k, v: (q[:, :, :3], k, v), RuntimeError, "multiple"),
    "head dim 300": (lambda q, k, v: (_rand(2, 5, 4, 300, dtype=q.dtype),) * 3, RuntimeError, "head dim"),
    "k/v seqlen mismatch": (lambda q, k, v: (q, k, v[:, :3]), RuntimeError, "seqlen"),
    "q with 3 dims": (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dims"),
    "k with 3 dims": (lambda q, k, v: (q, k[0], v), ValueError, "k must have 4 dims"),
    "non-contiguous last dim": (
        lambda q, k, v: (q, k, _rand(2, 7, 2, 16, dtype=v.dtype)[..., ::2]), ValueError, "v must have a contiguous last dim"),
    "not a tensor": (lambda q, k, v: (q, k, v.tolist()), TypeError, "v must be a torch.Tensor"),
    "integer dtype": (lambda q, k, v: (q.long(), k.long(), v.long()), RuntimeError, "float"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_flash_attn_func_rejects_bad_inputs(case):
    make, error, match = BAD_INPUTS[case]
    with pytest.raises(error, match=match):
        flashattn.flash_attn_func(*make(*_qkv()))


def test_inputs_on_different_devices_raise():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device (CUDA)")
    q, k, v = _qkv(torch.float16)
    with pytest.raises(ValueError, match="same device"):
        flashattn.flash_attn_func(q, k.cuda(), v.cuda())


def test_raw_op_rejects_non_contiguous_last_dim():
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="contiguous last dim"):
        torch.ops.flashattn.fwd(_rand(2, 5, 4, 16, dtype=torch.float32)[..., ::2], k, v, 0.1, False, False)


@pytest.mark.parametrize("kwargs, name", [
    ({"alibi_slopes": torch.ones(4), "softcap": 20.0}, "alibi_slopes with softcap"),
])
@pytest.mark.parametrize("api", ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"])
def test_unimplemented_arguments_raise(api, kwargs, name):
    q = _rand(2, 5, 4, 8)
    args = {
        "flash_attn_func": (q, q, q),
        "flash_attn_kvpacked_func": (q, torch.stack([q, q], dim=2)),
        "flash_attn_qkvpacked_func": (torch.stack([q, q, q], dim=2),),
    }[api]
    with pytest.raises(NotImplementedError, match=name):
        getattr(flashattn, api)(*args, **kwargs)


def test_packed_dim_size_is_checked():
    with pytest.raises(ValueError, match="qkv"):
        flashattn.flash_attn_qkvpacked_func(_rand(2, 5, 2, 4, 8))
    with pytest.raises(ValueError, match="kv"):
        flashattn.flash_attn_kvpacked_func(_rand(2, 5, 4, 8), _rand(2, 5, 3, 4, 8))


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_matches_unpacked_and_grads_flow(causal):
    qkv = _rand(2, 9, 3, 4, 8, requires_grad=True)
    with _OpLog() as log:
        out = flashattn.flash_attn_qkvpacked_func(qkv, causal=causal)
    assert not [n for n in log.names if n.startswith(COPY_OPS)], log.names  # q, k, v are views into qkv
    q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(2))
    ref = flashattn.flash_attn_func(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout)
    assert qkv.grad.shape == qkv.shape
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2))
    assert torch.autograd.gradcheck(lambda t: flashattn.flash_attn_qkvpacked_func(t, causal=causal), (qkv.detach()[:1, :4, :, :2, :3].clone().requires_grad_(),))


@pytest.mark.parametrize("causal", [False, True])
def test_kvpacked_matches_unpacked_and_grads_flow(causal):
    q = _rand(2, 6, 4, 8, requires_grad=True)
    kv = _rand(2, 9, 2, 2, 8, requires_grad=True)
    with _OpLog() as log:
        out = flashattn.flash_attn_kvpacked_func(q, kv, causal=causal)
    assert not [n for n in log.names if n.startswith(COPY_OPS)], log.names
    k, v = (t.detach().requires_grad_() for t in kv.unbind(2))
    q2 = q.detach().requires_grad_()
    ref = flashattn.flash_attn_func(q2, k, v, causal=causal)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout)
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(kv.grad, torch.stack([k.grad, v.grad], dim=2))


# --------------------------------------------------------------------------------------------------
# deterministic=True: accepted by the op and the FlashAttention-2 API, reaches the backward op, and
# changes nothing on the CPU (whose backward is always deterministic)
# --------------------------------------------------------------------------------------------------


class _BwdCalls(TorchDispatchMode):
    """Records the deterministic flag every flashattn.bwd call runs with (its default, False, when the
    dispatcher leaves the trailing argument out)."""

    def __init__(self):
        super().__init__()
        self.flags = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(func).startswith("flashattn.bwd"):
            self.flags.append(kwargs.get("deterministic", args[9] if len(args) > 9 else False))
        return func(*args, **kwargs)


def test_bwd_schema_has_the_optional_arguments_last():
    schema = torch.ops.flashattn.bwd.default._schema
    names = [a.name for a in schema.arguments]
    assert names[-12:] == ["causal_bottom_right", "deterministic", "attn_mask", "dmask", "dropout_p", "rng_state",
                           "sink", "dsink", "softcap", "window_left", "window_right", "alibi_slopes"]
    assert [schema.arguments[i].default_value for i in range(-11, 0)] == [False, None, None, 0.0, None, None, None, 0.0,
                                                                          -1, -1, None]
    assert schema.arguments[-9].alias_info.is_write  # dmask is written in place
    assert schema.arguments[-5].alias_info.is_write  # and dsink


@pytest.mark.parametrize("causal, bottom_right", [(False, False), (True, False), (True, True)])
def test_bwd_op_accepts_deterministic(causal, bottom_right):
    q, k, v = _rand(2, 9, 4, 8), _rand(2, 13, 2, 8), _rand(2, 13, 2, 8)
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.35, causal, bottom_right)
    dout = torch.randn_like(out)
    args = (dout, q, k, v, out, lse, 0.35, causal, bottom_right)
    default = torch.ops.flashattn.bwd(*args)  # the nine-argument call keeps working
    for grads in (torch.ops.flashattn.bwd(*args, True), torch.ops.flashattn.bwd(*args, deterministic=True),
                  torch.ops.flashattn.bwd(*args, False)):
        for g, g0 in zip(grads, default):
            assert torch.equal(g, g0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_bwd_deterministic(dtype):
    q, k, v = _rand(2, 5, 4, 8, dtype=dtype), _rand(2, 7, 2, 8, dtype=dtype), _rand(2, 7, 2, 8, dtype=dtype)
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.35, True, True)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (torch.randn_like(out), q, k, v, out, lse, 0.35, True, True, True))


def test_fake_bwd_accepts_deterministic():
    with _fake_mode():
        q = torch.empty(3, 11, 8, 40)
        k = torch.empty(3, 13, 2, 40)
        out, lse = torch.ops.flashattn.fwd(q, k, k, 0.1, True, True)
        dq, dk, dv = torch.ops.flashattn.bwd(out, q, k, k, out, lse, 0.1, True, True, deterministic=True)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def _fa2_call(api, deterministic, causal):
    """One FlashAttention-2 API call on fresh leaves (same inputs every time: seeded), forward and
    backward; returns (out, input grads, the deterministic flags the backward op received)."""
    gen = torch.Generator().manual_seed(7)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32).requires_grad_()  # noqa: E731
    if api == "flash_attn_func":
        inputs = (randn(2, 9, 4, 8), randn(2, 12, 2, 8), randn(2, 12, 2, 8))
    elif api == "flash_attn_kvpacked_func":
        inputs = (randn(2, 9, 4, 8), randn(2, 12, 2, 2, 8))
    else:
        inputs = (randn(2, 9, 3, 4, 8),)
    out = getattr(flashattn, api)(*inputs, causal=causal, deterministic=deterministic)
    with _BwdCalls() as calls:
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
    return out.detach(), grads, calls.flags


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("api", ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"])
def test_flash_attn_deterministic_is_passed_to_the_backward(api, causal):
    out, grads, flags = _fa2_call(api, False, causal)
    out_det, grads_det, flags_det = _fa2_call(api, True, causal)
    assert flags == [False] and flags_det == [True]
    assert torch.equal(out, out_det)
    for g, g_det in zip(grads, grads_det):
        assert torch.equal(g, g_det)


def _sdpa_call(deterministic_algorithms, dropout_p=0.0, last_dim_strided=False):
    """One scaled_dot_product_attention call on fresh leaves (the same inputs every time), forward and
    backward, with torch.use_deterministic_algorithms set as given; returns (out, grads, the flags the
    backward op received)."""
    gen = torch.Generator().manual_seed(7)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32).requires_grad_()  # noqa: E731
    q, k, v = randn(2, 4, 9, 8), randn(2, 2, 12, 8), randn(2, 2, 12, 8)
    inputs = (q, k, v)
    if last_dim_strided:  # views whose last dim has stride 2: the op copies them
        inputs = tuple(t.repeat_interleave(2, dim=-1)[..., ::2] for t in inputs)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic_algorithms)
    try:
        torch.manual_seed(3)
        out = flashattn.scaled_dot_product_attention(*inputs, dropout_p=dropout_p, is_causal=True, enable_gqa=True)
        with _BwdCalls() as calls:
            grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    finally:
        torch.use_deterministic_algorithms(previous)
    return out.detach(), grads, calls.flags


@pytest.mark.parametrize("dropout_p, last_dim_strided", [(0.0, False), (0.3, False), (0.0, True)])
def test_sdpa_deterministic_algorithms_reach_the_backward(dropout_p, last_dim_strided):
    # Under torch.use_deterministic_algorithms(True) the drop-in's backward runs with deterministic=True;
    # nothing else changes (same output, same gradients on the CPU, the same dropout mask for a seed).
    out, grads, flags = _sdpa_call(False, dropout_p, last_dim_strided)
    out_det, grads_det, flags_det = _sdpa_call(True, dropout_p, last_dim_strided)
    assert flags == [False] and flags_det == [True]
    assert torch.equal(out, out_det)
    for g, g_det in zip(grads, grads_det):
        assert torch.equal(g, g_det)


def test_gradcheck_flash_attn_func_deterministic():
    q = _rand(1, 3, 4, 4, requires_grad=True)
    k = _rand(1, 6, 2, 4, requires_grad=True)
    v = _rand(1, 6, 2, 4, requires_grad=True)
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_torch_compile_fullgraph_deterministic_cpu():
    torch._dynamo.reset()

    def block(q, k, v):
        return flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True).square().sum()

    args = [_rand(2, 9, 4, 8, requires_grad=True), _rand(2, 12, 2, 8, requires_grad=True),
            _rand(2, 12, 2, 8, requires_grad=True)]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args)
    loss_ref = block(*args)
    grads_ref = torch.autograd.grad(loss_ref, args)
    torch.testing.assert_close(loss, loss_ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r)


def test_default_softmax_scale():
    q, k, v = _qkv(torch.float64)
    out = flashattn.flash_attn_func(q, k, v)
    torch.testing.assert_close(out, attention_reference(q, k, v, scale=1 / math.sqrt(8)))
    out = flashattn.flash_attn_func(q, k, v, softmax_scale=0.01)
    torch.testing.assert_close(out, attention_reference(q, k, v, scale=0.01))


# --------------------------------------------------------------------------------------------------
# torch.compile and the command line
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_cpu(dynamic):
    torch._dynamo.reset()

    def block(q, k, v, qkv):
        a = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        b = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
        return a.sum() + b.square().sum()

    args = [_rand(2, 4, 9, 8, requires_grad=True), _rand(2, 2, 12, 8, requires_grad=True),
            _rand(2, 2, 12, 8, requires_grad=True), _rand(2, 9, 3, 4, 8, requires_grad=True)]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args)
    loss_ref = block(*args)
    grads_ref = torch.autograd.grad(loss_ref, args)
    torch.testing.assert_close(loss, loss_ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r)


def test_version():
    assert flashattn.__version__ == "0.1.0"


@pytest.mark.parametrize("command", ["info", "demo"])
def test_command_line(command):
    result = subprocess.run([sys.executable, "-m", "flashattn", command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flashattn" in result.stdout


@pytest.mark.parametrize("enabled", [False, True])
def test_sdpa_backward_follows_torch_deterministic_algorithms(enabled):
    q, k, v = (torch.randn(2, 4, 9, 8, requires_grad=True) for _ in range(3))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        with _BwdCalls() as calls:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    finally:
        torch.use_deterministic_algorithms(previous)
    assert calls.flags == [enabled]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_opcheck_with_attn_mask(mask_dtype):
    """fwd and bwd with a broadcast attn_mask (and bwd writing dmask in place) pass opcheck, the
    autograd formula included (a floating mask that requires grad gets its gradient)."""
    q = _rand(2, 5, 4, 8, requires_grad=True)
    k = _rand(2, 7, 2, 8, requires_grad=True)
    v = _rand(2, 7, 2, 8, requires_grad=True)
    if mask_dtype == torch.bool:
        mask = (torch.rand(2, 1, 1, 7) > 0.3).expand(2, 4, 5, 7)
    else:
        mask = torch.randn(2, 1, 1, 7, requires_grad=True).expand(2, 4, 5, 7)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.35, True, True, mask))
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.35, True, True, mask)
    dmask = None if mask_dtype == torch.bool else torch.empty(2, 4, 5, 7)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.35, True, True, False,
         mask.detach(), dmask),
    )


def test_compile_fullgraph_with_masks_matches_eager():
    """torch.compile(fullgraph=True) through the SDPA drop-in with a float mask that requires grad (the
    backward writes dmask in place) and a boolean padding mask: same values and gradients as eager."""
    q = _rand(2, 4, 33, 16, requires_grad=True)
    k = _rand(2, 4, 40, 16, requires_grad=True)
    v = _rand(2, 4, 40, 16, requires_grad=True)
    bias = _rand(1, 4, 33, 40, requires_grad=True)
    padding = torch.rand(2, 1, 1, 40) > 0.2

    def loss(q, k, v, bias, padding):
        return (flashattn.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum()
                + flashattn.scaled_dot_product_attention(q, k, v, attn_mask=padding).square().sum())

    leaves = (q, k, v, bias)
    compiled = torch.compile(loss, fullgraph=True)(*leaves, padding)
    grads = torch.autograd.grad(compiled, leaves)
    eager = loss(*leaves, padding)
    torch.testing.assert_close(compiled, eager)
    for g, e in zip(grads, torch.autograd.grad(eager, leaves)):
        torch.testing.assert_close(g, e)


# deterministic: part of fwd's schema, for the backward autograd runs.
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("heads_first", [False, True])
def test_fwd_passes_deterministic_to_bwd(deterministic, heads_first):
    """The backward that autograd runs for fwd (and fwd_heads_first) calls bwd with the forward's
    deterministic flag: one autograd for both modes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class BwdCalls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.flags = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.flashattn.bwd.default:
                self.flags.append(kwargs.get("deterministic", args[9] if len(args) > 9 else False))
            return func(*args, **kwargs)

    q, k, v = (torch.randn(1, 17, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    op = torch.ops.flashattn.fwd_heads_first if heads_first else torch.ops.flashattn.fwd
    out, _ = op(q, k, v, 0.35, True, False, None, 0.0, None, deterministic)
    calls = BwdCalls()
    with calls:
        out.sum().backward()
    assert calls.flags == [deterministic]


def test_opcheck_fwd_deterministic():
    q, k, v = (torch.randn(1, 9, 2, 8, dtype=torch.float32, requires_grad=True) for _ in range(3))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.35, True, True, None, 0.0, None, True))
