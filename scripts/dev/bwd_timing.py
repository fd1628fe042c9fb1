"""TFLOP/s of torch.ops.flashattn.bwd alone (bf16, B * N = 16k, H * D = 2048) over a small grid: a quick
look while changing the backward kernels; benchmarks/bench.py is the measurement of record."""
import sys

import torch
from triton.testing import do_bench

import flashattn._C  # noqa: F401

dims = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [64, 128]
for d in dims:
    for causal in (False, True):
        for n in (512, 1024, 4096, 16384):
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out, lse = torch.ops.flashattn.fwd(q, k, v, d ** -0.5, causal, False)
            dout = torch.randn_like(out)
            t = do_bench(lambda: torch.ops.flashattn.bwd(dout, q, k, v, out, lse, d ** -0.5, causal, False),
                         warmup=50, rep=200, return_mode="median")
            flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
            print(f"d={d} causal={int(causal)} n={n:5d} bwd {flops / t / 1e9:6.1f} TFLOP/s ({t * 1e3:7.1f} us)", flush=True)
