"""The sm90 forward's causal schedule, dynamic tail against static pairs, in one process: the op is
timed with FLASHATTN_SM90_STATIC_SCHEDULE unset and set to 1 (read on every call), beside SDPA's cuDNN
backend, in rotating rounds (bf16, B * N = 16k, H * D = 2048, causal). A quick A/B;
benchmarks/bench.py is the measurement of record.
Usage: schedule_ab.py [head dims, e.g. 64,128] [seqlens, e.g. 512,1024,2048] [rounds, default 3]"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn._C  # noqa: F401

dims = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [64, 128, 256]
seqlens = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [512, 1024, 2048, 4096, 8192, 16384]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3


def timed(schedule, q, k, v, d):
    if schedule == "cudnn":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    if schedule == "static":
        os.environ["FLASHATTN_SM90_STATIC_SCHEDULE"] = "1"
    else:
        os.environ.pop("FLASHATTN_SM90_STATIC_SCHEDULE", None)
    try:
        return do_bench(lambda: torch.ops.flashattn.fwd(q, k, v, d ** -0.5, True, False), warmup=25, rep=100,
                        return_mode="median")
    finally:
        os.environ.pop("FLASHATTN_SM90_STATIC_SCHEDULE", None)


names = ["dynamic", "static", "cudnn"]
for d in dims:
    for n in seqlens:
        b, h = 16384 // n, 2048 // d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * n * n * d / 2
        ms = {name: [] for name in names}
        for r in range(rounds):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]
                ms[name].append(timed(name, q, k, v, d))
        tf = {name: flops / statistics.median(t) / 1e9 for name, t in ms.items()}
        print(f"d={d} causal n={n:5d} dynamic {tf['dynamic']:6.1f} static {tf['static']:6.1f} cuDNN {tf['cudnn']:6.1f} "
              f"dynamic/static {tf['dynamic'] / tf['static']:5.3f} dynamic/cuDNN {tf['dynamic'] / tf['cudnn']:5.3f}",
              flush=True)
