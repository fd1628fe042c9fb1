#!/usr/bin/env python3
"""The CPU path beside torch's own CPU SDPA, in the same run: forward and forward + backward time.

Grid (the install issue's CPU figure): B=1, H=4, N in --seqlen (default 512..4k), D 64/128, causal
and not, float32 and bfloat16, on --threads threads (default 2: torch.set_num_threads). Both take the
same (B, H, N, D) tensors: flashattn.scaled_dot_product_attention (the CPU kernels) and
torch.nn.functional.scaled_dot_product_attention (torch picks its CPU backend). Timing: wall clock,
the median of --rounds rounds of --iters calls each, the two methods alternating round by round after
one warm-up call each. Before timing, flashattn's forward is compared with torch's (max abs error).

  python benchmarks/bench_cpu.py --out bench-cpu
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import flashattn  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqlen", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--headdim", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    p.add_argument("--mode", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=3, help="calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="folder for bench_cpu.md and bench_cpu.json")
    return p.parse_args(argv)


def timed(fn, iters):
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e3


def call(attention, q, k, v, causal, mode):
    if mode == "fwd":
        with torch.no_grad():
            return lambda: attention(q, k, v, is_causal=causal)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)

    def run():
        out = attention(*leaves, is_causal=causal)
        torch.autograd.grad(out, leaves, dout)
    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    header = "| dtype | D | N | causal | mode | max err | flashattn ms | torch ms | flashattn / torch speed |"
    print(header + "\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for dtype_name in args.dtype:
        for head_dim in args.headdim:
            for seqlen in args.seqlen:
                for causal in (False, True):
                    q, k, v = (torch.randn(args.batch, args.heads, seqlen, head_dim, dtype=DTYPES[dtype_name])
                               for _ in range(3))
                    with torch.no_grad():
                        err = (flashattn.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
                               - F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()).abs().max().item()
                    for mode in args.mode:
                        fns = {"flashattn": call(flashattn.scaled_dot_product_attention, q, k, v, causal, mode),
                               "torch": call(F.scaled_dot_product_attention, q, k, v, causal, mode)}
                        for fn in fns.values():
                            fn()  # warm-up
                        times = {name: [] for name in fns}
                        for r in range(args.rounds):
                            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                                times[name].append(timed(fns[name], args.iters))
                        ms = {name: statistics.median(t) for name, t in times.items()}
                        row = {"dtype": dtype_name, "head_dim": head_dim, "seqlen": seqlen, "causal": causal,
                               "mode": mode, "max_err": err, "flashattn_ms": ms["flashattn"], "torch_ms": ms["torch"],
                               "speed": ms["torch"] / ms["flashattn"]}
                        rows.append(row)
                        print(f"| {dtype_name} | {head_dim} | {seqlen} | {'yes' if causal else 'no'} | {mode} | "
                              f"{err:.1e} | {ms['flashattn']:.2f} | {ms['torch']:.2f} | {row['speed']:.2f} |",
                              flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                "threads": args.threads, "cpu": platform.processor() or platform.machine(),
                "command": "python benchmarks/bench_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        with open(os.path.join(args.out, "bench_cpu.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "bench_cpu.md"), "w") as f:
            f.write(f"# flashattn CPU path beside torch SDPA on CPU, {meta['date']}\n\n")
            f.write(f"torch {meta['torch']}, {args.threads} threads. Command: `{meta['command']}`.\n\n")
            f.write(header + "\n|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['dtype']} | {r['head_dim']} | {r['seqlen']} | {'yes' if r['causal'] else 'no'} | "
                        f"{r['mode']} | {r['max_err']:.1e} | {r['flashattn_ms']:.2f} | {r['torch_ms']:.2f} | "
                        f"{r['speed']:.2f} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
