"""The CPU kernels behind torch.ops.flashattn.fwd / bwd, called directly (no autograd wrapper).

Each case is checked against an inline float64 reference that materializes the score matrix, and the
backward against torch.autograd.grad of that reference. float16/bfloat16 use the FlashAttention-2 rule
(GUIDE section 4): the error must stay within 2x (3x for gradients) of the error of the same math run
in the low dtype, plus 1e-5.
"""
import math

import pytest
import torch

import flashattn._C  # noqa: F401  (registers torch.ops.flashattn)

fwd_op = torch.ops.flashattn.fwd
bwd_op = torch.ops.flashattn.bwd

LOW_DTYPES = [torch.float16, torch.bfloat16]
# Absolute tolerance for dtypes whose kernel accumulates in the input dtype itself.
TIGHT_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def causal_offset(lq, lk, causal, bottom_right):
    return (lk - lq if bottom_right else 0) if causal else None


def reference(q, k, v, scale, causal=False, bottom_right=False):
    """Plain attention in q's dtype: returns out [B, Lq, Hq, D] and lse [B, Hq, Lq].

    A row that sees no key gives out = 0 and lse = -inf, with no NaN in the values or the gradients.
    """
    b, lq, hq, d = q.shape
    lk, hk = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2)  # [B, Hq, Lq, D]
    kh = k.transpose(1, 2).repeat_interleave(hq // max(hk, 1), dim=1)  # [B, Hq, Lk, D]
    vh = v.transpose(1, 2).repeat_interleave(hq // max(hk, 1), dim=1)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # [B, Hq, Lq, Lk]
    visible = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        offset = causal_offset(lq, lk, causal, bottom_right)
        visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
    sees_keys = visible.any(dim=-1)[:, None]  # [Lq, 1]
    # Fully masked rows get finite dummy scores, then are zeroed: softmax of all -inf would be NaN.
    scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~sees_keys, 0.0)
    probs = torch.softmax(scores, dim=-1) * sees_keys
    out = (probs @ vh).transpose(1, 2)
    lse = torch.logsumexp(scores, dim=-1).masked_fill(~sees_keys[:, 0], float("-inf"))
    return out, lse


def reference_with_grads(q, k, v, dout, scale, causal=False, bottom_right=False, dtype=torch.float64):
    """reference() run in `dtype`, with the gradients of out against dout."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = reference(*leaves, scale, causal, bottom_right)
    if out.numel() == 0:
        grads = [torch.zeros_like(t) for t in leaves]
    else:
        grads = torch.autograd.grad(out, leaves, dout.to(dtype), allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    return out.detach(), lse.detach(), grads


def max_err(x, ref):
    """max |x - ref| in float64, NaN-aware (a NaN anywhere yields inf so that it never passes)."""
    x, ref = x.double(), ref.double()
    if x.numel() == 0:
        return 0.0
    same_inf = torch.isinf(ref) & (x == ref)
    diff = torch.where(same_inf, torch.zeros_like(x), (x - ref).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    return diff.max().item()


def make_qkv(b, lq, lk, hq, hk, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, hq, d, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(b, lk, hk, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(b, lk, hk, d, generator=gen, dtype=torch.float64).to(dtype)
    dout = torch.randn(b, lq, hq, d, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, dout


def run_ops(q, k, v, dout, scale, causal, bottom_right):
    out, lse = fwd_op(q, k, v, scale, causal, bottom_right)
    dq, dk, dv = bwd_op(dout, q, k, v, out, lse, scale, causal, bottom_right)
    return out, lse, (dq, dk, dv)


def check_case(q, k, v, dout, causal=False, bottom_right=False, scale=None, baseline_rule=None):
    """Runs fwd + bwd and checks shapes, dtypes, values and gradients against the references.

    baseline_rule: judge against the same math run in q's dtype (the default for float16/bfloat16)
    rather than a fixed tolerance; for ill-conditioned inputs, where any float32 code errs more.
    """
    dtype = q.dtype
    b, lq, hq, d = q.shape
    lk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out, lse, grads = run_ops(q, k, v, dout, scale, causal, bottom_right)

    assert out.shape == (b, lq, hq, d) and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (b, hq, lq)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == dtype and g.is_contiguous()

    ref_out, ref_lse, ref_grads = reference_with_grads(q, k, v, dout, scale, causal, bottom_right)
    names = ("dq", "dk", "dv")
    if baseline_rule is None:
        baseline_rule = dtype not in TIGHT_TOL
    if not baseline_rule:
        tol = TIGHT_TOL[dtype]
        assert max_err(out, ref_out) <= tol
        assert max_err(lse, ref_lse) <= tol
        for name, g, r in zip(names, grads, ref_grads):
            assert max_err(g, r) <= tol, name
    else:
        base_out, _, base_grads = reference_with_grads(q, k, v, dout, scale, causal, bottom_right, dtype=dtype)
        assert max_err(out, ref_out) <= 2 * max_err(base_out, ref_out) + 1e-5
        # lse is accumulated in float32 from the same low-precision inputs the reference sees.
        finite_lse = ref_lse[torch.isfinite(ref_lse)]
        lse_magnitude = finite_lse.abs().max().item() if finite_lse.numel() else 0.0
        assert max_err(lse, ref_lse) <= 1e-4 * max(1.0, lse_magnitude)
        for name, g, r, base in zip(names, grads, ref_grads, base_grads):
            assert max_err(g, r) <= 3 * max_err(base, r) + 1e-5, name
    return out, lse, grads


ALL_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(
    "causal,bottom_right", [(False, False), (True, False), (True, True)], ids=["full", "causal_tl", "causal_br"]
)
@pytest.mark.parametrize("lq,lk", [(17, 97), (97, 17), (113, 1), (1, 113), (1, 1), (130, 130)])
def test_seqlens_and_masks(dtype, causal, bottom_right, lq, lk):
    q, k, v, dout = make_qkv(2, lq, lk, 2, 2, 40, dtype, seed=lq * 1000 + lk)
    check_case(q, k, v, dout, causal, bottom_right)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("d", [1, 40, 72, 96, 160, 256])
def test_head_dims(dtype, d):
    q, k, v, dout = make_qkv(1, 33, 70, 2, 1, d, dtype, seed=d)
    check_case(q, k, v, dout, causal=True, bottom_right=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("hk", [2, 1, 6])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(dtype, hk, causal):
    q, k, v, dout = make_qkv(2, 45, 77, 6, hk, 24, dtype, seed=hk)
    check_case(q, k, v, dout, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_non_contiguous_inputs(dtype):
    gen = torch.Generator().manual_seed(7)
    b, lq, lk, hq, hk, d = 2, 29, 41, 4, 2, 24

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    q = randn(b, hq, lq, d).transpose(1, 2)  # [B, H, S, D] viewed as [B, S, H, D]
    k = randn(b, lk + 3, hk, d)[:, 3:]  # storage offset, batch stride larger than the view
    v = randn(b, lk, 2 * hk, d)[:, :, hk:]  # every other head block: strided heads, offset
    dout = randn(b, hq, lq, d).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous() or dout.is_contiguous())
    assert k.storage_offset() > 0 and v.storage_offset() > 0
    out, lse, grads = check_case(q, k, v, dout, causal=True, bottom_right=True)

    # out and dout may be non-contiguous in the backward too; the result must not change.
    out_strided = torch.empty(b, hq, lq, d, dtype=dtype).transpose(1, 2).copy_(out)
    scale = 1.0 / math.sqrt(d)
    again = bwd_op(dout, q, k, v, out_strided, lse, scale, True, True)
    for g, g2 in zip(grads, again):
        assert torch.equal(g, g2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_fully_masked_rows(dtype):
    # Bottom-right causal with Lq > Lk: the first Lq - Lk query rows see no key.
    q, k, v, dout = make_qkv(2, 50, 20, 3, 3, 16, dtype, seed=3)
    out, lse, (dq, dk, dv) = check_case(q, k, v, dout, causal=True, bottom_right=True)
    masked = slice(0, 30)
    assert torch.all(out[:, masked] == 0)
    assert torch.all(lse[:, :, masked] == float("-inf"))
    assert torch.all(dq[:, masked] == 0)
    assert torch.isfinite(lse[:, :, 30:]).all()
    # One key, eight queries, bottom-right: only the last row sees it, so it alone feeds dk and dv.
    q, k, v, dout = make_qkv(1, 8, 1, 2, 1, 8, dtype, seed=4)
    out, lse, (dq, dk, dv) = check_case(q, k, v, dout, causal=True, bottom_right=True, scale=0.5)
    assert torch.all(out[:, :7] == 0) and torch.all(dq[:, :7] == 0)
    assert torch.equal(out[0, 7], v[0, 0].expand(2, 8))  # softmax over one key is exactly 1
    assert dq.abs().max() <= 1e-5  # ... and (up to rounding) zero gradient with respect to the score


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_scores_do_not_overflow(dtype):
    # Scores around +-200: a naive exp overflows, the running-max softmax must not.
    q, k, v, dout = make_qkv(1, 70, 70, 2, 2, 16, dtype, seed=5)
    q = (q.double() * 12).to(dtype)
    out, lse, grads = check_case(q, k, v, dout, scale=4.0, baseline_rule=True)
    assert lse.abs().max() > 100


@pytest.mark.parametrize(
    "b,lq,lk,hq,hk",
    [(0, 5, 5, 2, 1), (2, 0, 5, 2, 1), (2, 5, 0, 2, 1), (2, 0, 0, 2, 2), (2, 5, 5, 0, 1), (1, 3, 4, 0, 0)],
    ids=["B0", "Lq0", "Lk0", "Lq0_Lk0", "Hq0", "Hq0_Hk0"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_empty_shapes(b, lq, lk, hq, hk, dtype):
    d = 8
    q, k, v, dout = make_qkv(b, lq, lk, hq, hk, d, dtype)
    for causal in (False, True):
        out, lse, (dq, dk, dv) = run_ops(q, k, v, dout, 0.3, causal, True)
        assert out.shape == q.shape and lse.shape == (b, hq, lq)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        # No key anywhere (Lk == 0) or no query anywhere: every output is the empty-softmax value.
        assert torch.all(out == 0) and torch.all(lse == float("-inf"))
        assert torch.all(dq == 0) and torch.all(dk == 0) and torch.all(dv == 0)


def test_float32_lse_given_to_float64_backward_and_float64_lse_to_float32():
    # The backward accepts either lse dtype; the result must match the one from the native lse.
    for dtype, other in ((torch.float64, torch.float32), (torch.float32, torch.float64)):
        q, k, v, dout = make_qkv(1, 20, 30, 2, 2, 16, dtype, seed=9)
        out, lse = fwd_op(q, k, v, 0.25, True, False)
        native = bwd_op(dout, q, k, v, out, lse, 0.25, True, False)
        converted = bwd_op(dout, q, k, v, out, lse.to(other), 0.25, True, False)
        for g, g2 in zip(native, converted):
            assert max_err(g, g2) <= 1e-5


def test_deterministic_and_thread_count_independent():
    q, k, v, dout = make_qkv(2, 90, 75, 6, 2, 32, torch.float32, seed=11)
    first = run_ops(q, k, v, dout, 0.2, True, True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run_ops(q, k, v, dout, 0.2, True, True)
    finally:
        torch.set_num_threads(threads)
    second = run_ops(q, k, v, dout, 0.2, True, True)
    flat = lambda r: [r[0], r[1], *r[2]]  # noqa: E731
    for a, b_, c in zip(flat(first), flat(single), flat(second)):
        assert torch.equal(a, b_) and torch.equal(a, c)


class _Attention(torch.autograd.Function):
    """Minimal autograd wrapper around the two ops, for gradcheck."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, bottom_right):
        out, lse = fwd_op(q, k, v, scale, causal, bottom_right)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, bottom_right)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = bwd_op(dout.contiguous(), q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None


@pytest.mark.parametrize("causal,bottom_right", [(False, False), (True, True)])
def test_gradcheck(causal, bottom_right):
    q, k, v, _ = make_qkv(1, 5, 7, 2, 1, 3, torch.float64, seed=13)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *t: _Attention.apply(*t, 0.7, causal, bottom_right), inputs)


def test_bad_inputs_raise():
    q, k, v, _ = make_qkv(1, 4, 4, 2, 2, 8, torch.float32)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        fwd_op(q, k.double(), v, 1.0, False, False)
    q3, k3, _, _ = make_qkv(1, 4, 4, 3, 2, 8, torch.float32)
    with pytest.raises(RuntimeError, match="multiple of the number of key/value heads"):
        fwd_op(q3, k3, k3, 1.0, False, False)
    q300, k300, v300, _ = make_qkv(1, 4, 4, 1, 1, 300, torch.float32)
    with pytest.raises(RuntimeError, match=r"head dim must be in \[1, 256\]"):
        fwd_op(q300, k300, v300, 1.0, False, False)
    with pytest.raises(RuntimeError, match="must have 4 dims"):
        fwd_op(q[0], k[0], v[0], 1.0, False, False)
    with pytest.raises(RuntimeError, match="CPU inputs must be"):
        fwd_op(q.int(), k.int(), v.int(), 1.0, False, False)
    out, lse = fwd_op(q, k, v, 1.0, False, False)
    with pytest.raises(RuntimeError, match="lse must have shape"):
        bwd_op(out, q, k, v, out, lse[:, :1], 1.0, False, False)
