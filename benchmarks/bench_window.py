#!/usr/bin/env python3
"""Sliding-window attention: a window of W keys over N queries, flashattn beside FlashAttention-4 and beside
flashattn's own attention over W-long sequences.

Per (N, W) cell, bf16, ``--heads`` x ``--headdim``, causal with ``window_size=(W - 1, 0)`` (each query sees
itself and the W - 1 keys before it, Mistral's form) at batch 1, these contenders are timed in rotating
rounds (harness.rotating_medians):

- ``flashattn``: flash_attn_func with the window;
- ``fa4``: FlashAttention-4 (``flash_attn.cute.interface.flash_attn_func``) with the same window (n/a with the
  reason when it does not import or refuses the call);
- ``causal W``: flashattn's causal attention over N / W sequences of W tokens (batch N / W): the same rows,
  each query seeing the keys before it within its chunk (about half of what the window lets it see);
- ``full W``: flashattn's attention without a mask over those N / W sequences: each query sees W keys, as
  nearly every query of the window does.

Modes: fwd, bwd (the backward alone, of one forward) and fwdbwd, each a median of CUDA-event timings. Reported:
the window's speed over FlashAttention-4's (FA4 ms / flashattn ms) and its time over the chunked runs'
(flashattn ms / chunked ms), with the useful TFLOP/s of each (the visible (query, key) pairs counted exactly:
4 * D per pair forward, 10 * D backward). Before timing, the window's forward is checked against
flashattn.reference in float32 on a slice of the heads (``--max-err``).

    python benchmarks/bench_window.py --out DIR      # DIR/bench_window.md and .json
    python benchmarks/bench_window.py --render DIR/bench_window.json   # its markdown again, to stdout

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
import flashattn  # noqa: E402
from flashattn.reference import attention_reference  # noqa: E402
from harness import (  # noqa: E402  (benchmarks/harness.py)
    AnchorUnavailable,
    _fa4_interface,
    metadata,
    render_saved,
    rotating_medians,
    save_run,
    short_error,
    time_ms,
    timed_fn,
    warm_up,
)

MODES = ("fwd", "bwd", "fwdbwd")
FLOPS_PER_PAIR = {"fwd": 4, "bwd": 10, "fwdbwd": 14}  # times D per visible (query, key) pair


def window_pairs(seqlen: int, window: int) -> int:
    """Visible (query, key) pairs of one head under window_size=(window - 1, 0) over seqlen tokens."""
    full = max(seqlen - window, 0) * window  # queries past the first `window` see `window` keys
    head = min(seqlen, window)
    return full + head * (head + 1) // 2


def contenders(seqlen: int, window: int):
    """name -> (forward(q, k, v) -> out, chunked): chunked contenders take (N / W, W, H, D) views."""
    forwards, missing = {}, {}
    forwards["flashattn"] = (lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True,
                                                                      window_size=(window - 1, 0)), False)
    forwards["causal W"] = (lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True), True)
    forwards["full W"] = (lambda q, k, v: flashattn.flash_attn_func(q, k, v), True)
    try:
        fa4 = _fa4_interface().flash_attn_func

        def theirs(q, k, v):
            out = fa4(q, k, v, causal=True, window_size=(window - 1, 0))
            return out[0] if isinstance(out, (tuple, list)) else out
        forwards["fa4"] = (theirs, False)
    except AnchorUnavailable as exc:
        missing["fa4"] = str(exc)
    return forwards, missing


def reference_error(forward, q, k, v, window: int) -> float:
    """max |forward - reference| in float32 over the first two heads (the reference materializes N x N)."""
    with torch.no_grad():
        q2, k2, v2 = (t[:, :, :2].contiguous() for t in (q, k, v))
        out = forward(q2, k2, v2).float()
        n = q.size(1)
        offset = torch.arange(n, device=q.device)[None, :] - torch.arange(n, device=q.device)[:, None]
        band = (offset <= 0) & (offset > -window)
        ref = attention_reference(q2.float(), k2.float(), v2.float(), attn_mask=band)
    return (out - ref).abs().max().item()


def run_cell(seqlen, window, args, device="cuda") -> dict:
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (1, seqlen, args.heads, args.headdim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype)
    chunks = seqlen // window
    # The chunked runs' inputs: the same tokens as N / W sequences of W (views of the same storage).
    chunked = [t.detach().view(chunks, window, args.heads, args.headdim).requires_grad_() for t in (q, k, v)]
    dout_chunked = dout.view(chunks, window, args.heads, args.headdim)
    forwards, status = contenders(seqlen, window)
    row = {"seqlen": seqlen, "window": window, "heads": args.heads, "head_dim": args.headdim,
           "pairs": {"flashattn": window_pairs(seqlen, window), "fa4": window_pairs(seqlen, window),
                     "causal W": chunks * window * (window + 1) // 2, "full W": chunks * window * window},
           "ms": {m: {} for m in args.mode}, "max_err": {}, "status": status}
    for name in list(forwards):
        forward, is_chunked = forwards[name]
        inputs = (*chunked, dout_chunked) if is_chunked else (q, k, v, dout)
        try:
            warm_up(forward, *inputs, backward=True)
            if not is_chunked:
                row["max_err"][name] = err = reference_error(forward, q, k, v, window)
                if err > args.max_err:
                    status[name] = f"WRONG: max err {err:.3g} > {args.max_err:g}"
                    del forwards[name]
        except Exception as exc:  # noqa: BLE001  (reported, never stops the run)
            status[name] = "failed: " + short_error(exc)
            del forwards[name]
    for mode in args.mode:
        def time_one(name, mode=mode):
            forward, is_chunked = forwards[name]
            inputs = (*chunked, dout_chunked) if is_chunked else (q, k, v, dout)
            return time_ms(timed_fn(forward, mode, *inputs), args.warmup, args.rep / args.rounds, device)

        row["ms"][mode] = rotating_medians(forwards, time_one, args.rounds, status)
    return row


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def table_lines(rows: List[dict]) -> List[str]:
    lines = ["| N | W | mode | flashattn ms (TFLOP/s) | FA4 ms (TFLOP/s) | speed vs FA4 | causal W ms (TFLOP/s) | "
             "time / causal W | full W ms (TFLOP/s) | time / full W |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode, ms in r["ms"].items():
            def cell(name):
                t = ms.get(name)
                if t is None:
                    return "n/a"
                flops = r["pairs"][name] * r["heads"] * r["head_dim"] * FLOPS_PER_PAIR[mode]
                return f"{t:.3f} ({flops / t / 1e9:.0f})"

            ours = ms.get("flashattn")
            speed = ms["fa4"] / ours if ours and ms.get("fa4") else None
            over_causal = ours / ms["causal W"] if ours and ms.get("causal W") else None
            over_full = ours / ms["full W"] if ours and ms.get("full W") else None
            lines.append(f"| {r['seqlen']} | {r['window']} | {mode} | {cell('flashattn')} | {cell('fa4')} | "
                         f"{_fmt(speed, '.2f')} | {cell('causal W')} | {_fmt(over_causal, '.2f')} | {cell('full W')} | "
                         f"{_fmt(over_full, '.2f')} |")
    return lines


def markdown(meta: dict, args: dict, rows: List[dict]) -> List[str]:
    lines = [f"# Sliding windows, {meta['gpu'] or meta['device']}, {meta['date']}, commit {meta['git_commit']}", "",
             f"{'bf16' if meta['device'] == 'cuda' else 'float32'}, batch 1, H = {args['heads']}, D = {args['headdim']}, "
             f"causal with window_size = (W - 1, 0); torch {meta['torch']}, flash-attn-4 {meta['flash_attn_4']}. "
             "speed vs FA4: FA4 ms / flashattn ms, both with the window; time / causal W and time / full W: the "
             "window's time over flashattn's causal and unmasked attention on the same tokens as N / W sequences "
             "of W. TFLOP/s count the visible pairs only. "
             f"Command: `{meta['command']}`.", ""]
    lines += table_lines(rows)
    notes = sorted({f"- N={r['seqlen']} W={r['window']}: {n}: {why}" for r in rows for n, why in r["status"].items()})
    if notes:
        lines += ["", "Notes:"] + notes
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--seqlen", nargs="+", type=int, default=[32768])
    p.add_argument("--window", nargs="+", type=int, default=[4096])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=float, default=25.0, help="ms of untimed calls before each timing")
    p.add_argument("--rep", type=float, default=300.0, help="ms of timed calls per contender, over all rounds")
    p.add_argument("--max-err", type=float, default=2e-2)
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", help="cuda, or cpu (float32, wall clock: to try the script)")
    p.add_argument("--render", default=None, metavar="JSON", help="print the markdown of an earlier run's json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        return render_saved(args.render, markdown)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_window: no CUDA GPU here (--device cpu tries the script on the CPU)")
        return 1
    for seqlen in args.seqlen:
        for window in args.window:
            if seqlen % window:
                print(f"bench_window: N={seqlen} is not a multiple of W={window}")
                return 1
    torch.manual_seed(0)
    meta = metadata(args.device)
    meta["command"] = "python benchmarks/bench_window.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows = []
    for seqlen in args.seqlen:
        for window in args.window:
            rows.append(run_cell(seqlen, window, args, args.device))
            print("\n".join(table_lines(rows[-1:])[2:]), flush=True)
    lines = markdown(meta, vars(args), rows)
    print("\n".join(lines))
    save_run(args.out, "bench_window", lines, meta, vars(args), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
