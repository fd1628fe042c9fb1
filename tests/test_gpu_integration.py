"""The public APIs on CUDA against torch SDPA, and the op's integration with PyTorch's machinery:
opcheck, torch.compile(fullgraph=True), CUDA graph capture and replay, fallbacks."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn import sdpa as fa_sdpa
from flashattn.reference import attention_reference, causal_visibility
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle

from conftest import requires_cuda

pytestmark = requires_cuda

DTYPES = [torch.float16, torch.bfloat16]


def _dtype_id(dtype):
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def _leaves(*tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]


def _torch_math_sdpa(q, k, v, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _bhsd_baseline(q, k, v, is_causal_bottom_right=None, scale=None):
    """The oracle's baseline for (B, H, S, D) inputs: the reference math in the inputs' dtype."""
    out = attention_reference(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale,
        is_causal=is_causal_bottom_right is not None, causal_bottom_right=bool(is_causal_bottom_right), upcast=False,
    )
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# scaled_dot_product_attention vs torch SDPA (math backend in float32 defines the semantics)
# --------------------------------------------------------------------------------------------------

SDPA_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa)
    (2, 4, 4, 97, 97, 64, False, False),
    (2, 4, 4, 97, 97, 64, True, False),
    (1, 8, 8, 113, 203, 128, True, False),  # top-left causal with Lq < Lk
    (1, 8, 8, 203, 113, 80, True, False),  # top-left causal with Lq > Lk
    (3, 8, 2, 128, 256, 96, True, True),  # GQA
    (2, 4, 1, 65, 33, 40, False, True),  # MQA
    (2, 4, 1, 17, 17, 32, True, False),  # a single key/value head broadcasts without enable_gqa
]


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "b{}h{}kv{}-{}x{}-d{}-causal{}-gqa{}".format(*c))
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_sdpa_matches_torch(dtype, case):
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, enable_gqa = case
    q = torch.randn(batch, heads_q, seqlen_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=dtype)
    dout = torch.randn(batch, heads_q, seqlen_q, head_dim, device="cuda", dtype=dtype)

    leaves = _leaves(q, k, v)
    fa_sdpa._warned_reasons.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = flashattn.scaled_dot_product_attention(*leaves, is_causal=is_causal, enable_gqa=enable_gqa)
    assert not [w for w in caught if "falling back" in str(w.message)], "the supported path fell back to torch"
    grads = torch.autograd.grad(out, leaves, dout)

    ref_leaves = _leaves(q, k, v, dtype=torch.float32)
    gqa_kwargs = {"enable_gqa": True} if enable_gqa else {}
    ref = _torch_math_sdpa(*ref_leaves, is_causal=is_causal, **gqa_kwargs)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.float())

    base_leaves = _leaves(q, k, v)
    base = _bhsd_baseline(*base_leaves, is_causal_bottom_right=False if is_causal else None)
    base_grads = torch.autograd.grad(base, base_leaves, dout)

    assert out.shape == (batch, heads_q, seqlen_q, head_dim) and out.dtype == dtype
    assert_oracle("out", out, ref, base, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)


def test_sdpa_3d_and_5d_inputs():
    for shape_q, shape_kv in [((4, 33, 64), (4, 47, 64)), ((2, 3, 4, 33, 64), (2, 3, 4, 47, 64))]:
        q = torch.randn(shape_q, device="cuda", dtype=torch.float16)
        k = torch.randn(shape_kv, device="cuda", dtype=torch.float16)
        v = torch.randn(shape_kv, device="cuda", dtype=torch.float16)
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref = _torch_math_sdpa(q.float(), k.float(), v.float(), is_causal=True)
        assert out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def test_sdpa_dropout_p_one_goes_to_torch():
    """dropout_p = 1 is outside the kernels' [0, 1): the call goes to torch's SDPA with a warning naming
    the reason, and gives what torch gives: zeros, or torch's own error where its backend refuses p = 1
    (its cuDNN backend does; calling it a second time with p = 1 crashed the process here, so the
    error is not compared against a second torch call)."""
    q, k, v = (torch.randn(2, 4, 33, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    fa_sdpa._warned_reasons.clear()
    with pytest.warns(UserWarning, match="dropout_p"):
        try:
            out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
        except RuntimeError as exc:
            assert "flashattn" not in str(exc)  # torch's error, not one of the kernels'
        else:
            assert out.shape == q.shape and not out.any()


@pytest.mark.parametrize("kwargs, reason", [
    ({"dtype": torch.float32}, "float32"),
    ({"head_dim": 320}, "head dim"),
])
def test_sdpa_falls_back_on_cuda(kwargs, reason):
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", torch.float16)
    head_dim = kwargs.pop("head_dim", 64)
    q, k, v = (torch.randn(2, 4, 33, head_dim, device="cuda", dtype=dtype) for _ in range(3))
    fa_sdpa._warned_reasons.clear()
    with pytest.warns(UserWarning, match=reason):
        out = flashattn.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.shape == q.shape
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, ref)


# --------------------------------------------------------------------------------------------------
# FlashAttention-2 API vs torch SDPA (bottom-right causal through an explicit mask)
# --------------------------------------------------------------------------------------------------

FA2_CASES = [
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
    (2, 97, 97, 4, 4, 64, False),
    (2, 97, 97, 4, 4, 64, True),
    (1, 113, 203, 8, 2, 128, True),  # bottom-right causal, Lq < Lk
    (2, 1, 128, 4, 1, 80, True),  # one query sees every key
    (3, 256, 256, 2, 2, 256, True),
]


@pytest.mark.parametrize("case", FA2_CASES, ids=lambda c: "b{}-{}x{}-h{}kv{}-d{}-causal{}".format(*c))
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_flash_attn_func_matches_torch(dtype, case):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal = case
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)

    leaves = _leaves(q, k, v)
    out, lse, probs = flashattn.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
    assert probs is None
    grads = torch.autograd.grad(out, leaves, dout)

    ref_leaves = _leaves(q, k, v, dtype=torch.float32)
    mask = causal_visibility(seqlen_q, seqlen_k, bottom_right=True, device="cuda") if causal else None
    ref = _torch_math_sdpa(
        *(t.transpose(1, 2) for t in ref_leaves), attn_mask=mask, enable_gqa=heads_q != heads_kv
    ).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.float())

    base_leaves = _leaves(q, k, v)
    base = attention_reference(*base_leaves, is_causal=causal, causal_bottom_right=True, upcast=False)
    base_grads = torch.autograd.grad(base, base_leaves, dout)

    assert_oracle("out", out, ref, base, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)
    scores = torch.einsum("bqhd,bkhd->bhqk", ref_leaves[0].detach(), ref_leaves[1].detach().repeat_interleave(heads_q // heads_kv, dim=2))
    scores = scores / math.sqrt(head_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_packed_apis_on_cuda(dtype):
    qkv = torch.randn(2, 97, 3, 4, 64, device="cuda", dtype=dtype, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(2))
    ref = flashattn.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    grads = torch.autograd.grad(ref, (q, k, v), dout)
    torch.testing.assert_close(dqkv, torch.stack(grads, dim=2), atol=1e-2, rtol=1e-2)


# --------------------------------------------------------------------------------------------------
# Registration and PyTorch machinery
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal, bottom_right", [(False, False), (True, False), (True, True)])
def test_opcheck_cuda(causal, bottom_right):
    q = torch.randn(2, 33, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 47, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 47, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.125, causal, bottom_right))
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.125, causal, bottom_right)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.125, causal, bottom_right),
    )


def test_opcheck_cuda_with_attn_mask():
    q = torch.randn(2, 33, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 47, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 47, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mask = torch.randn(1, 1, 33, 47, device="cuda", dtype=torch.bfloat16, requires_grad=True).expand(2, 4, 33, 47)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, 0.125, False, False, mask))
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q, k, v, 0.125, False, False, mask)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.125, False, False, False,
         mask.detach(), torch.empty(2, 4, 33, 47, device="cuda", dtype=torch.bfloat16)),
    )


class AttentionBlock(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        qkv = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        out = flashattn.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seqlen, dim))


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    block = AttentionBlock(256, 4).cuda().to(torch.bfloat16)
    x = torch.randn(2, 193, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(block, fullgraph=True, backend=recording_backend)(x)
    assert len(graphs) == 1 and "flashattn.fwd" in graphs[0].code

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    out_eager = block(x)
    grads_eager = torch.autograd.grad(out_eager.float().square().sum(), [x, *block.parameters()])
    out_compiled = compiled(x)
    grads_compiled = torch.autograd.grad(out_compiled.float().square().sum(), [x, *block.parameters()])
    torch.testing.assert_close(out_compiled, out_eager, atol=2e-2, rtol=2e-2)
    for g_c, g_e in zip(grads_compiled, grads_eager):
        torch.testing.assert_close(g_c, g_e, atol=5e-2, rtol=5e-2)


def test_cuda_graph_replay_with_new_inputs():
    shape_q, shape_kv = (2, 8, 129, 64), (2, 2, 257, 64)
    static = [torch.randn(s, device="cuda", dtype=torch.float16, requires_grad=True) for s in (shape_q, shape_kv, shape_kv)]
    static_dout = torch.randn(shape_q, device="cuda", dtype=torch.float16)

    def step():
        out = flashattn.scaled_dot_product_attention(*static, is_causal=True, enable_gqa=True)
        return (out, *torch.autograd.grad(out, static, static_dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step()

    for _ in range(2):
        fresh = [torch.randn_like(t) for t in static]
        fresh_dout = torch.randn_like(static_dout)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
            static_dout.copy_(fresh_dout)
        graph.replay()
        torch.cuda.synchronize()

        leaves = _leaves(*fresh)
        out = flashattn.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
        expected = (out, *torch.autograd.grad(out, leaves, fresh_dout))
        for name, got, want in zip(("out", "dq", "dk", "dv"), static_results, expected):
            # Forward replay is bitwise; the backward's dq uses atomics, so allow last-bit differences.
            if name == "out":
                assert torch.equal(got, want), "replayed forward differs from eager"
            else:
                torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2, msg=f"replayed {name} differs")


def test_cuda_graph_attention_block_step(kernel_path):
    """Linear -> flashattn SDPA -> Linear, forward and backward (gradients of the input and of every
    parameter) captured in one CUDA graph and replayed on new input values: matches eager."""
    torch.manual_seed(0)
    block = AttentionBlock(256, 4).cuda().to(torch.bfloat16)  # head dim 64
    params = list(block.parameters())
    static_x = torch.randn(2, 193, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    static_dout = torch.randn(2, 193, 256, device="cuda", dtype=torch.bfloat16)

    def step(x, dout):
        out = block(x)
        return (out, *torch.autograd.grad(out, [x, *params], dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static_x, static_dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step(static_x, static_dout)

    names = ["out", "dx"] + [f"d{name}" for name, _ in block.named_parameters()]
    for _ in range(2):
        x = torch.randn_like(static_x)
        dout = torch.randn_like(static_dout)
        with torch.no_grad():
            static_x.copy_(x)
            static_dout.copy_(dout)
        graph.replay()
        torch.cuda.synchronize()
        expected = step(x.requires_grad_(), dout)
        for name, got, want in zip(names, static_results, expected):
            # dq is summed with atomics (last bits vary between runs), so compare within bf16 rounding.
            err = (got.float() - want.float()).abs().max().item()
            assert err <= 2e-2 * want.float().abs().max().item() + 1e-3, f"replayed {name} differs by {err:.3e}"


def test_sdpa_backward_is_reproducible_under_deterministic_algorithms():
    # torch.use_deterministic_algorithms(True) makes the drop-in's backward add dq in a fixed order:
    # two runs give the same bits. Many key blocks per query block, GQA, causal.
    torch.manual_seed(0)
    q = torch.randn(2, 8, 1500, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 1500, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dout = torch.randn(2, 8, 1500, 64, device="cuda", dtype=torch.bfloat16)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(3):
            out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            runs.append(torch.autograd.grad(out, (q, k, v), dout))
    finally:
        torch.use_deterministic_algorithms(previous)
    for grads in runs[1:]:
        for g, g0 in zip(grads, runs[0]):
            assert torch.equal(g, g0)
