#!/usr/bin/env python3
"""Host time per call of flashattn's entry points, on the CPU with tiny tensors ([1, 1, 1, 8]), so the
figure is the Python and dispatcher path around the kernel (the kernel's own work is a few hundred
nanoseconds): the best of --rounds rounds of --calls calls each. Runs without a GPU, to compare host
paths between builds (run it once per checkout, e.g. with PYTHONPATH pointing at each).

  python3 scripts/dev/host_time_cpu.py [--calls 2000] [--rounds 7]
"""
import argparse
import time

import torch

import flashattn


def best_us(fn, calls, rounds):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 1, 1, 8, requires_grad=True) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    calls = {
        "torch.ops.flashattn.fwd": lambda: torch.ops.flashattn.fwd(q, k, v, 0.35, True, False),
        "flashattn.flash_attn_func": lambda: flashattn.flash_attn_func(q, k, v, causal=True),
        "flashattn.scaled_dot_product_attention": lambda: flashattn.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True),
    }
    print("| call | grad mode, inputs requiring grad (us) | no_grad (us) |")
    print("|---|--:|--:|")
    for name, fn in calls.items():
        with_grad = best_us(fn, args.calls, args.rounds)
        with torch.no_grad():
            without = best_us(fn, args.calls, args.rounds)
        print(f"| {name} | {with_grad:.1f} | {without:.1f} |", flush=True)


if __name__ == "__main__":
    main()
