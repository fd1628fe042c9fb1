"""Helpers shared by the attention tests: the fp16/bf16 correctness oracle and input builders."""
from __future__ import annotations

import torch

from flashattn.reference import attention_reference

# The FlashAttention-2 rule: a low-precision result may be at most this many times further from the
# float32 reference than the same PyTorch math run in the low dtype (the baseline), plus an absolute slack.
OUT_FACTOR = 2.0
GRAD_FACTOR = 3.0
ABS_SLACK = 1e-5
# Where the exact answer is identically zero (e.g. dk when there is a single key: the softmax is constant),
# the baseline's autograd cancels exactly while a kernel's dS = P * (dP - delta) leaves float32 rounding
# noise (~1e-6 per row, summed over the rows); such a tensor must stay below this instead.
ZERO_REF_SLACK = 1e-4

# (causal flag, bottom-right flag) per causal mode name.
CAUSAL_MODES = {"none": (False, False), "top_left": (True, False), "bottom_right": (True, True)}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def assert_oracle(name: str, result: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, factor: float) -> None:
    """max|result - ref| <= factor * max|baseline - ref| + ABS_SLACK, and no NaN/inf in result."""
    assert result.shape == ref.shape, f"{name}: shape {tuple(result.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(result).all(), f"{name}: result has NaN or inf"
    err = max_abs_diff(result, ref)
    base_err = max_abs_diff(baseline, ref)
    bound = factor * base_err + ABS_SLACK
    if ref.numel() and ref.abs().max().item() == 0.0:
        bound = max(bound, ZERO_REF_SLACK)
    assert err <= bound, (
        f"{name}: max|out - ref| = {err:.3e} exceeds {factor:g} * max|baseline - ref| + {ABS_SLACK:g} = {bound:.3e}"
    )


def make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device, layout="contiguous"):
    """Random q [B, Lq, Hq, D], k/v [B, Lk, Hk, D] (randn, never zeros) in the requested memory layout.

    layout: "contiguous"; "bhsd" (a contiguous [B, H, S, D] tensor transposed to [B, S, H, D]);
    "padded" (a slice of a wider tensor with a storage offset, rows still 16-byte aligned);
    "unaligned" (a slice whose rows start at an odd element offset, so 16-byte loads are impossible).
    """

    def one(seqlen, heads):
        shape = (batch, seqlen, heads, head_dim)
        if layout == "contiguous":
            return torch.randn(shape, dtype=dtype, device=device)
        if layout == "bhsd":
            return torch.randn(batch, heads, seqlen, head_dim, dtype=dtype, device=device).transpose(1, 2)
        if layout == "padded":
            base = torch.randn(batch, seqlen + 2, heads, head_dim + 8, dtype=dtype, device=device)
            return base[:, 2:, :, 8:]
        if layout == "unaligned":
            base = torch.randn(batch, seqlen, heads, head_dim + 3, dtype=dtype, device=device)
            return base[..., 1 : head_dim + 1]
        raise ValueError(layout)

    return one(seqlen_q, heads_q), one(seqlen_k, heads_kv), one(seqlen_k, heads_kv)


def reference_and_baseline(q, k, v, dout, scale, is_causal, bottom_right):
    """(ref_out, ref_grads, ref_lse) in float32 and (base_out, base_grads) in the inputs' dtype."""
    leaves32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = attention_reference(*leaves32, scale, is_causal, bottom_right, upcast=True, return_lse=True)
    ref_grads = torch.autograd.grad(ref_out, leaves32, dout.float()) if ref_out.numel() else None
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base_out = attention_reference(*leaves, scale, is_causal, bottom_right, upcast=False)
    base_grads = torch.autograd.grad(base_out, leaves, dout) if base_out.numel() else None
    return (ref_out, ref_grads, ref_lse.detach()), (base_out.detach(), base_grads)
