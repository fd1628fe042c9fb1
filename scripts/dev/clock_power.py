#!/usr/bin/env python3
"""SM clock, power and throttle reasons while one forward runs back to back for a few seconds:
flashattn's against SDPA's cuDNN backend at the same shape, sampled by nvidia-smi every 50 ms. When a
kernel holds the GPU at its power limit, the clock it gets (and so its speed) depends on the energy
its instructions take, not only on their count; this shows whether two kernels run at one clock.

  python3 scripts/dev/clock_power.py [--configs 128:4096:0,64:512:1] [--seconds 3]
"""
import argparse
import statistics
import subprocess
import time

import torch

from forward_pair import forward_pairs
QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def sampled_while(call, seconds):
    """(samples as (MHz, W, C, reasons), calls made, GPU ms per call) while call() runs for `seconds`."""
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            call()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    samples = []
    for line in out.strip().splitlines()[2:]:  # the first samples may predate the loop
        fields = [f.strip() for f in line.split(",")]
        try:
            samples.append((float(fields[0]), float(fields[1]), float(fields[2]), fields[3]))
        except (ValueError, IndexError):
            pass
    return samples, calls, start.elapsed_time(end) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="128:4096:0,64:512:1", help="comma-separated head_dim:seqlen:causal")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print("| D | N | causal | impl | GPU us/call | TFLOP/s | SM MHz median (min-max) | W median (max) | C max | reasons |")
    print("|---|---|---|---|--:|--:|---|---|--:|---|")
    for head_dim, seqlen, causal, flops, calls in forward_pairs(args.configs):
        for impl in ("flashattn", "sdpa_cudnn", "flashattn"):  # ours before and after: a drift shows
            samples, _, ms = sampled_while(calls[impl], args.seconds)
            if not samples:
                print(f"| {head_dim} | {seqlen} | {causal} | {impl} | {ms * 1e3:.1f} | no samples |")
                continue
            mhz, watts, temp = ([s[i] for s in samples] for i in range(3))
            reasons = sorted({s[3] for s in samples})
            print(f"| {head_dim} | {seqlen} | {causal} | {impl} | {ms * 1e3:.1f} | {flops / ms / 1e9:.0f} | "
                  f"{statistics.median(mhz):.0f} ({min(mhz):.0f}-{max(mhz):.0f}) | "
                  f"{statistics.median(watts):.0f} ({max(watts):.0f}) | {max(temp):.0f} | {' '.join(reasons)} |",
                  flush=True)


if __name__ == "__main__":
    main()
