"""The chunked references of tests/chunked_reference.py agree with flashattn.attention_reference (float64,
autograd for the gradients) on every row and key they are asked about, for every chunking."""
import pytest
import torch

from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES

from chunked_reference import reference_keys, reference_rows


@pytest.mark.parametrize("causal_mode", list(CAUSAL_MODES))
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(23, 37), (37, 23), (1, 9), (9, 1)])
@pytest.mark.parametrize("heads_q, heads_kv", [(2, 2), (6, 2)])
def test_chunked_reference_matches_attention_reference(causal_mode, seqlen_q, seqlen_k, heads_q, heads_kv):
    is_causal, bottom_right = CAUSAL_MODES[causal_mode]
    gen = torch.Generator().manual_seed(seqlen_q * 100 + seqlen_k + heads_q)
    q = torch.randn(2, seqlen_q, heads_q, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, seqlen_k, heads_kv, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, seqlen_k, heads_kv, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, seqlen_q, heads_q, 8, generator=gen, dtype=torch.float64)
    scale = 0.7
    out, lse = attention_reference(q, k, v, scale, is_causal, bottom_right, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q, k, v, out = q.detach(), k.detach(), v.detach(), out.detach()

    rows = torch.tensor([seqlen_q - 1, 0] + list(range(1, seqlen_q - 1, 3)))
    keys = torch.tensor([0, seqlen_k - 1] + list(range(2, seqlen_k - 1, 4)))
    for chunk in (1, 5, 64):
        out_r, lse_r, dq_r = reference_rows(q, k, v, dout, rows, scale, is_causal, bottom_right,
                                            dtype=torch.float64, key_chunk=chunk)
        torch.testing.assert_close(out_r, out[:, rows])
        torch.testing.assert_close(lse_r, lse[:, :, rows])
        torch.testing.assert_close(dq_r, dq[:, rows])
        dk_r, dv_r = reference_keys(q, k, v, dout, out, lse, keys, scale, is_causal, bottom_right,
                                    dtype=torch.float64, query_chunk=chunk)
        torch.testing.assert_close(dk_r, dk[:, keys])
        torch.testing.assert_close(dv_r, dv[:, keys])
