"""ALiBi (alibi_slopes, FlashAttention-2's bias -slope * |i + Lk - Lq - j|) in flash_attn_func and its packed
forms, flash_attn_with_kvcache and the varlen functions, forward and gradients, against the reference
with the bias written out as an additive mask."""
import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.reference import attention_reference
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


def _bias(slopes, seqlen_q, seqlen_k, heads, causal, window=(-1, -1)):
    """(B or 1, H, Lq, Lk) float64: -slope * |i + Lk - Lq - j|, -inf where causal or the window hide the key."""
    i = torch.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k)
    bias = -slopes.double().reshape(-1, heads)[:, :, None, None].cpu() * (i - j).abs()
    hidden = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool)
    right = 0 if causal else window[1]
    if right >= 0:
        hidden |= j > i + right
    if window[0] >= 0:
        hidden |= j < i - window[0]
    return bias.masked_fill(hidden, float("-inf"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(37, 37), (20, 45), (45, 20)])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
@pytest.mark.parametrize("window", [(-1, -1), (9, 4)], ids=["full", "window"])
def test_alibi_matches_reference(device, causal, seqlen_q, seqlen_k, per_batch, window):
    torch.manual_seed(seqlen_q * 7 + seqlen_k)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, heads_q, heads_kv, head_dim = 2, 6, 2, 32
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    slopes = torch.rand((batch, heads_q) if per_batch else (heads_q,), device=device) * 0.5
    out = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    group = heads_q // heads_kv
    bias = _bias(slopes, seqlen_q, seqlen_k, heads_q, causal, window)
    # GQA: the reference reads each kv head once per query head of its group (autograd sums dk, dv back).
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(ref_leaves[0], ref_leaves[1].repeat_interleave(group, 2),
                              ref_leaves[2].repeat_interleave(group, 2), head_dim ** -0.5, False, False, attn_mask=bias)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double().cpu())
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = attention_reference(base_leaves[0], base_leaves[1].repeat_interleave(group, 2),
                               base_leaves[2].repeat_interleave(group, 2), head_dim ** -0.5, False, False,
                               upcast=False, attn_mask=bias.to(device, dtype))
    base_grads = torch.autograd.grad(base, base_leaves, dout)
    if seqlen_q > seqlen_k and causal:  # the first Lq - Lk rows see no key: out 0 in both
        ref = torch.nan_to_num(ref)
    assert_oracle("out", out.detach().cpu().double(), ref, base.detach().cpu().double(), OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g.cpu().double(), torch.nan_to_num(r), torch.nan_to_num(b.cpu().double()), GRAD_FACTOR)


def _geometric_slopes(heads, device):
    """ALiBi's own slopes, 2^(-8 h / heads) for h = 1..heads."""
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, device=device, dtype=torch.float32) / heads)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (150, 0)), (False, (90, 40))],
                         ids=["full", "causal", "causal_window", "window"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(300, 300), (200, 517), (517, 200)])
def test_alibi_gpu_kernels_match_reference(kernel_path, head_dim, causal, window, seqlen_q, seqlen_k):
    """The sm90 kernels' own term (head dims they serve, several query and key blocks, tail blocks,
    GQA, (batch, heads) slopes, ALiBi's geometric slopes so distant keys still count) and, with the
    planner's force_sm80, the sm80 kernels' additive mask: out and every gradient by the oracle, LSE
    against the reference's."""
    torch.manual_seed(head_dim + seqlen_q + 3 * seqlen_k)
    device, dtype = "cuda", torch.bfloat16
    batch, heads_q, heads_kv = 2, 4, 2
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    slopes = _geometric_slopes(heads_q, device) * torch.tensor([[1.0], [0.5]], device=device)  # (batch, heads)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes,
                                            return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    group = heads_q // heads_kv
    bias = _bias(slopes, seqlen_q, seqlen_k, heads_q, causal, window)
    scale = head_dim ** -0.5
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(ref_leaves[0], ref_leaves[1].repeat_interleave(group, 2),
                              ref_leaves[2].repeat_interleave(group, 2), scale, False, False, attn_mask=bias)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double().cpu())
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = attention_reference(base_leaves[0], base_leaves[1].repeat_interleave(group, 2),
                               base_leaves[2].repeat_interleave(group, 2), scale, False, False,
                               upcast=False, attn_mask=bias.to(device, dtype))
    base_grads = torch.autograd.grad(base, base_leaves, dout)
    empty = ~torch.isfinite(bias).any(-1, keepdim=True).expand(batch, heads_q, seqlen_q, 1)  # rows without keys
    ref, base = torch.nan_to_num(ref), torch.nan_to_num(base)
    assert_oracle("out", out.detach().cpu().double(), ref, base.detach().cpu().double(), OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g.cpu().double(), torch.nan_to_num(r), torch.nan_to_num(b.cpu().double()), GRAD_FACTOR)
    want_lse = _reference_lse(q, k, bias, group)
    seen = ~empty[..., 0]
    torch.testing.assert_close(lse.cpu().double()[seen], want_lse[seen], rtol=1e-2, atol=2e-2)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("extra", ["sink", "dropout", "deterministic"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_gpu_with_sinks_dropout_deterministic(head_dim, extra, causal):
    """ALiBi's term beside attention sinks (their gradient too), dropout (the masked kernels; the
    reference applies the returned keep-mask) and deterministic mode (bitwise equal gradients twice)."""
    torch.manual_seed(head_dim + len(extra))
    device, dtype = "cuda", torch.bfloat16
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = 2, 260, 390, 4, 2
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    slopes = _geometric_slopes(heads_q, device)
    sink = torch.randn(heads_q, device=device, requires_grad=True) if extra == "sink" else None
    dropout_p = 0.1 if extra == "dropout" else 0.0
    leaves = (q, k, v) + ((sink,) if sink is not None else ())

    def run():
        out, _, keep = flashattn.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal, alibi_slopes=slopes,
                                                 deterministic=extra == "deterministic", learnable_sink=sink,
                                                 return_attn_probs=True)
        return out, keep

    out, keep = run()
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    bias = _bias(slopes, seqlen_q, seqlen_k, heads_q, causal)

    def reference(upcast, dev, dt):
        ls = [t.detach().to(dev, torch.float64 if upcast else t.dtype).requires_grad_() for t in leaves]
        r = attention_reference(ls[0], ls[1], ls[2], head_dim ** -0.5, False, False, upcast=upcast,
                                attn_mask=bias.to(dev, dt), dropout_p=dropout_p,
                                dropout_mask=None if keep is None else keep.to(dev),
                                sink=ls[3] if sink is not None else None)
        return torch.nan_to_num(r), [torch.nan_to_num(g) for g in torch.autograd.grad(r, ls, dout.to(dev, r.dtype))]

    ref, ref_grads = reference(True, "cpu", torch.float64)
    base, base_grads = reference(False, device, dtype)
    assert_oracle("out", out.detach().cpu().double(), ref, base.detach().cpu().double(), OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, base_grads):
        assert_oracle(name, g.cpu().double(), r, b.cpu().double(), GRAD_FACTOR)
    if extra == "deterministic":
        again = torch.autograd.grad(run()[0], leaves, dout)
        for g, h in zip(grads, again):
            assert torch.equal(g, h)


def _varlen_reference(leaves, lengths_q, lengths_k, slopes, group, causal, window, upcast, device, dtype,
                      sink=None):
    """The packed output of each sequence's reference with its own ALiBi bias (float64 on the CPU when
    upcast, else in the inputs' dtype on `device`), rows without keys 0."""
    outs, sq, sk = [], 0, 0
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        q, k, v = leaves[0][sq:sq + lq][None], leaves[1][sk:sk + lk][None], leaves[2][sk:sk + lk][None]
        bias = _bias(slopes[b], lq, lk, q.size(2), causal, window).to(device, torch.float64 if upcast else dtype)
        out = attention_reference(q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2), q.size(-1) ** -0.5,
                                  False, False, upcast=upcast, attn_mask=bias, sink=sink)
        outs.append(torch.nan_to_num(out[0]))
        sq, sk = sq + lq, sk + lk
    return torch.cat(outs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_paged_varlen_equals_contiguous(device, causal):
    """flash_attn_varlen_func over a paged cache with ALiBi (on CUDA the decode op, a few queries per
    sequence; on the CPU the gathered pages on the variable-length op) gives what the same call over the
    contiguous rows gives, each sequence's bias from its own key count (seqused_k)."""
    torch.manual_seed(21 + causal)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    heads_q, heads_kv, head_dim, page_size = 8, 2, 64, 16
    lengths_q, lengths_k = [3, 1, 2], [40, 17, 64]
    q = torch.randn(sum(lengths_q), heads_q, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa
    slopes = torch.rand(3, heads_q, device=device) * 0.3
    pages_per_seq = 4
    k_pages = torch.zeros(3 * pages_per_seq + 1, page_size, heads_kv, head_dim, dtype=dtype, device=device)
    v_pages = torch.zeros_like(k_pages)
    order = torch.randperm(3 * pages_per_seq, device=device) + 1  # page 0 is never used
    table = order.reshape(3, pages_per_seq).to(torch.int32)
    start = 0
    for b, n in enumerate(lengths_k):
        for j in range(n):
            k_pages[table[b, j // page_size], j % page_size] = k[start + j]
            v_pages[table[b, j // page_size], j % page_size] = v[start + j]
        start += n
    used = torch.tensor(lengths_k, dtype=torch.int32, device=device)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k_pages, v_pages, cu(lengths_q), None, max(lengths_q), 0,
                                                   seqused_k=used, block_table=table, causal=causal,
                                                   alibi_slopes=slopes, return_attn_probs=True)
    want, want_lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                                         max(lengths_k), causal=causal, alibi_slopes=slopes,
                                                         return_attn_probs=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, want, **tol)
    torch.testing.assert_close(lse, want_lse, **tol)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("num_splits", [1, 3, 0])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged16"])
def test_alibi_gpu_decode_op_matches_reference(head_dim, num_splits, paged):
    """flash_attn_with_kvcache with ALiBi on the decode op (its term from each query's diagonal position:
    two queries, causal, a left-padded sequence, (batch, heads) slopes, GQA, key splits) against the
    reference with the bias written out, out and LSE."""
    torch.manual_seed(head_dim + num_splits)
    device, dtype = "cuda", torch.bfloat16
    batch, seqlen_q, heads_q, heads_kv, capacity = 3, 2, 8, 2, 300
    group = heads_q // heads_kv
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    lengths = torch.tensor([300, 129, 40], dtype=torch.int32, device=device)
    leftpad = torch.tensor([0, 5, 0], dtype=torch.int32, device=device)
    slopes = _geometric_slopes(heads_q, device) * torch.tensor([[1.0], [0.5], [2.0]], device=device)
    kwargs = dict(cache_seqlens=lengths, cache_leftpad=leftpad, causal=True, alibi_slopes=slopes,
                  num_splits=num_splits, return_softmax_lse=True)
    if paged:
        page_size = 16
        pages = capacity // page_size + 1
        table = torch.arange(batch * pages, device=device, dtype=torch.int32).reshape(batch, pages)
        k_pages = torch.zeros(batch * pages, page_size, heads_kv, head_dim, dtype=dtype, device=device)
        v_pages = torch.zeros_like(k_pages)
        k_pages.view(batch, pages * page_size, heads_kv, head_dim)[:, :capacity] = k_cache
        v_pages.view(batch, pages * page_size, heads_kv, head_dim)[:, :capacity] = v_cache
        kwargs.pop("cache_leftpad")  # FlashAttention-2 refuses cache_leftpad with a block_table
        leftpad = torch.zeros_like(leftpad)
        out, lse = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, **kwargs)
    else:
        out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    keys = torch.arange(capacity)
    for b in range(batch):
        n = int(lengths[b])
        position = n - seqlen_q + torch.arange(seqlen_q)  # each query's diagonal position
        bias = -slopes[b].cpu().double()[:, None, None] * (position[:, None] - keys).abs()  # (Hq, Lq, capacity)
        hidden = (keys > position[:, None]) | (keys >= n) | (keys < int(leftpad[b]))
        bias = bias.masked_fill(hidden, float("-inf"))[None]
        kb, vb = (t[b:b + 1].repeat_interleave(group, 2) for t in (k_cache, v_cache))
        ref = attention_reference(q[b:b + 1].double().cpu(), kb.double().cpu(), vb.double().cpu(), head_dim ** -0.5,
                                  False, False, attn_mask=bias)
        base = attention_reference(q[b:b + 1], kb, vb, head_dim ** -0.5, False, False, upcast=False,
                                   attn_mask=bias.to(device, dtype))
        assert_oracle(f"out[{b}]", out[b:b + 1].cpu().double(), ref, base.cpu().double(), OUT_FACTOR)
        want_lse = _reference_lse(q[b:b + 1], k_cache[b:b + 1], bias, group)[0]
        torch.testing.assert_close(lse[b].cpu().double(), want_lse, rtol=1e-3, atol=1e-3)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (70, 0)), (False, (50, 30))],
                         ids=["full", "causal", "causal_window", "window"])
def test_alibi_gpu_varlen_kernels_match_reference(kernel_path, head_dim, causal, window):
    """flash_attn_varlen_func with ALiBi: on sm90 the variable-length kernels' term, each sequence from its
    own diagonal (Lq above, below and equal to Lk, a one-row sequence, GQA, (batch, heads) slopes), with
    force_sm80 the padded batch's mask; out and every gradient by the oracle, the LSE against the
    reference's."""
    torch.manual_seed(head_dim + 17)
    device, dtype = "cuda", torch.bfloat16
    lengths_q, lengths_k = [130, 1, 257, 64], [200, 1, 100, 64]
    heads_q, heads_kv, group = 4, 2, 2
    q = torch.randn(sum(lengths_q), heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa
    slopes = _geometric_slopes(heads_q, device) * torch.tensor([[1.0], [0.5], [2.0], [0.25]], device=device)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                                   max(lengths_k), causal=causal, window_size=window,
                                                   alibi_slopes=slopes, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref = _varlen_reference(ref_leaves, lengths_q, lengths_k, slopes.cpu(), group, causal, window, True, "cpu",
                            dtype)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double().cpu())
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = _varlen_reference(base_leaves, lengths_q, lengths_k, slopes, group, causal, window, False, device, dtype)
    base_grads = torch.autograd.grad(base, base_leaves, dout)
    assert_oracle("out", out.detach().cpu().double(), ref.detach(), base.detach().cpu().double(), OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g.cpu().double(), r, b.cpu().double(), GRAD_FACTOR)
    sq, sk = 0, 0
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        bias = _bias(slopes[b], lq, lk, heads_q, causal, window)
        want = _reference_lse(q[sq:sq + lq][None], k[sk:sk + lk][None], bias, group)[0]  # (Hq, lq)
        seen = torch.isfinite(want)
        torch.testing.assert_close(lse[:, sq:sq + lq].cpu().double()[seen], want[seen], rtol=1e-2, atol=2e-2)
        sq, sk = sq + lq, sk + lk


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("extra", ["sink", "deterministic"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_gpu_varlen_with_sinks_deterministic(head_dim, extra, causal):
    """The variable-length kernels' ALiBi beside attention sinks (their gradient too) and in deterministic
    mode (bitwise equal gradients twice), (heads,) slopes."""
    torch.manual_seed(head_dim + len(extra) + causal)
    device, dtype = "cuda", torch.bfloat16
    lengths_q, lengths_k = [190, 3, 300], [260, 3, 129]
    heads_q, heads_kv, group = 4, 2, 2
    q = torch.randn(sum(lengths_q), heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa
    slopes = _geometric_slopes(heads_q, device)
    sink = torch.randn(heads_q, device=device, requires_grad=True) if extra == "sink" else None
    leaves = (q, k, v) + ((sink,) if sink is not None else ())

    def run():
        return flashattn.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                                max(lengths_k), causal=causal, alibi_slopes=slopes,
                                                deterministic=extra == "deterministic", learnable_sink=sink)

    out = run()
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    per_seq = slopes.expand(len(lengths_q), heads_q)

    def reference(upcast, dev):
        ls = [t.detach().to(dev, torch.float64 if upcast else t.dtype).requires_grad_() for t in leaves]
        r = _varlen_reference(ls, lengths_q, lengths_k, per_seq.to(dev), group, causal, (-1, -1), upcast, dev, dtype,
                              sink=ls[3] if sink is not None else None)
        return r, torch.autograd.grad(r, ls, dout.to(dev, r.dtype))

    ref, ref_grads = reference(True, "cpu")
    base, base_grads = reference(False, device)
    assert_oracle("out", out.detach().cpu().double(), ref.detach(), base.detach().cpu().double(), OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, base_grads):
        assert_oracle(name, g.cpu().double(), r, b.cpu().double(), GRAD_FACTOR)
    if extra == "deterministic":
        again = torch.autograd.grad(run(), leaves, dout)
        for g, h in zip(grads, again):
            assert torch.equal(g, h)


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_packed_forms_equal_the_plain_call(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn(2, 19, 4, 32, dtype=dtype, device=device) for _ in range(3))
    slopes = torch.rand(4, device=device) * 0.3
    plain = flashattn.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    torch.testing.assert_close(flashattn.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), causal=True,
                                                                  alibi_slopes=slopes), plain, rtol=0, atol=0)
    torch.testing.assert_close(flashattn.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), causal=True,
                                                                   alibi_slopes=slopes), plain, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_kvcache(device, causal):
    """Each sequence's queries at their own diagonal (cache_seqlens after the append), left padding never
    attended (on CUDA the decode op at this head dim, on the CPU the batched kernels)."""
    torch.manual_seed(3)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, seqlen_q, heads_q, heads_kv, head_dim, capacity = 3, 2, 4, 2, 32, 40
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    lengths = torch.tensor([5, 40, 23], dtype=torch.int32, device=device)
    leftpad = torch.tensor([0, 6, 2], dtype=torch.int32, device=device)
    slopes = torch.rand(batch, heads_q, device=device) * 0.4
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=leftpad,
                                            causal=causal, alibi_slopes=slopes)
    for b in range(batch):
        n, lp = int(lengths[b]), int(leftpad[b])
        bias = _bias(slopes[b], seqlen_q, n, heads_q, causal)
        bias[..., :lp] = float("-inf")
        ks, vs = (t[b:b + 1, :n].repeat_interleave(heads_q // heads_kv, 2) for t in (k_cache, v_cache))
        ref = attention_reference(q[b:b + 1].double().cpu(), ks.double().cpu(), vs.double().cpu(), head_dim ** -0.5,
                                  False, False, attn_mask=bias)
        base = attention_reference(q[b:b + 1], ks, vs, head_dim ** -0.5, False, False, upcast=False,
                                   attn_mask=bias.to(device, dtype))
        assert_oracle(f"out[{b}]", out[b:b + 1].cpu().double(), ref, base.cpu().double(), OUT_FACTOR)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_varlen_equals_per_sequence_calls(device, causal):
    """The packed batch with ALiBi gives each sequence what flash_attn_func gives it alone (its own
    diagonal), forward and gradients."""
    torch.manual_seed(5)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lengths_q, lengths_k = [7, 30, 1], [7, 30, 1] if causal else [12, 30, 4]
    heads, head_dim = 4, 32
    q = torch.randn(sum(lengths_q), heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), heads, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa
    slopes = torch.rand(3, heads, device=device) * 0.5
    out = flashattn.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
                                           causal=causal, alibi_slopes=slopes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    sq, sk = 0, 0
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        rows_q, rows_k = slice(sq, sq + lq), slice(sk, sk + lk)
        leaves = [t[rows][None].detach().clone().requires_grad_() for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k))]
        want = flashattn.flash_attn_func(*leaves, causal=causal, alibi_slopes=slopes[b])
        want_grads = torch.autograd.grad(want, leaves, dout[rows_q][None])
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out[rows_q], want[0], **tol)
        for g, w, rows in zip(grads, want_grads, (rows_q, rows_k, rows_k)):
            torch.testing.assert_close(g[rows], w[0], **tol)
        sq, sk = sq + lq, sk + lk


def test_alibi_argument_errors():
    q, k, v = (torch.randn(2, 5, 4, 8) for _ in range(3))
    with pytest.raises(ValueError, match="alibi_slopes must be a float32"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4, dtype=torch.float16))
    with pytest.raises(ValueError, match="alibi_slopes must be a float32"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3, 4))
    with pytest.raises(TypeError, match="alibi_slopes must be a torch.Tensor"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=[0.5] * 4)
    with pytest.raises(NotImplementedError, match="alibi_slopes with softcap"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4), softcap=10.0)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    pages = torch.randn(3, 4, 4, 8)
    with pytest.raises(ValueError, match="alibi_slopes must be a float32"):
        flashattn.flash_attn_varlen_func(torch.randn(2, 4, 8), pages, pages, cu, None, 1, 8,
                                         seqused_k=torch.tensor([3, 4], dtype=torch.int32),
                                         block_table=torch.tensor([[0, 1], [2, 0]], dtype=torch.int32),
                                         alibi_slopes=torch.ones(3))


def _reference_lse(q, k, bias, group):
    """(B, Hq, Lq) float64 LSE of the scaled scores plus the bias; -inf for a row that sees no key."""
    qd = q.detach().double().cpu().transpose(1, 2)
    kd = k.detach().double().cpu().repeat_interleave(group, 2).transpose(1, 2)
    scores = qd @ kd.transpose(-1, -2) * q.size(-1) ** -0.5 + bias
    return torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(37, 37), (20, 45), (45, 20)])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
@pytest.mark.parametrize("window", [(-1, -1), (9, 4)], ids=["full", "window"])
def test_alibi_lse_matches_reference(device, causal, seqlen_q, seqlen_k, per_batch, window):
    """The returned softmax_lse carries the bias whole, whichever form the kernels ran (a term per key, with
    the row's part added back, or a mask per score)."""
    torch.manual_seed(seqlen_q + 3 * seqlen_k)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, heads_q, heads_kv, head_dim = 2, 6, 3, 32
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    slopes = torch.rand((batch, heads_q) if per_batch else (heads_q,), device=device) * 0.5
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes,
                                            return_attn_probs=True)
    ref = _reference_lse(q, k, _bias(slopes, seqlen_q, seqlen_k, heads_q, causal, window), heads_q // heads_kv)
    seen = torch.isfinite(ref)  # rows that see some key
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu().double()[seen], ref[seen], **tol)
    plain = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)[1]
    torch.testing.assert_close(lse.cpu()[~seen], plain.cpu()[~seen], rtol=0, atol=0)  # as without ALiBi


def test_alibi_reaches_the_op_as_slopes(monkeypatch):
    """flash_attn_func hands ALiBi to the op as its slopes (the sm90 kernels add the term; no mask is
    built in Python), in the op's (heads,) or (batch, heads) form; the varlen functions hand them to the
    variable-length op where it serves the call, and their padded path (here: dropout) takes causal ALiBi
    as a per-key mask (zero query stride, B * H * Lk floats)."""
    seen = []
    attention = flashattn.ops.attention

    def spy(q, k, v, scale, is_causal, causal_bottom_right, deterministic=False, attn_mask=None, *args, **kwargs):
        seen.append((is_causal, attn_mask, kwargs.get("alibi_slopes")))
        return attention(q, k, v, scale, is_causal, causal_bottom_right, deterministic, attn_mask, *args, **kwargs)

    monkeypatch.setattr(flashattn.ops, "attention", spy)
    batch, seqlen_q, seqlen_k, heads = 2, 30, 50, 4
    q = torch.randn(batch, seqlen_q, heads, 16)
    k, v = (torch.randn(batch, seqlen_k, heads, 16) for _ in range(2))
    slopes = torch.rand(heads) * 0.5
    for causal, window in ((True, (-1, -1)), (True, (8, 0)), (False, (-1, -1))):
        flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes)
        is_causal, mask, passed = seen[-1]
        assert is_causal == causal and mask is None and torch.equal(passed, slopes)
    per_batch = torch.rand(batch, heads) * 0.5
    flashattn.flash_attn_func(q, k, v, alibi_slopes=per_batch)
    assert torch.equal(seen[-1][2], per_batch)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    varlen_seen = []
    varlen_fwd = flashattn.ops.varlen_fwd
    monkeypatch.setattr(flashattn.ops, "varlen_fwd",
                        lambda *args: varlen_seen.append(args[-1]) or varlen_fwd(*args))
    flashattn.flash_attn_varlen_func(q[0], k[0, :30], v[0, :30], cu, cu, 20, 20, causal=True, alibi_slopes=slopes)
    assert len(varlen_seen) == 1 and torch.equal(varlen_seen[0], slopes)
    calls = len(seen)
    flashattn.flash_attn_varlen_func(q[0], k[0, :30], v[0, :30], cu, cu, 20, 20, causal=True, dropout_p=0.1,
                                     alibi_slopes=slopes)  # dropout: the padded batch
    assert len(varlen_seen) == 1 and len(seen) == calls + 1
    assert seen[-1][1].stride(2) == 0 and seen[-1][1].untyped_storage().nbytes() == 2 * heads * 20 * 4


@pytest.mark.parametrize("causal,window,bottom_right", [(False, (-1, -1), True), (True, (-1, -1), True),
                                                        (True, (-1, -1), False), (True, (5, 0), True),
                                                        (False, (4, 9), True), (True, (-1, -1), "sink")])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(37, 37), (20, 45), (45, 20)])
def test_op_alibi_equals_its_bias_as_a_mask(causal, window, bottom_right, seqlen_q, seqlen_k):
    """flashattn.fwd / bwd with alibi_slopes against the same op with ALiBi's bias as an additive mask
    (the window folded into it), in float64 on the CPU: out, lse and every gradient. Causal masking on
    ALiBi's diagonal or left of it (bottom-right, or top-left with Lq <= Lk) takes the op's per-key form
    (alibi.h), the rest the whole bias; a sink always the whole bias. (The CUDA kernels' term is
    checked against the reference by the tests above.)"""
    torch.manual_seed(11)
    device, dtype = "cpu", torch.float64
    batch, heads_q, heads_kv, head_dim = 2, 4, 2, 64
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
            for _ in range(2))
    slopes = torch.rand(batch, heads_q, device=device) * 0.5
    sink = torch.randn(heads_q, dtype=dtype, requires_grad=True) if bottom_right == "sink" else None
    bottom_right = bottom_right is not False
    scale = head_dim ** -0.5
    out, lse = flashattn.ops.attention(q, k, v, scale, causal, bottom_right, window_left=window[0],
                                       window_right=window[1], sink=sink, alibi_slopes=slopes)
    per_key = causal and window == (-1, -1) and sink is None and (bottom_right or seqlen_q <= seqlen_k)
    # The whole bias in float32, as the op builds it (a float32 slope times a distance, rounded once): the
    # same mask, so the same result up to float64 rounding. The per-key form's float32 terms,
    # slope * (j - Lk // 2), round differently (2^-24 of up to 0.5 * 23 each), so that form is held to the
    # exact (float64) bias within a tolerance of that size.
    bias = _bias(slopes, seqlen_q, seqlen_k, heads_q, False, window)
    if not per_key:
        bias = bias.float()
    if causal and not bottom_right:  # the causal mask on the top-left diagonal, ALiBi's distances as always
        bias = bias.masked_fill(torch.arange(seqlen_k) > torch.arange(seqlen_q)[:, None], float("-inf"))
    elif causal:
        bias = bias.masked_fill(torch.arange(seqlen_k) > torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q,
                                float("-inf"))
    want_out, want_lse = flashattn.ops.attention(q, k, v, scale, False, True, sink=sink,
                                                 attn_mask=bias.expand(batch, heads_q, seqlen_q, seqlen_k))
    tol = dict(rtol=1e-5, atol=1e-5) if per_key else dict(rtol=1e-9, atol=1e-9)
    seen = torch.isfinite(want_lse)
    torch.testing.assert_close(out, want_out, **tol)
    torch.testing.assert_close(lse[seen], want_lse[seen], **tol)
    assert torch.equal(torch.isfinite(lse), seen)
    dout = torch.randn_like(out)
    leaves = (q, k, v) + ((sink,) if sink is not None else ())
    grads = torch.autograd.grad(out, leaves, dout)
    want = torch.autograd.grad(want_out, leaves, dout)
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp, **tol)


def test_op_alibi_argument_errors():
    q = torch.randn(2, 8, 4, 16)
    k = v = torch.randn(2, 8, 2, 16)
    op = torch.ops.flashattn.fwd
    with pytest.raises(RuntimeError, match="alibi_slopes must have shape"):
        op(q, k, v, 0.25, False, True, alibi_slopes=torch.ones(3))
    with pytest.raises(RuntimeError, match="alibi_slopes must be float32"):
        op(q, k, v, 0.25, False, True, alibi_slopes=torch.ones(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="alibi_slopes must be contiguous"):
        op(q, k, v, 0.25, False, True, alibi_slopes=torch.ones(4, 2).t())
    with pytest.raises(RuntimeError, match="alibi_slopes with softcap is not supported"):
        op(q, k, v, 0.25, False, True, softcap=5.0, alibi_slopes=torch.ones(4))
    with pytest.raises(RuntimeError, match="alibi_slopes with an attn_mask is not supported"):
        op(q, k, v, 0.25, False, True, attn_mask=torch.ones(2, 4, 8, 8, dtype=torch.bool), alibi_slopes=torch.ones(4))


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_varlen_lse_equals_per_sequence_calls(device):
    torch.manual_seed(6)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lengths = [7, 30, 1]
    heads, head_dim = 4, 32
    q, k, v = (torch.randn(sum(lengths), heads, head_dim, dtype=dtype, device=device) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    slopes = torch.rand(3, heads, device=device) * 0.5
    _, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                                 alibi_slopes=slopes, return_attn_probs=True)
    start = 0
    for b, n in enumerate(lengths):
        rows = slice(start, start + n)
        _, want, _ = flashattn.flash_attn_func(q[rows][None], k[rows][None], v[rows][None], causal=True,
                                               alibi_slopes=slopes[b], return_attn_probs=True)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
        torch.testing.assert_close(lse[:, rows], want[0], **tol)
        start += n
