"""Dropout on the CUDA kernels.

The keep-mask is a pure function of (seed, offset, batch, head, query, key) (csrc/common/dropout.h),
so the CUDA keep-mask op must equal the CPU one bit for bit, and the kernels' output and gradients
must equal reference attention with that same mask applied, under the oracle of GUIDE section 4 (the
forward and the backward regenerate the mask independently: a mismatch between them fails the
gradient checks).
"""
import math

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES, GRAD_FACTOR, OUT_FACTOR, assert_oracle, make_qkv

from conftest import requires_cuda
from test_gpu_masks import make_mask_source

pytestmark = requires_cuda


def _rng(seed, offset, device="cuda"):
    return torch.tensor([seed, offset], dtype=torch.int64, device=device)


def check_dropout(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, dropout_p, seed=1,
                  mask=None, layout="contiguous", deterministic=False):
    """Runs ops.attention with dropout through autograd and checks out, dq, dk, dv (and a float mask's
    gradient) against the reference under the keep-mask the op exposes for the same rng_state."""
    is_causal, bottom_right = CAUSAL_MODES[causal]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", layout)
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    scale = head_dim**-0.5
    rng_state = _rng(seed, 7 * seed + 3)
    keep = ops.dropout_keep_mask(rng_state, batch, heads_q, seqlen_q, seqlen_k, dropout_p)  # [B, Hq, Lq, Lk]
    source, view = (None, None) if mask is None else make_mask_source(*mask, batch, heads_q, seqlen_q, seqlen_k, dtype)
    mask_grad = source is not None and source.dtype != torch.bool

    def run(attention, cast):
        leaves = [cast(t).detach().clone().requires_grad_() for t in (q, k, v)]
        extra = []
        attn_mask = None
        if source is not None:
            mask_source = source if source.dtype == torch.bool else cast(source).detach().clone()
            mask_source.requires_grad_(mask_grad)
            attn_mask = view(mask_source)
            extra = [mask_source] if mask_grad else []
        out = attention(leaves, attn_mask)
        out = out[0] if isinstance(out, tuple) else out
        return out, torch.autograd.grad(out, leaves + extra, dout.to(out.dtype))

    out, grads = run(lambda ls, m: ops.attention(*ls, scale, is_causal, bottom_right, deterministic, m,
                                                 dropout_p=dropout_p, rng_state=rng_state), lambda t: t)
    ref_out, ref_grads = run(lambda ls, m: attention_reference(*ls, scale, is_causal, bottom_right, attn_mask=m,
                                                               dropout_p=dropout_p, dropout_mask=keep),
                             lambda t: t.float())
    base_out, base_grads = run(lambda ls, m: attention_reference(*ls, scale, is_causal, bottom_right, upcast=False,
                                                                 attn_mask=m, dropout_p=dropout_p, dropout_mask=keep),
                               lambda t: t.to(dtype))
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dmask"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)


# No row of a single key only (Lk = 1, or Lq = Lk = 1 under causal masking) as the only row: there the
# exact dq is identically 0 while the backward's delta = rowsum(dO * O) comes from the rounded output
# (scaled by 1 / (1 - p)), the known limit in README's Limits; tests/test_cpu_dropout.py checks that
# case in float32 instead.
SEQLENS = [(3, 5), (17, 17), (97, 203), (203, 97), (256, 256), (1025, 1025)]


def _cases():
    cases = []
    heads = [(2, 4, 4), (1, 8, 2)]
    head_dims = [64, 128, 40, 256, 96, 192, 72, 32]
    i = 0
    for seqlens in SEQLENS:
        for causal in ("none", "top_left", "bottom_right"):
            for p in (0.1, 0.5):
                dtype = [torch.bfloat16, torch.float16][i % 2]
                b, hq, hk = heads[i % 2]
                d = head_dims[i % len(head_dims)]
                name = f"{seqlens[0]}x{seqlens[1]}-{causal}-p{p}-d{d}-h{hq}/{hk}-{dtype}".replace("torch.", "")
                cases.append(pytest.param(b, seqlens, hq, hk, d, dtype, causal, p, id=name))
                i += 1
    return cases


@pytest.mark.parametrize("batch,seqlens,heads_q,heads_kv,head_dim,dtype,causal,dropout_p", _cases())
def test_dropout_oracle(batch, seqlens, heads_q, heads_kv, head_dim, dtype, causal, dropout_p):
    check_dropout(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal, dropout_p)


@pytest.mark.parametrize("batch,seqlens,heads_q,heads_kv,head_dim,dtype,causal,dropout_p", _cases()[::3])
def test_dropout_oracle_on_the_sm80_path(batch, seqlens, heads_q, heads_kv, head_dim, dtype, causal, dropout_p,
                                         plan_options):
    plan_options(force_sm80=True)
    check_dropout(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal, dropout_p)


@pytest.mark.parametrize("mask", [("bool", "b11k"), ("float", "bhqk"), ("bool", "blocks"), ("float", "empty_rows")])
@pytest.mark.parametrize("seqlens", [(97, 203), (300, 300)])
def test_dropout_with_masks(mask, seqlens):
    check_dropout(2, seqlens[0], seqlens[1], 4, 2, 64, torch.bfloat16, "none", 0.2, mask=mask)


@pytest.mark.parametrize("layout", ["bhsd", "unaligned"])
def test_dropout_with_strided_inputs(layout):
    check_dropout(2, 130, 250, 4, 2, 80, torch.float16, "bottom_right", 0.3, layout=layout)


@pytest.mark.parametrize("shape", [(2, 3, 37, 201), (1, 2, 256, 256), (3, 1, 1, 5)])
def test_keep_mask_matches_the_cpu_formula(shape):
    rng_cpu = _rng(123456789012345, 987654321, "cpu")
    on_gpu = ops.dropout_keep_mask(rng_cpu.cuda(), *shape, 0.3)
    on_cpu = ops.dropout_keep_mask(rng_cpu, *shape, 0.3)
    assert on_gpu.dtype == torch.bool and on_gpu.shape == shape
    assert torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.parametrize("dropout_p", [0.05, 0.1, 0.5, 0.9])
def test_kept_fraction(dropout_p):
    keep = ops.dropout_keep_mask(_rng(5, 11), 4, 8, 512, 512, dropout_p)
    n = keep.numel()
    kept = keep.sum().item() / n
    sigma = math.sqrt(dropout_p * (1 - dropout_p) / n)
    assert abs(kept - (1 - dropout_p)) < 5 * sigma


def test_same_rng_state_is_bitwise_reproducible_and_seeds_differ():
    q, k, v = make_qkv(2, 300, 300, 4, 4, 64, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)

    def run(rng_state):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = ops.attention(*leaves, 0.125, False, False, True, dropout_p=0.2, rng_state=rng_state)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    first, second, other = run(_rng(1, 2)), run(_rng(1, 2)), run(_rng(2, 2))
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_manual_seed_reproduces_a_run():
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.float16, "cuda")
    torch.manual_seed(0)
    a, _ = ops.attention(q, k, v, 0.125, False, False, dropout_p=0.3)
    b, _ = ops.attention(q, k, v, 0.125, False, False, dropout_p=0.3)
    torch.manual_seed(0)
    c, _ = ops.attention(q, k, v, 0.125, False, False, dropout_p=0.3)
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_cuda_graph_replays_draw_new_masks():
    """rng_state is drawn inside the graph, so every replay drops a different set; each replay's
    output is still the reference under the keep-mask of the rng_state it drew."""
    q, k, v = make_qkv(1, 200, 200, 2, 2, 64, torch.bfloat16, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside capture
            rng_state = ops.draw_rng_state(q.device)
            out, _ = ops.fwd(q, k, v, 0.125, False, False, None, 0.25, rng_state)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rng_state = ops.draw_rng_state(q.device)
        out, _ = ops.fwd(q, k, v, 0.125, False, False, None, 0.25, rng_state)
    seen = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        keep = ops.dropout_keep_mask(rng_state, 1, 2, 200, 200, 0.25)
        ref = attention_reference(q.float(), k.float(), v.float(), 0.125, dropout_p=0.25, dropout_mask=keep)
        base = attention_reference(q, k, v, 0.125, upcast=False, dropout_p=0.25, dropout_mask=keep)
        assert_oracle("out", out, ref, base, OUT_FACTOR)
        seen.append(rng_state.clone())
    assert not torch.equal(seen[0], seen[1])


def test_sdpa_drop_in_runs_dropout_on_the_kernels(recwarn):
    """No fallback warning, and the output is that of some keep-mask: rows are finite and the mean
    over many heads is close to that without dropout (dropout keeps the expectation)."""
    q, k, v = (torch.randn(2, 64, 256, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    assert not [w for w in recwarn.list if "falls back" in str(w.message) or "fall back" in str(w.message)]
    plain = flashattn.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all()
    assert (out.float() - plain.float()).mean().abs().item() < 0.01


def test_flash_attn_func_exposes_the_keep_mask():
    q, k, v = make_qkv(2, 150, 170, 4, 2, 64, torch.bfloat16, "cuda")
    out, lse, keep = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, return_attn_probs=True)
    assert keep.shape == (2, 4, 150, 170) and keep.dtype == torch.bool
    ref = attention_reference(q.float(), k.float(), v.float(), 64**-0.5, True, True, dropout_p=0.2, dropout_mask=keep)
    base = attention_reference(q, k, v, 64**-0.5, True, True, upcast=False, dropout_p=0.2, dropout_mask=keep)
    assert_oracle("out", out, ref, base, OUT_FACTOR)


def test_dropout_memory_is_linear_in_seqlen():
    """Forward + backward with dropout at N = 32k allocate nothing quadratic: the keep-mask is
    regenerated, never stored (an [H, N, N] bool mask alone would be 16 GiB here)."""
    batch, seqlen, heads, head_dim = 1, 32768, 16, 128
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out, _ = ops.attention(q, k, v, head_dim**-0.5, False, False, dropout_p=0.1, rng_state=_rng(3, 4))
    torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    per_token = batch * seqlen * heads * head_dim * 2  # one [B, N, H, D] bf16 tensor
    # out, dq, dk, dv, the fp32 dq workspace (2 tensors' worth) and small row buffers: well under 10.
    assert peak < 10 * per_token, f"peak extra memory {peak / 2**20:.0f} MiB"
