#!/usr/bin/env python3
"""Whether short forward calls are bound by the host: per call, the CPU time to issue it (calls queued
back to back, no synchronisation), the GPU time per call when queued that way (CUDA events around the
loop), and the GPU time per call replayed from a CUDA graph (no host work between kernels). When the
queued time is near the issue time and above the graph time, the host sets the pace.

  python3 scripts/dev/host_overhead.py [--head-dim 64] [--seqlens 512,1024] [--causal] [--api ops|fa2|cudnn] [--grad]

--api picks the call: torch.ops.flashattn.fwd (ops), flashattn.flash_attn_func (fa2, the benchmark's
flashattn call) or SDPA's cuDNN backend on the same (B, N, H, D) tensors transposed (cudnn, the
benchmark's anchor call); --grad gives the inputs requires_grad, as the benchmark does, so the call
also records the autograd graph (the graph replay is then left out: capture keeps no autograd state).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import flashattn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flashattn import ops  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

TOKENS, MODEL_DIM, CALLS = 16384, 2048, 200


def per_call_us(run, calls=CALLS):
    """(host issue time, GPU time) per call in microseconds of `calls` back-to-back calls of run()."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    issue = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    return issue, start.elapsed_time(end) / calls * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlens", default="512,1024")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--api", choices=("ops", "fa2", "cudnn"), default="ops")
    parser.add_argument("--grad", action="store_true")
    args = parser.parse_args()
    print("| api | grad | D | N | causal | host issue us/call | GPU us/call, queued | GPU us/call, graph |")
    print("|---|---|---|---|---|--:|--:|--:|")
    for seqlen in map(int, args.seqlens.split(",")):
        batch, heads = TOKENS // seqlen, MODEL_DIM // args.head_dim
        q, k, v = (torch.randn(batch, seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=args.grad) for _ in range(3))
        scale = args.head_dim**-0.5

        def run():
            if args.api == "ops":
                ops.fwd(q, k, v, scale, args.causal, False)
            elif args.api == "fa2":
                flashattn.flash_attn_func(q, k, v, causal=args.causal)
            else:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=args.causal)
        for _ in range(20):
            run()
        issue, queued = per_call_us(run)
        row = f"| {args.api} | {args.grad} | {args.head_dim} | {seqlen} | {args.causal} | {issue:.1f} | {queued:.1f}"
        if args.grad:
            print(row + " | n/a |", flush=True)
            continue
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                run()
        _, replayed = per_call_us(graph.replay, calls=CALLS // 10)
        print(row + f" | {replayed / 10:.1f} |", flush=True)


if __name__ == "__main__":
    main()
