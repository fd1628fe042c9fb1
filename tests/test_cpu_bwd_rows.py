"""The CPU backward's fused per-row steps (csrc/cpu/attention_cpu_bwd_rows.cpp: P from the scores and
lse, dS from dP, their bfloat16 copies) in each of their vector forms: every form this CPU runs
(FLASHATTN_CPU_VECTOR caps the choice, read once per process, so each form runs in a process of its
own), dq, dk and dv against float64 autograd (the GUIDE's oracle: within twice the error of the same
math in the inputs' dtype), on what the vector code must get right: rows whose length is no multiple of
the vector width, causal diagonals, rows without a visible key (their dq exactly 0), a boolean mask, a
floating mask, softcap (dS finished after its pass), GQA, large scores, odd head dims, row and key
counts, in float32 and bfloat16; and keys no query sees holding NaN, which must reach no gradient. The
cap also picks the bfloat16 products' form (csrc/cpu/attention_cpu_bwd_bf16_products.h): AVX512-BF16
where the CPU has it and nothing caps it, else cpublas's gemm.
"""
import pytest

from cpu_vector_forms import run_in_form

WORKER = r"""
import json, math
import torch
import flashattn

def attention(q, k, v, scale, causal, mask, softcap, dtype):
    # q [B, Lq, H, D], k / v [B, Lk, Hk, D] in dtype; the keys' heads repeated for GQA.
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    lq, lk = s.shape[-2:]
    excluded = torch.zeros(lq, lk, dtype=torch.bool)
    if causal:
        excluded = torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1)
    excluded = excluded.expand(s.shape)
    if mask is not None:
        if mask.dtype == torch.bool:
            excluded = excluded | ~mask
        else:
            s = s + mask.to(dtype)
    empty = excluded.all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(excluded & ~empty, -math.inf).masked_fill(empty, 0), -1)
    p = p.masked_fill(excluded, 0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)

def grads(fn, inputs, dout):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, dout.to(out.dtype))

def within_oracle(result, ref, base):
    return float((result.double() - ref).abs().max()) <= 2 * float((base.double() - ref).abs().max()) + 1e-5

torch.manual_seed(0)
results = {"form": flashattn._C.cpu_softmax_rows_form(), "products": flashattn._C.cpu_bwd_bf16_products_form(),
           "cases": []}
CASES = [  # lq, lk, heads, kv heads, d, causal, mask kind, softcap, big
    (37, 97, 2, 2, 64, False, None, 0.0, False),
    (600, 531, 4, 2, 40, True, None, 0.0, False),
    (130, 531, 2, 1, 72, False, "bool", 0.0, False),
    (130, 300, 2, 2, 64, False, "float", 0.0, False),
    (90, 513, 2, 2, 32, True, None, 20.0, False),
    (64, 700, 2, 2, 64, False, None, 0.0, True),
    (301, 45, 2, 1, 33, False, None, 0.0, False),  # odd head dim, odd rows and keys
]
for dtype in (torch.float32, torch.bfloat16):
    for lq, lk, heads, heads_kv, d, causal, mask_kind, softcap, big in CASES:
        q = torch.randn(2, lq, heads, d, dtype=dtype) * (8 if big else 1)
        k, v = (torch.randn(2, lk, heads_kv, d, dtype=dtype) for _ in range(2))
        dout = torch.randn(2, lq, heads, d, dtype=dtype)
        scale = d ** -0.5
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(2, heads, lq, lk) > 0.5
            mask[:, :, 5] = False  # rows that see no key
        elif mask_kind == "float":
            mask = torch.randn(2, heads, lq, lk, dtype=dtype)
        if mask is None:
            ours = lambda q, k, v: flashattn.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                             softcap=softcap)
        else:
            ours = lambda q, k, v: flashattn.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale,
                enable_gqa=True).transpose(1, 2)
        got = grads(ours, (q, k, v), dout)
        ref = grads(lambda q, k, v: attention(q, k, v, scale, causal, mask, softcap, torch.float64),
                    (q.double(), k.double(), v.double()), dout.double())
        base = grads(lambda q, k, v: attention(q, k, v, scale, causal, mask, softcap, dtype), (q, k, v), dout)
        ok = all(bool(torch.isfinite(g).all()) and within_oracle(g, r, b) for g, r, b in zip(got, ref, base))
        if mask_kind == "bool":
            ok = ok and bool((got[0][:, 5] == 0).all())
        results["cases"].append([str(dtype), lq, lk, heads, heads_kv, d, causal, mask_kind, softcap, big, ok])
# Keys no query sees (top-left causal, Lq < Lk, an odd number of keys seen) hold NaN: they must not
# reach any gradient (the bfloat16 products pair the last seen key with the next one).
q, dout = torch.randn(1, 301, 2, 64, dtype=torch.bfloat16), torch.randn(1, 301, 2, 64, dtype=torch.bfloat16)
k, v = (torch.randn(1, 600, 2, 64, dtype=torch.bfloat16) for _ in range(2))
k[:, 301:], v[:, 301:] = float("nan"), float("nan")
ours = lambda q, k, v: flashattn.scaled_dot_product_attention(
    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
got = grads(ours, (q, k, v), dout)
ref = grads(lambda q, k, v: attention(q, k[:, :301], v[:, :301], 0.125, True, None, 0.0, torch.float64),
            (q.double(), k.double(), v.double()), dout.double())
base = grads(lambda q, k, v: attention(q, k[:, :301], v[:, :301], 0.125, True, None, 0.0, torch.bfloat16),
             (q, k, v), dout)
results["unseen_nan_keys"] = (
    all(bool(torch.isfinite(g[:, :301]).all()) and within_oracle(g[:, :301], r[:, :301], b[:, :301])
        for g, r, b in zip(got, ref, base))
    and bool((got[1][:, 301:] == 0).all()) and bool((got[2][:, 301:] == 0).all()))
print(json.dumps(results))
"""




@pytest.mark.parametrize("cap", [None, "avx2", "scalar"])
def test_every_vector_form_matches_the_reference(cap):
    result = run_in_form(WORKER, cap, timeout=600)
    if cap == "scalar":
        assert result["form"] == "scalar"
    elif cap == "avx2":
        assert result["form"] in ("avx2", "scalar")  # scalar on a CPU without AVX2
    if cap is not None:
        assert result["products"] != "avx512_bf16"  # the cap rules the AVX512-BF16 products out too
    assert len(result["cases"]) == 14
    failed = [case for case in result["cases"] if not case[-1]]
    assert not failed, f"form {result['form']}, products {result['products']}: {failed}"
    assert result["unseen_nan_keys"], f"form {result['form']}, products {result['products']}"
