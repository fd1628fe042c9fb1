#!/usr/bin/env python3
"""The attention variants of today's models beside plain attention, flashattn beside FlashAttention-4.

For each variant (``sink``: a learned sink logit per query head, gpt-oss's; ``softcap``: scores capped to
30 * tanh(score / 30), Gemma 2's form; ``alibi``: ALiBi's bias with the slopes 2^(-8 (h + 1) / heads),
FlashAttention-2's ``alibi_slopes``) and each (N, causal) cell of a
B * N = ``--tokens`` grid at ``--heads`` x ``--headdim`` (bf16), four contenders are timed in rotating
rounds (harness.rotating_medians): flashattn plain, flashattn with the variant, FlashAttention-4 plain and
FlashAttention-4 with the variant (``flash_attn.cute.interface.flash_attn_func``, its ``learnable_sink``,
``softcap`` or ``alibi_slopes``;
n/a with the reason when it does not import or refuses the call). Modes: fwd, bwd (the backward alone, of
one forward) and fwdbwd, each a median of CUDA-event timings (harness.time_ms); the backward computes
the variant's own gradient too (the sink's) where it has one, as a training step does.

Reported per cell and mode: the variant's cost over plain attention in each library (variant ms / plain
ms - 1; the figure is at most 10%) and flashattn's speed over FlashAttention-4 with the same variant
(FA4 ms / flashattn ms; the figure is at least 1.0). Before timing, each variant's forward is checked
against flashattn.reference in float32 (max abs error, ``--max-err``); one that is off is marked WRONG
and not timed.

    python benchmarks/bench_variants.py --out DIR      # DIR/bench_variants.md and .json
    python benchmarks/bench_variants.py --seqlen 4096 --variants sink
    python benchmarks/bench_variants.py --render DIR/bench_variants.json   # its markdown again, to stdout

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
    warm_up,
)

VARIANTS = ("sink", "softcap", "alibi")
MODES = ("fwd", "bwd", "fwdbwd")


def variant_args(variant: str, heads: int, device) -> Dict[str, torch.Tensor]:
    """The keyword arguments (flashattn's and FlashAttention-4's names agree) that turn a variant on."""
    if variant == "sink":
        return {"learnable_sink": (torch.randn(heads, device=device) + 1.0).requires_grad_()}
    if variant == "softcap":
        return {"softcap": 30.0}
    if variant == "alibi":
        return {"alibi_slopes": torch.exp2(-8.0 * torch.arange(1, heads + 1, device=device) / heads)}
    raise ValueError(variant)


def alibi_bias(slopes: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """(1, heads, Lq, Lk) float32: ALiBi's -slope * |i + Lk - Lq - j|."""
    i = torch.arange(seqlen_q, device=slopes.device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=slopes.device)
    return -slopes[None, :, None, None] * (i - j).abs().float()


def contenders(variant: str, causal: bool, extra: Dict[str, torch.Tensor]):
    """name -> forward(q, k, v) -> out, and name -> reason for the contenders that cannot run."""
    forwards, missing = {}, {}

    def ours(kwargs):
        return lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, **kwargs)

    forwards["flashattn"] = ours({})
    forwards[f"flashattn+{variant}"] = ours(extra)
    try:
        fa4 = _fa4_interface().flash_attn_func

        def theirs(kwargs):
            def forward(q, k, v):
                out = fa4(q, k, v, causal=causal, **kwargs)
                return out[0] if isinstance(out, (tuple, list)) else out
            return forward

        forwards["fa4"] = theirs({})
        forwards[f"fa4+{variant}"] = theirs(extra)
    except AnchorUnavailable as exc:
        missing["fa4"] = missing[f"fa4+{variant}"] = str(exc)
    return forwards, missing


def timed_call(forward, mode, q, k, v, dout, leaves):
    """The callable to time for `mode`, the gradients taken for `leaves`; a forward (outside the
    timing) for bwd."""
    if mode == "fwd":
        return lambda: forward(q, k, v)
    if mode == "bwd":
        out = forward(q, k, v)
        return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return lambda: torch.autograd.grad(forward(q, k, v), leaves, dout)


REFERENCE_ROWS = 2048  # query rows the reference checks: a (1, H, rows, N) float32 bias, 2 GiB at N = 16k


def reference_error(forward, q, k, v, causal: bool, extra) -> float:
    """max |forward - reference| in float32 on the first batch entry's last REFERENCE_ROWS queries
    (all of them below that; the last rows see every key, and causal alignment is bottom-right, so
    the slice is the same problem with fewer queries)."""
    with torch.no_grad():
        out = forward(q[:1], k[:1], v[:1]).float()[:, -REFERENCE_ROWS:]
        q_rows = q[:1, -REFERENCE_ROWS:]
        sink = extra.get("learnable_sink")
        slopes = extra.get("alibi_slopes")
        ref = attention_reference(q_rows.float(), k[:1].float(), v[:1].float(), None, causal, True,
                                  sink=None if sink is None else sink.detach().float(),
                                  softcap=extra.get("softcap", 0.0),
                                  attn_mask=None if slopes is None else alibi_bias(slopes, q_rows.size(1), k.size(1)))
    return (out - ref).abs().max().item()


def run_cell(variant, seqlen, causal, args, device="cuda") -> dict:
    device = torch.device(device)
    batch = max(1, args.tokens // seqlen)
    shape = (batch, seqlen, args.heads, args.headdim)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype)
    extra = variant_args(variant, args.heads, device)
    forwards, status = contenders(variant, causal, extra)
    row = {"variant": variant, "batch": batch, "seqlen": seqlen, "heads": args.heads, "head_dim": args.headdim,
           "causal": causal, "ms": {m: {} for m in args.mode}, "max_err": {}, "status": status}
    for name in list(forwards):
        try:
            warm_up(forwards[name], q, k, v, dout, backward=True)
            row["max_err"][name] = err = reference_error(forwards[name], q, k, v, causal, extra if "+" in name else {})
            if err > args.max_err:
                status[name] = f"WRONG: max err {err:.3g} > {args.max_err:g}"
                del forwards[name]
        except Exception as exc:  # noqa: BLE001  (reported, never stops the run)
            status[name] = "failed: " + short_error(exc)
            del forwards[name]
    for mode in args.mode:
        def time_one(name, mode=mode):
            leaves = (q, k, v) + (tuple(t for t in extra.values() if isinstance(t, torch.Tensor) and t.requires_grad)
                                  if "+" in name else ())
            return time_ms(timed_call(forwards[name], mode, q, k, v, dout, leaves), args.warmup,
                           args.rep / args.rounds, device)

        row["ms"][mode] = rotating_medians(forwards, time_one, args.rounds, status)
    return row


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def table_lines(rows: List[dict]) -> List[str]:
    lines = ["| variant | N | causal | mode | flashattn ms | +variant ms | cost | FA4 ms | FA4 +variant ms | FA4 cost | "
             "speed vs FA4 (+variant) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["variant"]
        for mode, ms in r["ms"].items():
            ours, ours_v, fa4, fa4_v = (ms.get(n) for n in ("flashattn", f"flashattn+{v}", "fa4", f"fa4+{v}"))
            cost = ours_v / ours - 1 if ours and ours_v else None
            fa4_cost = fa4_v / fa4 - 1 if fa4 and fa4_v else None
            speed = fa4_v / ours_v if fa4_v and ours_v else None
            lines.append(f"| {v} | {r['seqlen']} | {'yes' if r['causal'] else 'no'} | {mode} | {_fmt(ours, '.3f')} | "
                         f"{_fmt(ours_v, '.3f')} | {_fmt(cost, '+.1%')} | {_fmt(fa4, '.3f')} | {_fmt(fa4_v, '.3f')} | "
                         f"{_fmt(fa4_cost, '+.1%')} | {_fmt(speed, '.2f')} |")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--seqlen", nargs="+", type=int, default=[1024, 4096, 16384])
    p.add_argument("--tokens", type=int, default=16384, help="batch * seqlen")
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


def markdown(meta: dict, args: dict, rows: List[dict]) -> List[str]:
    lines = [f"# Attention variants, {meta['gpu'] or meta['device']}, {meta['date']}, commit {meta['git_commit']}", "",
             f"{'bf16' if meta['device'] == 'cuda' else 'float32'}, B * N = {args['tokens']}, H = {args['heads']}, D = {args['headdim']}; torch {meta['torch']}, "
             f"flash-attn-4 {meta['flash_attn_4']}. cost: the variant's time over the same library's plain "
             "attention, minus 1; speed vs FA4: FA4 ms / flashattn ms, both with the variant. "
             f"Command: `{meta['command']}`.", ""]
    lines += table_lines(rows)
    notes = sorted({f"- N={r['seqlen']} causal={r['causal']}: {n}: {why}" for r in rows for n, why in r["status"].items()})
    if notes:
        lines += ["", "Notes:"] + notes
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        return render_saved(args.render, markdown)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_variants: no CUDA GPU here (--device cpu tries the script on the CPU)")
        return 1
    torch.manual_seed(0)
    meta = metadata(args.device)
    meta["command"] = "python benchmarks/bench_variants.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows = []
    for variant in args.variants:
        for seqlen in args.seqlen:
            for causal in (False, True):
                rows.append(run_cell(variant, seqlen, causal, args, args.device))
                print("\n".join(table_lines(rows[-1:])[2:]), flush=True)
    lines = markdown(meta, vars(args), rows)
    print("\n".join(lines))
    save_run(args.out, "bench_variants", lines, meta, vars(args), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
