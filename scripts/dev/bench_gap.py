#!/usr/bin/env python3
"""Where a benchmark cell's time goes: the benchmark's own timed loop (triton's do_bench: an L2 flush,
a start event, the call, an end event, all queued without synchronisation) taken apart per call.

For each method and config it prints, as medians over the calls: the flush's GPU time, the timed GPU
time (start to end event, what the benchmark reports), the host time per loop iteration, and
do_bench's own figure. When the host time per iteration exceeds flush + kernel, the GPU waits for
the host and the timed span includes that wait: the cell is bound by the host, not by the kernel.

  python3 scripts/dev/bench_gap.py [--configs 128:512:0,64:512:1] [--calls 200] [--rounds 3]
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import harness  # noqa: E402  (benchmarks/harness.py)

FLUSH_BYTES = 256 * 2**20  # triton's do_bench flush buffer


def timed_loop(fn, calls):
    """(flush ms, timed ms, host us per iteration) medians of `calls` do_bench-style iterations."""
    cache = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(calls)]
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for before, start, end in events:
        before.record()
        cache.zero_()
        start.record()
        fn()
        end.record()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    flush = statistics.median(b.elapsed_time(s) for b, s, _ in events)
    timed = statistics.median(s.elapsed_time(e) for _, s, e in events)
    return flush, timed, host


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="128:512:0,128:512:1,64:512:1,256:512:1",
                        help="D:N:causal, comma separated")
    parser.add_argument("--methods", default="flashattn,sdpa_cudnn")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from triton.testing import do_bench

    print("| method | D | N | causal | round | flush us | timed us | host us/iter | do_bench us |")
    print("|---|---|---|---|---|--:|--:|--:|--:|")
    for config in args.configs.split(","):
        head_dim, seqlen, causal = (int(x) for x in config.split(":"))
        batch, heads = harness.config_shape(seqlen, head_dim)
        q, k, v, dout = harness.make_inputs(batch, seqlen, heads, head_dim, torch.bfloat16, "cuda")
        for r in range(args.rounds):
            for name in args.methods.split(","):
                forward = harness.make_impl(name, bool(causal), seqlen)
                fn = harness.timed_fn(forward, "fwd", q, k, v, dout)
                flush, timed, host = timed_loop(fn, args.calls)
                whole = do_bench(fn, warmup=10, rep=50, return_mode="median")
                print(f"| {name} | {head_dim} | {seqlen} | {causal} | {r} | {flush * 1e3:.1f} | {timed * 1e3:.1f} "
                      f"| {host:.1f} | {whole * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
