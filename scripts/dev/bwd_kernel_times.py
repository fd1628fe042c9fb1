#!/usr/bin/env python3
"""Where a backward call's GPU time goes, launch by launch: the preprocess (delta, LSE in base 2), the
main kernel and the dq conversion, for flashattn's bwd op on the standard grid's shapes (bf16,
B * N = 16k, H * D = 2048), from torch.profiler's CUDA kernel times (median of --calls calls each).

  python3 scripts/dev/bwd_kernel_times.py                      # D 64/128/256, N 1k/4k/16k, causal and not
  python3 scripts/dev/bwd_kernel_times.py --headdim 128 --seqlen 1024
"""
import argparse
import statistics
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import flashattn._C  # noqa: F401


def kernel_times(d, n, causal, calls):
    b, h = max(16384 // n, 1), 2048 // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.ops.flashattn.fwd(q, k, v, d**-0.5, causal, False)
    dout = torch.randn_like(out)
    for _ in range(3):  # warm-up
        torch.ops.flashattn.bwd(dout, q, k, v, out, lse, d**-0.5, causal, False)
    torch.cuda.synchronize()
    per_kernel = defaultdict(list)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.ops.flashattn.bwd(dout, q, k, v, out, lse, d**-0.5, causal, False)
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name].append(event.device_time)
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    rows = []
    for name, times in per_kernel.items():
        rows.append((statistics.median(times) * len(times) / calls, name))
    total = sum(t for t, _ in rows)
    print(f"D={d} N={n} causal={causal}: {total:.1f} us per call, {flops / total / 1e6:.0f} TFLOP/s over the launches")
    for t, name in sorted(rows, reverse=True):
        short = name if len(name) < 90 else name[:87] + "..."
        print(f"  {t:9.1f} us  {100 * t / total:5.1f}%  {short}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headdim", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    for d in args.headdim:
        for n in args.seqlen:
            for causal in (False, True):
                kernel_times(d, n, causal, args.calls)


if __name__ == "__main__":
    main()
