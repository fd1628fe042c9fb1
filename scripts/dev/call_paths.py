"""One forward shape timed through each way of calling it, to place a gap between the op timing
(scripts/dev/fwd_timing.py) and bench.py: torch.ops.flashattn.fwd on plain tensors, flash_attn_func on
tensors that require grad (as bench.py calls it), the same under torch.no_grad(), and SDPA's cuDNN
backend; do_bench (L2 flushed before each call) and a CUDA-event loop without flushes.
Usage: call_paths.py [head dim, default 128] [seqlen, default 512] [causal 0/1, default 0]"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = int(sys.argv[2]) if len(sys.argv) > 2 else 512
causal = bool(int(sys.argv[3])) if len(sys.argv) > 3 else False
b, h = 16384 // n, 2048 // d
flops = 4 * b * h * n * n * d / (2 if causal else 1)
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


def no_grad_func():
    with torch.no_grad():
        return flashattn.flash_attn_func(qg, kg, vg, causal=causal)


calls = {
    "op": lambda: torch.ops.flashattn.fwd(q, k, v, d ** -0.5, causal, False),
    "func_grad": lambda: flashattn.flash_attn_func(qg, kg, vg, causal=causal),
    "func_no_grad": no_grad_func,
    "cudnn": cudnn,
}


def event_loop(fn, reps=200):
    for _ in range(20):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def host_us(fn, reps=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


for rnd in range(2):
    for name, fn in calls.items():
        flushed = do_bench(fn, warmup=25, rep=100, return_mode="median")
        loop = event_loop(fn)
        print(f"round {rnd} d={d} n={n} causal={int(causal)} {name:13s} do_bench {flops / flushed / 1e9:6.1f} TFLOP/s "
              f"({flushed * 1e3:6.1f} us)  back-to-back {flops / loop / 1e9:6.1f} ({loop * 1e3:6.1f} us)  "
              f"host {host_us(fn):6.1f} us/call", flush=True)
