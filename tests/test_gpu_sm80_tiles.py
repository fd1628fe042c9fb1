"""The sm80 kernels' smaller tile configurations, for GPUs that offer a block less shared memory than an
H200 (an A100 163 KiB, sm86 and sm89 99 KiB), run on the H200 with the planner's force_sm80 and
smem_per_block_cap options: the plan must pick the configuration expected for that limit, and the
kernels must pass the oracle with it (plain, causal, Lq != Lk, GQA, masks with the mask's gradient,
dropout, deterministic repeats). The configurations themselves are in csrc/sm80/kernel_configs.h.
"""
import pytest
import torch

from conftest import requires_cuda
from flashattn import ops, plan
from flashattn.reference import attention_reference
from flashattn.testing import OUT_FACTOR, assert_oracle, make_qkv
from test_gpu_attention import run_case
from test_gpu_dropout import check_dropout
from test_gpu_masks import check_masked

pytestmark = requires_cuda

A100, CONSUMER = 166912, 101376  # shared memory per block (bytes)

# (limit, head dim, the backward's tiles): the pairs where the backward leaves its first configuration.
# tests/test_plan.py holds the planner's whole choice table, forward included.
RUNS_BACKWARD = [pytest.param(limit, d, tiles, id=f"{limit // 1024}KiB-d{d}") for limit, d, tiles in [
    (A100, 128, 1), (A100, 192, 1), (A100, 256, 1), (CONSUMER, 64, 1), (CONSUMER, 96, 1), (CONSUMER, 128, 2)]]


def _described(limit, head_dim, **fields):
    return {"cc": (8, 0), "num_sms": 108, "smem_per_block": limit, "batch": 1, "heads_q": 4, "heads_kv": 2,
            "seqlen_q": 1000, "seqlen_k": 1000, "head_dim": head_dim, **fields}


@pytest.fixture
def capped(plan_options):
    """Plans as a GPU with `limit` bytes a block would, asserting the backward's tiles are `tiles`."""
    def cap(limit, head_dim, tiles=None):
        plan_options(force_sm80=True, smem_per_block_cap=limit)
        if tiles is not None:
            assert plan.plan_bwd(_described(limit, head_dim))["sm80_tiles"] == tiles
    return cap


@pytest.mark.parametrize("limit,head_dim,tiles", RUNS_BACKWARD)
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
def test_small_tiles_match_oracle(capped, limit, head_dim, tiles, causal):
    capped(limit, head_dim, tiles)
    # Several query blocks per key block (the single-buffered Q/dO ring wraps), Lq != Lk both ways, GQA.
    run_case(1, 700, 433, 4, 2, head_dim, torch.bfloat16, causal)
    run_case(2, 203, 517, 2, 1, head_dim - 8, torch.float16, causal)


@pytest.mark.parametrize("limit,head_dim,tiles", RUNS_BACKWARD)
def test_small_tiles_with_masks(capped, limit, head_dim, tiles):
    capped(limit, head_dim, tiles)
    check_masked(1, 300, 300, 4, 2, head_dim, torch.bfloat16, "top_left", "float", "blocks", mask_grad=True)
    check_masked(2, 97, 203, 2, 2, head_dim, torch.float16, "none", "bool", "tiles")


@pytest.mark.parametrize("limit,head_dim,tiles", RUNS_BACKWARD)
def test_small_tiles_with_dropout(capped, limit, head_dim, tiles):
    capped(limit, head_dim, tiles)
    check_dropout(1, 256, 300, 4, 2, head_dim, torch.bfloat16, "none", 0.2)
    check_dropout(1, 97, 203, 2, 1, head_dim, torch.float16, "bottom_right", 0.1, mask=("bool", "b11k"))


@pytest.mark.parametrize("limit,head_dim,tiles", RUNS_BACKWARD)
def test_small_tiles_deterministic_backward_repeats_bitwise(capped, limit, head_dim, tiles):
    capped(limit, head_dim, tiles)
    q, k, v = make_qkv(1, 700, 700, 4, 2, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)

    def grads():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = ops.attention(*leaves, head_dim**-0.5, True, False, True)
        return torch.autograd.grad(out, leaves, dout)

    first, second = grads(), grads()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("head_dim,masked,tiles", [(192, False, 1), (192, True, 1), (256, False, 1), (256, True, 2)])
def test_consumer_gpu_forward_tiles_match_oracle(capped, head_dim, masked, tiles):
    # The 99 KiB forward at the head dims whose backward has no configuration there (forward only).
    capped(CONSUMER, head_dim)
    assert plan.plan_fwd(_described(CONSUMER, head_dim, dropout=masked))["sm80_tiles"] == tiles
    q, k, v = make_qkv(2, 300, 217, 4, 2, head_dim, torch.bfloat16, "cuda")
    mask = (torch.rand(300, 217, device="cuda") > 0.2).expand(2, 4, 300, 217) if masked else None
    scale = head_dim**-0.5
    out, _ = ops.fwd(q, k, v, scale, True, True, mask)
    ref = attention_reference(q, k, v, scale, True, True, attn_mask=mask)
    base = attention_reference(q, k, v, scale, True, True, upcast=False, attn_mask=mask)
    assert_oracle("out", out, ref, base, OUT_FACTOR)


@pytest.mark.parametrize("head_dim", [192, 256])
def test_consumer_gpu_backward_above_128_raises_before_launch(capped, head_dim):
    # The forward fits 99 KiB at these head dims; no backward configuration does.
    capped(CONSUMER, head_dim)
    q, k, v = (torch.randn(1, 256, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out, _ = ops.attention(q, k, v, head_dim**-0.5, False, False, False)
    needs = plan.plan_bwd(_described(CONSUMER, head_dim))["smem"]["bytes"]
    with pytest.raises(RuntimeError, match=f"needs {needs} bytes of shared memory per block .* offers {CONSUMER}"):
        out.sum().backward()
