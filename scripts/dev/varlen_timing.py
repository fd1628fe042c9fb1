"""Where the time of one variable-length forward goes, beside the batched forward on the same tokens.

For each call: the host time per call (calls queued back to back, no synchronization), the GPU time per
call with the GPU ahead of the host (a spin kernel first, so host time hides), the time as
benchmarks/bench_varlen.py takes it (L2 flushed, then CUDA events around one call, host time
included), and the kernels one call launches with their GPU times (torch.profiler).

    python scripts/dev/varlen_timing.py [--docs 8] [--length 2048] [--heads 16] [--head-dim 128]
"""
import argparse
import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "benchmarks")]
import flashattn  # noqa: E402
from bench_varlen import median_ms  # noqa: E402  (its timer: L2 flushed, then one call between events)
from flashattn import ops  # noqa: E402


def host_us(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def gpu_ms(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of spinning: the host queues every call meanwhile
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def kernels(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append(f"      {e.device_time_total:8.1f} us  {e.name[:100]}")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args()
    b, n, h, d = args.docs, args.length, args.heads, args.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b * n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    cu = torch.arange(0, b * n + 1, n, device="cuda", dtype=torch.int32)
    scale = d ** -0.5
    calls = {
        "flash_attn_varlen_func": lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True),
        "ops.varlen_fwd": lambda: ops.varlen_fwd(q, k, v, cu, cu, None, None, scale, True, True, False),
        "flash_attn_func (batched)": lambda: flashattn.flash_attn_func(q.view(b, n, h, d), k.view(b, n, h, d),
                                                                      v.view(b, n, h, d), causal=True),
    }
    flops = 4 * b * n * n * h * d / 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {b} x {n} tokens, H={h}, D={d}, causal, bf16")
    for name, fn in calls.items():
        gpu = gpu_ms(fn)
        print(f"{name}: host {host_us(fn):.0f} us/call, GPU {gpu * 1e3:.0f} us/call ({flops / gpu / 1e9:.0f} TFLOP/s),"
              f" flushed + host {median_ms(fn, 10, 3000, 'cuda') * 1e3:.0f} us")
        print("\n".join(kernels(fn)))


if __name__ == "__main__":
    main()
