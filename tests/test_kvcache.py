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
    torch.testing.assert_close(whole, flashattn.flash_attn_func(q, k_cache, v_cache), rtol=0, atol=0)
    part = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20)
    torch.testing.assert_close(part, flashattn.flash_attn_func(q, k_cache[:, :20], v_cache[:, :20]), rtol=2e-2,
                               atol=2e-2)


def test_kvcache_argument_errors():
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(2, 10, 4, 16)
    new = torch.randn(2, 3, 4, 16)
    lengths = torch.tensor([2, 7], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), rotary_cos=torch.ones(10, 8))
    with pytest.raises(NotImplementedError, match="block_table"):
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
