"""flash_attn_with_kvcache (flashattn.kvcache) against the oracle, sequence by sequence, on the CPU and
on CUDA: decoding steps and chunks of new tokens appended to caches of different lengths."""
import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.testing import OUT_FACTOR, assert_oracle, reference_and_baseline

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


def _expected(q, k_full, v_full, lengths, scale, causal):
    """Per sequence: the oracle's (ref_out, ref_lse) and the baseline's out, over the first lengths[b] keys."""
    refs, bases, lses = [], [], []
    for b, n in enumerate(lengths):
        (ref_out, _, ref_lse), (base_out, _) = reference_and_baseline(
            q[b:b + 1], k_full[b:b + 1, :n], v_full[b:b + 1, :n], torch.zeros_like(q[b:b + 1]), scale, causal, True)
        refs.append(ref_out)
        bases.append(base_out)
        lses.append(ref_lse)
    return torch.cat(refs), torch.cat(bases), torch.cat(lses)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_new", [(1, 1), (1, 0), (5, 5), (7, 3)])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(4, 4, 64), (8, 2, 128)])
def test_kvcache_matches_oracle(device, causal, seqlen_q, seqlen_new, heads_q, heads_kv, head_dim):
    dtype = torch.bfloat16
    batch, seqlen_cache = 3, 200
    cached = [0, 57, 190]  # before the append; 190 + 7 queries fit, and a sequence starts empty
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, seqlen_cache, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    k_new, v_new = (torch.randn(batch, seqlen_new, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(cached):
        k_full[b, n:n + seqlen_new] = k_new[b]
        v_full[b, n:n + seqlen_new] = v_new[b]
    cache_seqlens = torch.tensor(cached, dtype=torch.int32, device=device)
    appended = seqlen_new > 0
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new if appended else None, v_new if appended else None, cache_seqlens=cache_seqlens,
        causal=causal, return_softmax_lse=True)
    # The caches now hold the new keys and values after each sequence's cached ones, the rest unchanged.
    assert torch.equal(k_cache, k_full) and torch.equal(v_cache, v_full)
    lengths = [n + seqlen_new for n in cached]
    ref_out, base_out, ref_lse = _expected(q, k_full, v_full, lengths, head_dim ** -0.5, causal)
    assert out.shape == q.shape and lse.shape == (batch, heads_q, seqlen_q)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    empty = torch.isneginf(ref_lse).to(lse.device)
    assert torch.equal(torch.isneginf(lse), empty)
    torch.testing.assert_close(lse[~empty], ref_lse.to(lse.device)[~empty], rtol=0, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_int_and_full_cache_lengths(device):
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=device)
    k_cache, v_cache = (torch.randn(2, 50, 4, 64, dtype=torch.bfloat16, device=device) for _ in range(2))
    whole = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache)
    if device == "cpu":  # the batched op over the whole cache, as flash_attn_func runs it (CUDA: the decode op)
        torch.testing.assert_close(whole, flashattn.flash_attn_func(q, k_cache, v_cache), rtol=0, atol=0)
    ref_out, base_out, _ = _expected(q, k_cache, v_cache, [50, 50], 64 ** -0.5, False)
    assert_oracle("out", whole, ref_out, base_out, OUT_FACTOR)
    part = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20)
    torch.testing.assert_close(part, flashattn.flash_attn_func(q, k_cache[:, :20], v_cache[:, :20]), rtol=2e-2,
                               atol=2e-2)


def test_kvcache_argument_errors():
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(2, 10, 4, 16)
    new = torch.randn(2, 3, 4, 16)
    lengths = torch.tensor([2, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_table must be an int32 tensor of shape"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), block_table=lengths)
    with pytest.raises(ValueError, match="k and v must be given together"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), k=new, cache_seqlens=lengths)
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), k=new, v=new)
    with pytest.raises(ValueError, match="cache_seqlens must be an int32 tensor"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths[None])
    with pytest.raises(ValueError, match="outside the cache"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=11)
    with pytest.raises(ValueError, match="k and v must have shape"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), k=new[:, :, :2], v=new[:, :, :2],
                                          cache_seqlens=lengths)
    # An append past the cache's end is checked on the device (the CPU raises at once).
    with pytest.raises(RuntimeError, match="cache_seqlens \\+ seqlen_new must be in"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), k=new, v=new, cache_seqlens=lengths + 1)


# ---- rotary embedding, cache_batch_idx and cache_leftpad (FlashAttention-2's semantics) ----


def _rotary_tables(rows, rotary_dim, dtype, device):
    """Random rotary tables (cos, sin) of (rows, rotary_dim / 2) angles, in dtype."""
    angle = torch.rand(rows, rotary_dim // 2, device=device) * 6.283
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def _rotary_reference(x, cos, sin, positions, interleaved):
    """x (B, S, H, D) rotated at positions (B, S), in float64, as complex multiplication: pairs (re, im) are
    dims (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2)."""
    half = cos.size(1)
    x = x.double()
    angle = torch.atan2(sin.double(), cos.double())[positions].unsqueeze(2)  # (B, S, 1, half)
    if interleaved:
        pairs = torch.complex(x[..., 0:2 * half:2], x[..., 1:2 * half:2])
    else:
        pairs = torch.complex(x[..., :half], x[..., half:2 * half])
    turned = pairs * torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        rotated = torch.stack([turned.real, turned.imag], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([turned.real, turned.imag], dim=-1)
    return torch.cat([rotated, x[..., 2 * half:]], dim=-1)


def _serving_reference(q, k_rows, v_rows, starts, ends, scale, causal):
    """Per sequence b, float64: q[b] over keys starts[b]..ends[b] of its cache rows k_rows[b] / v_rows[b],
    the causal diagonal aligned to ends[b] (query i sees key j <= ends[b] - seqlen_q + i)."""
    from flashattn.reference import attention_reference
    outs = []
    seqlen_q, seqlen_cache = q.size(1), k_rows.size(1)
    for b in range(q.size(0)):
        keys = torch.arange(seqlen_cache)
        visible = (keys >= starts[b]) & (keys < ends[b])
        visible = visible[None].expand(seqlen_q, seqlen_cache)
        if causal:
            visible = visible & (keys[None] <= ends[b] - seqlen_q + torch.arange(seqlen_q)[:, None])
        outs.append(attention_reference(q[b:b + 1].double(), k_rows[b:b + 1].double(), v_rows[b:b + 1].double(),
                                        scale, attn_mask=visible[None, None].to(q.device)))
    return torch.cat(outs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_kvcache_rotary_batch_idx_and_leftpad(device, causal, interleaved):
    """New keys rotated at their cache rows and written to the rows cache_batch_idx picks, the queries
    rotated at the same positions (causal) or all at cache_seqlens (not), keys before cache_leftpad never
    attended (their cache rows hold huge values that would show); the other cache rows untouched."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, cache_batch, seqlen_cache, heads_q, heads_kv, head_dim, rotary_dim = 3, 5, 64, 4, 2, 32, 16
    seqlen_q, seqlen_new = (4, 4) if causal else (2, 3)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(cache_batch, seqlen_cache, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    k_new, v_new = (torch.randn(batch, seqlen_new, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    cos, sin = _rotary_tables(seqlen_cache, rotary_dim, dtype, device)
    cached = torch.tensor([10, 0, 40], dtype=torch.int32, device=device)
    leftpad = torch.tensor([3, 0, 17], dtype=torch.int32, device=device)
    rows = torch.tensor([4, 0, 2], dtype=torch.int32, device=device)
    for b in range(batch):  # the left padding: values that would dominate any row that attended to them
        k_cache[rows[b], :leftpad[b]] = 30.0
        v_cache[rows[b], :leftpad[b]] = 1e3
    k_before, v_before = k_cache.clone(), v_cache.clone()

    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=cached, cache_batch_idx=rows, cache_leftpad=leftpad,
                                            causal=causal, rotary_interleaved=interleaved)

    steps = torch.arange(max(seqlen_q, seqlen_new), device=device)
    pos_k = cached.long()[:, None] + steps[:seqlen_new]
    pos_q = cached.long()[:, None] + (steps[:seqlen_q] if causal else 0 * steps[:seqlen_q])
    k_rot = _rotary_reference(k_new, cos, sin, pos_k, interleaved)
    q_rot = _rotary_reference(q, cos, sin, pos_q, interleaved)
    k_expected, v_expected = k_before.double(), v_before.double()
    for b in range(batch):
        n = int(cached[b])
        k_expected[rows[b], n:n + seqlen_new] = k_rot[b]
        v_expected[rows[b], n:n + seqlen_new] = v_new[b].double()
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_cache.double(), k_expected, **tol)
    assert torch.equal(v_cache.double(), v_expected)
    sel = rows.long()
    ref = _serving_reference(q_rot, k_expected[sel], v_expected[sel], leftpad.tolist(),
                             (cached + seqlen_new).tolist(), head_dim ** -0.5, causal)
    torch.testing.assert_close(out.double(), ref, **(dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16
                                                     else dict(atol=1e-4, rtol=1e-4)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", ["plain", "window", "leftpad_batch_idx", "softcap", "paged", "not_causal"])
def test_kvcache_cpu_decoding_step_by_kv_head(dtype, options):
    """A CPU decoding step with grouped query heads (one query, nheads > nheads_k), which the CPU path
    runs as one call per kv head with its query heads as rows, against the same step over caches whose
    kv heads are repeated per query head (one query head per kv head: a call per query head), out and
    LSE, with the window, left padding, cache_batch_idx, softcap, paged caches and non-causal calls."""
    torch.manual_seed(0)
    batch, cache_batch, seqlen_cache, heads_q, heads_kv, head_dim = 3, 4, 80, 8, 2, 64
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype)
    k_cache, v_cache = (torch.randn(cache_batch, seqlen_cache, heads_kv, head_dim, dtype=dtype) for _ in range(2))
    kwargs = dict(cache_seqlens=torch.tensor([70, 1, 33], dtype=torch.int32), causal=options != "not_causal",
                  return_softmax_lse=True)
    if options == "window":
        kwargs["window_size"] = (9, 0)
    if options == "leftpad_batch_idx":
        kwargs["cache_leftpad"] = torch.tensor([5, 0, 30], dtype=torch.int32)
        kwargs["cache_batch_idx"] = torch.tensor([3, 0, 1], dtype=torch.int32)
    if options == "softcap":
        kwargs["softcap"] = 2.0

    def call(k, v):
        if options != "paged":
            rows = slice(None) if "cache_batch_idx" in kwargs else slice(batch)  # the sequences' cache rows
            return flashattn.flash_attn_with_kvcache(q, k[rows], v[rows], **kwargs)
        # Pages of 16 rows in reverse order.
        pages = k[:batch].reshape(batch * seqlen_cache // 16, 16, *k.shape[2:]).flip(0)
        values = v[:batch].reshape(batch * seqlen_cache // 16, 16, *v.shape[2:]).flip(0)
        table = (pages.size(0) - 1 - torch.arange(pages.size(0), dtype=torch.int32)).view(batch, -1)
        return flashattn.flash_attn_with_kvcache(q, pages, values, block_table=table, **kwargs)

    out, lse = call(k_cache, v_cache)
    group = heads_q // heads_kv
    ref_out, ref_lse = call(k_cache.repeat_interleave(group, dim=2), v_cache.repeat_interleave(group, dim=2))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), ref_out.float(), **tol)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_rotary_positions_with_window(device):
    """With a sliding window (not causal) the queries are rotated at cache_seqlens + i, as with causal
    (FlashAttention-2's rule): the call equals one on queries and keys rotated beforehand."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, seqlen_cache, heads_q, heads_kv, head_dim, rotary_dim, seqlen_q = 2, 48, 4, 2, 32, 32, 3
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, seqlen_cache, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    k_new, v_new = (torch.randn(batch, seqlen_q, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    cos, sin = _rotary_tables(seqlen_cache, rotary_dim, dtype, device)
    cached = torch.tensor([20, 7], dtype=torch.int32, device=device)
    positions = cached.long()[:, None] + torch.arange(seqlen_q, device=device)
    q_rot = _rotary_reference(q, cos, sin, positions, False).to(dtype)
    k_rot = _rotary_reference(k_new, cos, sin, positions, False).to(dtype)
    k_pre, v_pre = k_cache.clone(), v_cache.clone()
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=cached, window_size=(6, 1), rotary_interleaved=False)
    expected = flashattn.flash_attn_with_kvcache(q_rot, k_pre, v_pre, k_rot, v_new, cache_seqlens=cached,
                                                 window_size=(6, 1))
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, expected, **tol)


def test_kvcache_serving_argument_errors():
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(3, 10, 4, 16)
    new = torch.randn(2, 1, 4, 16)
    lengths = torch.tensor([2, 7], dtype=torch.int32)
    cos = torch.ones(10, 4)
    with pytest.raises(ValueError, match="rotary_cos and rotary_sin must be given together"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=cos, cache_seqlens=lengths,
                                          cache_batch_idx=lengths * 0)
    with pytest.raises(ValueError, match="apply to new k and v"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), rotary_cos=cos, rotary_sin=cos,
                                          cache_seqlens=lengths, cache_batch_idx=lengths * 0)
    with pytest.raises(ValueError, match="rotary_dim <= headdim"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=torch.ones(10, 9),
                                          rotary_sin=torch.ones(10, 9), cache_seqlens=lengths,
                                          cache_batch_idx=lengths * 0)
    with pytest.raises(ValueError, match="cache_batch_idx must be an int32 tensor"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths, cache_batch_idx=[0, 1])
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same shape"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths)  # batch 3 without the idx
    # Values are checked on the device (the CPU raises at once).
    with pytest.raises(RuntimeError, match="cache_batch_idx must be in"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths,
                                          cache_batch_idx=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="cache_leftpad must be in"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths,
                                          cache_batch_idx=lengths * 0, cache_leftpad=lengths + 1)
    with pytest.raises(RuntimeError, match="a rotary position is past"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=torch.ones(5, 4),
                                          rotary_sin=torch.ones(5, 4), cache_seqlens=lengths,
                                          cache_batch_idx=lengths * 0)
