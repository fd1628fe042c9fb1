"""A value head dim different from the query/key head dim (DeepSeek-style 192 / 128, and 128 / 64; also
a value wider than the query) against the oracle, through the SDPA drop-in, the FlashAttention-2 API and
the varlen functions: out and every gradient against a float64 reference (flashattn.reference takes
any value head dim), with the FlashAttention-2 rule of GUIDE section 4. CPU cases run everywhere; CUDA
cases where a GPU is.
"""
import warnings

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES, GRAD_FACTOR, OUT_FACTOR, assert_attention_oracle, assert_oracle

from conftest import requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

# (query/key head dim, value head dim)
DIMS = [(192, 128), (128, 64), (64, 128), (40, 24)]


def _dtypes(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.bfloat16, torch.float16]


def _qkv(b, lq, lk, hq, hk, d, dv, dtype, device):
    q = torch.randn(b, lq, hq, d, dtype=dtype, device=device)
    k = torch.randn(b, lk, hk, d, dtype=dtype, device=device)
    v = torch.randn(b, lk, hk, dv, dtype=dtype, device=device)
    return q, k, v


def _reference(q, k, v, dout, scale, causal, bottom_right, upcast=True, dropout_p=0.0, keep=None):
    """(out, lse, grads of q, k, v): float64 with upcast, else in q's dtype."""
    dtype = torch.float64 if upcast else q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_reference(*leaves, scale, causal, bottom_right, upcast=upcast, return_lse=True,
                                   dropout_p=dropout_p, dropout_mask=keep)
    return out.detach(), lse.detach(), torch.autograd.grad(out, leaves, dout.to(dtype))


def _judge(out, lse, grads, q, k, v, dout, scale, causal, bottom_right, dropout_p=0.0, keep=None):
    ref = _reference(q, k, v, dout, scale, causal, bottom_right, True, dropout_p, keep)
    base = _reference(q, k, v, dout, scale, causal, bottom_right, False, dropout_p, keep)
    assert out.shape == ref[0].shape
    assert_attention_oracle(out, lse, grads, ref, base)


def _judge_without_lse(out, grads, q, k, v, dout, scale, causal, bottom_right):
    """As _judge for calls that return no lse: out and the gradients of q, k and v."""
    ref = _reference(q, k, v, dout, scale, causal, bottom_right)
    base = _reference(q, k, v, dout, scale, causal, bottom_right, upcast=False)
    assert_oracle("out", out, ref[0], base[0], OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref[2], base[2]):
        assert_oracle(name, g, r, b, GRAD_FACTOR)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("causal_mode", ["none", "bottom_right", "top_left"])
def test_flash_attn_func_value_head_dim(device, dims, causal_mode):
    d, dv = dims
    causal, bottom_right = CAUSAL_MODES[causal_mode]
    for dtype in _dtypes(device):
        q, k, v = _qkv(2, 37, 53 if causal_mode != "top_left" else 37, 4, 2, d, dv, dtype, device)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        scale = d ** -0.5
        out, lse = ops.attention(*leaves, scale, causal, bottom_right)
        assert out.shape == (2, 37, 4, dv) and out.is_contiguous()
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, leaves, dout)
        _judge(out.detach(), lse, grads, q, k, v, dout, scale, causal, bottom_right)
        # The FlashAttention-2 API: the default scale is q's head dim's, not the padded one's.
        if causal_mode != "top_left":
            api = flashattn.flash_attn_func(q, k, v, causal=causal)
            torch.testing.assert_close(api, out.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_value_head_dim_with_dropout(device):
    """The keep-mask does not depend on the head dims: the padded call drops what the reference drops."""
    dtype = _dtypes(device)[-1]
    q, k, v = _qkv(2, 45, 45, 4, 4, 128, 64, dtype, device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    rng_state = ops.draw_rng_state(q.device)
    keep = ops.dropout_keep_mask(rng_state, 2, 4, 45, 45, 0.2)
    out, lse = ops.attention(*leaves, 128 ** -0.5, True, True, dropout_p=0.2, rng_state=rng_state)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    _judge(out.detach(), lse, grads, q, k, v, dout, 128 ** -0.5, True, True, 0.2, keep)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(192, 128), (64, 128)], ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_value_head_dim(device, dims, is_causal):
    """The SDPA drop-in serves it (no fallback warning): out and the gradients against the oracle."""
    d, dv = dims
    dtype = _dtypes(device)[-1]
    q = torch.randn(2, 4, 29, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(2, 4, 29, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(2, 4, 29, dv, dtype=dtype, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*falling back")
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 4, 29, dv)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # In the (B, S, H, D) layout of the reference.
    bshd = [t.detach().transpose(1, 2) for t in (q, k, v)]
    _judge_without_lse(out.detach().transpose(1, 2), [g.transpose(1, 2) for g in grads], *bshd, dout.transpose(1, 2),
                       d ** -0.5, is_causal, False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(192, 128), (128, 64)], ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_value_head_dim(device, dims, causal):
    """flash_attn_varlen_func: each sequence's out and gradients against the oracle on that sequence alone."""
    d, dv = dims
    dtype = _dtypes(device)[-1]
    lengths_q, lengths_k = [17, 64, 1, 40], [23, 64, 9, 33]
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lengths_k).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lengths_q), 4, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(sum(lengths_k), 2, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(sum(lengths_k), 2, dv, dtype=dtype, device=device, requires_grad=True)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
    assert out.shape == (sum(lengths_q), 4, dv)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for i in range(len(lengths_q)):
        rows_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rows_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
        parts = [t.detach()[rows][None] for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k))]
        sequence_grads = [g[rows][None] for g, rows in zip(grads, (rows_q, rows_k, rows_k))]
        _judge_without_lse(out.detach()[rows_q][None], sequence_grads, *parts, dout[rows_q][None], d ** -0.5, causal,
                           True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(192, 128), (64, 128)], ids=lambda d: f"{d[0]}-{d[1]}")
def test_paged_varlen_value_head_dim(device, dims):
    """flash_attn_varlen_func over a paged cache whose value pages have their own head dim (seqused_k,
    the pages scattered): each sequence's out and LSE against the oracle on its own keys."""
    d, dv = dims
    dtype = _dtypes(device)[-1]
    lengths_q, used, heads_q, heads_kv, page, pages_per_seq = [3, 1, 5], [20, 7, 32], 4, 2, 8, 4
    batch = len(lengths_q)
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lengths_q), heads_q, d, dtype=dtype, device=device)
    k_cache = torch.randn(batch * pages_per_seq, page, heads_kv, d, dtype=dtype, device=device)
    v_cache = torch.randn(batch * pages_per_seq, page, heads_kv, dv, dtype=dtype, device=device)
    order = torch.randperm(batch * pages_per_seq, generator=torch.Generator().manual_seed(4))
    block_table = order.view(batch, pages_per_seq).to(torch.int32).to(device)
    seqused_k = torch.tensor(used, dtype=torch.int32, device=device)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, max(lengths_q), None, causal=True,
                                                   block_table=block_table, seqused_k=seqused_k,
                                                   return_attn_probs=True)
    assert out.shape == (sum(lengths_q), heads_q, dv)
    for b in range(batch):
        rows_q = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys, values = (c[block_table[b].long()].reshape(-1, heads_kv, c.size(-1))[:used[b]][None]
                        for c in (k_cache, v_cache))
        dout = torch.zeros(1, lengths_q[b], heads_q, dv, dtype=dtype, device=device)
        ref = _reference(q[rows_q][None], keys, values, dout, d ** -0.5, True, True)
        base = _reference(q[rows_q][None], keys, values, dout, d ** -0.5, True, True, upcast=False)
        assert_oracle("out", out[rows_q][None], ref[0], base[0], OUT_FACTOR)
        torch.testing.assert_close(lse[:, rows_q].double(), ref[1][0].to(lse.device), rtol=0, atol=2e-3)


def test_key_head_dim_mismatch_still_raises():
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 7, 2, 16), torch.randn(1, 7, 2, 8)
    with pytest.raises(RuntimeError, match="same head dim"):
        flashattn.flash_attn_func(q, k, v)


def test_value_head_dim_under_compile():
    """torch.compile traces the padding (no graph break)."""
    q, k, v = torch.randn(1, 9, 2, 32), torch.randn(1, 9, 2, 32), torch.randn(1, 9, 2, 16)
    fn = torch.compile(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True), fullgraph=True,
                       backend="eager")
    torch.testing.assert_close(fn(q, k, v), flashattn.flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dims", [(192, 128), (64, 128)], ids=lambda d: f"{d[0]}-{d[1]}")
def test_kvcache_value_head_dim(device, paged, dims):
    """flash_attn_with_kvcache with a value cache of its own head dim: the append writes both caches and
    the attention over each sequence's keys matches the oracle (the batched kernels over padded copies)."""
    d, dv = dims
    dtype = _dtypes(device)[-1]
    batch, seqlen_q, seqlen_new, heads_q, heads_kv, page = 3, 4, 4, 4, 2, 16
    cached = [0, 21, 40]
    capacity = 48
    q = torch.randn(batch, seqlen_q, heads_q, d, dtype=dtype, device=device)
    k_rows = torch.randn(batch, capacity, heads_kv, d, dtype=dtype, device=device)
    v_rows = torch.randn(batch, capacity, heads_kv, dv, dtype=dtype, device=device)
    k_new = torch.randn(batch, seqlen_new, heads_kv, d, dtype=dtype, device=device)
    v_new = torch.randn(batch, seqlen_new, heads_kv, dv, dtype=dtype, device=device)
    block_table = None
    if paged:
        # Sequence b's rows on pages in reverse order: pages_per_seq * (batch - 1 - b) + p.
        pages_per_seq = capacity // page
        order = [pages_per_seq * (batch - 1 - b) + p for b in range(batch) for p in range(pages_per_seq)]
        block_table = torch.tensor(order, dtype=torch.int32, device=device).view(batch, pages_per_seq)
        k_cache = torch.empty(batch * pages_per_seq, page, heads_kv, d, dtype=dtype, device=device)
        v_cache = torch.empty(batch * pages_per_seq, page, heads_kv, dv, dtype=dtype, device=device)
        k_cache[block_table.flatten().long()] = k_rows.reshape(-1, page, heads_kv, d)
        v_cache[block_table.flatten().long()] = v_rows.reshape(-1, page, heads_kv, dv)
    else:
        k_cache, v_cache = k_rows.clone(), v_rows.clone()
    cache_seqlens = torch.tensor(cached, dtype=torch.int32, device=device)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                                 block_table=block_table, causal=True, return_softmax_lse=True)
    assert out.shape == (batch, seqlen_q, heads_q, dv)
    for b, n in enumerate(cached):
        k_rows[b, n:n + seqlen_new], v_rows[b, n:n + seqlen_new] = k_new[b], v_new[b]
    if paged:
        got_v = v_cache[block_table.long()].reshape(batch, capacity, heads_kv, dv)
    else:
        got_v = v_cache
    assert torch.equal(got_v, v_rows), "the value cache holds the appended rows"
    for b, n in enumerate(cached):
        parts = (q[b:b + 1], k_rows[b:b + 1, :n + seqlen_new], v_rows[b:b + 1, :n + seqlen_new])
        dout = torch.zeros(1, seqlen_q, heads_q, dv, dtype=dtype, device=device)
        ref = _reference(*parts, dout, d ** -0.5, True, True)
        base = _reference(*parts, dout, d ** -0.5, True, True, upcast=False)
        assert_oracle("out", out[b:b + 1], ref[0], base[0], OUT_FACTOR)
        torch.testing.assert_close(lse[b:b + 1].double(), ref[1].to(lse.device), rtol=0, atol=2e-3)
