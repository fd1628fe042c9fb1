#!/usr/bin/env python3
"""Backward time with deterministic=True against the default, per head dim and causal setting
(B * N = 16k tokens, H * D = 2048, bf16): the cost of deterministic mode's ordered dq reductions.

  python3 scripts/dev/bwd_deterministic_cost.py --seqlen 1024 4096 16384 --headdim 64 128 256
  python3 scripts/dev/bwd_deterministic_cost.py --seqlen 4096 --headdim 128 --mask --dropout 0.1

--mask adds a (B, 1, 1, N) boolean mask excluding one key in the middle (no key prefix, so the masked kernel
runs it; deterministic mode reads its elements in every tile, the default only in the tile holding the
hole); --dropout P drops with p = P.
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
    parser.add_argument("--mask", action="store_true", help="a boolean (B, 1, 1, N) mask (the masked kernel)")
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout_p (the masked kernel's dropout form)")
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
                mask = None
                if args.mask:
                    mask = torch.ones(batch, 1, 1, seqlen, device=device, dtype=torch.bool)
                    mask[:, :, :, seqlen // 2] = False
                    mask = mask.expand(batch, heads, seqlen, seqlen)
                rng = torch.tensor([1, 2], device=device) if args.dropout > 0 else None
                out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, False, mask, args.dropout, rng)
                times = []
                for deterministic in (False, True):
                    def run():
                        torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, False,
                                                deterministic=deterministic, attn_mask=mask,
                                                dropout_p=args.dropout, rng_state=rng)
                    times.append(time_ms(run, 10, 60, device))
                print(f"| {head_dim} | {seqlen} | {'yes' if causal else 'no'} | {times[0]:.3f} | {times[1]:.3f} | "
                      f"{times[1] / times[0] - 1:+.1%} |")


if __name__ == "__main__":
    main()
