"""The variable-length FlashAttention-2 functions (flashattn.varlen) against the oracle, sequence by
sequence: out, lse and the gradients of q, k and v, on the CPU and on CUDA."""
import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle, reference_and_baseline

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]

# (query lengths, key lengths) per sequence: different lengths, Lq != Lk both ways, an empty query
# sequence, one longer than a kernel tile, a single row.
LENGTHS = [
    pytest.param([5, 17, 1], [5, 17, 1], id="self"),
    pytest.param([3, 0, 40, 130], [7, 9, 33, 129], id="cross-empty-q"),
    pytest.param([70, 2], [1, 65], id="lq-gt-lk"),
]


def _cu(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _packed(lengths, heads, head_dim, dtype, device):
    return torch.randn(sum(lengths), heads, head_dim, dtype=dtype, device=device)


def _oracle(q, k, v, dout, lengths_q, lengths_k, scale, causal):
    """Per sequence: (ref_out, ref_grads, ref_lse) and (base_out, base_grads), packed like the inputs."""
    refs, bases, lses = [], [], []
    starts_q, starts_k = _cu(lengths_q, "cpu").tolist(), _cu(lengths_k, "cpu").tolist()
    for b in range(len(lengths_q)):
        rows_q, rows_k = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        (ref_out, ref_grads, ref_lse), (base_out, base_grads) = reference_and_baseline(
            q[rows_q][None], k[rows_k][None], v[rows_k][None], dout[rows_q][None], scale, causal, True)
        if ref_grads is None:  # no query rows: no output, no gradients
            ref_grads = [torch.zeros_like(t[None], dtype=ref_out.dtype) for t in (q[rows_q], k[rows_k], v[rows_k])]
            base_grads = [torch.zeros_like(t[None]) for t in (q[rows_q], k[rows_k], v[rows_k])]
        refs.append((ref_out[0], [g[0] for g in ref_grads]))
        bases.append((base_out[0], [g[0] for g in base_grads]))
        lses.append(ref_lse[0])
    cat = lambda parts: torch.cat(parts, 0)  # noqa: E731
    ref = (cat([r[0] for r in refs]), [cat([r[1][i] for r in refs]) for i in range(3)], torch.cat(lses, 1))
    base = (cat([r[0] for r in bases]), [cat([r[1][i] for r in bases]) for i in range(3)])
    return ref, base


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths_q,lengths_k", LENGTHS)
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(4, 4, 64), (6, 2, 128)])
def test_varlen_matches_oracle(device, causal, lengths_q, lengths_k, heads_q, heads_kv, head_dim):
    dtype = torch.bfloat16
    q = _packed(lengths_q, heads_q, head_dim, dtype, device)
    k = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    v = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    dout = torch.randn_like(q)
    scale = head_dim ** -0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, keep = flashattn.flash_attn_varlen_func(
        *leaves, _cu(lengths_q, device), _cu(lengths_k, device), max(lengths_q) + 3, max(lengths_k), causal=causal,
        return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = _oracle(q, k, v, dout, lengths_q, lengths_k, scale, causal)
    assert out.shape == q.shape and out.dtype == dtype and keep is None
    assert lse.shape == (heads_q, sum(lengths_q)) and lse.dtype == torch.float32
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, grad, ref, base in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, grad, ref, base, GRAD_FACTOR)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty.to(lse.device))
    torch.testing.assert_close(lse[~empty.to(lse.device)], ref_lse[~empty].to(lse.device), rtol=0, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_packed_variants_match_the_unpacked_one(device):
    lengths = [9, 30, 4]
    cu = _cu(lengths, device)
    qkv = torch.randn(sum(lengths), 3, 4, 64, dtype=torch.bfloat16, device=device)
    q, k, v = qkv.unbind(1)
    want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    got_qkv = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 30, causal=True)
    got_kv = flashattn.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 30, 30, causal=True)
    assert torch.equal(got_qkv, want) and torch.equal(got_kv, want)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_dropout_keeps_the_mask_it_returns(device):
    # With dropout the keep-mask comes back in the padded coordinates: the output rebuilt from it by
    # the reference, sequence by sequence, is the output.
    lengths = [12, 5]
    cu = _cu(lengths, device)
    q, k, v = (_packed(lengths, 2, 32, torch.float32 if device == "cpu" else torch.bfloat16, device) for _ in range(3))
    out, _, keep = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, dropout_p=0.3, return_attn_probs=True)
    assert keep.shape == (2, 2, 12, 12) and keep.dtype == torch.bool
    starts = _cu(lengths, "cpu").tolist()
    for b, n in enumerate(lengths):
        rows = slice(starts[b], starts[b + 1])
        want = flashattn.attention_reference(q[rows][None].float(), k[rows][None].float(), v[rows][None].float(),
                                             32 ** -0.5, False, True, dropout_p=0.3,
                                             dropout_mask=keep[b:b + 1, :, :n, :n])
        torch.testing.assert_close(out[rows].float(), want[0], rtol=2e-2, atol=2e-2)


def test_varlen_argument_errors():
    q = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        flashattn.flash_attn_varlen_func(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k must be a 1-dim"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu[None], 6, 6)
    with pytest.raises(ValueError, match="same length"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu[:2], 6, 6)
    with pytest.raises(ValueError, match="max_seqlen_k must be an int"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, -1)
    with pytest.raises(ValueError, match="q must have 3 dims"):
        flashattn.flash_attn_varlen_func(q[None], q, q, cu, cu, 6, 6)
    with pytest.raises(NotImplementedError, match="block_table"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, block_table=cu)
    with pytest.raises(NotImplementedError, match="window_size"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, window_size=(4, 0))
    # The offsets themselves are checked on the device (here, the CPU raises at once).
    with pytest.raises(RuntimeError, match="longer than max_seqlen_q"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6)
    with pytest.raises(RuntimeError, match="must be the packed row count"):
        flashattn.flash_attn_varlen_func(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), cu, 6, 6)


def test_varlen_compiles_without_graph_breaks():
    lengths = [5, 17, 3]
    cu = _cu(lengths, "cpu")
    q, k, v = (_packed(lengths, 4, 32, torch.float32, "cpu").requires_grad_() for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, causal=True),
                             fullgraph=True)
    out = compiled(q, k, v)
    torch.testing.assert_close(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, causal=True))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(g.shape == t.shape for g, t in zip(grads, (q, k, v)))
