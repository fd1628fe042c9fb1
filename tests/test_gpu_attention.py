"""Correctness of the CUDA kernels (forward and backward) against the fp16/bf16 oracle (GUIDE section 4).

Every case draws fresh randn inputs, runs torch.ops.flashattn.fwd through autograd (so bwd runs
too), and checks out, dq, dk, dv with the FlashAttention-2 rule against a float32 reference, plus lse
against the reference log-sum-exp. The main axes (dtype, sequence lengths, causal mode, head dim) are
parametrized; batch/head layouts, GQA ratios and memory layouts are sampled across the cases so the
grid stays at a few hundred cases.
"""
import itertools
import math
import random

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.testing import (
    CAUSAL_MODES,
    GRAD_FACTOR,
    OUT_FACTOR,
    assert_oracle,
    make_qkv,
    max_abs_diff,
    reference_and_baseline,
)

from conftest import requires_cuda

pytestmark = requires_cuda

DTYPES = [torch.float16, torch.bfloat16]
SEQLENS = [(1, 1), (17, 17), (97, 97), (113, 203), (203, 113), (1025, 1025), (128, 1), (1, 128), (512, 512)]
HEAD_DIMS = [32, 40, 64, 72, 80, 96, 128, 160, 192, 256]
ODD_HEAD_DIMS = [1, 13]
# (batch, heads_q, heads_kv)
HEAD_CONFIGS = [(1, 16, 16), (3, 2, 2), (2, 8, 2), (2, 4, 1)]
LAYOUTS = ["contiguous", "bhsd", "padded", "unaligned"]


def _dtype_id(dtype):
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal_mode, layout="contiguous",
             key_ramp=0.0):
    """key_ramp: scores gain key_ramp * j / seqlen_k (in base-2 units, query-independent) at key j."""
    is_causal, bottom_right = CAUSAL_MODES[causal_mode]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", layout)
    if key_ramp:
        # Feature 0 carries the ramp: q's is 4 everywhere, k's grows along the keys.
        ramp = torch.linspace(0, key_ramp, seqlen_k, device="cuda") * math.log(2) * math.sqrt(head_dim) / 4
        q[..., 0] = 4
        k[..., 0] = ramp[None, :, None].to(dtype)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    scale = 1.0 / math.sqrt(head_dim)

    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)

    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = reference_and_baseline(
        q, k, v, dout, scale, is_causal, bottom_right
    )
    assert out.dtype == dtype and out.shape == (batch, seqlen_q, heads_q, head_dim) and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (batch, heads_q, seqlen_q)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, grad, ref, base in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_grads, base_grads):
        assert_oracle(name, grad, ref, base, GRAD_FACTOR)

    # lse: -inf exactly where the reference row sees no key, close elsewhere.
    empty_rows = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty_rows), "lse: -inf rows differ from the reference"
    assert not torch.isnan(lse).any(), "lse has NaN"
    torch.testing.assert_close(lse[~empty_rows], ref_lse[~empty_rows], atol=1e-3, rtol=1e-4)


def _main_grid():
    # The secondary axes (batch/head config, two head dims) are drawn per case from a fixed-seed generator.
    rng = random.Random(20240)
    cases = []
    for dtype, seqlens, causal in itertools.product(DTYPES, SEQLENS, CAUSAL_MODES):
        heads = rng.choice(HEAD_CONFIGS)
        head_dims = rng.sample(HEAD_DIMS, 2)
        case_id = f"{_dtype_id(dtype)}-{seqlens[0]}x{seqlens[1]}-{causal}-b{heads[0]}h{heads[1]}kv{heads[2]}"
        cases.append(pytest.param(dtype, seqlens, causal, heads, head_dims, id=case_id))
    return cases


@pytest.mark.parametrize("dtype, seqlens, causal_mode, heads, head_dims", _main_grid())
def test_seqlen_grid(dtype, seqlens, causal_mode, heads, head_dims):
    """Every (dtype, Lq x Lk, causal mode), at two head dims and one batch/head config drawn per case."""
    seqlen_q, seqlen_k = seqlens
    batch, heads_q, heads_kv = heads
    for head_dim in head_dims:
        run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal_mode)


@pytest.mark.parametrize("causal_mode", list(CAUSAL_MODES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS + ODD_HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_head_dim_grid(dtype, head_dim, causal_mode):
    """Every head dim (including non-powers of two and odd sizes) at an awkward Lq != Lk shape."""
    for seqlen_q, seqlen_k in [(113, 203), (203, 113)]:
        run_case(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, causal_mode)


@pytest.mark.parametrize("heads", [(8, 2), (4, 1)], ids=["8q2kv", "4q1kv"])
@pytest.mark.parametrize("causal_mode", list(CAUSAL_MODES))
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_gqa(dtype, causal_mode, heads):
    heads_q, heads_kv = heads
    for seqlen_q, seqlen_k, head_dim in [(97, 97, 64), (113, 203, 128), (203, 113, 80)]:
        run_case(2, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal_mode)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
@pytest.mark.parametrize("head_dim", [40, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_strided_inputs(dtype, head_dim, layout):
    """Non-contiguous views: transposed [B, H, S, D], sliced with a storage offset, rows not 16-byte aligned."""
    for causal_mode, (seqlen_q, seqlen_k) in [("none", (97, 97)), ("bottom_right", (113, 203)), ("top_left", (203, 113))]:
        run_case(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, causal_mode, layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("shape", ["no_keys", "no_batch", "no_queries"])
def test_empty_inputs(dtype, shape):
    batch, seqlen_q, seqlen_k = {"no_keys": (2, 17, 0), "no_batch": (0, 17, 17), "no_queries": (2, 0, 17)}[shape]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, 64, dtype, "cuda")
    for t in (q, k, v):
        t.requires_grad_()
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.125, True, True)
    assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)
    # With no key every row's output is 0 and its lse -inf (vacuous for the other empty shapes).
    if seqlen_k == 0:
        assert torch.equal(out, torch.zeros_like(out))
        assert torch.isneginf(lse).all()
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout, allow_unused=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for g in (dq, dk, dv):
        assert torch.equal(g, torch.zeros_like(g))


# Rows whose max keeps growing along the keys: by about 3 (base 2) per 128-key block, so the running
# max is passed by less than a factor 2^8 over a few blocks before it moves, and by about 24 per block,
# so it moves every block; falling scores leave it at the first block's.
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("key_ramp", [24.0, 192.0, -64.0])
@pytest.mark.parametrize("causal_mode", ["none", "top_left"])
def test_running_max_growing_along_keys(dtype, head_dim, key_ramp, causal_mode):
    run_case(2, 1025, 1025, 4, 2, head_dim, dtype, causal_mode, key_ramp=key_ramp)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_is_bitwise_reproducible(causal):
    q, k, v = make_qkv(2, 1025, 1025, 8, 2, 128, torch.bfloat16, "cuda")
    out1, lse1 = torch.ops.flashattn.fwd(q, k, v, 0.088, causal, True)
    out2, lse2 = torch.ops.flashattn.fwd(q, k, v, 0.088, causal, True)
    assert torch.equal(out1, out2)
    assert torch.equal(lse1, lse2)


def test_custom_scale():
    q, k, v = make_qkv(1, 97, 113, 4, 4, 64, torch.float16, "cuda")
    for t in (q, k, v):
        t.requires_grad_()
    dout = torch.randn_like(q)
    for scale in (0.01, 0.5):
        out, _ = torch.ops.flashattn.fwd(q, k, v, scale, True, True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        (ref_out, ref_grads, _), (base_out, base_grads) = reference_and_baseline(q, k, v, dout, scale, True, True)
        assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
        for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            assert_oracle(name, g, r, b, GRAD_FACTOR)


# --------------------------------------------------------------------------------------------------
# deterministic=True: the backward gives the same bits on every run
# --------------------------------------------------------------------------------------------------

DETERMINISTIC_CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal mode): many key blocks per
    # (batch, kv head), so many CTAs add into each dq block.
    (2, 1000, 1000, 4, 4, 64, "none"),
    (2, 1000, 1000, 4, 4, 64, "top_left"),  # = bottom-right when Lq == Lk
    (2, 1000, 1000, 8, 2, 64, "none"),  # GQA: each CTA adds into the dq of 4 query heads
    (2, 1000, 1000, 8, 2, 64, "bottom_right"),
    (2, 1000, 1500, 4, 4, 64, "top_left"),  # the last key blocks see no query and add nothing
    (2, 1500, 1000, 8, 2, 64, "top_left"),
    (2, 1000, 1500, 8, 2, 64, "bottom_right"),
    (2, 1500, 1000, 4, 4, 64, "bottom_right"),  # the first 500 query rows see no key
    # 128-query steps at width 64 (two dq turns a step): the diagonal 64 queries into a step, so a key
    # block's first step has a 64-query block that sees none of its keys; and 900 queries, whose last
    # step has no second block.
    (2, 900, 964, 4, 4, 64, "bottom_right"),
    (2, 964, 900, 8, 2, 64, "bottom_right"),
    (2, 1000, 1000, 4, 4, 72, "bottom_right"),  # padded head dim: the element-wise dq add
    (2, 1000, 1000, 4, 4, 128, "none"),
    (2, 1000, 1000, 8, 2, 256, "top_left"),  # 64-key blocks
    (2, 1000, 1000, 4, 4, 96, "none"),  # tile width 96: two dQ pieces per consumer on the sm90 path
    (2, 1000, 1000, 4, 2, 80, "bottom_right"),  # padded to tile width 96
    (2, 1000, 1500, 4, 2, 192, "bottom_right"),  # the sm90 wide kernel at tile width 192
    (2, 1000, 1000, 4, 2, 136, "none"),  # padded to tile width 192 on the sm90 path
    (2, 2048, 2048, 16, 16, 128, "top_left"),  # 512 CTAs: several waves on any GPU
]


@pytest.mark.parametrize("path", ["default", "sm80"])
@pytest.mark.parametrize("case", DETERMINISTIC_CASES, ids=lambda c: "b{}-{}x{}-h{}kv{}-d{}-{}".format(*c))
def test_deterministic_backward_is_bitwise_reproducible(case, path, plan_options):
    if path == "sm80":
        plan_options(force_sm80=True)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal_mode = case
    is_causal, bottom_right = CAUSAL_MODES[causal_mode]
    dtype = torch.bfloat16
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda")
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right)
    args = (dout, q, k, v, out, lse, scale, is_causal, bottom_right)

    runs = [torch.ops.flashattn.bwd(*args, deterministic=True) for _ in range(3)]
    for run in runs[1:]:
        for name, grad, first in zip(("dq", "dk", "dv"), run, runs[0]):
            assert torch.equal(grad, first), (
                f"{name} differs between deterministic runs (max |diff| {max_abs_diff(grad, first):.3e})"
            )

    # Through autograd, as flash_attn_func(..., deterministic=True) runs it: the same bits again.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out_autograd, _ = ops.attention(*leaves, scale, is_causal, bottom_right, deterministic=True)
    assert torch.equal(out_autograd, out)
    for grad, first in zip(torch.autograd.grad(out_autograd, leaves, dout), runs[0]):
        assert torch.equal(grad, first)

    # As accurate as the default backward: both pass the oracle.
    default = torch.ops.flashattn.bwd(*args)
    (_, ref_grads, _), (_, base_grads) = reference_and_baseline(q, k, v, dout, scale, is_causal, bottom_right)
    for name, grad, grad_default, ref, base in zip(("dq", "dk", "dv"), runs[0], default, ref_grads, base_grads):
        assert_oracle(name, grad, ref, base, GRAD_FACTOR)
        assert_oracle(f"{name} (default backward)", grad_default, ref, base, GRAD_FACTOR)

    # Deterministic mode changes only the order of dq's additions: dk and dv are the default backward's
    # (same path), bit for bit.
    assert torch.equal(default[1], runs[0][1]) and torch.equal(default[2], runs[0][2])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_qkvpacked_deterministic_gradients_repeat(causal):
    qkv = torch.randn(2, 1000, 3, 8, 64, dtype=torch.float16, device="cuda")
    dout = torch.randn(2, 1000, 8, 64, dtype=torch.float16, device="cuda")
    grads = []
    for _ in range(2):
        leaf = qkv.clone().requires_grad_()
        out = flashattn.flash_attn_qkvpacked_func(leaf, causal=causal, deterministic=True)
        grads.append(torch.autograd.grad(out, leaf, dout)[0])
    assert torch.equal(grads[0], grads[1])


# --------------------------------------------------------------------------------------------------
# Memory: O(N), nothing N^2
# --------------------------------------------------------------------------------------------------

MIB = 1 << 20


def _peak_extra(fn):
    """(result, peak bytes allocated during fn beyond what was allocated before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def test_forward_memory_is_output_plus_lse():
    batch, heads, seqlen, head_dim = 1, 16, 16384, 128
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16, "cuda")
    torch.ops.flashattn.fwd(q, k, v, 0.088, True, False)  # warm-up (lazy init outside the measurement)
    (out, lse), extra = _peak_extra(lambda: torch.ops.flashattn.fwd(q, k, v, 0.088, True, False))
    out_bytes = out.numel() * out.element_size()
    lse_bytes = lse.numel() * lse.element_size()
    assert extra <= out_bytes + lse_bytes + MIB, (
        f"forward allocated {extra / MIB:.1f} MiB beyond its inputs; out + lse = {(out_bytes + lse_bytes) / MIB:.1f} MiB"
    )


def test_backward_memory_grows_linearly():
    batch, heads, head_dim = 1, 16, 128
    extras = {}
    for seqlen in (8192, 16384):
        q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16, "cuda")
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.088, True, False)
        dout = torch.randn_like(out)
        args = (dout, q, k, v, out, lse, 0.088, True, False)
        torch.ops.flashattn.bwd(*args)  # warm-up
        _, extras[seqlen] = _peak_extra(lambda: torch.ops.flashattn.bwd(*args))
        input_bytes = q.numel() * q.element_size()
        # dq, dk, dv (3 inputs' worth) plus fp32 workspaces of a few inputs' worth: far below one N^2 matrix.
        assert extras[seqlen] <= 8 * input_bytes, f"backward at N={seqlen} allocated {extras[seqlen] / MIB:.1f} MiB"
        del q, k, v, out, lse, dout, args
    ratio = extras[16384] / extras[8192]
    assert ratio < 2.5, f"backward extra memory grew {ratio:.2f}x from N=8192 to N=16384 (expected ~2x)"
