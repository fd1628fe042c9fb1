#!/usr/bin/env python3
"""Backward time with deterministic=True against the default, per head dim and causal setting
(B * N = 16k tokens, H * D = 2048, bf16): the cost of deterministic mode's ordered dq reductions.

  python3 scripts/dev/bwd_deterministic_cost.py --seqlen 1024 4096 16384 --headdim 64 128 256
"""
import argparse
import math

import torch

import flashattn  # noqa: F401  (registers torch.ops.flashattn)
from benchmarks.harness import time_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--headdim", type=int, nargs="+", default=[64, 96, 128, 192, 256])
    args = parser.parse_args()
    device = torch.device("cuda")
    print("| D | N | causal | default ms | deterministic ms | cost |")
    print("|---|---|---|---|---|---|")
    for head_dim in args.headdim:
        for seqlen in args.seqlen:
            for causal in (False, True):
                batch, heads = max(16384 // seqlen, 1), max(2048 // head_dim, 1)
                q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=torch.bfloat16)
                                 for _ in range(4))
                scale = 1 / math.sqrt(head_dim)
                out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, False)
                times = []
                for deterministic in (False, True):
                    def run():
                        torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, False,
                                                deterministic=deterministic)
                    times.append(time_ms(run, 10, 60, device))
                print(f"| {head_dim} | {seqlen} | {'yes' if causal else 'no'} | {times[0]:.3f} | {times[1]:.3f} | "
                      f"{times[1] / times[0] - 1:+.1%} |")


if __name__ == "__main__":
    main()
