#!/usr/bin/env python3
"""The attention-mask and dropout figures (bf16, B*N = 16k tokens, H*D = 2048), each against its
baseline or anchors in the same run:

  causal_mask    a boolean tril mask vs is_causal=True (both flashattn): tile skipping at work
  padding_mask   a (B, 1, 1, N) boolean padding mask (the last 10% of keys of every other sequence
                 masked) vs no mask (both flashattn)
  dense_float    a dense random (B, H, N, N) float mask, forward + backward with the mask's gradient:
                 flashattn vs SDPA's EFFICIENT_ATTENTION backend with the same mask
  dropout        dropout_p = 0.1 vs dropout_p = 0 (both flashattn, no mask)
  dropout_anchors
                 dropout_p = 0.1, causal and not, no mask: flashattn vs torch SDPA with one backend
                 forced (sdpa_kernel, so no fallback), CUDNN_ATTENTION and FLASH_ATTENTION
                 (FlashAttention-2), all three with p = 0.1. torch builds with pytorch PR 174245
                 (the 2.14 CI one has it) refuse cuDNN at a p that is not a multiple of 1/16, the
                 resolution of some cuDNN kernels: its column is then n/a

TFLOP/s use the unmasked FLOP count (causal: halved), so a ratio is a ratio of times. The methods of
a figure are timed in --rounds rotating rounds (harness.rotating_medians; a figure is the median of
its rounds), so that clock changes over the run fall on all alike. Each method is called once
before its rounds: one that raises (e.g. a forced SDPA backend refusing the case) is left out and
reported as n/a with its error and the reasons torch warned of.

  python3 benchmarks/bench_masks.py --out DIR      # writes DIR/masks.json and DIR/masks.md
  python3 benchmarks/bench_masks.py --figures dropout_anchors --seqlens 1024,4096,16384 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn  # noqa: E402
from flashattn import ops  # noqa: E402
from harness import rotating_medians, short_error, time_ms  # noqa: E402  (benchmarks/harness.py)

TOKENS, MODEL_DIM = 16384, 2048
FIGURES = ("causal_mask", "padding_mask", "dropout", "dense_float", "dropout_anchors")
DROPOUT_P = 0.1
# Figures of flashattn against several anchors: (flashattn's method, ((label, anchor's method), ...)).
ANCHOR_FIGURES = {"dropout_anchors": ("flashattn p=0.1", (("cuDNN", "SDPA cuDNN p=0.1"), ("FA2", "SDPA FA2 p=0.1")))}


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


def first_call(call, dev):
    """Runs call once: None when it ran, else "failed: <error>", followed by the reasons torch warned of
    while it failed (a forced SDPA backend that refuses a case says why only in warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
            if torch.device(dev).type == "cuda":
                torch.cuda.synchronize()
            return None
        except Exception as exc:  # noqa: BLE001
            reasons = []
            for w in caught:
                why = str(w.message).split("(Triggered internally at")[0].strip()
                if why and why not in reasons:
                    reasons.append(why)
            why = " ".join(reasons)
            return "failed: " + short_error(exc) + (f" ({why[:400]})" if why else "")


def bench_one(head_dim, seqlen, warmup, rep, rounds, dev="cuda", figures=FIGURES):
    batch, heads = TOKENS // seqlen, MODEL_DIM // head_dim
    dtype = torch.bfloat16
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=dev, dtype=dtype, requires_grad=True)
               for _ in range(3))
    scale = head_dim**-0.5
    rows = []

    def record(figure, mode, methods):
        """methods: name -> (causal, fn, leaves), timed against each other in rotating rounds; a method
        whose first call fails is left out of the rounds, with its error in its row."""
        calls = {name: run_mode(fn, leaves, mode) for name, (_, fn, leaves) in methods.items()}
        status = {name: why for name, why in ((name, first_call(call, dev)) for name, call in calls.items()) if why}
        timed = {name: call for name, call in calls.items() if name not in status}
        ms = rotating_medians(timed, lambda name: time_ms(timed[name], warmup, rep / rounds, torch.device(dev)),
                              rounds, status)
        for name, (causal, _, _) in methods.items():
            row = dict(figure=figure, mode=mode, method=name, head_dim=head_dim, seqlen=seqlen, causal=causal,
                       batch=batch, heads=heads)
            if name in ms:
                seconds = ms[name] * 1e-3
                row.update(ms=ms[name], tflops=flops(batch, heads, seqlen, head_dim, causal, mode) / seconds / 1e12)
            else:  # the method failed (e.g. a backend refused the case): report it, do not stop
                row.update(error=status[name])
            rows.append(row)

    qkv = [q, k, v]
    rng_state = torch.tensor([1234, 5678], dtype=torch.int64, device=dev)
    if "causal_mask" in figures:
        tril = torch.ones(seqlen, seqlen, dtype=torch.bool, device=dev).tril().expand(batch, heads, seqlen, seqlen)
    if "padding_mask" in figures:
        keep = torch.ones(batch, 1, 1, seqlen, dtype=torch.bool, device=dev)
        keep[::2, ..., seqlen - seqlen // 10:] = False
        padding = keep.expand(batch, heads, seqlen, seqlen)

    def ours_dropout(causal):
        return lambda: ops.attention(q, k, v, scale, causal, False, dropout_p=DROPOUT_P, rng_state=rng_state)[0]
    for mode in ("fwd", "fwdbwd"):
        if "causal_mask" in figures:
            record("causal_mask", mode, {
                "flashattn is_causal": (True, lambda: ops.fwd(q, k, v, scale, True, False)[0], qkv),
                "flashattn tril mask": (True, lambda: ops.fwd(q, k, v, scale, False, False, tril)[0], qkv)})
        if "padding_mask" in figures:
            record("padding_mask", mode, {
                "flashattn no mask": (False, lambda: ops.fwd(q, k, v, scale, False, False)[0], qkv),
                "flashattn padding mask": (False, lambda: ops.fwd(q, k, v, scale, False, False, padding)[0], qkv)})
        if "dropout" in figures:
            record("dropout", mode, {
                "flashattn p=0": (False, lambda: ops.fwd(q, k, v, scale, False, False)[0], qkv),
                "flashattn p=0.1": (False, ours_dropout(False), qkv)})
    bhsd = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]

    def sdpa(backend, **kwargs):
        """SDPA on (B, H, N, D) views of q, k, v with only `backend` allowed: a case it refuses raises."""
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*bhsd, scale=scale, **kwargs)
        return call
    if "dense_float" in figures:
        dense = torch.randn(batch, heads, seqlen, seqlen, device=dev, dtype=dtype, requires_grad=True)
        record("dense_float", "fwdbwd", {
            "flashattn dense float mask": (False, lambda: ops.fwd(q, k, v, scale, False, False, dense)[0],
                                           qkv + [dense]),
            "SDPA efficient dense float mask": (False, sdpa(SDPBackend.EFFICIENT_ATTENTION, attn_mask=dense),
                                                bhsd + [dense])})
        del dense
    if "dropout_anchors" in figures:
        for causal in (False, True):
            for mode in ("fwd", "fwdbwd"):
                record("dropout_anchors", mode, {
                    "flashattn p=0.1": (causal, ours_dropout(causal), qkv),
                    "SDPA cuDNN p=0.1": (causal, sdpa(SDPBackend.CUDNN_ATTENTION, dropout_p=DROPOUT_P,
                                                      is_causal=causal), bhsd),
                    "SDPA FA2 p=0.1": (causal, sdpa(SDPBackend.FLASH_ATTENTION, dropout_p=DROPOUT_P,
                                                    is_causal=causal), bhsd)})
    return rows


def ratios(rows):
    """(figure, mode, D, N, causal) -> the figure's ratio: masked / baseline speed (the two-method figures)."""
    pairs = {"causal_mask": ("flashattn tril mask", "flashattn is_causal"),
             "padding_mask": ("flashattn padding mask", "flashattn no mask"),
             "dense_float": ("flashattn dense float mask", "SDPA efficient dense float mask"),
             "dropout": ("flashattn p=0.1", "flashattn p=0")}
    found = {}
    for r in rows:
        found[(r["figure"], r["mode"], r["head_dim"], r["seqlen"], r["causal"], r["method"])] = r.get("tflops")
    out = []
    for (fig, mode, d, n, causal, method), t in sorted(found.items()):
        if fig not in pairs or method != pairs[fig][0]:
            continue
        b = found.get((fig, mode, d, n, causal, pairs[fig][1]))
        out.append(dict(figure=fig, mode=mode, head_dim=d, seqlen=n, causal=causal, ours=t, baseline=b,
                        ratio=(t / b) if (t and b) else None))
    return out


def anchor_ratios(rows):
    """One entry per cell of the figures of ANCHOR_FIGURES: flashattn's TFLOP/s, each anchor's, and
    flashattn's over each anchor's ("x cuDNN"); None where a method failed."""
    found = {(r["figure"], r["mode"], r["head_dim"], r["seqlen"], r["causal"], r["method"]): r.get("tflops")
             for r in rows}
    cells = sorted({key[:5] for key in found if key[0] in ANCHOR_FIGURES},
                   key=lambda c: (c[0], c[1], c[2], c[4], c[3]))
    out = []
    for fig, mode, d, n, causal in cells:
        ours, anchors = ANCHOR_FIGURES[fig]
        t = found.get((fig, mode, d, n, causal, ours))
        entry = dict(figure=fig, mode=mode, head_dim=d, seqlen=n, causal=causal, flashattn=t, anchors={}, ratios={})
        for label, method in anchors:
            a = found.get((fig, mode, d, n, causal, method))
            entry["anchors"][label] = a
            entry["ratios"][label] = (t / a) if (t and a) else None
        out.append(entry)
    return out


def failures(rows):
    """(method, error) -> the number of cells it failed in, in the order first seen."""
    out = {}
    for r in rows:
        if "error" in r:
            out[(r["method"], r["error"])] = out.get((r["method"], r["error"]), 0) + 1
    return out


def markdown(result):
    """masks.md's lines for a run's result (masks.json's content)."""
    fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    fmt_ratio = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [f"# Mask figures ({result['gpu']}, torch {result['torch']}, commit {result['commit']}, {result['date']})",
             "", "TFLOP/s count the unmasked, undropped FLOPs (causal: halved; forward + backward 3.5x the "
             "forward); a ratio is flashattn's speed over the other method's, timed in the same rotating rounds."]
    if result["ratios"]:
        lines += ["", "| figure | mode | D | N | flashattn TFLOP/s | baseline TFLOP/s | ratio |",
                  "|---|---|---|---|---|---|---|"]
        for r in result["ratios"]:
            lines.append(f"| {r['figure']} | {r['mode']} | {r['head_dim']} | {r['seqlen']} | {fmt(r['ours'])} | "
                         f"{fmt(r['baseline'])} | {fmt_ratio(r['ratio'])} |")
    for fig, (ours, anchors) in ANCHOR_FIGURES.items():
        entries = [e for e in result["anchor_ratios"] if e["figure"] == fig]
        if not entries:
            continue
        labels = [label for label, _ in anchors]
        lines += ["", f"## {fig}: {ours} beside " + ", ".join(m for _, m in anchors)
                  + " (torch SDPA, one backend forced with sdpa_kernel)", "",
                  "| mode | D | N | causal | flashattn TFLOP/s | " + " | ".join(f"{a} TFLOP/s" for a in labels) + " | "
                  + " | ".join(f"x {a}" for a in labels) + " |",
                  "|---|---|---|---|" + "--:|" * (1 + 2 * len(labels))]
        for e in entries:
            lines.append(f"| {e['mode']} | {e['head_dim']} | {e['seqlen']} | {'yes' if e['causal'] else 'no'} | "
                         f"{fmt(e['flashattn'])} | " + " | ".join(fmt(e["anchors"][a]) for a in labels) + " | "
                         + " | ".join(fmt_ratio(e["ratios"][a]) for a in labels) + " |")
    failed = failures(result["rows"])
    if failed:
        lines += ["", "n/a: the method failed (left out of that cell's rounds):", ""]
        lines += [f"- {method}, {count} cell{'s' if count > 1 else ''}: {error}"
                  for (method, error), count in failed.items()]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_masks_out")
    parser.add_argument("--figures", default=",".join(FIGURES),
                        help="comma-separated figures to run (default: all, " + ",".join(FIGURES) + ")")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096,8192")
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--rep", type=float, default=50, help="ms of timed calls per method, shared by its rounds")
    parser.add_argument("--rounds", type=int, default=3, help="rotating rounds per figure (default 3)")
    args = parser.parse_args()
    figures = [f for f in args.figures.split(",") if f]
    unknown = sorted(set(figures) - set(FIGURES))
    if unknown or not figures:
        parser.error(f"--figures: unknown {', '.join(unknown)} (choose from {', '.join(FIGURES)})" if unknown
                     else "--figures: none given")
    if not torch.cuda.is_available():
        sys.exit("bench_masks.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    rows = []
    said = set()
    for d in (int(x) for x in args.head_dims.split(",")):
        for n in (int(x) for x in args.seqlens.split(",")):
            new_rows = bench_one(d, n, args.warmup, args.rep, max(1, args.rounds), figures=figures)
            for method, error in failures(new_rows):  # each reason once, at its first cell
                if (method, error) not in said:
                    said.add((method, error))
                    print(f"D={d} N={n}: {method}: n/a, {error}", flush=True)
            rows += new_rows
            torch.cuda.empty_cache()
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=os.environ.get("FLASHATTN_GIT_COMMIT", "unknown"), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  seconds=round(time.time() - start, 1), args=vars(args), rows=rows, ratios=ratios(rows),
                  anchor_ratios=anchor_ratios(rows))
    with open(os.path.join(args.out, "masks.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = markdown(result)
    with open(os.path.join(args.out, "masks.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
