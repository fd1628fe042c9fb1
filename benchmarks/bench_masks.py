#!/usr/bin/env python3
"""The attention-mask figures (bf16, B*N = 16k tokens, H*D = 2048), each against its baseline in the
same run:

  causal_mask    a boolean tril mask vs is_causal=True (both flashattn): tile skipping at work
  padding_mask   a (B, 1, 1, N) boolean padding mask (the last 10% of keys of every other sequence
                 masked) vs no mask (both flashattn)
  dense_float    a dense random (B, H, N, N) float mask, forward + backward with the mask's gradient:
                 flashattn vs SDPA's EFFICIENT_ATTENTION backend with the same mask
  dropout        dropout_p = 0.1 vs dropout_p = 0 (both flashattn, no mask)

TFLOP/s use the unmasked FLOP count (causal: halved), so a ratio is a ratio of times. The two methods
of a figure are timed in --rounds rotating rounds (harness.rotating_medians; a figure is the median
of its rounds), so that clock changes over the run fall on both alike.

  python3 benchmarks/bench_masks.py --out DIR      # writes DIR/masks.json and DIR/masks.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn  # noqa: E402
from flashattn import ops  # noqa: E402
from harness import rotating_medians, time_ms  # noqa: E402  (benchmarks/harness.py)

TOKENS, MODEL_DIM = 16384, 2048


def flops(batch, heads, seqlen, head_dim, causal, mode):
    f = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    return f * {"fwd": 1.0, "fwdbwd": 3.5}[mode]


def run_mode(fn, leaves, mode):
    """A callable timing fn (fwd) or fn + backward (fwdbwd) on fresh grads."""
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn()
        return call
    dout = None

    def call():
        nonlocal dout
        out = fn()
        if dout is None:
            dout = torch.randn_like(out)
        torch.autograd.grad(out, leaves, dout)
    return call


def bench_one(head_dim, seqlen, warmup, rep, rounds, dev="cuda"):
    batch, heads = TOKENS // seqlen, MODEL_DIM // head_dim
    dtype = torch.bfloat16
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=dev, dtype=dtype, requires_grad=True)
               for _ in range(3))
    scale = head_dim**-0.5
    tril = torch.ones(seqlen, seqlen, dtype=torch.bool, device=dev).tril().expand(batch, heads, seqlen, seqlen)
    keep = torch.ones(batch, 1, 1, seqlen, dtype=torch.bool, device=dev)
    keep[::2, ..., seqlen - seqlen // 10:] = False
    padding = keep.expand(batch, heads, seqlen, seqlen)
    dense = torch.randn(batch, heads, seqlen, seqlen, device=dev, dtype=dtype, requires_grad=True)
    rows = []

    def record(figure, mode, methods):
        """methods: name -> (causal, fn, leaves), timed against each other in rotating rounds."""
        calls = {name: run_mode(fn, leaves, mode) for name, (_, fn, leaves) in methods.items()}
        status = {}
        ms = rotating_medians(calls, lambda name: time_ms(calls[name], warmup, rep / rounds, torch.device(dev)),
                              rounds, status)
        for name, (causal, _, _) in methods.items():
            row = dict(figure=figure, mode=mode, method=name, head_dim=head_dim, seqlen=seqlen, batch=batch,
                       heads=heads)
            if name in ms:
                seconds = ms[name] * 1e-3
                row.update(ms=ms[name], tflops=flops(batch, heads, seqlen, head_dim, causal, mode) / seconds / 1e12)
            else:  # the method failed (e.g. a backend refused the case): report it, do not stop
                row.update(error=status[name])
            rows.append(row)

    qkv = [q, k, v]
    rng_state = torch.tensor([1234, 5678], dtype=torch.int64, device=dev)
    for mode in ("fwd", "fwdbwd"):
        record("causal_mask", mode, {
            "flashattn is_causal": (True, lambda: ops.fwd(q, k, v, scale, True, False)[0], qkv),
            "flashattn tril mask": (True, lambda: ops.fwd(q, k, v, scale, False, False, tril)[0], qkv)})
        record("padding_mask", mode, {
            "flashattn no mask": (False, lambda: ops.fwd(q, k, v, scale, False, False)[0], qkv),
            "flashattn padding mask": (False, lambda: ops.fwd(q, k, v, scale, False, False, padding)[0], qkv)})
        record("dropout", mode, {
            "flashattn p=0": (False, lambda: ops.fwd(q, k, v, scale, False, False)[0], qkv),
            "flashattn p=0.1": (False, lambda: ops.attention(q, k, v, scale, False, False, dropout_p=0.1,
                                                             rng_state=rng_state)[0], qkv)})
    bhsd = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]

    def efficient():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(*bhsd, attn_mask=dense, scale=scale)
    record("dense_float", "fwdbwd", {
        "flashattn dense float mask": (False, lambda: ops.fwd(q, k, v, scale, False, False, dense)[0], qkv + [dense]),
        "SDPA efficient dense float mask": (False, efficient, bhsd + [dense])})
    return rows


def ratios(rows):
    """(figure, mode, D, N) -> the figure's ratio: masked / baseline speed."""
    pairs = {"causal_mask": ("flashattn tril mask", "flashattn is_causal"),
             "padding_mask": ("flashattn padding mask", "flashattn no mask"),
             "dense_float": ("flashattn dense float mask", "SDPA efficient dense float mask"),
             "dropout": ("flashattn p=0.1", "flashattn p=0")}
    found = {}
    for r in rows:
        found[(r["figure"], r["mode"], r["head_dim"], r["seqlen"], r["method"])] = r.get("tflops")
    out = []
    for (fig, mode, d, n, method), t in sorted(found.items()):
        ours, base = pairs[fig]
        if method != ours:
            continue
        b = found.get((fig, mode, d, n, base))
        out.append(dict(figure=fig, mode=mode, head_dim=d, seqlen=n, ours=t, baseline=b,
                        ratio=(t / b) if (t and b) else None))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_masks_out")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096,8192")
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--rep", type=float, default=50, help="ms of timed calls per method, shared by its rounds")
    parser.add_argument("--rounds", type=int, default=3, help="rotating rounds per figure (default 3)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        for n in (int(x) for x in args.seqlens.split(",")):
            rows += bench_one(d, n, args.warmup, args.rep, max(1, args.rounds))
            torch.cuda.empty_cache()
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=os.environ.get("FLASHATTN_GIT_COMMIT", "unknown"), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  seconds=round(time.time() - start, 1), rows=rows, ratios=ratios(rows))
    with open(os.path.join(args.out, "masks.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Mask figures ({result['gpu']}, torch {result['torch']}, commit {result['commit']}, {result['date']})",
             "", "| figure | mode | D | N | flashattn TFLOP/s | baseline TFLOP/s | ratio |", "|---|---|---|---|---|---|---|"]
    for r in result["ratios"]:
        fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['figure']} | {r['mode']} | {r['head_dim']} | {r['seqlen']} | {fmt(r['ours'])} | "
                     f"{fmt(r['baseline'])} | {ratio} |")
    with open(os.path.join(args.out, "masks.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
