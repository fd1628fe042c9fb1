#!/usr/bin/env python3
"""The spread of per-call kernel times: flashattn's forward against SDPA's cuDNN backend, each call after
an L2 flush (as the benchmark's timer does), every GPU kernel's duration from torch.profiler. A wide
spread in one kernel and not in the other places a benchmark's run-to-run difference in that kernel;
kernels besides the attention one (memsets, prepasses) show what a call adds around it.

  python3 scripts/dev/kernel_spread.py [--configs 64:512:1,64:1024:1,128:4096:0] [--calls 100]
"""
import argparse
import statistics

import torch

from forward_pair import forward_pairs


def kernel_times(call, calls):
    """{kernel name: [device us per call]} over `calls` calls, each after an L2 flush."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            times.setdefault(event.name, []).append(event.device_time)
    return {name: t for name, t in times.items() if "elementwise" not in name and "fill" not in name.lower()}


def quantiles(values):
    values = sorted(values)
    pick = lambda f: values[min(len(values) - 1, int(f * len(values)))]  # noqa: E731
    return values[0], pick(0.1), statistics.median(values), pick(0.9), values[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="64:512:1,64:1024:1,128:4096:0",
                        help="comma-separated head_dim:seqlen:causal")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print("| D | N | causal | impl | kernel | calls | min us | p10 | median | p90 | max |")
    print("|---|---|---|---|---|--:|--:|--:|--:|--:|--:|")
    for head_dim, seqlen, causal, _, calls in forward_pairs(args.configs):
        for impl, call in calls.items():
            for name, times in kernel_times(call, args.calls).items():
                cells = " | ".join(f"{t:.1f}" for t in quantiles(times))
                print(f"| {head_dim} | {seqlen} | {causal} | {impl} | {name[:60]} | {len(times)} | {cells} |",
                      flush=True)


if __name__ == "__main__":
    main()
