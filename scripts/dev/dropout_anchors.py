#!/usr/bin/env python3
"""What dropout p = 0.1 costs against p = 0 in flashattn and in torch SDPA's FLASH_ATTENTION and
CUDNN_ATTENTION backends, each method's two timed in the same rotating rounds (bf16, B*N = 16k tokens,
H*D = 2048, no mask, not causal). The ratio is p = 0.1 speed over p = 0 speed, per method.

  python3 scripts/dev/dropout_anchors.py [--head-dims 64,128] [--seqlens 1024,4096] [--methods flashattn]
      [--modes fwd] > table.md
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from bench_masks import MODEL_DIM, TOKENS, run_mode  # noqa: E402
from flashattn import ops  # noqa: E402
from harness import rotating_medians, time_ms  # noqa: E402  (benchmarks/harness.py)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,4096")
    parser.add_argument("--rep", type=float, default=60, help="ms of timed calls per method and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="flashattn,sdpa_flash,sdpa_cudnn")
    parser.add_argument("--modes", default="fwd,fwdbwd")
    args = parser.parse_args()
    print("| method | mode | D | N | p=0 TFLOP/s | p=0.1 TFLOP/s | ratio |")
    print("|---|---|---|---|--:|--:|--:|")
    for head_dim in map(int, args.head_dims.split(",")):
        for seqlen in map(int, args.seqlens.split(",")):
            batch, heads = TOKENS // seqlen, MODEL_DIM // head_dim
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            bhsd = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
            scale = head_dim**-0.5

            def ours(p):
                return lambda: ops.attention(q, k, v, scale, False, False, dropout_p=p)[0]

            def sdpa(backend, p):
                def fn():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(*bhsd, dropout_p=p, scale=scale)
                return fn
            methods = {"flashattn": (ours, [q, k, v]),
                       "sdpa_flash": (lambda p: sdpa(SDPBackend.FLASH_ATTENTION, p), bhsd),
                       "sdpa_cudnn": (lambda p: sdpa(SDPBackend.CUDNN_ATTENTION, p), bhsd)}
            methods = {name: methods[name] for name in args.methods.split(",")}
            for mode in args.modes.split(","):
                flop = 4 * batch * heads * seqlen * seqlen * head_dim * (1.0 if mode == "fwd" else 3.5)
                for name, (make, leaves) in methods.items():
                    calls = {p: run_mode(make(p), leaves, mode) for p in (0.0, 0.1)}
                    status = {}
                    ms = rotating_medians(calls, lambda p: time_ms(calls[p], 10, args.rep, torch.device("cuda")),
                                          args.rounds, status)
                    if len(ms) < 2:
                        print(f"| {name} | {mode} | {head_dim} | {seqlen} | failed: {status} | | |")
                        continue
                    t0, t1 = (flop / ms[p] / 1e9 for p in (0.0, 0.1))
                    print(f"| {name} | {mode} | {head_dim} | {seqlen} | {t0:.1f} | {t1:.1f} | {t1 / t0:.2f} |",
                          flush=True)


if __name__ == "__main__":
    main()
