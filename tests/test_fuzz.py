"""Property-based tests (hypothesis) of both public APIs and the raw op against reference attention.

Each test draws a case (tests/fuzz_strategies.py): batch 0..3, sequence lengths 0..70 independently
(so Lq != Lk both ways, and empty), head counts with GQA/MQA ratios, head dims 1..256 (mostly small),
memory layouts (transposed storage, padded slices with storage offsets, strided slices, stride-0
broadcasts of batch and head dims), a dtype, a softmax scale (default, zero, negative, large) and a
causal mode, then checks the output, the log-sum-exp where the API returns it, and the gradients of
every input against:

* ``flashattn.attention_reference`` for ``torch.ops.flashattn.fwd`` (both causal alignments) and the
  FlashAttention-2 API (bottom-right), and
* torch's own ``scaled_dot_product_attention`` (math backend) for the SDPA drop-in (top-left),

in float64 for float32/float64 inputs (within a rounding budget) and with the FlashAttention-2 oracle
of GUIDE section 4 for float16/bfloat16 (flashattn.testing, same tolerances). float16/bfloat16 cases
stay where that oracle can judge a gradient (sizes of at least 8, |scale| <= 1/sqrt(D)): outside it the
FlashAttention backward itself misses the oracle (LOW_PRECISION_LIMITS below).

The *_with_mask tests add an attention mask to those cases (fuzz_strategies.mask_cases): bool, float
of q's dtype or float32; any broadcast shape from (Lk,) to (B, H, Lq, Lk), sometimes with a strided
last dim; -inf / False entries and fully masked rows sometimes. The op and flashattn.ops.attention get
it expanded to [B, Hq, Lq, Lk] (the reference: attention_reference), the SDPA drop-in in torch's
broadcast convention (the reference: torch's SDPA; attn_mask with is_causal=True must raise, as in
torch). A float mask that requires grad has its gradient (with respect to the mask before the
broadcast) checked like q's; rows that see no key must give exact zeros in out, dq and the mask's
gradient, and no NaN anywhere. float16/bfloat16 masked cases keep sequence lengths of at least 24 (or
0): on shorter ones the FA2 oracle can reject the mask's gradient of a faithful FlashAttention backward
(tests/test_mask_regressions.py).

test_fuzz_op_with_dropout runs the op and flashattn.ops.attention on those masked cases (the mask may
be "none") with dropout (p in {0.1, 0.25, 0.5, 0.9}, any 64-bit seed and offset) against the reference
under the keep-mask the op exposes for the same rng_state; float32/float64 rounding budgets grow by
1 / (1 - p), the scale of the kept probabilities.

The number of examples comes from the profile in FLASHATTN_FUZZ_PROFILE (ci, the default; gpu; long).
Every test runs on the CPU and, where flashattn's CUDA kernels can run, on the GPU; the gpu profile
runs the GPU variants only (FLASHATTN_FUZZ_PROFILE=gpu python -m pytest tests/test_fuzz.py).
Counterexamples found by the fuzzer are kept below as plain tests (REGRESSIONS).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn import sdpa as fa_sdpa
from flashattn.reference import attention_reference
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle

from conftest import requires_cuda
from fuzz_strategies import (
    LOW_PRECISION,
    PROFILE,
    Layout,
    OpCase,
    OpDropoutCase,
    OpMaskCase,
    PackedCase,
    SdpaCase,
    SdpaMaskCase,
    check_lse,
    check_rounding,
    contiguous_layout,
    bf16_products_rounded,
    flash_backward_emulation,
    fuzz_settings,
    make_mask,
    make_storage,
    op_cases,
    op_dropout_cases,
    op_mask_cases,
    packed_cases,
    rounding_magnitudes,
    sdpa_cases,
    sdpa_mask_cases,
    visible_keys,
)

_GPU_ONLY = pytest.mark.skipif(PROFILE == "gpu", reason="the gpu fuzz profile runs the CUDA variants only")
DEVICES = [pytest.param("cpu", id="cpu", marks=_GPU_ONLY), pytest.param("cuda", id="cuda", marks=requires_cuda)]


# --------------------------------------------------------------------------------------------------
# One checker for every API
# --------------------------------------------------------------------------------------------------


def _view(layout: Layout, shape, dtype, device, gen) -> torch.Tensor:
    """A view of ``shape`` in ``layout`` over fresh random storage; the view carries autograd."""
    storage = make_storage(layout, shape, dtype, device, gen).requires_grad_()
    view = layout.view(storage, shape)
    assert tuple(view.shape) == tuple(shape) and view.device.type == torch.device(device).type
    return view


def _grads(out, inputs, dout):
    grads = torch.autograd.grad(out, inputs, dout, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads)]


def _leaves(inputs, dtype):
    return [t.detach().to(dtype).requires_grad_() for t in inputs]


def _mask_leaf(mask, dtype):
    """A fresh copy of ``mask`` for a reference: floating ones in ``dtype`` (requiring grad as the mask does)."""
    if mask is None or mask.dtype == torch.bool:
        return None if mask is None else mask.detach().clone()
    return mask.detach().to(dtype).requires_grad_(mask.requires_grad)


def _sum_to_mask(mask_to_full, mask):
    """The adjoint of ``mask_to_full`` (a broadcast of ``mask`` to ``[B, Hq, Lq, Lk]``): a function
    summing a ``[B, Hq, Lq, Lk]`` tensor over the dims the mask broadcasts, to the mask's shape."""

    def sum_to_mask(full):
        x = torch.zeros(mask.shape, dtype=full.dtype, device=full.device, requires_grad=True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(mask_to_full(x), x, full)
        return grad

    return sum_to_mask


def run_and_check(api, inputs, dout, reference, to_bshd, components, scale, is_causal, bottom_right, lse_expected,
                  mask=None, mask_to_full=None, value_scale=1.0):
    """Calls ``api(*inputs) -> (out, lse or None)``, backpropagates ``dout``, and checks everything.

    reference(*inputs) computes the API's result with plain PyTorch (autograd gives its gradients);
    to_bshd(*inputs, dout) -> (q, k, v, dout) in ``[B, L, H, D]`` for the reference lse and the rounding
    budget; components[i] names the tensors ("q", "k", "v") that inputs[i] holds.

    With ``mask_to_full`` (the masked tests; inputs are then q, k, v) the attention mask ``mask`` (None,
    or the tensor in the shape the API is given) is passed last to api and reference, and
    ``mask_to_full(mask)`` is the ``[B, Hq, Lq, Lk]`` mask the kernels see. A floating mask that
    requires grad has its gradient checked like an input's. Rows that see no key must give exact zeros
    in out and dq, the mask's gradient exact zeros wherever its key takes no part, and nothing a NaN.
    ``value_scale`` multiplies the float32/float64 rounding magnitudes: with dropout, kept probabilities
    are scaled by 1 / (1 - p), and so is every sum they enter.
    """
    masked = mask_to_full is not None
    dtype = inputs[0].dtype
    out, lse = api(*inputs, *((mask,) if masked else ()))
    assert out.dtype == dtype and out.device == inputs[0].device
    assert (lse is not None) == lse_expected
    mask_grad = mask is not None and mask.requires_grad
    grads = _grads(out, tuple(inputs) + ((mask,) if mask_grad else ()), dout)
    if mask_grad:
        components = tuple(components) + (("mask",),)

    ref_dtype = torch.float32 if dtype in LOW_PRECISION else torch.float64
    ref_inputs = _leaves(inputs, ref_dtype)
    ref_mask = _mask_leaf(mask, ref_dtype)
    ref_out = reference(*ref_inputs, *((ref_mask,) if masked else ()))
    ref_grads = _grads(ref_out, ref_inputs + ([ref_mask] if mask_grad else []), dout.detach().to(ref_dtype))
    assert out.shape == ref_out.shape, f"out shape {tuple(out.shape)} != {tuple(ref_out.shape)}"
    differentiated = tuple(inputs) + ((mask,) if mask_grad else ())
    assert all(g.shape == t.shape and g.dtype == t.dtype for g, t in zip(grads, differentiated))

    q, k, v, dout_bshd = to_bshd(*(t.detach() for t in ref_inputs), dout.detach().to(ref_dtype))
    full_mask = None if mask is None else mask_to_full(ref_mask.detach())  # [B, Hq, Lq, Lk]
    sum_to_mask = None if mask is None else _sum_to_mask(mask_to_full, mask)
    names = [f"grad of input {i} ({'+'.join(c)})" for i, c in enumerate(components)]
    if mask_grad:
        names[-1] = "grad of attn_mask"
    if dtype in LOW_PRECISION:
        base_inputs = _leaves(inputs, dtype)
        base_mask = _mask_leaf(mask, None if mask is None else mask.dtype)
        base_out = reference(*base_inputs, *((base_mask,) if masked else ()), upcast=False)
        base_grads = _grads(base_out, base_inputs + ([base_mask] if mask_grad else []), dout.detach())
        assert_oracle("out", out, ref_out, base_out.detach(), OUT_FACTOR)
        for name, g, r, b in zip(names, grads, ref_grads, base_grads):
            assert_oracle(name, g, r, b, GRAD_FACTOR)
        factor = None
    else:
        factor, magnitudes = rounding_magnitudes(q, k, v, dout_bshd, scale, is_causal, bottom_right, full_mask,
                                                 sum_to_mask if mask_grad else None)
        check_rounding("out", out, ref_out, value_scale * magnitudes["out"], factor)
        for name, component, g, r in zip(names, components, grads, ref_grads):
            magnitude = value_scale * max(magnitudes[c] for c in component)
            check_rounding(name, g, r, magnitude, factor)

    if lse is not None:
        _, ref_lse = attention_reference(q, k, v, scale, is_causal, bottom_right, return_lse=True, attn_mask=full_mask)
        assert lse.shape == ref_lse.shape and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        if factor is None:  # low precision: the GPU suite's lse tolerance (tests/test_gpu_attention.py)
            empty = torch.isneginf(ref_lse)
            assert torch.equal(torch.isneginf(lse), empty) and not torch.isnan(lse).any()
            torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=1e-3, rtol=1e-4)
        else:
            check_lse(lse, ref_lse, factor)

    if masked:  # exact zeros where no key takes part
        visible = visible_keys(q.shape[1], k.shape[1], is_causal, bottom_right, full_mask, q.device)
        empty = ~visible.expand(q.shape[0], q.shape[2], -1, -1).any(dim=-1)  # [B, Hq, Lq]
        dq, _, _, out_bshd = to_bshd(*grads[:3], out.detach())
        for name, t in (("out", out_bshd), ("dq", dq)):
            rows = t.transpose(1, 2)[empty]
            assert not rows.isnan().any() and (rows == 0).all(), f"{name}: rows that see no key are not zero"
        if mask_grad:
            takes_part = sum_to_mask(visible.expand(full_mask.shape).to(ref_dtype)) > 0
            unused = grads[-1][~takes_part]
            assert not unused.isnan().any() and (unused == 0).all(), \
                "grad of attn_mask: not zero where its key takes no part (masked, causal-hidden or an empty row)"
    return out, lse, grads


def _default_scale(head_dim):
    return 1.0 / math.sqrt(head_dim)


# --------------------------------------------------------------------------------------------------
# The raw op and flash_attn_func
# --------------------------------------------------------------------------------------------------


def _op_inputs(case: OpCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    b, lq, lk, hq, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim
    q = _view(case.layout_q, (b, lq, hq, d), case.dtype, device, gen)
    k = _view(case.layout_k, (b, lk, hk, d), case.dtype, device, gen)
    v = _view(case.layout_v, (b, lk, hk, d), case.dtype, device, gen)
    dout = make_storage(case.layout_dout, (b, lq, hq, d), case.dtype, device, gen)
    return q, k, v, case.layout_dout.view(dout, (b, lq, hq, d))


def _identity_bshd(q, k, v, dout):
    return q, k, v, dout


def check_op_case(case: OpCase, device: str = "cpu"):
    """torch.ops.flashattn.fwd (and bwd through its registered autograd) on one case."""
    q, k, v, dout = _op_inputs(case, device)
    scale = _default_scale(case.head_dim) if case.scale is None else case.scale

    def api(q, k, v):
        return torch.ops.flashattn.fwd(q, k, v, scale, case.causal, case.bottom_right)

    def reference(q, k, v, upcast=True):
        return attention_reference(q, k, v, scale, case.causal, case.bottom_right, upcast=upcast)

    out, _, _ = run_and_check(api, (q, k, v), dout, reference, _identity_bshd, (("q",), ("k",), ("v",)),
                              scale, case.causal, case.bottom_right, lse_expected=True)
    assert out.is_contiguous()


def check_flash_attn_case(case: OpCase, device: str = "cpu"):
    """flash_attn_func (bottom-right causal), with and without return_attn_probs."""
    assert case.bottom_right or not case.causal
    q, k, v, dout = _op_inputs(case, device)
    scale = case.head_dim ** -0.5 if case.scale is None else case.scale
    return_lse = case.seed % 2 == 0

    def api(q, k, v):
        result = flashattn.flash_attn_func(q, k, v, softmax_scale=case.scale, causal=case.causal,
                                           return_attn_probs=return_lse)
        if not return_lse:
            return result, None
        out, lse, probs = result
        assert probs is None and not lse.requires_grad
        return out, lse

    def reference(q, k, v, upcast=True):
        return attention_reference(q, k, v, scale, case.causal, True, upcast=upcast)

    out, _, _ = run_and_check(api, (q, k, v), dout, reference, _identity_bshd, (("q",), ("k",), ("v",)),
                              scale, case.causal, True, lse_expected=return_lse)
    assert out.is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(1.0)
@given(data=st.data())
def test_fuzz_raw_op(device, data):
    check_op_case(data.draw(op_cases(device), label="case"), device)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(1.0)
@given(data=st.data())
def test_fuzz_flash_attn_func(device, data):
    check_flash_attn_case(data.draw(op_cases(device, flash_api=True), label="case"), device)


# --------------------------------------------------------------------------------------------------
# flash_attn_kvpacked_func and flash_attn_qkvpacked_func
# --------------------------------------------------------------------------------------------------


def check_packed_case(case: PackedCase, device: str = "cpu"):
    gen = torch.Generator().manual_seed(case.seed)
    b, lq, lk, hq, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim
    scale = d ** -0.5 if case.scale is None else case.scale
    if case.packed == "qkv":
        inputs = (_view(case.layout_packed, (b, lq, 3, hq, d), case.dtype, device, gen),)
        components = (("q", "k", "v"),)

        def unpack(qkv):
            return qkv.unbind(2)

        def api(qkv):
            return flashattn.flash_attn_qkvpacked_func(qkv, softmax_scale=case.scale, causal=case.causal), None
    else:
        inputs = (_view(case.layout_q, (b, lq, hq, d), case.dtype, device, gen),
                  _view(case.layout_packed, (b, lk, 2, hk, d), case.dtype, device, gen))
        components = (("q",), ("k", "v"))

        def unpack(q, kv):
            return (q,) + tuple(kv.unbind(2))

        def api(q, kv):
            return flashattn.flash_attn_kvpacked_func(q, kv, softmax_scale=case.scale, causal=case.causal), None

    dout = case.layout_dout.view(make_storage(case.layout_dout, (b, lq, hq, d), case.dtype, device, gen), (b, lq, hq, d))

    def reference(*packed, upcast=True):
        return attention_reference(*unpack(*packed), scale, case.causal, True, upcast=upcast)

    def to_bshd(*args):
        return tuple(unpack(*args[:-1])) + (args[-1],)

    run_and_check(api, inputs, dout, reference, to_bshd, components, scale, case.causal, True, lse_expected=False)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(0.75)
@given(data=st.data())
def test_fuzz_packed(device, data):
    check_packed_case(data.draw(packed_cases(device), label="case"), device)


# --------------------------------------------------------------------------------------------------
# The SDPA drop-in against torch's SDPA
# --------------------------------------------------------------------------------------------------


def _sdpa_to_bshd(t):
    """(..., H, L, E) or (L, E) -> (N, L, H, E) with all leading dims flattened into N."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    return t.reshape((math.prod(t.shape[:-3]),) + tuple(t.shape[-3:])).transpose(1, 2)


def check_sdpa_case(case: SdpaCase, device: str = "cpu"):
    gen = torch.Generator().manual_seed(case.seed)
    shape_q, shape_k, shape_v = case.shapes()
    q = _view(case.layout_q, shape_q, case.dtype, device, gen)
    k = _view(case.layout_k, shape_k, case.dtype, device, gen)
    v = _view(case.layout_v, shape_v, case.dtype, device, gen)
    dout = case.layout_dout.view(make_storage(case.layout_dout, shape_q, case.dtype, device, gen), shape_q)
    scale = _default_scale(case.head_dim) if case.scale is None else case.scale
    gqa = {"enable_gqa": True} if case.enable_gqa else {}
    # torch's SDPA raises IndexError for 2-dim inputs with enable_gqa=True (it looks for a head dim);
    # flashattn's accepts them, and the flag means nothing there, so the reference goes without it.
    ref_gqa = gqa if case.heads_q is not None else {}
    # The case must reach flashattn's kernels, not torch's (a fallback would make the test vacuous).
    reason = fa_sdpa.fallback_reason(q, k, v, None, 0.0, case.enable_gqa)
    assert reason is None, reason

    def api(q, k, v):
        return flashattn.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal, scale=case.scale, **gqa), None

    def reference(q, k, v, upcast=True):
        if upcast:  # torch's own SDPA defines the semantics
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal, scale=case.scale, **ref_gqa)
        # The oracle's baseline: the same math in the low dtype.
        out = attention_reference(*(_sdpa_to_bshd(t) for t in (q, k, v)), scale, case.is_causal, False, upcast=False)
        return out.transpose(1, 2).reshape(q.shape)

    def to_bshd(q, k, v, dout):
        return tuple(_sdpa_to_bshd(t) for t in (q, k, v, dout))

    run_and_check(api, (q, k, v), dout, reference, to_bshd, (("q",), ("k",), ("v",)), scale, case.is_causal, False,
                  lse_expected=False)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(1.0)
@given(data=st.data())
def test_fuzz_sdpa(device, data):
    check_sdpa_case(data.draw(sdpa_cases(device), label="case"), device)


# --------------------------------------------------------------------------------------------------
# Attention masks: the op / flashattn.ops.attention and the SDPA drop-in
# --------------------------------------------------------------------------------------------------


def check_op_mask_case(case: OpMaskCase, device: str = "cpu", dropout_p: float = 0.0, rng_state=None):
    """torch.ops.flashattn.fwd or flashattn.ops.attention with the mask of ``case`` expanded to
    ``[B, Hq, Lq, Lk]`` (a stride-0 view), against attention_reference; a float mask's gradient is
    taken with respect to the mask before the expand (summed over its broadcast dims). With
    ``dropout_p`` > 0 the calls get it and ``rng_state`` (seed, offset), and the reference applies the
    keep-mask the op exposes for that rng_state."""
    op = case.op
    q, k, v, dout = _op_inputs(op, device)
    scale = _default_scale(op.head_dim) if op.scale is None else op.scale
    full = (op.batch, op.heads_q, op.seqlen_q, op.seqlen_k)
    mask = make_mask(case.mask, case.mask.shape(full), op.dtype, device)
    rng = None if dropout_p == 0.0 else torch.tensor(rng_state, dtype=torch.int64, device=device)
    keep = None if rng is None else flashattn.ops.dropout_keep_mask(rng, *full, dropout_p)  # [B, Hq, Lq, Lk]

    def to_full(m):
        return None if m is None else m.expand(full)

    def api(q, k, v, m):
        if case.api == "fwd":
            return torch.ops.flashattn.fwd(q, k, v, scale, op.causal, op.bottom_right, to_full(m), dropout_p, rng)
        return flashattn.ops.attention(q, k, v, scale, op.causal, op.bottom_right,
                                       deterministic=case.api == "attention_deterministic", attn_mask=to_full(m),
                                       dropout_p=dropout_p, rng_state=rng)

    def reference(q, k, v, m, upcast=True):
        return attention_reference(q, k, v, scale, op.causal, op.bottom_right, upcast=upcast, attn_mask=to_full(m),
                                   dropout_p=dropout_p, dropout_mask=keep)

    out, _, _ = run_and_check(api, (q, k, v), dout, reference, _identity_bshd, (("q",), ("k",), ("v",)),
                              scale, op.causal, op.bottom_right, lse_expected=True, mask=mask, mask_to_full=to_full,
                              value_scale=1.0 / (1.0 - dropout_p))
    assert out.is_contiguous()


def check_sdpa_mask_case(case: SdpaMaskCase, device: str = "cpu"):
    """flashattn.scaled_dot_product_attention with ``attn_mask`` against torch's SDPA (math backend)."""
    sdpa = case.sdpa
    gen = torch.Generator().manual_seed(sdpa.seed)
    shape_q, shape_k, shape_v = sdpa.shapes()
    q = _view(sdpa.layout_q, shape_q, sdpa.dtype, device, gen)
    k = _view(sdpa.layout_k, shape_k, sdpa.dtype, device, gen)
    v = _view(sdpa.layout_v, shape_v, sdpa.dtype, device, gen)
    dout = sdpa.layout_dout.view(make_storage(sdpa.layout_dout, shape_q, sdpa.dtype, device, gen), shape_q)
    scale = _default_scale(sdpa.head_dim) if sdpa.scale is None else sdpa.scale
    heads = () if sdpa.heads_q is None else (sdpa.heads_q,)
    weights = sdpa.lead + heads + (sdpa.seqlen_q, sdpa.seqlen_k)  # torch's attention weights
    full = (math.prod(sdpa.lead), sdpa.heads_q or 1, sdpa.seqlen_q, sdpa.seqlen_k)  # what the kernels see
    mask = make_mask(case.mask, case.mask.shape(weights), sdpa.dtype, device)
    gqa = {"enable_gqa": True} if sdpa.enable_gqa else {}
    ref_gqa = gqa if sdpa.heads_q is not None else {}  # see check_sdpa_case
    reason = fa_sdpa.fallback_reason(q, k, v, mask, 0.0, sdpa.enable_gqa)
    assert reason is None, reason

    if mask is not None and sdpa.is_causal:  # an error in torch, and so in the drop-in
        with pytest.raises(RuntimeError, match="is_causal"):
            flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, scale=sdpa.scale, **gqa)
        with pytest.raises(RuntimeError, match="is_causal"), sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=mask.detach(), is_causal=True,
                                           scale=sdpa.scale, **ref_gqa)
        return

    def to_full(m):
        return None if m is None else m.expand(weights).reshape(full)

    def api(q, k, v, m):
        return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=sdpa.is_causal,
                                                      scale=sdpa.scale, **gqa), None

    def reference(q, k, v, m, upcast=True):
        if upcast:  # torch's own SDPA defines the semantics
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=sdpa.is_causal,
                                                      scale=sdpa.scale, **ref_gqa)
        out = attention_reference(*(_sdpa_to_bshd(t) for t in (q, k, v)), scale, sdpa.is_causal, False, upcast=False,
                                  attn_mask=to_full(m))
        return out.transpose(1, 2).reshape(q.shape)

    def to_bshd(q, k, v, dout):
        return tuple(_sdpa_to_bshd(t) for t in (q, k, v, dout))

    run_and_check(api, (q, k, v), dout, reference, to_bshd, (("q",), ("k",), ("v",)), scale, sdpa.is_causal, False,
                  lse_expected=False, mask=mask, mask_to_full=to_full)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(1.0)
@given(data=st.data())
def test_fuzz_op_with_dropout(device, data):
    case: OpDropoutCase = data.draw(op_dropout_cases(device), label="case")
    check_op_mask_case(case.case, device, case.dropout_p, case.rng_state)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(2.0)
@given(data=st.data())
def test_fuzz_op_with_mask(device, data):
    check_op_mask_case(data.draw(op_mask_cases(device), label="case"), device)


@pytest.mark.parametrize("device", DEVICES)
@fuzz_settings(2.0)
@given(data=st.data())
def test_fuzz_sdpa_with_mask(device, data):
    check_sdpa_mask_case(data.draw(sdpa_mask_cases(device), label="case"), device)


# --------------------------------------------------------------------------------------------------
# The strategies themselves: the layouts they draw are what they claim to be
# --------------------------------------------------------------------------------------------------


def test_layout_views_have_the_claimed_strides():
    shape = (2, 5, 3, 8)
    plain = contiguous_layout(4)
    assert plain.view(make_storage(plain, shape, torch.float32, "cpu", torch.Generator()), shape).is_contiguous()
    fancy = Layout(order=(2, 0, 1, 3), pad=(1, 2, 0, 3), offset=(1, 2, 0, 1), step=(1, 2, 1, 1), expand=(2,))
    storage = make_storage(fancy, shape, torch.float32, "cpu", torch.Generator())
    view = fancy.view(storage, shape)
    assert tuple(view.shape) == shape
    assert view.stride(2) == 0 and view.stride(3) == 1 and view.storage_offset() > 0
    assert view.stride(1) == 2 * storage.stride(2)  # every other element of the (transposed) seqlen dim
    # Every element of the view is the storage element the layout says it is.
    assert torch.equal(view[1, 3, 2], storage[0, 1 + 1, 2 + 2 * 3, 1:9])


# --------------------------------------------------------------------------------------------------
# Counterexamples the fuzzer found, kept as plain tests
# --------------------------------------------------------------------------------------------------

_PLAIN4 = contiguous_layout(4)
# The last dim every other element, batch and heads broadcast with stride 0.
_STRIDED_LAST_BROADCAST4 = Layout(order=(0, 1, 2, 3), pad=(0, 0, 0, 0), offset=(0, 0, 0, 0), step=(1, 1, 1, 2),
                                  expand=(0, 2))

REGRESSIONS = [
    # Empty output (batch 0) and an upstream gradient whose last dim is not contiguous: the registered
    # backward called .contiguous(), a no-op on an empty tensor, and flashattn.bwd rejected the strides
    # ("dout must have a contiguous last dim, got strides [0, 4, 4, 2]"). Fixed in flashattn/ops.py.
    pytest.param(check_op_case, OpCase(
        batch=0, seqlen_q=0, seqlen_k=0, heads_q=1, heads_kv=1, head_dim=2, dtype=torch.float64, scale=0.0,
        causal=False, bottom_right=False, layout_q=_PLAIN4, layout_k=_PLAIN4, layout_v=_PLAIN4,
        layout_dout=_STRIDED_LAST_BROADCAST4, seed=0), id="empty-out-strided-dout"),
    pytest.param(check_flash_attn_case, OpCase(
        batch=0, seqlen_q=5, seqlen_k=7, heads_q=4, heads_kv=2, head_dim=8, dtype=torch.float32, scale=None,
        causal=True, bottom_right=True, layout_q=_PLAIN4, layout_k=_PLAIN4, layout_v=_PLAIN4,
        layout_dout=_STRIDED_LAST_BROADCAST4, seed=1), id="fa2-empty-out-strided-dout"),
    # An empty SDPA input whose last dim is strided: the drop-in's .contiguous() left it as it was and
    # flashattn.fwd raised, where torch returns an empty result. Fixed in the drop-in's copy of a strided
    # last dim (which fwd_heads_first makes now, in csrc/torch/autograd.cpp).
    pytest.param(check_sdpa_case, SdpaCase(
        lead=(0,), heads_q=2, heads_kv=2, enable_gqa=False, seqlen_q=3, seqlen_k=4, head_dim=8,
        dtype=torch.float32, scale=None, is_causal=False, layout_q=_STRIDED_LAST_BROADCAST4,
        layout_k=_STRIDED_LAST_BROADCAST4, layout_v=_PLAIN4, layout_dout=_PLAIN4, seed=2), id="sdpa-empty-strided-last-dim"),
]


@pytest.mark.parametrize("check, case", REGRESSIONS)
def test_fuzz_regression(check, case):
    check(case, "cpu")


# fp16/bf16 gradients the GUIDE section 4 oracle rejects although the kernel computes the FlashAttention
# backward faithfully. The backward takes delta = rowsum(dout * out) from the low-precision out, as
# FlashAttention's backward does; the oracle's baseline (PyTorch's softmax backward in the low dtype)
# subtracts the same rounded dP it sums, so its rounding cancels. When a row's softmax is close to
# one-hot (large |scale| * q.k) or spread over very few keys, the uncancelled rounding of out decides
# dq and dk: on the first case below max|dq - ref| is 0.17 (max|ref| 0.30) where the baseline errs by
# 0.0056, so the bound is 0.017. The fuzzer found the last three; the low-precision strategies now stay
# where the oracle holds (fuzz_strategies.draw_scale, LOW_PRECISION_MIN_SIZE); test_fuzz_* cover
# these shapes in float32/float64.
_K_OFFSET_BROADCAST = Layout(order=(0, 1, 2, 3), pad=(1, 0, 0, 1), offset=(1, 0, 0, 0), step=(1, 1, 1, 1),
                             expand=(0,))
_QKV_BROADCAST = Layout(order=(0, 1, 2, 3, 4), pad=(0,) * 5, offset=(0,) * 5, step=(1,) * 5, expand=(0, 3))
_BROADCAST4 = Layout(order=(0, 1, 2, 3), pad=(0,) * 4, offset=(0,) * 4, step=(1,) * 4, expand=(0, 2))

LOW_PRECISION_LIMITS = [
    pytest.param(check_op_case, OpCase(
        batch=1, seqlen_q=6, seqlen_k=8, heads_q=3, heads_kv=3, head_dim=24, dtype=torch.float16, scale=64.0,
        causal=False, bottom_right=False, layout_q=_PLAIN4, layout_k=_PLAIN4, layout_v=_PLAIN4,
        layout_dout=_PLAIN4, seed=11), id="one-hot-fp16"),
    pytest.param(check_op_case, OpCase(
        batch=2, seqlen_q=2, seqlen_k=5, heads_q=2, heads_kv=2, head_dim=2, dtype=torch.bfloat16, scale=64.0,
        causal=False, bottom_right=True, layout_q=_PLAIN4, layout_k=_PLAIN4, layout_v=_PLAIN4,
        layout_dout=_PLAIN4, seed=24), id="one-hot-bf16"),
    pytest.param(check_op_case, OpCase(
        batch=1, seqlen_q=2, seqlen_k=44, heads_q=1, heads_kv=1, head_dim=5, dtype=torch.float16,
        scale=-1 / math.sqrt(5), causal=True, bottom_right=False, layout_q=_PLAIN4, layout_k=_PLAIN4,
        layout_v=_PLAIN4, layout_dout=_PLAIN4, seed=21), id="rows-over-two-keys-fp16"),
    pytest.param(check_op_case, OpCase(
        batch=1, seqlen_q=2, seqlen_k=44, heads_q=1, heads_kv=1, head_dim=5, dtype=torch.bfloat16,
        scale=-1 / math.sqrt(5), causal=True, bottom_right=False, layout_q=_PLAIN4, layout_k=_PLAIN4,
        layout_v=_PLAIN4, layout_dout=_PLAIN4, seed=17), id="rows-over-two-keys-bf16"),
    pytest.param(check_flash_attn_case, OpCase(
        batch=2, seqlen_q=1, seqlen_k=3, heads_q=2, heads_kv=2, head_dim=1, dtype=torch.float16, scale=1.0,
        causal=False, bottom_right=True, layout_q=_PLAIN4, layout_k=_K_OFFSET_BROADCAST, layout_v=_PLAIN4,
        layout_dout=_PLAIN4, seed=0), id="fuzz-flash-attn-func-d1"),
    pytest.param(check_op_case, OpCase(
        batch=1, seqlen_q=1, seqlen_k=2, heads_q=1, heads_kv=1, head_dim=1, dtype=torch.float16, scale=-1.0,
        causal=False, bottom_right=False, layout_q=_PLAIN4, layout_k=_PLAIN4, layout_v=_PLAIN4,
        layout_dout=_PLAIN4, seed=0), id="fuzz-raw-op-d1"),
    pytest.param(check_packed_case, PackedCase(
        packed="qkv", batch=1, seqlen_q=2, seqlen_k=2, heads_q=1, heads_kv=1, head_dim=72, dtype=torch.float16,
        scale=1.0, causal=False, layout_q=_BROADCAST4, layout_packed=_QKV_BROADCAST, layout_dout=_BROADCAST4,
        seed=1), id="fuzz-qkvpacked-d72"),
]


# The cases of LOW_PRECISION_LIMITS the oracle accepts where the CPU backward rounds P and dS to bfloat16
# for their products (bf16_products_rounded): the rounding then matches the baseline's bfloat16 softmax
# backward closely enough on this one.
ORACLE_HOLDS_WITH_ROUNDED_PRODUCTS = {"one-hot-bf16"}


def _oracle_limit_params():
    rounded = bf16_products_rounded(torch.bfloat16) is not None
    miss = pytest.mark.xfail(strict=True, raises=AssertionError,
                             reason="fp16/bf16 oracle vs FlashAttention's delta from the low-precision out (see above)")
    return [pytest.param(*p.values, id=p.id,
                         marks=() if rounded and p.id in ORACLE_HOLDS_WITH_ROUNDED_PRODUCTS else (miss,))
            for p in LOW_PRECISION_LIMITS]


@pytest.mark.parametrize("check, case", _oracle_limit_params())
def test_low_precision_oracle_limit(check, case):
    check(case, "cpu")


@pytest.mark.parametrize("check, case", [p for p in LOW_PRECISION_LIMITS if p.values[0] is not check_packed_case])
def test_low_precision_backward_is_flash_attention_backward(check, case):
    """On those cases the kernel's gradients are the FlashAttention backward's, to the last bit of the
    low dtype: the oracle misses are the algorithm's, not an implementation fault."""
    q, k, v, dout = _op_inputs(case, "cpu")
    scale = _default_scale(case.head_dim) if case.scale is None else case.scale
    out, _ = torch.ops.flashattn.fwd(q, k, v, scale, case.causal, case.bottom_right)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    emulated = flash_backward_emulation(q, k, v, dout, out, scale, case.causal, case.bottom_right,
                                        round_products=bf16_products_rounded(case.dtype))
    for name, g, e in zip(("dq", "dk", "dv"), grads, emulated):
        one_ulp = torch.finfo(case.dtype).eps * e.abs().max().item()
        assert (g.double() - e.to(case.dtype).double()).abs().max().item() <= one_ulp, name


@pytest.mark.parametrize("api", ["sdpa", "flash_attn_func", "qkvpacked", "op"])
@pytest.mark.parametrize("shape", ["batch0", "seqlen_q0", "heads0"])
def test_sum_backward_of_an_empty_output(api, shape):
    """loss = attention(...).sum(); loss.backward() -- the gradient of sum() is a stride-0 expand."""
    batch, seqlen, heads = {"batch0": (0, 5, 2), "seqlen_q0": (2, 0, 2), "heads0": (2, 5, 0)}[shape]
    qkv = torch.randn(batch, seqlen, 3, heads, 8, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.unbind(2)
    if api == "sdpa":
        out = flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    elif api == "flash_attn_func":
        out = flashattn.flash_attn_func(q, k, v, causal=True)
    elif api == "qkvpacked":
        out = flashattn.flash_attn_qkvpacked_func(qkv)
    else:
        out, _ = torch.ops.flashattn.fwd(q, k, v, 0.5, True, True)
    assert out.numel() == 0
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and not qkv.grad.any()
