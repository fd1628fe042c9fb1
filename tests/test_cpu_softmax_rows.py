"""The CPU forward's fused per-row softmax step (csrc/cpu/attention_cpu_softmax_rows.cpp) in each of its
vector forms: every form this CPU runs (FLASHATTN_CPU_VECTOR caps the choice, read once per process, so
each form runs in a process of its own) against a float64 reference (the GUIDE's oracle: within twice the
error of the same math in the inputs' dtype), on the cases its vector code must
get right: rows whose length is no multiple of the vector width, rows without a visible key (-inf
scores: exactly 0 weight, out 0, lse -inf), a NaN score, large scores, causal diagonals and a boolean
mask, in float32 and bfloat16 (both on the gemm tiles that call it).
"""
import pytest

from cpu_vector_forms import run_in_form

WORKER = r"""
import json, math, sys
import torch
import flashattn._C  # noqa: F401
fwd = torch.ops.flashattn.fwd

def reference(q, k, v, scale, causal, mask, dtype):
    # Plain attention computed in dtype: out, lse.
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(dtype), k.to(dtype)) * scale
    lq, lk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.to(dtype))
    return out, lse

def within_oracle(result, ref, base):
    # GUIDE section 4: at most twice the error of the same math in the inputs' dtype, plus 1e-5.
    return float((result.double() - ref).abs().max()) <= 2 * float((base.double() - ref).abs().max()) + 1e-5

torch.manual_seed(0)
results = {"form": flashattn._C.cpu_softmax_rows_form(), "cases": []}
for dtype in (torch.float32, torch.bfloat16):
    for lq, lk, d, causal, masked, big in [(37, 97, 64, False, False, False), (1025, 1025, 40, True, False, False),
                                          (130, 531, 72, False, True, False), (64, 513, 64, False, False, True),
                                          (300, 17, 128, True, False, False)]:
        q, k, v = (torch.randn(2, n, 3, d, dtype=dtype) for n in (lq, lk, lk))
        if big:
            q = q * 30
        mask = None
        if masked:
            mask = torch.rand(2, 3, lq, lk) > 0.5
            mask[:, :, 5] = False  # rows that see no key
        scale = d ** -0.5
        out, lse = fwd(q, k, v, scale, causal, True, mask)
        ref_out, ref_lse = reference(q, k, v, scale, causal, mask, torch.float64)
        base_out, base_lse = reference(q, k, v, scale, causal, mask, dtype)
        empty = torch.isneginf(ref_lse)
        ok = (bool(torch.isfinite(out).all()) and bool(torch.equal(torch.isneginf(lse), empty))
              and within_oracle(out, ref_out, base_out)
              and within_oracle(lse[~empty], ref_lse[~empty], base_lse[~empty]))
        if masked:
            ok = ok and bool((out[:, 5] == 0).all())
        results["cases"].append([str(dtype), lq, lk, d, causal, masked, big, ok])
    # A NaN in k reaches the outputs of the rows that see it, and only those.
    q, k, v = (torch.randn(1, 97, 2, 64, dtype=dtype) for _ in range(3))
    k[0, 50, 0, 3] = float("nan")
    out, lse = fwd(q, k, v, 0.125, True, True, None)
    nan_ok = bool(torch.isnan(out[0, 50:, 0]).all()) and bool(torch.isfinite(out[0, :50, 0]).all())
    nan_ok = nan_ok and bool(torch.isnan(lse[0, 0, 50:]).all()) and bool(torch.isfinite(out[0, :, 1]).all())
    results["cases"].append([str(dtype), "nan in k", nan_ok])
print(json.dumps(results))
"""




@pytest.mark.parametrize("cap", [None, "avx2", "scalar"])
def test_every_vector_form_matches_the_reference(cap):
    result = run_in_form(WORKER, cap, timeout=300)
    if cap == "scalar":
        assert result["form"] == "scalar"
    elif cap == "avx2":
        assert result["form"] in ("avx2", "scalar")  # scalar on a CPU without AVX2
    failed = [case for case in result["cases"] if not case[-1]]
    assert not failed, f"form {result['form']}: {failed}"
