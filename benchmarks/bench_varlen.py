#!/usr/bin/env python3
"""Packed-document (variable-length) attention: flashattn's ``flash_attn_varlen_func`` beside
FlashAttention-4's varlen kernel and, at equal lengths, beside flashattn's own batched kernel.

Training on packed documents puts many sequences of different lengths in one row of ``total`` tokens,
each attending only within itself; the batched grid of benchmarks/harness.py never measures that. The
documents come from a length mix, drawn from ``--seed`` so that every run and every contender sees the
same documents:

  loguniform  lengths log-uniform in [64, 8192], drawn until ``total`` is filled (the last document is
              cut so the lengths sum to ``total``): the spread of a real pretraining mix
  equal       every document ``--equal-length`` tokens (``total`` must be a multiple): the case where a
              batched kernel does the same work, so varlen's overhead shows against it
  one-long    one document of half the total at a random place among short ones of 64..256 tokens:
              the load-balance case, one document dominating the work

Contenders, one column each: ``flashattn`` (``flashattn.flash_attn_varlen_func``), ``fa4``
(``flash_attn.cute.interface.flash_attn_varlen_func`` of FlashAttention-4, n/a with the reason said once
when it does not import) and ``batched`` (``flashattn.flash_attn_func`` on the same tokens viewed as a
(documents, length, heads, dim) batch; equal mix only). All take the same packed q, k, v and the same
fixed random output gradient. Before timing, each contender's forward is checked against SDPA run
document by document (max abs error, ``--max-err``); one that is off is marked WRONG and not timed.

Useful FLOPs count only each document's own attention, with benchmarks/harness.py's convention applied
per document: forward 4 * H * L^2 * D for a document of L tokens, halved when causal, summed over the
documents; backward 2.5x and forward + backward 3.5x the forward. Padding, masked-out tiles and any
other work a kernel does are not useful FLOPs: the same count divides every contender's time, so a
ratio of TFLOP/s is a ratio of speeds.

Timing: every contender's first call (FlashAttention-4 compiles for seconds per configuration) comes
before any timing. Each figure is then the median of ``--rounds`` rotating rounds (harness.rotating_medians:
every contender once per round, round r starting one contender later), each round the median of
``--iters`` calls timed alone with CUDA events after a few untimed ones, L2 flushed before each call as
triton's do_bench does; a call slower than ``--max-ms`` / iters gets fewer calls, so a pathologically
slow contender cannot stall the run. Peak extra memory: torch.cuda.max_memory_allocated over one
forward + backward minus what was allocated before it (the inputs). A contender that fails (out of
memory, say) is reported with its error; it never stops the run.

    python benchmarks/bench_varlen.py --out DIR     # DIR/bench_varlen.md and DIR/bench_varlen.json
    python benchmarks/bench_varlen.py --totals 16384 --mixes equal --iters 5
    python benchmarks/bench_varlen.py --dry-run     # the documents and their FLOPs; no GPU needed

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import statistics
import sys
import time
import traceback
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
import flashattn  # noqa: E402
from harness import (  # noqa: E402  (benchmarks/harness.py)
    FLOPS_FACTOR,
    AnchorUnavailable,
    _fa4_interface,
    cuda_unusable_reason,
    fa4_status,
    metadata,
    peak_extra_mib,
    rotating_medians,
    short_error,
    timed_fn,
    warm_up,
)

MIXES = ("loguniform", "equal", "one-long")
CONTENDERS = ("flashattn", "fa4", "batched")
MODES = ("fwd", "bwd", "fwdbwd")
DEFAULT_TOTALS = (16384, 65536)
LOGUNIFORM_LENGTHS = (64, 8192)
ONE_LONG_SHORT_LENGTHS = (64, 256)
DEFAULT_EQUAL_LENGTH = 2048
DTYPE = torch.bfloat16
# Untimed calls before each measurement's timed ones: the GPU's clocks drop while another contender's
# inputs are set up, and come back within a few calls.
WARMUP_CALLS = 3
# What triton's do_bench writes between calls so that no call finds its inputs in L2 (H200: 60 MiB of L2).
L2_FLUSH_BYTES = 256 * 2**20
MIB = 2**20


# --------------------------------------------------------------------------------------------------
# The documents
# --------------------------------------------------------------------------------------------------


def _fill(lengths: List[int], total: int, draw) -> List[int]:
    """lengths followed by drawn lengths until they sum to total, the last one cut to fit."""
    filled = sum(lengths)
    while filled < total:
        length = min(draw(), total - filled)
        lengths.append(length)
        filled += length
    return lengths


def document_lengths(mix: str, total: int, seed: int = 0, equal_length: int = DEFAULT_EQUAL_LENGTH) -> List[int]:
    """The document lengths of a mix, summing to total. The same (mix, total, seed) always gives the
    same lengths (Python's own generator: the same on every machine and torch version)."""
    if total < 1:
        raise ValueError(f"total must be at least 1, got {total}")
    rng = random.Random(seed)
    if mix == "loguniform":
        low, high = LOGUNIFORM_LENGTHS
        log_low, log_high = math.log(low), math.log(high)
        return _fill([], total, lambda: min(high, max(low, round(math.exp(rng.uniform(log_low, log_high))))))
    if mix == "equal":
        if equal_length < 1 or total % equal_length:
            raise ValueError(f"the equal mix needs total ({total}) to be a multiple of the document length "
                             f"({equal_length})")
        return [equal_length] * (total // equal_length)
    if mix == "one-long":
        low, high = ONE_LONG_SHORT_LENGTHS
        long_length = max(1, total // 2)
        shorts = _fill([], total - long_length, lambda: rng.randint(low, high))
        where = rng.randint(0, len(shorts))
        return shorts[:where] + [long_length] + shorts[where:]
    raise ValueError(f"unknown mix {mix!r} (choose from {', '.join(MIXES)})")


def cu_seqlens(lengths: List[int], device) -> torch.Tensor:
    """int32 offsets of the documents in the packed rows: 0, then the running sum of the lengths."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def useful_fwd_flops(lengths: List[int], heads: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of each document's own attention, summed: 4 * H * L^2 * D per document (QK^T and PV),
    halved when causal (harness.py's convention, per document). heads: query heads (GQA shares keys and
    values, not the work)."""
    flops = sum(4 * heads * length * length * head_dim for length in lengths)
    return flops / 2 if causal else float(flops)


# --------------------------------------------------------------------------------------------------
# The contenders: each forward(q, k, v) -> out for packed (total, heads, dim) tensors
# --------------------------------------------------------------------------------------------------


def flashattn_varlen_forward(offsets: torch.Tensor, max_seqlen: int, causal: bool):
    return lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, offsets, offsets, max_seqlen, max_seqlen,
                                                            causal=causal)


def fa4_varlen_forward(offsets: torch.Tensor, max_seqlen: int, causal: bool):
    """FlashAttention-4's varlen function (AnchorUnavailable when flash_attn.cute does not import)."""
    varlen = _fa4_interface().flash_attn_varlen_func

    def forward(q, k, v):
        out = varlen(q, k, v, cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=max_seqlen,
                     max_seqlen_k=max_seqlen, causal=causal)
        # Versions differ in what they return: the output alone or (out, lse).
        return out[0] if isinstance(out, (tuple, list)) else out

    return forward


def batched_forward(documents: int, length: int, causal: bool):
    """flashattn's batched kernel on the packed rows viewed as (documents, length, heads, dim): the same
    attention as varlen when every document has `length` tokens, with no copy either way."""

    def forward(q, k, v):
        def batch(x):
            return x.view(documents, length, x.shape[1], x.shape[2])

        return flashattn.flash_attn_func(batch(q), batch(k), batch(v), causal=causal).reshape(q.shape)

    return forward


def applicable(contender: str, mix: str) -> bool:
    """Whether a contender runs a mix at all: the batched kernel only where every document has one length."""
    return contender != "batched" or mix == "equal"


def make_forward(contender: str, lengths: List[int], offsets: torch.Tensor, causal: bool):
    if contender == "flashattn":
        return flashattn_varlen_forward(offsets, max(lengths), causal)
    if contender == "fa4":
        return fa4_varlen_forward(offsets, max(lengths), causal)
    if contender == "batched":
        if len(set(lengths)) != 1:
            raise ValueError("the batched contender needs documents of one length")
        return batched_forward(len(lengths), lengths[0], causal)
    raise ValueError(f"unknown contender {contender!r} (choose from {', '.join(CONTENDERS)})")


def reference_forward(q, k, v, lengths: List[int], causal: bool) -> torch.Tensor:
    """Attention document by document with torch SDPA, the check each contender passes before it is timed."""
    group = q.shape[1] // k.shape[1]
    outs, start = [], 0
    with torch.no_grad():
        for length in lengths:
            rows = slice(start, start + length)
            qd = q[rows].transpose(0, 1)[None]
            kd, vd = (x[rows].repeat_interleave(group, dim=1).transpose(0, 1)[None] for x in (k, v))
            outs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)[0].transpose(0, 1))
            start += length
    return torch.cat(outs)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------

_l2_flush_buffers: Dict[torch.device, torch.Tensor] = {}


def _timed_call_ms(fn, device: torch.device) -> float:
    """Milliseconds of one call of fn: CUDA events, L2 flushed first, on the GPU; wall clock elsewhere."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    flush = _l2_flush_buffers.get(device)
    if flush is None:
        flush = _l2_flush_buffers[device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fn, iters: int, max_ms: float, device) -> float:
    """Median of up to `iters` calls of fn timed one by one, after untimed calls (one, which also estimates
    the call's time, then WARMUP_CALLS). Fewer calls when iters of them would take more than max_ms (at
    least one)."""
    device = torch.device(device)
    estimate = max(_timed_call_ms(fn, device), 1e-3)
    calls = max(1, min(iters, int(max_ms / estimate)))
    for _ in range(min(WARMUP_CALLS, calls)):
        fn()
    return statistics.median(_timed_call_ms(fn, device) for _ in range(calls))


# --------------------------------------------------------------------------------------------------
# One case: a (mix, total) configuration, every contender
# --------------------------------------------------------------------------------------------------


def case_config(mix, total, args) -> dict:
    """What a case is, before anything runs: its documents and their useful FLOPs."""
    lengths = document_lengths(mix, total, args.seed, args.equal_length)
    return {"mix": mix, "total": total, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "causal": args.causal, "seed": args.seed, "documents": len(lengths), "max_seqlen": max(lengths),
            "lengths": lengths, "useful_fwd_flops": useful_fwd_flops(lengths, args.heads, args.head_dim, args.causal),
            "contenders": [c for c in args.contenders if applicable(c, mix)]}


def _free_cached(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_case(config: dict, args, device="cuda", dtype=DTYPE, announced: Optional[Dict[str, str]] = None) -> dict:
    """Checks, times and measures every contender of one case; returns the case's result row.

    row["ms"][contender][mode] and row["tflops"][contender][mode] for the modes fwd, bwd and fwdbwd;
    row["peak_mib"][contender] for one forward + backward (CUDA only); row["status"][contender] says why
    a contender has no figures. announced: contender -> status already said for the whole run (an anchor
    that does not import), used as that contender's status without trying it again."""
    device = torch.device(device)
    announced = announced or {}
    row = dict(config, dtype=str(dtype).replace("torch.", ""), ms={}, tflops={}, peak_mib={}, max_abs_err={},
               first_call_s={}, status={})
    lengths, total = config["lengths"], config["total"]
    generator = torch.Generator(device=device).manual_seed(config["seed"])

    def randn(heads):
        return torch.randn(total, heads, config["head_dim"], generator=generator, device=device, dtype=dtype)

    q, k, v = (randn(h).requires_grad_() for h in (config["heads"], config["kv_heads"], config["kv_heads"]))
    dout = randn(config["heads"])
    offsets = cu_seqlens(lengths, device)
    reference = reference_forward(q, k, v, lengths, config["causal"]).float()

    forwards = {}
    for name in config["contenders"]:
        if name in announced:
            row["status"][name] = announced[name]
            continue
        try:
            forward = make_forward(name, lengths, offsets, config["causal"])
            row["first_call_s"][name] = warm_up(forward, q, k, v, dout, backward=True, verbose=args.verbose)
            with torch.no_grad():
                err = (forward(q, k, v).float() - reference).abs().max().item()
            row["max_abs_err"][name] = err
            if not math.isfinite(err) or err > args.max_err:
                row["status"][name] = f"WRONG: max abs error {err:.3e} > {args.max_err:g}; not timed"
                continue
            forwards[name] = forward
        except Exception as exc:  # noqa: BLE001  (a contender that fails is reported, never fatal)
            why = str(exc) if isinstance(exc, AnchorUnavailable) else short_error(exc)
            row["status"][name] = ("unavailable: " if isinstance(exc, AnchorUnavailable) else "failed: ") + why
            if args.verbose:
                traceback.print_exc()
        _free_cached(device)
    del reference

    for mode in MODES:
        def time_one(name):
            return median_ms(timed_fn(forwards[name], mode, q, k, v, dout), args.iters, args.max_ms, device)

        status = {}
        medians = rotating_medians(list(forwards), time_one, args.rounds, status, args.verbose)
        for name, why in status.items():  # failed in this mode: not tried again in the next ones
            row["status"][name] = f"{mode} {why}"
            forwards.pop(name)
        for name, ms in medians.items():
            row["ms"].setdefault(name, {})[mode] = ms
            row["tflops"].setdefault(name, {})[mode] = FLOPS_FACTOR[mode] * config["useful_fwd_flops"] / (ms * 1e-3) / 1e12
        _free_cached(device)

    for name, forward in forwards.items():
        try:
            mib = peak_extra_mib(timed_fn(forward, "fwdbwd", q, k, v, dout), device)
            if mib is not None:  # None: not measurable off CUDA
                row["peak_mib"][name] = mib
        except Exception as exc:  # noqa: BLE001
            row["status"][name] = "memory measurement failed: " + short_error(exc)
        _free_cached(device)
    del q, k, v, dout, forwards
    _free_cached(device)
    return row


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------

# Per contender: (column title, the cell's figure from a row, its format).
_CONTENDER_COLUMNS = (
    ("fwd TFLOP/s", lambda row, name: row["tflops"].get(name, {}).get("fwd")),
    ("bwd TFLOP/s", lambda row, name: row["tflops"].get(name, {}).get("bwd")),
    ("fwd+bwd ms", lambda row, name: row["ms"].get(name, {}).get("fwdbwd")),
    ("peak extra MiB", lambda row, name: row["peak_mib"].get(name)),
)
_RATIO_MODES = (("fwd", "fwd"), ("bwd", "bwd"), ("fwd+bwd", "fwdbwd"))


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def ratio(row, anchor: str, mode: str) -> Optional[float]:
    """flashattn's useful TFLOP/s over the anchor's (the anchor's time over flashattn's), or None."""
    ours, theirs = row["tflops"].get("flashattn", {}).get(mode), row["tflops"].get(anchor, {}).get(mode)
    return ours / theirs if ours and theirs else None


def table_lines(rows: List[dict], contenders: List[str]) -> List[str]:
    """The markdown table: one row per (mix, total); per contender its figures, then flashattn's ratios
    to each other contender. A cell is n/a where the contender did not run or failed (reasons in the
    notes) and - where it does not apply (the batched kernel off the equal mix) or was not measured."""
    anchors = [a for a in contenders if a != "flashattn"]
    head = ["mix", "total", "docs", "max len", "max err"]
    head += [f"{name} {title}" for name in contenders for title, _ in _CONTENDER_COLUMNS]
    head += [f"flashattn/{anchor} {label}" for anchor in anchors for label, _ in _RATIO_MODES]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|---:|" + "---:|" * (len(head) - 5)]
    for row in rows:
        err = row["max_abs_err"].get("flashattn")
        cells = [row["mix"], str(row["total"]), str(row["documents"]), str(row["max_seqlen"]),
                 f"{err:.1e}" if err is not None else "-"]
        for name in contenders:
            for _, figure in _CONTENDER_COLUMNS:
                value = figure(row, name)
                if value is not None:
                    cells.append(_number(value))
                else:
                    cells.append("n/a" if name in row["status"] else "-")
        for anchor in anchors:
            for _, mode in _RATIO_MODES:
                value = ratio(row, anchor, mode)
                cells.append(f"{value:.2f}" if value is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def note_lines(rows: List[dict]) -> List[str]:
    """Why cells are n/a: each (contender, reason) once, with the cases it applies to (or every case)."""
    cases: Dict[tuple, List[str]] = {}
    for row in rows:
        for name, why in row["status"].items():
            cases.setdefault((name, why), []).append(f"{row['mix']} {row['total']}")
    lines = []
    for (name, why), where in cases.items():
        scope = "every case" if len(where) == len(rows) and len(rows) > 1 else ", ".join(where)
        lines.append(f"- {name} ({scope}): {why}")
    return lines


def markdown(meta: dict, rows: List[dict], contenders: List[str]) -> List[str]:
    """bench_varlen.md's lines."""
    first = rows[0] if rows else {}
    shape = (f"H={first.get('heads')} (kv heads {first.get('kv_heads')}), D={first.get('head_dim')}, "
             f"{first.get('dtype')}, {'causal' if first.get('causal') else 'not causal'}, seed {first.get('seed')}")
    gpu = meta.get("gpu") or "CPU"
    fa4 = meta.get("fa4") or {}
    fa4_text = (f"FlashAttention-4 {fa4['version']}" if "version" in fa4
                else f"FlashAttention-4 unavailable ({fa4['unavailable']})" if "unavailable" in fa4 else "")
    lines = [
        f"# flashattn packed-document (varlen) attention, {meta.get('date')}",
        "",
        f"{gpu}, torch {meta.get('torch')}, flashattn {meta.get('flashattn')} at commit {meta.get('git_commit')}"
        + (f", {fa4_text}" if fa4_text else "") + f". {shape}. Timer: {meta.get('timer')}.",
    ]
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`."]
    lines += [
        "",
        "TFLOP/s count each document's own attention only (forward 4*H*L^2*D per document, halved when causal; "
        "backward 2.5x), so every contender is divided by the same work. `flashattn/X` is flashattn's varlen "
        "throughput over X's (above 1: flashattn faster). Peak extra MiB: max_memory_allocated over one "
        "forward + backward minus what was allocated before it. `max err`: max |flashattn - SDPA| of the forward "
        "output, SDPA run document by document. The document lengths of every case are in bench_varlen.json.",
        "",
    ]
    lines += table_lines(rows, contenders)
    notes = note_lines(rows)
    if notes:
        lines += ["", "n/a, failed or otherwise noted:", ""] + notes
    return lines


def write_results(out_dir: str, meta: dict, rows: List[dict], args_dict: dict, contenders: List[str]) -> List[str]:
    """bench_varlen.json (every figure, the documents, the run's metadata) and bench_varlen.md in out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "bench_varlen.json")
    with open(json_path + ".tmp", "w") as f:
        json.dump({"meta": meta, "args": args_dict, "results": rows}, f, indent=1)
    os.replace(json_path + ".tmp", json_path)  # never a half-written file, even when the run is killed
    md_path = os.path.join(out_dir, "bench_varlen.md")
    with open(md_path, "w") as f:
        f.write("\n".join(markdown(meta, rows, contenders)) + "\n")
    return [json_path, md_path]


def dry_run_lines(configs: List[dict]) -> List[str]:
    """What --dry-run prints: each case's documents and useful FLOPs."""
    lines = []
    for c in configs:
        fwd = c["useful_fwd_flops"]
        lines.append(f"{c['mix']} total={c['total']}: {c['documents']} documents, longest {c['max_seqlen']}; "
                     f"H={c['heads']} kv heads {c['kv_heads']} D={c['head_dim']} "
                     f"{'causal' if c['causal'] else 'not causal'}; useful forward {fwd / 1e9:.2f} GFLOP, backward "
                     f"{FLOPS_FACTOR['bwd'] * fwd / 1e9:.2f} GFLOP; contenders {', '.join(c['contenders'])}")
        lines.append("  lengths: " + " ".join(str(length) for length in c["lengths"]))
    return lines


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--totals", nargs="+", type=int, default=list(DEFAULT_TOTALS),
                   help="packed tokens per case (default 16384 65536)")
    p.add_argument("--mixes", nargs="+", choices=MIXES, default=list(MIXES), help="length mixes (default: all)")
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                   help="default: all (batched runs the equal mix only)")
    p.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    p.add_argument("--kv-heads", type=int, help="key/value heads, a divisor of --heads (default: --heads; fewer is GQA)")
    p.add_argument("--head-dim", type=int, default=128, help="default 128")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="attend to the whole document")
    p.add_argument("--seed", type=int, default=0, help="seed of the document lengths and the inputs (default 0)")
    p.add_argument("--equal-length", type=int, default=DEFAULT_EQUAL_LENGTH,
                   help=f"document length of the equal mix (default {DEFAULT_EQUAL_LENGTH})")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement (default 20)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rotating rounds of every contender per mode; a figure is their median (default 3)")
    p.add_argument("--max-ms", type=float, default=3000,
                   help="at most about this many ms of timed calls per measurement: fewer calls for a slow one "
                        "(default 3000)")
    p.add_argument("--max-err", type=float, default=5e-2,
                   help="max |contender - SDPA| of the forward before it is marked wrong and not timed")
    p.add_argument("--out", help="folder for bench_varlen.md and bench_varlen.json (nothing written without it)")
    p.add_argument("--dry-run", action="store_true", help="print the cases, their documents and FLOPs; run nothing")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing contenders")
    args = p.parse_args(argv)
    args.kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads:
        p.error(f"--kv-heads ({args.kv_heads}) must divide --heads ({args.heads})")
    if args.head_dim < 1 or min(args.totals) < 1:
        p.error("--head-dim and --totals must be at least 1")
    if args.iters < 1 or args.rounds < 1 or args.max_ms <= 0:
        p.error("--iters and --rounds must be at least 1, --max-ms more than 0")
    if "equal" in args.mixes:
        uneven = [t for t in args.totals if args.equal_length < 1 or t % args.equal_length]
        if uneven:
            p.error(f"the equal mix needs every total to be a multiple of --equal-length {args.equal_length}: "
                    f"{', '.join(map(str, uneven))} is not")
    return args


def run(args, device="cuda", dtype=DTYPE, meta: Optional[dict] = None, on_case=None) -> List[dict]:
    """Runs every (mix, total) case, printing the table as it goes; returns the rows. meta receives
    whether FlashAttention-4 imports; on_case(rows) is called after every case."""
    device = torch.device(device)
    configs = [case_config(mix, total, args) for mix in args.mixes for total in args.totals]
    contenders = list(args.contenders)
    announced = {}
    if "fa4" in contenders:
        fa4 = fa4_status()
        if meta is not None:
            meta["fa4"] = fa4
        if "unavailable" in fa4:
            print(f"FlashAttention-4: unavailable ({fa4['unavailable']}); its column is n/a", flush=True)
            announced["fa4"] = "unavailable: " + fa4["unavailable"]
    header = table_lines([], contenders)
    print("\n".join(header), flush=True)
    rows = []
    for config in configs:
        row = run_case(config, args, device, dtype, announced)
        rows.append(row)
        print(table_lines([row], contenders)[-1], flush=True)
        for name, why in row["status"].items():
            if why != announced.get(name):
                print(f"    {name}: {why}", flush=True)
        if on_case is not None:
            on_case(rows)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.dry_run:
        configs = [case_config(mix, total, args) for mix in args.mixes for total in args.totals]
        print("\n".join(dry_run_lines(configs)))
        return 0
    reason = cuda_unusable_reason()
    if reason is not None:
        print(f"bench_varlen.py: needs a CUDA GPU of compute capability 8.0+ with flashattn's CUDA kernels: {reason}. "
              "--dry-run shows the cases without one.", file=sys.stderr)
        return 1
    started = time.monotonic()
    meta = metadata("cuda")
    meta["timer"] = "CUDA events, median of the calls of each round (L2 flushed before each), median of the rounds"
    meta["command"] = " ".join(["python benchmarks/bench_varlen.py"] + ([shlex.join(argv)] if argv else []))
    meta["complete"] = False
    print(f"{meta['gpu']}, torch {meta['torch']}, flashattn {meta['flashattn']}, commit {meta['git_commit']}", flush=True)

    def save(rows, complete):
        meta["elapsed_s"] = round(time.monotonic() - started, 1)
        meta["complete"] = complete
        return write_results(args.out, meta, rows, vars(args), list(args.contenders))

    rows = run(args, meta=meta, on_case=(lambda rows: save(rows, False)) if args.out else None)
    if args.out:
        for path in save(rows, True):
            print(f"wrote {path}")
    else:
        print("(pass --out DIR to save bench_varlen.md and bench_varlen.json)")
    print("\n" + "\n".join(markdown(meta, rows, list(args.contenders))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
