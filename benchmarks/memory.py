#!/usr/bin/env python3
"""Extra GPU memory of attention: flashattn beside SDPA's flash and cuDNN backends.

Extra memory is torch.cuda.max_memory_allocated() over the call minus what was allocated before it
(the inputs, and for the backward also the forward's saved tensors), GUIDE section 5.

* Forward at B=1, H=16, N=131072, D=128, bf16, causal: the output (512 MiB) and the fp32 LSE (8 MiB)
  are the floor; anything N^2 would need terabytes.
* Backward at several N: dq, dk, dv plus workspaces, which should grow linearly with N.

    python benchmarks/memory.py --out benchmarks/results/<name>
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import flashattn  # noqa: E402
from harness import metadata, short_error  # noqa: E402  (benchmarks/harness.py)

MIB = 2**20
IMPLS = ["flashattn", "sdpa_flash", "sdpa_cudnn"]


def forward_fn(name, causal):
    if name == "flashattn":
        return lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[name]

    def forward(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
            ).transpose(1, 2)

    return forward


def peak_extra_bytes(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def measure(name, seqlen, heads, head_dim, dtype, causal, backward):
    q, k, v = (torch.randn(1, seqlen, heads, head_dim, device="cuda", dtype=dtype, requires_grad=backward)
               for _ in range(3))
    forward = forward_fn(name, causal)
    input_bytes = q.numel() * q.element_size()
    if not backward:
        with torch.no_grad():
            forward(q, k, v)  # warm-up: lazy initialization stays outside the measurement
            _, extra = peak_extra_bytes(lambda: forward(q, k, v))
        return {"extra_mib": extra / MIB, "extra_over_input": extra / input_bytes}
    out = forward(q, k, v)
    dout = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # warm-up
    _, extra = peak_extra_bytes(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return {"extra_mib": extra / MIB, "extra_over_input": extra / input_bytes}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fwd-seqlen", type=int, default=131072)
    p.add_argument("--bwd-seqlens", nargs="+", type=int, default=[4096, 8192, 16384, 32768, 65536])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--out", help="folder for memory.json and memory.md")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not flashattn.cuda_kernels_built():
        print("memory benchmarks need a CUDA GPU and flashattn's CUDA kernels")
        return 1
    dtype, causal = torch.bfloat16, True
    rows = []
    cases = [("fwd", args.fwd_seqlen)] + [("bwd", n) for n in args.bwd_seqlens]
    for mode, seqlen in cases:
        row = {"mode": mode, "seqlen": seqlen, "heads": args.heads, "head_dim": args.headdim}
        input_mib = seqlen * args.heads * args.headdim * 2 / MIB
        row["input_mib"] = input_mib
        for name in IMPLS:
            try:
                row[name] = measure(name, seqlen, args.heads, args.headdim, dtype, causal, mode == "bwd")
            except Exception as exc:  # noqa: BLE001  (an anchor that fails is reported, never fatal)
                row[name] = {"error": short_error(exc)}
            torch.cuda.empty_cache()
        rows.append(row)
        cells = [f"{name} {row[name]['extra_mib']:.0f} MiB" if "extra_mib" in row[name] else f"{name} n/a"
                 for name in IMPLS]
        print(f"{mode} N={seqlen} (one input {input_mib:.0f} MiB): " + ", ".join(cells), flush=True)

    if args.out:
        meta = metadata()
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "memory.json"), "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
        lines = [
            f"# flashattn extra memory, {meta['date']}",
            "",
            f"GPU {meta['gpu']}, torch {meta['torch']}, flashattn {meta['flashattn']} at commit {meta['git_commit']}.",
            f"B=1, H={args.heads}, D={args.headdim}, bf16, causal. Extra = max_memory_allocated over the call minus "
            "memory allocated before it, in MiB (in parentheses: multiples of one input tensor). fwd floor: "
            "out (1 input) + fp32 LSE; bwd floor: dq, dk, dv (3 inputs).",
            "",
            "| mode | N | one input (MiB) | " + " | ".join(IMPLS) + " |",
            "|---|---|---|" + "---|" * len(IMPLS),
        ]
        for row in rows:
            cells = []
            for name in IMPLS:
                r = row[name]
                cells.append(f"{r['extra_mib']:.0f} ({r['extra_over_input']:.2f}x)" if "extra_mib" in r else "n/a")
            lines.append(f"| {row['mode']} | {row['seqlen']} | {row['input_mib']:.0f} | " + " | ".join(cells) + " |")
        errors = [f"- {row['mode']} N={row['seqlen']} {name}: {row[name]['error']}"
                  for row in rows for name in IMPLS if "error" in row[name]]
        if errors:
            lines += ["", "Unavailable or failed:", ""] + errors
        with open(os.path.join(args.out, "memory.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}/memory.json and memory.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
