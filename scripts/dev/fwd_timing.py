"""TFLOP/s of torch.ops.flashattn.fwd beside SDPA's cuDNN backend (bf16, B * N = 16k, H * D = 2048) over a
small grid: a quick look while changing the forward kernels; benchmarks/bench.py is the measurement of
record. scripts/dev/ab_fwd.sh runs it in two trees for an A/B in one device call.
Usage: fwd_timing.py [head dims, e.g. 64,128,256] [seqlens, e.g. 512,1024,2048]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn._C  # noqa: F401

dims = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [64, 128, 256]
seqlens = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [512, 1024, 2048, 4096, 16384]
for d in dims:
    for causal in (False, True):
        for n in seqlens:
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            t = do_bench(lambda: torch.ops.flashattn.fwd(q, k, v, d ** -0.5, causal, False), warmup=50, rep=200,
                         return_mode="median")
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                tc = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=50,
                              rep=200, return_mode="median")
            print(f"d={d} causal={int(causal)} n={n:5d} fwd {flops / t / 1e9:6.1f} cuDNN {flops / tc / 1e9:6.1f} "
                  f"ratio {tc / t:5.2f}", flush=True)
