"""Attention masks in the CPU kernels behind torch.ops.flashattn.fwd / bwd, called directly (and
through flashattn.ops' autograd in one gradcheck).

The mask is a [B, Hq, Lq, Lk] view with any strides (usually a broadcast made with .expand()), bool
(True = the key takes part), or of q's dtype or float32 (added to the scaled score). Each case is
checked in float64 against a dense reference that materializes scale * q @ k^T + mask, and its
gradients (dq, dk, dv and the mask's, dmask) against torch.autograd on that reference. float32/bfloat16 use
the FlashAttention-2 rule (GUIDE section 4): the error stays within 2x (3x for gradients) of the
error of the same reference math run in the low dtype, plus 1e-5.
"""
import math

import pytest
import torch

import flashattn.ops  # registers torch.ops.flashattn and its autograd

OPS = torch.ops.flashattn
NEG_INF = float("-inf")


def fwd(q, k, v, scale, causal, bottom_right, mask):
    return OPS.fwd(q, k, v, scale, causal, bottom_right, attn_mask=mask)


def bwd(dout, q, k, v, out, lse, scale, causal, bottom_right, mask, dmask=None):
    return OPS.bwd(dout, q, k, v, out, lse, scale, causal, bottom_right, attn_mask=mask, dmask=dmask)


def visible_keys(lq, lk, causal, bottom_right):
    """[Lq, Lk] bool: the keys causal masking leaves to each query."""
    if not causal:
        return torch.ones(lq, lk, dtype=torch.bool)
    offset = lk - lq if bottom_right else 0
    return torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset


def reference(q, k, v, scale, causal, bottom_right, mask):
    """Dense attention in q's dtype: out [B, Lq, Hq, D], lse [B, Hq, Lq]. A row left with no key gives
    out = 0 and lse = -inf, with no NaN in the values or the gradients."""
    b, lq, hq, d = q.shape
    lk, hk = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2)  # [B, Hq, Lq, D]
    kh = k.transpose(1, 2).repeat_interleave(hq // hk, dim=1)  # [B, Hq, Lk, D]
    vh = v.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # [B, Hq, Lq, Lk]
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else scores + mask
    scores = scores.masked_fill(~visible_keys(lq, lk, causal, bottom_right), NEG_INF)
    empty = (scores == NEG_INF).all(dim=-1, keepdim=True)  # [B, Hq, Lq, 1]
    # Empty rows get finite dummy scores, then are zeroed: softmax of all -inf would be NaN.
    scores = scores.masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1) * ~empty
    out = (probs @ vh).transpose(1, 2)
    lse = torch.logsumexp(scores, dim=-1).masked_fill(empty[..., 0], NEG_INF)
    return out, lse


def reference_with_grads(q, k, v, mask, dout, scale, causal, bottom_right, dtype=torch.float64):
    """reference() in `dtype`, with the gradients of out against dout: (out, lse, [dq, dk, dv], dmask)
    where dmask is the gradient w.r.t. the dense [B, Hq, Lq, Lk] float mask (None for bool/none)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    float_mask = mask is not None and mask.dtype != torch.bool
    if float_mask:
        mask = mask.detach().to(dtype).contiguous().requires_grad_()  # dense: its gradient is dS
        leaves.append(mask)
    out, lse = reference(*leaves[:3], scale, causal, bottom_right, mask)
    grads = torch.autograd.grad(out, leaves, dout.to(dtype), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    return out.detach(), lse.detach(), grads[:3], grads[3] if float_mask else None


def run_ops(q, k, v, mask, dout, scale, causal, bottom_right):
    """fwd then bwd through the ops; dmask is asked for when the mask is floating."""
    out, lse = fwd(q, k, v, scale, causal, bottom_right, mask)
    dmask = None
    if mask is not None and mask.dtype != torch.bool:
        dmask = torch.zeros(mask.shape, dtype=mask.dtype)
    dq, dk, dv = bwd(dout, q, k, v, out, lse, scale, causal, bottom_right, mask, dmask)
    return out, lse, [dq, dk, dv], dmask


MASK_KINDS = ["lq_lk", "1_1_lq_lk", "b_1_1_lk", "b_hq_lq_lk", "b_hq_lq_1", "strided_keys", "transposed"]


def make_mask(kind, is_bool, b, hq, lq, lk, dtype):
    """A [B, Hq, Lq, Lk] mask view of the given broadcast kind. bool: about 30% False; float: random
    values with about 15% -inf."""
    shape = {
        "lq_lk": (lq, lk),
        "1_1_lq_lk": (1, 1, lq, lk),
        "b_1_1_lk": (b, 1, 1, lk),
        "b_hq_lq_lk": (b, hq, lq, lk),
        "b_hq_lq_1": (b, hq, lq, 1),
        "strided_keys": (b, hq, lq, 3 * lk),  # every third element: last-dim stride 3
        "transposed": (b, hq, lk, lq),  # transposed: last-dim stride Lq
    }[kind]
    if is_bool:
        base = torch.rand(shape) > 0.3
    else:
        base = torch.randn(shape, dtype=dtype).masked_fill(torch.rand(shape) < 0.15, NEG_INF)
    if kind == "strided_keys":
        base = base[..., ::3]
    elif kind == "transposed":
        base = base.transpose(-1, -2)
    mask = base.expand(b, hq, lq, lk)
    assert mask.shape == (b, hq, lq, lk)
    return mask


def make_inputs(b, lq, lk, hq, hk, d, dtype):
    q = torch.randn(b, lq, hq, d, dtype=dtype)
    k = torch.randn(b, lk, hk, d, dtype=dtype)
    v = torch.randn(b, lk, hk, d, dtype=dtype)
    dout = torch.randn(b, lq, hq, d, dtype=dtype)
    return q, k, v, dout


def assert_no_nan(*tensors):
    for t in tensors:
        assert not t.isnan().any()


def check_float64(q, k, v, mask, dout, causal, bottom_right):
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, lse, grads, dmask = run_ops(q, k, v, mask, dout, scale, causal, bottom_right)
    ref_out, ref_lse, ref_grads, ref_dmask = reference_with_grads(q, k, v, mask, dout, scale, causal, bottom_right)
    assert_no_nan(out, lse, *grads)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-10, rtol=0)  # -inf entries must match exactly
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0, msg=lambda m: f"{name}: {m}")
    if ref_dmask is not None:
        assert_no_nan(dmask)
        torch.testing.assert_close(dmask, ref_dmask, atol=1e-10, rtol=0)


# (B, Lq, Lk, Hq, Hk, D): Lq != Lk both ways, several tiles (64) and a partial one, GQA, seqlen 1.
SHAPES = [(2, 97, 70, 4, 2, 40), (1, 17, 97, 2, 1, 40), (2, 1, 17, 2, 2, 40), (1, 70, 1, 2, 1, 40)]
CAUSAL = [(False, False), (True, False), (True, True)]


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("causal,bottom_right", CAUSAL, ids=["full", "causal_tl", "causal_br"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mask_float64_matches_reference(shape, causal, bottom_right, kind, is_bool):
    b, lq, lk, hq, hk, d = shape
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    mask = make_mask(kind, is_bool, b, hq, lq, lk, torch.float64)
    check_float64(q, k, v, mask, dout, causal, bottom_right)


def test_noncontiguous_qkv_with_mask():
    b, lq, lk, hq, hk, d = 2, 33, 71, 4, 2, 40
    q = torch.randn(b, hq, lq, d, dtype=torch.float64).transpose(1, 2)
    k = torch.randn(b, hk, lk, d, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(b, lk, 2 * hk, d, dtype=torch.float64)[:, :, ::2]
    dout = torch.randn(b, lq, hq, d, dtype=torch.float64)
    mask = make_mask("b_1_1_lk", False, b, hq, lq, lk, torch.float64)
    check_float64(q, k, v, mask, dout, True, True)


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
@pytest.mark.parametrize("causal,bottom_right", CAUSAL, ids=["full", "causal_tl", "causal_br"])
def test_padding_mask_with_whole_excluded_key_blocks(causal, bottom_right, is_bool):
    """A [B, 1, 1, Lk] padding mask whose excluded keys cover whole 64-key blocks for some batches."""
    b, lq, lk, hq, hk, d = 3, 70, 150, 2, 1, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    lengths = [150, 40, 100]
    keep = torch.arange(lk)[None, :] < torch.tensor(lengths)[:, None]  # [B, Lk]
    mask = keep if is_bool else torch.randn(keep.shape, dtype=torch.float64).masked_fill(~keep, NEG_INF)
    check_float64(q, k, v, mask[:, None, None, :].expand(b, hq, lq, lk), dout, causal, bottom_right)


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
@pytest.mark.parametrize("causal,bottom_right", CAUSAL, ids=["full", "causal_tl", "causal_br"])
def test_fully_masked_rows(causal, bottom_right, is_bool):
    """Rows the mask (alone, or with causal) leaves without a key: out 0, lse -inf, zero gradients."""
    b, lq, lk, hq, hk, d = 2, 97, 70, 4, 2, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    keep = torch.rand(b, hq, lq, lk) > 0.3
    keep[0, 1, 5] = False  # one row of one head
    keep[1, :, 60:] = False  # trailing rows of a batch, every head (a second query block too)
    keep[:, :, :, 0] = False  # with causal top-left, query 0 sees only key 0: empty
    mask = keep if is_bool else torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, NEG_INF)
    scale = 1.0 / math.sqrt(d)
    out, lse, (dq, dk, dv), dmask = run_ops(q, k, v, mask, dout, scale, causal, bottom_right)
    empty = ~(keep & visible_keys(lq, lk, causal, bottom_right)).any(dim=-1)  # [B, Hq, Lq]
    assert empty[0, 1, 5] and empty[1, :, 60:].all()
    assert_no_nan(out, lse, dq, dk, dv)
    assert (lse[empty] == NEG_INF).all() and torch.isfinite(lse[~empty]).all()
    out_h, dq_h = out.transpose(1, 2), dq.transpose(1, 2)  # [B, Hq, Lq, D]
    assert (out_h[empty] == 0).all() and (dq_h[empty] == 0).all()
    if dmask is not None:
        assert_no_nan(dmask)
        assert (dmask[empty] == 0).all()
    check_float64(q, k, v, mask, dout, causal, bottom_right)


def test_all_keys_masked_everywhere():
    """No query sees any key: everything is empty, dk/dv are zero."""
    b, lq, lk, hq, hk, d = 1, 17, 97, 2, 1, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    mask = torch.full((1, 1, 1, 1), NEG_INF, dtype=torch.float64).expand(b, hq, lq, lk)
    out, lse, grads, dmask = run_ops(q, k, v, mask, dout, 0.5, False, False)
    assert (out == 0).all() and (lse == NEG_INF).all() and (dmask == 0).all()
    assert all((g == 0).all() for g in grads)


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
def test_neutral_mask_is_bitwise_the_unmasked_result(is_bool):
    """An all-True / all-zero mask adds exact zeros: the same bits as no mask, causal included."""
    b, lq, lk, hq, hk, d = 2, 97, 70, 4, 2, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float32)
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool) if is_bool else torch.zeros(1, 1, 1, 1, dtype=torch.float32)
    mask = mask.expand(b, hq, lq, lk)
    for causal, bottom_right in CAUSAL:
        plain = run_ops(q, k, v, None, dout, 0.3, causal, bottom_right)
        masked = run_ops(q, k, v, mask, dout, 0.3, causal, bottom_right)
        for got, want in zip([masked[0], masked[1], *masked[2]], [plain[0], plain[1], *plain[2]]):
            assert torch.equal(got, want)


def test_mask_path_is_bitwise_reproducible_across_thread_counts():
    b, lq, lk, hq, hk, d = 2, 97, 130, 4, 2, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float32)
    mask = make_mask("b_hq_lq_lk", False, b, hq, lq, lk, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run_ops(q, k, v, mask, dout, 0.2, True, True)
        torch.set_num_threads(max(threads, 2))
        multi = run_ops(q, k, v, mask, dout, 0.2, True, True)
    finally:
        torch.set_num_threads(threads)
    for got, want in zip([multi[0], multi[1], *multi[2], multi[3]], [single[0], single[1], *single[2], single[3]]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
def test_nan_propagates(is_bool):
    """A NaN in q reaches out and lse of its row, masked or not; a NaN mask value reaches its row."""
    b, lq, lk, hq, hk, d = 1, 17, 70, 2, 1, 40
    q, k, v, _ = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    mask = make_mask("b_hq_lq_lk", is_bool, b, hq, lq, lk, torch.float64).clone()
    mask[0, :, :, 1] = True if is_bool else 0.0  # every row sees key 1
    q[0, 3, 1, 7] = float("nan")
    if not is_bool:
        mask[0, 0, 9, 40] = float("nan")
    out, lse = fwd(q, k, v, 0.3, False, False, mask)
    assert out[0, 3, 1].isnan().all() and lse[0, 1, 3].isnan()
    nan_rows = {(1, 3)} if is_bool else {(1, 3), (0, 9)}
    for h in range(hq):
        for i in range(lq):
            assert lse[0, h, i].isnan().item() == ((h, i) in nan_rows)


@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
def test_excluded_key_takes_no_part(is_bool):
    """A key the mask excludes (False or -inf) takes no part, like a causal-hidden one: a NaN in its k
    or an inf in its v changes nothing."""
    b, lq, lk, hq, hk, d = 1, 17, 70, 2, 1, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    keep = torch.ones(b, hq, lq, lk, dtype=torch.bool)
    keep[..., 33] = False
    mask = keep if is_bool else torch.randn(keep.shape, dtype=torch.float64).masked_fill(~keep, NEG_INF)
    ref = run_ops(q, k, v, mask, dout, 0.3, True, True)
    k[0, 33, 0, 5] = float("nan")
    v[0, 33, 0, 7] = float("inf")
    got = run_ops(q, k, v, mask, dout, 0.3, True, True)
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv", "dmask"), (got[0], got[1], *got[2], got[3]),
                          (ref[0], ref[1], *ref[2], ref[3])):
        if x is not None:
            assert torch.equal(x, y), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_large_negative_mask_values_are_not_exclusion(dtype):
    """finfo.min is a (very negative) score, not -inf: a row of only such keys gets the softmax of
    its scores (here uniform: the scores are lost next to finfo.min), as in the reference, and its
    gradients too, though lse = m + log(l) has no room left for log(l)."""
    b, lq, lk, hq, hk, d = 1, 17, 70, 2, 1, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, dtype)
    mask = torch.zeros(b, hq, lq, lk, dtype=dtype)
    mask[0, 1, 4] = torch.finfo(dtype).min / 2
    mask[0, 0, :, 50:] = torch.finfo(dtype).min
    mask[0, 0, 2, :30] = -1e4  # large, yet finite next to the scores
    if dtype == torch.float64:
        check_float64(q, k, v, mask, dout, True, True)
        return
    scale = 1.0 / math.sqrt(d)
    out, lse, grads, dmask = run_ops(q, k, v, mask, dout, scale, True, True)
    ref_out, ref_lse, ref_grads, ref_dmask = reference_with_grads(q, k, v, mask, dout, scale, True, True)
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv", "dmask"), (out, lse, *grads, dmask),
                               (ref_out, ref_lse, *ref_grads, ref_dmask)):
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", ["lq_lk", "b_1_1_lk"])
def test_float32_mask_with_float64_inputs(kind):
    b, lq, lk, hq, hk, d = 2, 97, 70, 4, 2, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    mask = make_mask(kind, False, b, hq, lq, lk, torch.float32)
    scale = 1.0 / math.sqrt(d)
    out, lse, grads, dmask = run_ops(q, k, v, mask, dout, scale, True, False)
    ref_out, ref_lse, ref_grads, ref_dmask = reference_with_grads(q, k, v, mask, dout, scale, True, False)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-10, rtol=0)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert dmask.dtype == torch.float32
    torch.testing.assert_close(dmask.double(), ref_dmask, atol=1e-6, rtol=1e-6)


# float32 and bfloat16 against the float64 reference, judged by the same math run in the low dtype
# (whose mask is rounded to the low dtype too).
@pytest.mark.parametrize("dtype,mask_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                              (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16_f32mask"])
@pytest.mark.parametrize("is_bool", [True, False], ids=["bool", "float"])
@pytest.mark.parametrize("kind", ["lq_lk", "b_1_1_lk", "strided_keys"])
@pytest.mark.parametrize("causal,bottom_right", [(False, False), (True, True)], ids=["full", "causal_br"])
def test_low_precision_within_fa2_rule(causal, bottom_right, kind, is_bool, dtype, mask_dtype):
    if is_bool and mask_dtype != dtype:
        pytest.skip("the mask dtype only matters for a floating mask")
    b, lq, lk, hq, hk, d = 2, 97, 70, 4, 2, 40
    q, k, v, dout = make_inputs(b, lq, lk, hq, hk, d, dtype)
    mask = make_mask(kind, is_bool, b, hq, lq, lk, mask_dtype)
    scale = 1.0 / math.sqrt(d)
    out, lse, grads, dmask = run_ops(q, k, v, mask, dout, scale, causal, bottom_right)
    ref_out, ref_lse, ref_grads, ref_dmask = reference_with_grads(q, k, v, mask, dout, scale, causal, bottom_right)
    base_out, _, base_grads, base_dmask = reference_with_grads(q, k, v, mask, dout, scale, causal, bottom_right,
                                                               dtype=dtype)

    def within(name, got, base, want, factor):
        assert not got.isnan().any(), name
        err = (got.double() - want).abs().max().item()
        bound = factor * (base.double() - want).abs().max().item() + 1e-5
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"

    within("out", out, base_out, ref_out, 2)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    # lse is float32 for low-precision inputs: held to float32 accuracy.
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-4, rtol=1e-5)
    for name, got, base, want in zip(("dq", "dk", "dv"), grads, base_grads, ref_grads):
        within(name, got, base, want, 3)
    if ref_dmask is not None:
        within("dmask", dmask, base_dmask, ref_dmask, 3)


class MaskedAttention(torch.autograd.Function):
    """fwd and bwd ops as a function of q, k, v and a float mask, for gradcheck."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal, bottom_right):
        out, lse = fwd(q, k, v, scale, causal, bottom_right, mask)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.args = (scale, causal, bottom_right)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask, out, lse = ctx.saved_tensors
        scale, causal, bottom_right = ctx.args
        dmask = torch.zeros(mask.shape, dtype=mask.dtype)
        dq, dk, dv = bwd(dout.contiguous(), q, k, v, out, lse, scale, causal, bottom_right, mask, dmask)
        return dq, dk, dv, dmask, None, None, None


@pytest.mark.parametrize("api", ["ops", "function"])
@pytest.mark.parametrize("mask_shape", [(2, 2, 5, 7), (2, 1, 1, 7)], ids=["dense", "broadcast"])
@pytest.mark.parametrize("causal,bottom_right", CAUSAL, ids=["full", "causal_tl", "causal_br"])
def test_gradcheck_with_float_mask(causal, bottom_right, mask_shape, api):
    """Through flashattn.ops' autograd and through the ops called directly (MaskedAttention). The
    broadcast mask is expanded outside the kernels: autograd sums dmask back to its shape."""
    b, lq, lk, hq, hk, d = 2, 5, 7, 2, 1, 6
    q, k, v, _ = make_inputs(b, lq, lk, hq, hk, d, torch.float64)
    mask = torch.randn(mask_shape, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (q, k, v, mask)]

    def attention(q, k, v, mask):
        mask = mask.expand(b, hq, lq, lk)
        if api == "ops":
            return flashattn.ops.attention(q, k, v, 0.4, causal, bottom_right, attn_mask=mask)[0]
        return MaskedAttention.apply(q, k, v, mask, 0.4, causal, bottom_right)

    assert torch.autograd.gradcheck(attention, inputs)
