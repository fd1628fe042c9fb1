#!/usr/bin/env python3
"""Quick kernel check on a GPU: the oracle of GUIDE section 4 on a handful of awkward shapes through
torch.ops.flashattn directly, then fwd/bwd TFLOP/s beside SDPA's flash and cuDNN backends.
Used while developing kernels; the full suites are tests/ and benchmarks/bench.py."""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

import flashattn._C  # noqa: F401  (registers torch.ops.flashattn)


def reference(q, k, v, scale, causal, bottom_right, dtype):
    """[B, S, H, D] attention computed in `dtype`; rows that see no key give 0."""
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    lq, lk = q.shape[2], k.shape[2]
    if causal:
        offset = lk - lq if bottom_right else 0
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + offset, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.matmul(p, v).transpose(1, 2)


def check_case(b, lq, lk, hq, hk, d, causal, bottom_right, dtype, transposed=False):
    dev = "cuda"
    def make(l, h):
        if transposed:  # a [B, H, S, D] tensor viewed as [B, S, H, D]
            return torch.randn(b, h, l, d, device=dev, dtype=dtype).transpose(1, 2).requires_grad_()
        return torch.randn(b, l, h, d, device=dev, dtype=dtype, requires_grad=True)
    q, k, v = make(lq, hq), make(lk, hk), make(lk, hk)
    scale = 1.0 / math.sqrt(d)
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, bottom_right)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, bottom_right)
    errs = {}
    names = ("out", "dq", "dk", "dv")
    ref_out = reference(q, k, v, scale, causal, bottom_right, torch.float32)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout.float())
    base_out = reference(q, k, v, scale, causal, bottom_right, dtype)
    base_grads = torch.autograd.grad(base_out, (q, k, v), dout)
    ok = True
    for name, ours, ref, base, mult in zip(names, (out, dq, dk, dv), (ref_out,) + ref_grads,
                                           (base_out,) + base_grads, (2, 3, 3, 3)):
        err = (ours.float() - ref.float()).abs().max().item() if ours.numel() else 0.0
        base_err = (base.float() - ref.float()).abs().max().item() if ours.numel() else 0.0
        good = math.isfinite(err) and err <= mult * base_err + 1e-5
        ok &= good
        errs[name] = f"{err:.2e}/{base_err:.2e}{'' if good else ' FAIL'}"
    print(f"{'ok  ' if ok else 'FAIL'} b={b} lq={lq} lk={lk} hq={hq} hk={hk} d={d} causal={causal} br={bottom_right} "
          f"{str(dtype)[6:]} T={transposed} " + " ".join(f"{k}={v}" for k, v in errs.items()), flush=True)
    return ok


def correctness():
    cases = []
    for dtype in (torch.bfloat16, torch.float16):
        for d in (32, 40, 64, 72, 96, 128, 160, 192, 256, 13, 1):
            cases.append((2, 97, 97, 4, 2, d, False, False, dtype))
            cases.append((1, 113, 203, 2, 1, d, True, False, dtype))
        for (lq, lk) in ((1, 1), (17, 17), (1025, 1025), (203, 113), (113, 203), (128, 1), (1, 128)):
            for causal, br in ((False, False), (True, False), (True, True)):
                cases.append((2, lq, lk, 4, 4, 128, causal, br, dtype))
                cases.append((1, lq, lk, 2, 2, 64, causal, br, dtype))
    n_fail = 0
    for c in cases:
        n_fail += not check_case(*c)
    n_fail += not check_case(2, 300, 300, 8, 2, 128, True, False, torch.bfloat16, transposed=True)
    print(f"correctness: {len(cases) + 1 - n_fail} passed, {n_fail} failed")
    return n_fail == 0


def bench():
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            for n in (1024, 4096, 16384):
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
                scale = d ** -0.5
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, False)
                dout = torch.randn_like(out)
                t_fwd = do_bench(lambda: torch.ops.flashattn.fwd(q, k, v, scale, causal, False), warmup=50, rep=200, return_mode="median")
                t_bwd = do_bench(lambda: torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, False), warmup=50, rep=200, return_mode="median")
                res = [f"d={d} causal={int(causal)} n={n}", flops / t_fwd / 1e9, 2.5 * flops / t_bwd / 1e9]
                qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    try:
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            g = torch.randn_like(o)
                            tf = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=50, rep=200, return_mode="median")
                            tfb = do_bench(lambda: torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt), g), warmup=50, rep=200, return_mode="median")
                        res += [flops / tf / 1e9, 2.5 * flops / max(tfb - tf, 1e-6) / 1e9]
                    except Exception as e:  # noqa: BLE001
                        res += [float("nan"), float("nan")]
                rows.append(res)
                print(f"{res[0]:24s} ours fwd {res[1]:6.1f} bwd {res[2]:6.1f} | FA2 fwd {res[3]:6.1f} bwd {res[4]:6.1f} | cuDNN fwd {res[5]:6.1f} bwd {res[6]:6.1f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    good = correctness()
    if args.bench:
        bench()
    sys.exit(0 if good else 1)
