"""Attention sinks (the ops' ``sink``, the FlashAttention API's ``learnable_sink``) against the oracle.

Each case runs the op through autograd and judges out, lse, dq, dk, dv and the sink's gradient against
a float64 reference that appends the sink as an extra softmax column (flashattn.reference), with the
FlashAttention-2 rule (GUIDE section 4): the error may be at most a small multiple of the same math's
error in the inputs' dtype. Sinks are drawn as values the inputs' dtype holds exactly, so that the
low-precision baseline sees the same sinks. CPU cases run everywhere; CUDA cases where a GPU is.
"""
import math

import pytest
import torch

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES, GRAD_FACTOR, OUT_FACTOR, assert_oracle, make_qkv

from conftest import requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def draw_sink(heads, dtype, device, spread=2.0):
    """(heads,) float32 sink logits that `dtype` holds exactly, around 1 with the given spread."""
    return (torch.randn(heads, device=device) * spread + 1.0).to(dtype).float()


def reference(q, k, v, sink, dout, scale, causal, bottom_right, mask=None, dropout_p=0.0, keep=None, upcast=True):
    """(out, lse, grads of q, k, v, sink) of attention_reference: float64 with upcast, else in q's dtype."""
    dtype = torch.float64 if upcast else q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sink)]
    m = mask
    if mask is not None and mask.dtype != torch.bool:
        m = mask.to(dtype)
    out, lse = attention_reference(*leaves[:3], scale, causal, bottom_right, upcast=upcast, return_lse=True,
                                   attn_mask=m, dropout_p=dropout_p, dropout_mask=keep, sink=leaves[3])
    grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    return out.detach(), lse.detach(), grads


def run_flashattn(q, k, v, sink, dout, scale, causal, bottom_right, mask=None, dropout_p=0.0, rng_state=None,
                  deterministic=False):
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    out, lse = ops.attention(*leaves[:3], scale, causal, bottom_right, deterministic, mask, dropout_p, rng_state,
                             sink=leaves[3])
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse.detach(), grads


def check(q, k, v, sink, scale, causal_mode, mask=None, dropout_p=0.0, deterministic=False):
    causal, bottom_right = CAUSAL_MODES[causal_mode]
    dout = torch.randn_like(q)
    rng_state = keep = None
    if dropout_p > 0.0:
        rng_state = ops.draw_rng_state(q.device)
        keep = ops.dropout_keep_mask(rng_state, q.size(0), q.size(2), q.size(1), k.size(1), dropout_p)
    out, lse, grads = run_flashattn(q, k, v, sink, dout, scale, causal, bottom_right, mask, dropout_p, rng_state,
                                    deterministic)
    ref_out, ref_lse, ref_grads = reference(q, k, v, sink, dout, scale, causal, bottom_right, mask, dropout_p, keep)
    base_out, base_lse, base_grads = reference(q, k, v, sink, dout, scale, causal, bottom_right, mask, dropout_p, keep,
                                               upcast=False)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    assert_oracle("lse", lse, ref_lse, base_lse, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)
    assert grads[3].dtype == sink.dtype
    return out, lse


CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.bfloat16, torch.float16]

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal mode)
SHAPES = [
    (2, 37, 53, 4, 2, 16, "none"),
    (2, 53, 37, 4, 4, 24, "bottom_right"),  # Lq > Lk: the first 16 rows see no key (all sink)
    (1, 70, 70, 3, 1, 40, "top_left"),
    (2, 1, 129, 4, 2, 64, "bottom_right"),  # one query row over a longer key range
]


def _dtypes(device):
    return CPU_DTYPES if device == "cpu" else CUDA_DTYPES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sink_oracle(device, shape):
    b, lq, lk, hq, hk, d, causal_mode = shape
    for dtype in _dtypes(device):
        q, k, v = make_qkv(b, lq, lk, hq, hk, d, dtype, device)
        check(q, k, v, draw_sink(hq, dtype, device), 1.0 / math.sqrt(d), causal_mode)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_keys_get_the_sink(device):
    """A row that sees no key: out 0 and lse the sink's logit (here the bottom-right rows of Lq > Lk)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(1, 20, 5, 2, 2, 32, dtype, device)
    sink = torch.tensor([0.5, -1.25], device=device)
    out, lse = ops.attention(q, k, v, 0.2, True, True, sink=sink)
    assert torch.equal(out[:, :15], torch.zeros_like(out[:, :15]))
    assert torch.equal(lse[0, :, :15], sink[:, None].expand(2, 15))
    # No keys at all (Lk = 0): every row.
    out, lse = ops.attention(q, k[:, :0], v[:, :0], 0.2, False, False, sink=sink)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse[0], sink[:, None].expand(2, 20))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_sink_with_masks(device, mask_kind):
    """With an attention mask, a row the mask empties included (it gets the sink alone)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, lq, lk, hq, hk, d = 2, 45, 70, 4, 2, 64
    q, k, v = make_qkv(b, lq, lk, hq, hk, d, dtype, device)
    keep = torch.rand(b, 1, lq, lk, device=device) > 0.3
    keep[:, :, 3] = False  # row 3 sees no key
    if mask_kind == "bool":
        mask = keep.expand(b, hq, lq, lk)
    else:
        mask = torch.randn(b, 1, lq, lk, device=device).masked_fill(~keep, float("-inf")).to(dtype).expand(b, hq, lq, lk)
    out, lse = check(q, k, v, draw_sink(hq, dtype, device), 1.0 / math.sqrt(d), "bottom_right", mask=mask)
    assert torch.equal(out[:, 3], torch.zeros_like(out[:, 3]))


@pytest.mark.parametrize("device", DEVICES)
def test_sink_with_dropout(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = make_qkv(2, 64, 96, 4, 2, 64, dtype, device)
    check(q, k, v, draw_sink(4, dtype, device), 0.125, "none", dropout_p=0.17)


@requires_cuda
@pytest.mark.parametrize("head_dim", [8, 40, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal_mode", ["none", "bottom_right"])
def test_sink_every_gpu_width(kernel_path, head_dim, causal_mode):
    """Every tile width of both GPU paths (sm90 where the GPU has it, and the sm80 kernels forced)."""
    for dtype in CUDA_DTYPES:
        q, k, v = make_qkv(2, 200, 333, 4, 2, head_dim, dtype, "cuda")
        check(q, k, v, draw_sink(4, dtype, "cuda"), 1.0 / math.sqrt(head_dim), causal_mode)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sink_deterministic_repeats_bitwise(head_dim):
    q, k, v = make_qkv(2, 300, 300, 4, 1, head_dim, torch.bfloat16, "cuda")
    sink = draw_sink(4, torch.bfloat16, "cuda")
    first = check(q, k, v, sink, 1.0 / math.sqrt(head_dim), "bottom_right", deterministic=True)
    dout = torch.randn_like(q)
    runs = [run_flashattn(q, k, v, sink, dout, 1.0 / math.sqrt(head_dim), True, True, deterministic=True)
            for _ in range(2)]
    assert torch.equal(runs[0][0], first[0])
    for a, b in zip(runs[0][2], runs[1][2]):
        assert torch.equal(a, b)


@requires_cuda
def test_sink_large_scores_stay_finite():
    """Scores far above the sink and a sink far above the scores: no overflow either way."""
    q, k, v = make_qkv(1, 130, 130, 2, 2, 64, torch.bfloat16, "cuda")
    sink = torch.tensor([-60.0, 60.0], device="cuda")
    check(q * 4, k * 4, v, sink, 1.0, "none")


# ---- the FlashAttention API and variable-length batches ----


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_learnable_sink(device):
    """flash_attn_func(learnable_sink=...) with a bfloat16 parameter, as gpt-oss holds its sinks: the
    sink's gradient comes back in its dtype, and matches the op's."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 33, 33, 4, 2, 32, dtype, device))
    sink = torch.randn(4, device=device).to(torch.bfloat16).requires_grad_()
    out = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16
    ref_out, _, ref_grads = reference(q, k, v, sink.float(), dout, 32 ** -0.5, True, True)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(sink.grad.double(), ref_grads[3], atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(3), "learnable_sink must be a floating"),
    (torch.zeros(4, 1), "learnable_sink must be a floating"),
    (torch.zeros(4, dtype=torch.int32), "learnable_sink must be a floating"),
])
def test_learnable_sink_bad_shapes_raise(bad, message):
    q, k, v = make_qkv(1, 8, 8, 4, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):
        flashattn.flash_attn_func(q, k, v, learnable_sink=bad)


def test_op_checks_the_sink():
    q, k, v = make_qkv(1, 8, 8, 4, 2, 16, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match=r"sink must have shape \(heads_q,\)"):
        ops.fwd(q, k, v, 0.25, False, False, sink=torch.zeros(2))
    out, lse = ops.fwd(q, k, v, 0.25, False, False, sink=torch.zeros(4))
    with pytest.raises(RuntimeError, match="dsink .* needs a sink"):
        ops.bwd(torch.randn_like(out), q, k, v, out, lse, 0.25, False, False, dsink=torch.zeros(4))


def test_opcheck_with_sink():
    """fwd and bwd with a sink (and bwd writing dsink in place) pass opcheck, autograd included."""
    q = torch.randn(2, 5, 4, 8, requires_grad=True)
    k = torch.randn(2, 7, 2, 8, requires_grad=True)
    v = torch.randn(2, 7, 2, 8, requires_grad=True)
    sink = torch.randn(4, requires_grad=True)
    torch.library.opcheck(ops.fwd, (q, k, v, 0.35, True, True), {"sink": sink})
    with torch.no_grad():
        out, lse = ops.fwd(q, k, v, 0.35, True, True, sink=sink)
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.35, True,
                                    True), {"sink": sink.detach(), "dsink": torch.empty(4)})


def test_torch_compile_with_sink():
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 9, 4, 8, requires_grad=True) for _ in range(3))
    sink = torch.randn(4, requires_grad=True)

    def f(q, k, v, sink):
        return flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    grads = torch.autograd.grad(compiled(q, k, v, sink), (q, k, v, sink))
    grads_ref = torch.autograd.grad(f(q, k, v, sink), (q, k, v, sink))
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r)


def _varlen_case(device, dtype, lengths_q, lengths_k, hq, hk, d):
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lengths_k).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lengths_q), hq, d, device=device, dtype=dtype)
    k = torch.randn(sum(lengths_k), hk, d, device=device, dtype=dtype)
    v = torch.randn(sum(lengths_k), hk, d, device=device, dtype=dtype)
    return q, k, v, cu_q, cu_k


def _varlen_reference(q, k, v, sink, dout, cu_q, cu_k, scale, causal, upcast):
    dtype = torch.float64 if upcast else q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sink)]
    outs = []
    for b in range(cu_q.numel() - 1):
        sq, eq, sk, ek = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        outs.append(attention_reference(leaves[0][None, sq:eq], leaves[1][None, sk:ek], leaves[2][None, sk:ek], scale,
                                        causal, True, upcast=upcast, sink=leaves[3])[0])
    out = torch.cat(outs)
    return out.detach(), torch.autograd.grad(out, leaves, dout.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_learnable_sink(device, causal):
    """flash_attn_varlen_func with sinks, a sequence without keys among them (its rows: the sink alone)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lengths_q, lengths_k = [33, 7, 1, 90], [40, 0, 65, 90]
    q, k, v, cu_q, cu_k = _varlen_case(device, dtype, lengths_q, lengths_k, 4, 2, 64)
    sink = draw_sink(4, dtype, device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    out = flashattn.flash_attn_varlen_func(*leaves[:3], cu_q, cu_k, 90, 90, causal=causal, learnable_sink=leaves[3])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_out, ref_grads = _varlen_reference(q, k, v, sink, dout, cu_q, cu_k, 0.125, causal, True)
    base_out, base_grads = _varlen_reference(q, k, v, sink, dout, cu_q, cu_k, 0.125, causal, False)
    assert_oracle("out", out.detach(), ref_out, base_out, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)
    assert torch.equal(out[33:40], torch.zeros_like(out[33:40]))
