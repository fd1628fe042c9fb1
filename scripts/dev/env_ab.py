#!/usr/bin/env python3
"""TFLOP/s of torch.ops.flashattn.fwd (or, with --direction bwd, of its backward: 2.5x the forward's
FLOPs) under each value of one of the planner's switches (flashattn.plan, e.g. sm90_multicast off /
on), beside SDPA's cuDNN backend, in one process and one build (bf16, B * N = 16k, H * D = 2048). Methods are timed in rotating rounds (do_bench medians) so
that clock and power drift over the run falls on each alike; the table gives each round's figures.

  python3 scripts/dev/env_ab.py --env sm90_multicast --values off,on \
      [--configs 128:4096:0,64:16384:0] [--rounds 2]

--settings compares settings of several switches instead: semicolon-separated, each a comma-separated
list of OPTION=VALUE (or "-" for none of them changed; scripts/dev/env_settings.py), e.g.
  --settings "-;sm90_wide_key_blocks=off;sm90_wide_key_blocks=on,sm90_multicast=off"
After each configuration's rounds a "median" row gives the median of every column.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn._C  # noqa: F401
from env_settings import apply, switches_of


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env")
    parser.add_argument("--values", default="off,on")
    parser.add_argument("--settings", help="semicolon-separated settings (see above); replaces --env/--values")
    parser.add_argument("--configs", default="128:1024:0,128:2048:0,128:4096:0,128:8192:0,128:16384:0",
                        help="D:N:causal, comma separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    args = parser.parse_args()
    if args.settings:
        methods = args.settings.split(";")
    elif args.env:
        methods = [f"{args.env}={v}" for v in args.values.split(",")]
    else:
        parser.error("give --env or --settings")
    switches = switches_of(methods)
    methods.append("cuDNN")
    print(f"| D | N | causal | round | {' | '.join(methods)} | " + " | ".join(f"{m} / cuDNN" for m in methods[:-1]) + " |")
    print("|---|---|---|---|" + "--:|" * (2 * len(methods) - 1))
    for config in args.configs.split(","):
        d, n, causal = (int(x) for x in config.split(":"))
        b, h = 16384 // n, 2048 // d
        backward = args.direction == "bwd"
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                   for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4 * b * h * n * n * d / (2 if causal else 1) * (2.5 if backward else 1)

        def ours_forward():
            return torch.ops.flashattn.fwd(q, k, v, d ** -0.5, bool(causal), False)

        def cudnn_forward():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))

        if backward:  # the backward of one saved forward each (the plan is made when it runs)
            out, out_cudnn = ours_forward()[0], cudnn_forward()
            dout = torch.randn_like(out)

            def ours():
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            def cudnn():
                return torch.autograd.grad(out_cudnn, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)
        else:
            ours, cudnn = ours_forward, cudnn_forward

        rounds = []
        for r in range(args.rounds):
            tflops = {}
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for m in order:
                if m == "cuDNN":
                    fn = cudnn
                else:
                    apply(m, switches)
                    fn = ours
                tflops[m] = flops / do_bench(fn, warmup=50, rep=200, return_mode="median") / 1e9
            apply(None, switches)
            rounds.append(tflops)
            print_row(d, n, causal, r, tflops, methods)
        print_row(d, n, causal, "median", {m: statistics.median(t[m] for t in rounds) for m in methods}, methods)


def print_row(d, n, causal, label, tflops, methods):
    cells = " | ".join(f"{tflops[m]:.1f}" for m in methods)
    ratios = " | ".join(f"{tflops[m] / tflops['cuDNN']:.3f}" for m in methods[:-1])
    print(f"| {d} | {n} | {causal} | {label} | {cells} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
