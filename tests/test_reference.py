"""The plain-PyTorch reference itself: it must agree with torch's SDPA, whose semantics it documents."""
import pytest
import torch
import torch.nn.functional as F

from flashattn.reference import attention_reference, causal_visibility


def _sdpa_bshd(q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs).transpose(1, 2)


@pytest.mark.parametrize("seqlens", [(5, 5), (3, 7), (7, 3)])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_torch_top_left(seqlens, heads, is_causal):
    (seqlen_q, seqlen_k), (heads_q, heads_kv) = seqlens, heads
    q = torch.randn(2, seqlen_q, heads_q, 8, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, heads_kv, 8, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, heads_kv, 8, dtype=torch.float64)
    out = attention_reference(q, k, v, is_causal=is_causal)
    ref = _sdpa_bshd(q, k, v, is_causal=is_causal, enable_gqa=heads_q != heads_kv)
    torch.testing.assert_close(out, ref)


def test_reference_bottom_right_matches_masked_torch():
    q = torch.randn(2, 3, 2, 8, dtype=torch.float64)
    k = torch.randn(2, 7, 2, 8, dtype=torch.float64)
    v = torch.randn(2, 7, 2, 8, dtype=torch.float64)
    out = attention_reference(q, k, v, scale=0.3, is_causal=True, causal_bottom_right=True)
    mask = causal_visibility(3, 7, bottom_right=True)
    torch.testing.assert_close(out, _sdpa_bshd(q, k, v, attn_mask=mask, scale=0.3))


def test_causal_visibility_alignments():
    top_left = causal_visibility(2, 4, bottom_right=False)
    bottom_right = causal_visibility(2, 4, bottom_right=True)
    assert top_left.tolist() == [[True, False, False, False], [True, True, False, False]]
    assert bottom_right.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_reference_rows_without_keys_are_zero_with_zero_grads():
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 2, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 2, 4, dtype=torch.float64, requires_grad=True)
    out, lse = attention_reference(q, k, v, is_causal=True, causal_bottom_right=True, return_lse=True)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))  # rows 0..2 see no key when Lq=5 > Lk=2
    assert torch.isneginf(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 3:]).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :3], torch.zeros_like(q.grad[:, :3]))


def test_reference_upcast_dtypes():
    q = torch.randn(1, 3, 2, 4, dtype=torch.bfloat16)
    assert attention_reference(q, q, q).dtype == torch.float32
    assert attention_reference(q, q, q, upcast=False).dtype == torch.bfloat16
    assert attention_reference(q.double(), q.double(), q.double()).dtype == torch.float64
