"""The correctness oracle and input builders shared by the test suite and ``python -m flashattn check``.

The oracle is the FlashAttention-2 rule (GUIDE section 4): a low-precision result may be at most
``factor`` times further from a reference computed one precision up than the same plain-PyTorch math
run in the inputs' dtype (the baseline), plus a small absolute slack. A NaN or inf never passes.
For float16/bfloat16 the reference is float32; :func:`check_case` extends the rule to float32
inputs with a float64 reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .reference import attention_reference

__all__ = [
    "ABS_SLACK",
    "CAUSAL_MODES",
    "GRAD_FACTOR",
    "OUT_FACTOR",
    "ZERO_REF_SLACK",
    "CaseResult",
    "OracleFigure",
    "assert_attention_oracle",
    "assert_oracle",
    "check_case",
    "dtype_name",
    "make_qkv",
    "max_abs_diff",
    "oracle_figure",
    "reference_and_baseline",
    "run_attention",
]

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


@dataclass
class OracleFigure:
    """One tensor judged by the oracle: its error, the error allowed, and whether it passed."""

    name: str
    err: float
    baseline_err: float
    bound: float
    finite: bool
    shape_ok: bool

    @property
    def passed(self) -> bool:
        return self.shape_ok and self.finite and self.err <= self.bound


def oracle_figure(name: str, result: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, factor: float) -> OracleFigure:
    """The oracle's figures for one tensor: max|result - ref| against factor * max|baseline - ref| + ABS_SLACK."""
    shape_ok = result.shape == ref.shape
    finite = bool(torch.isfinite(result).all()) if result.numel() else True
    err = max_abs_diff(result, ref) if shape_ok else math.inf
    if math.isnan(err):
        err = math.inf
    base_err = max_abs_diff(baseline, ref)
    bound = factor * base_err + ABS_SLACK
    if ref.numel() and ref.abs().max().item() == 0.0:
        bound = max(bound, ZERO_REF_SLACK)
    return OracleFigure(name, err, base_err, bound, finite, shape_ok)


def assert_oracle(name: str, result: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, factor: float) -> None:
    """max|result - ref| <= factor * max|baseline - ref| + ABS_SLACK, and no NaN/inf in result."""
    assert result.shape == ref.shape, f"{name}: shape {tuple(result.shape)} != reference {tuple(ref.shape)}"
    figure = oracle_figure(name, result, ref, baseline, factor)
    assert figure.finite, f"{name}: result has NaN or inf"
    assert figure.err <= figure.bound, (
        f"{name}: max|out - ref| = {figure.err:.3e} exceeds {factor:g} * max|baseline - ref| + {ABS_SLACK:g} "
        f"= {figure.bound:.3e}"
    )


def assert_attention_oracle(out, lse, grads, ref, base,
                            grad_names=("dq", "dk", "dv", "dsink")) -> None:
    """assert_oracle on an attention call's out, lse and gradients: ref and base are (out, lse, grads) of the
    float64 reference and of the same math in the inputs' dtype. lse must be -inf exactly on the rows the
    reference leaves without a key (and is judged on the others)."""
    assert_oracle("out", out, ref[0], base[0], OUT_FACTOR)
    empty = torch.isneginf(ref[1])
    assert torch.equal(torch.isneginf(lse).cpu(), empty.cpu()), "lse: -inf rows differ from the reference"
    assert_oracle("lse", lse[~empty], ref[1][~empty], base[1][~empty], OUT_FACTOR)
    for name, g, r, b in zip(grad_names, grads, ref[2], base[2]):
        assert_oracle(name, g, r, b, GRAD_FACTOR)


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


def reference_and_baseline(q, k, v, dout, scale, is_causal, bottom_right, ref_dtype=torch.float32):
    """(ref_out, ref_grads, ref_lse) in ref_dtype (float32 by default) and (base_out, base_grads) in the inputs' dtype."""
    leaves_ref = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = attention_reference(*leaves_ref, scale, is_causal, bottom_right, upcast=True, return_lse=True)
    ref_grads = torch.autograd.grad(ref_out, leaves_ref, dout.to(ref_dtype)) if ref_out.numel() else None
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base_out = attention_reference(*leaves, scale, is_causal, bottom_right, upcast=False)
    base_grads = torch.autograd.grad(base_out, leaves, dout) if base_out.numel() else None
    return (ref_out, ref_grads, ref_lse.detach()), (base_out.detach(), base_grads)


def run_attention(q, k, v, dout, scale, is_causal, bottom_right):
    """flashattn's forward (``torch.ops.flashattn.fwd``) and, through autograd, its backward: (out, (dq, dk, dv))."""
    from . import ops

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = ops.fwd(*leaves, float(scale), bool(is_causal), bool(bottom_right))
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), tuple(g.detach() for g in grads)


@dataclass
class CaseResult:
    """The oracle's verdict on one (shape, dtype, mask) case: out, dq, dk and dv figures."""

    description: str
    figures: List[OracleFigure] = field(default_factory=list)
    error: Optional[str] = None  # set when the case raised instead of returning

    @property
    def passed(self) -> bool:
        return self.error is None and all(f.passed for f in self.figures)


_REF_DTYPE: Dict[torch.dtype, torch.dtype] = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
}


def check_case(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads_q: int,
    heads_kv: int,
    head_dim: int,
    causal_mode: str,
    dtype: torch.dtype,
    device,
    layout: str = "contiguous",
    scale: Optional[float] = None,
) -> CaseResult:
    """Runs flashattn forward + backward on fresh random inputs and judges out, dq, dk, dv with the oracle.

    The reference is one precision up (float32 for float16/bfloat16, float64 for float32); the baseline
    is the same plain-PyTorch math in the inputs' dtype. Exceptions are caught and reported in the result.
    """
    is_causal, bottom_right = CAUSAL_MODES[causal_mode]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    description = (
        f"{torch.device(device).type:<4} {dtype_name(dtype):<4} b={batch} lq={seqlen_q} lk={seqlen_k} "
        f"h={heads_q}/{heads_kv} d={head_dim} causal={causal_mode}" + (f" {layout}" if layout != "contiguous" else "")
    )
    result = CaseResult(description)
    try:
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device, layout)
        dout = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
        out, grads = run_attention(q, k, v, dout, scale, is_causal, bottom_right)
        (ref_out, ref_grads, _), (base_out, base_grads) = reference_and_baseline(
            q, k, v, dout, scale, is_causal, bottom_right, ref_dtype=_REF_DTYPE[dtype]
        )
        result.figures.append(oracle_figure("out", out, ref_out, base_out, OUT_FACTOR))
        for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            result.figures.append(oracle_figure(name, g, r, b, GRAD_FACTOR))
    except Exception as exc:  # noqa: BLE001  (reported as a failed case, never a traceback)
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return result


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype: fp16, bf16, fp32, fp64."""
    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}
    return names.get(dtype, str(dtype).replace("torch.", ""))
