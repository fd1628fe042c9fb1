#!/usr/bin/env python3
"""Decoding over a KV cache: flashattn's ``flash_attn_with_kvcache`` (contiguous and paged caches) beside
torch SDPA and FlashAttention-4, as K+V bandwidth against the GPU's own copy bandwidth, all in one run.

A decoding step reads the whole cache once for one (or a few) queries per sequence, so its speed is set
by memory bandwidth, not FLOPs: each figure is the bytes of K and V read, 2 * B * L * Hk * D * element
size, over the time of one call, and that bandwidth as a fraction of what a plain device-to-device copy
reaches on the same GPU in the same run (``dst.copy_(src)`` of ``--copy-mib`` MiB, read and write both
counted). Defaults: bf16, one query per sequence (``--seqlen-q``), Hq = 32, Hk = 8, D = 128, no mask
(every query sees the whole cache), softmax scale 1 / sqrt(D).

Rows are batch x cache length (``--rows 1x8192 8x32768``; a k suffix means 1024), cache_seqlens equal to
the cache length for every sequence. Methods, one column each:

- ``flashattn``: ``flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=...)`` over a
  contiguous (B, L, Hk, D) cache, cache_seqlens an int32 tensor;
- ``paged16``, ``paged256``: the same call over a paged cache, (num_pages, page_size, Hk, D) with page
  size 16 or 256, ``block_table=`` an int32 (B, pages per sequence) table holding a random permutation of
  the pages (``--seed``), so that a sequence's pages are scattered over the pool as a serving system's are;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` over the cache in
  SDPA's (B, H, L, D) layout, made outside the timing, torch choosing the backend;
- ``fa4``: FlashAttention-4's ``flash_attn.cute.interface.flash_attn_func`` over the contiguous cache,
  one split (FA4 refuses num_splits != 1 on SM90);
- ``fa4_paged``: its ``flash_attn_varlen_func`` with the queries packed (B * seqlen_q, Hq, D),
  ``cu_seqlens_q``, ``seqused_k`` and ``page_table`` over the paged cache of ``--fa4-page-size``.

``--splits 1 4 16`` adds flashattn's contiguous call with ``num_splits`` forced to each value, in a table
of its own. A method that cannot run (FlashAttention-4 not importing, a call refused) is n/a with its
reason in the notes; it never stops the run. Before timing, every method's output is compared with a
float32 reference computed here (max abs error); one above ``--max-err`` is still timed but its cells are
marked WRONG.

Timing: harness.time_ms (triton's do_bench: CUDA events, L2 flushed before each call, median), every
method's first call (FlashAttention-4 compiles for seconds per configuration) made before any timing.
The methods of a row are timed in ``--rounds`` rotating rounds (harness.rotating_medians), each
measurement with ``--warmup`` ms of warm-up and rep / rounds ms of calls; a figure is the median of its
rounds. The copy bandwidth is timed the same way before the first row.

``--time-budget SECONDS``: rows not started by then are not run and stay in the tables marked skipped.
A row's timings take about rounds * methods * (warmup + rep / rounds) ms (some 2-3 s at the defaults);
the rest of a row is making its inputs and the reference, and FlashAttention-4's compilations, which its
first row pays (they are per configuration, not per shape). With ``--out`` the markdown and JSON are rewritten after every row, so a run that is killed still
leaves what it measured.

    python benchmarks/bench_decode.py --out DIR     # DIR/bench_decode.md and DIR/bench_decode.json
    python benchmarks/bench_decode.py --quick --splits 1 4 16
    python benchmarks/bench_decode.py --render DIR/bench_decode.json   # its markdown again, to stdout

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import statistics
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
import flashattn  # noqa: E402
from harness import (  # noqa: E402  (benchmarks/harness.py)
    AnchorUnavailable,
    _fa4_interface,
    cuda_unusable_reason,
    fa4_status,
    metadata,
    render_saved,
    rotating_medians,
    save_run,
    short_error,
    time_ms,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
METHODS = ("flashattn", "paged16", "paged256", "sdpa", "fa4", "fa4_paged")
TITLES = {"flashattn": "flashattn contig", "paged16": "paged 16", "paged256": "paged 256", "sdpa": "SDPA",
          "fa4": "FA4", "fa4_paged": "FA4 paged"}
PAGE_SIZES = {"paged16": 16, "paged256": 256}
DEFAULT_ROWS = ("1x8192", "1x131072", "8x8192", "8x32768", "64x4096", "64x16384")
QUICK_ROWS = ("1x8192", "8x8192")
# The float32 reference holds K and V of this many cache rows at a time (2 * 2^18 * 8 * 128 * 4 bytes = 2 GiB
# at the default heads), so the largest rows do not need a float32 copy of the whole cache.
REFERENCE_CHUNK_TOKENS = 2**18
MIB = 2**20
STEM = "bench_decode"


# --------------------------------------------------------------------------------------------------
# Sizes and figures
# --------------------------------------------------------------------------------------------------


def parse_row(text: str) -> Tuple[int, int]:
    """"8x32768" (or "8x32k", k = 1024) -> (batch, cache length)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*([kK]?)\s*", text)
    if not match:
        raise ValueError(f"a row is BATCHxLENGTH, such as 8x32768 or 8x32k; got {text!r}")
    batch, length = int(match.group(1)), int(match.group(2)) * (1024 if match.group(3) else 1)
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be at least 1, got {text!r}")
    return batch, length


def row_label(batch: int, seqlen: int) -> str:
    return f"{batch} x {seqlen}"


def kv_bytes(batch: int, seqlen: int, kv_heads: int, head_dim: int, element_size: int) -> int:
    """Bytes of K and V a decoding step over the whole cache reads."""
    return 2 * batch * seqlen * kv_heads * head_dim * element_size


def bandwidth_tbps(nbytes: float, us: float) -> float:
    """nbytes moved in us microseconds, in TB/s (10^12 bytes a second)."""
    return nbytes / (us * 1e-6) / 1e12


def copy_bandwidth_tbps(buffer_bytes: float, ms: float) -> float:
    """A copy of buffer_bytes reads and writes them both: 2 * buffer_bytes in ms milliseconds, in TB/s."""
    return bandwidth_tbps(2 * buffer_bytes, ms * 1e3)


def pages_per_sequence(seqlen: int, page_size: int) -> int:
    return -(-seqlen // page_size)


def make_block_table(batch: int, pages_per_seq: int, seed: int) -> torch.Tensor:
    """int32 (batch, pages_per_seq) on the CPU: a random permutation of the pool's batch * pages_per_seq
    pages, drawn from seed with torch's CPU generator (the same table on every machine)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(batch * pages_per_seq, generator=generator).view(batch, pages_per_seq).to(torch.int32)


def paged_cache(cache: torch.Tensor, block_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pool (num_pages, page_size, Hk, D) holding cache (B, L, Hk, D) in the pages block_table names:
    position t of sequence b is row t % page_size of page block_table[b, t // page_size]. The rows past L
    in a sequence's last page are zeros (FA4 loads whole pages, and a NaN there would spread)."""
    batch, seqlen = cache.shape[:2]
    pages = block_table.size(1)
    padded = cache
    if pages * page_size != seqlen:
        padded = cache.new_zeros((batch, pages * page_size) + tuple(cache.shape[2:]))
        padded[:, :seqlen] = cache
    pool = cache.new_empty((batch * pages, page_size) + tuple(cache.shape[2:]))
    pool[block_table.to(cache.device).long().flatten()] = padded.reshape(batch * pages, page_size, *cache.shape[2:])
    return pool


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        chunk_tokens: int = REFERENCE_CHUNK_TOKENS) -> torch.Tensor:
    """float32 attention of q (B, Sq, Hq, D) over the whole cache k, v (B, L, Hk, D), no mask, scale
    1 / sqrt(D), query head h reading kv head h // (Hq / Hk). A few sequences at a time (at most
    chunk_tokens cache rows in float32), so the largest caches need no float32 copy of their own."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    step = max(1, chunk_tokens // max(1, seqlen))
    outs = []
    for start in range(0, batch, step):
        rows = slice(start, start + step)
        qc = q[rows].float().reshape(-1, seqlen_q, kv_heads, group, head_dim)
        kc, vc = k[rows].float(), v[rows].float()
        scores = torch.einsum("bqhgd,bkhd->bhgqk", qc, kc) / math.sqrt(head_dim)
        outs.append(torch.einsum("bhgqk,bkhd->bqhgd", scores.softmax(dim=-1), vc).reshape(-1, seqlen_q, heads, head_dim))
    return torch.cat(outs)


# --------------------------------------------------------------------------------------------------
# The methods: each a call with no arguments over inputs made beforehand, returning (B, Sq, Hq, D)
# --------------------------------------------------------------------------------------------------


def _first(out):
    # FlashAttention-4's versions differ in what they return: the output alone or (out, lse).
    return out[0] if isinstance(out, (tuple, list)) else out


class Inputs:
    """One row's tensors: q, the contiguous cache, and on demand the paged pools, SDPA's layout and the
    packed queries; each made once and shared by the methods that read it."""

    def __init__(self, batch, seqlen, args, device, dtype):
        self.batch, self.seqlen, self.args, self.device = batch, seqlen, args, device
        generator = torch.Generator(device=device).manual_seed(args.seed)

        def randn(*shape):
            return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

        self.q = randn(batch, args.seqlen_q, args.heads, args.headdim)
        self.k = randn(batch, seqlen, args.kv_heads, args.headdim)
        self.v = randn(batch, seqlen, args.kv_heads, args.headdim)
        self.seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device=device)
        self._made: Dict[object, object] = {}

    def _once(self, key, make):
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def paged(self, page_size: int):
        """(k pool, v pool, block table on the device) of that page size."""
        def make():
            table = make_block_table(self.batch, pages_per_sequence(self.seqlen, page_size), self.args.seed)
            return (paged_cache(self.k, table, page_size), paged_cache(self.v, table, page_size),
                    table.to(self.device))
        return self._once(("paged", page_size), make)

    def sdpa_layout(self):
        """q, k, v in SDPA's (B, H, L, D) layout, contiguous."""
        return self._once("sdpa", lambda: tuple(t.transpose(1, 2).contiguous() for t in (self.q, self.k, self.v)))

    def packed(self):
        """(q packed (B * Sq, Hq, D), cu_seqlens_q int32 (B + 1,))."""
        seqlen_q = self.args.seqlen_q
        return self._once("packed", lambda: (
            self.q.reshape(self.batch * seqlen_q, self.args.heads, self.args.headdim),
            torch.arange(0, (self.batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=self.device)))

    def release(self):
        self._made.clear()
        del self.q, self.k, self.v, self.seqlens


def make_method(name: str, x: Inputs) -> Callable[[], torch.Tensor]:
    """The call to check and time for method `name` (AnchorUnavailable when FlashAttention-4 does not
    import). Everything besides the call itself (layouts, pages, tables) is made here, outside the timing."""
    if name == "flashattn":
        return lambda: flashattn.flash_attn_with_kvcache(x.q, x.k, x.v, cache_seqlens=x.seqlens)
    if name.startswith("splits="):
        splits = int(name.split("=", 1)[1])
        return lambda: flashattn.flash_attn_with_kvcache(x.q, x.k, x.v, cache_seqlens=x.seqlens, num_splits=splits)
    if name in PAGE_SIZES:
        k_pages, v_pages, table = x.paged(PAGE_SIZES[name])
        return lambda: flashattn.flash_attn_with_kvcache(x.q, k_pages, v_pages, cache_seqlens=x.seqlens,
                                                         block_table=table)
    if name == "sdpa":
        q, k, v = x.sdpa_layout()

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        # The check reads the output in the (B, Sq, Hq, D) layout; the timed call is sdpa alone.
        sdpa.output = lambda: sdpa().transpose(1, 2)
        return sdpa
    if name == "fa4":
        fa4 = _fa4_interface().flash_attn_func
        return lambda: _first(fa4(x.q, x.k, x.v, causal=False))
    if name == "fa4_paged":
        varlen = _fa4_interface().flash_attn_varlen_func
        k_pages, v_pages, table = x.paged(x.args.fa4_page_size)
        q_packed, cu_seqlens_q = x.packed()

        def fa4_paged():
            return _first(varlen(q_packed, k_pages, v_pages, cu_seqlens_q=cu_seqlens_q, seqused_k=x.seqlens,
                                 max_seqlen_q=x.args.seqlen_q, page_table=table, causal=False))

        fa4_paged.output = lambda: fa4_paged().view(x.q.shape)
        return fa4_paged
    raise ValueError(f"unknown method {name!r}")


def method_names(args) -> List[str]:
    """The methods a run times, in column order: the chosen ones, then one per --splits value."""
    return [m for m in METHODS if m in args.methods] + [f"splits={s}" for s in args.splits]


# --------------------------------------------------------------------------------------------------
# One row: a (batch, cache length), every method
# --------------------------------------------------------------------------------------------------


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_cached(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _copy_times_ms(nbytes: int, args, device) -> List[float]:
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return [time_ms(lambda: dst.copy_(src), args.warmup, args.rep / args.rounds, device) for _ in range(args.rounds)]


def measure_copy(args, device) -> dict:
    """The device's copy bandwidth: dst.copy_(src) of --copy-mib MiB, timed as the methods are (median of
    --rounds measurements), 2 * size bytes moved per call."""
    nbytes = int(args.copy_mib * MIB)
    times = _copy_times_ms(nbytes, args, device)
    _free_cached(device)  # the buffers are gone with _copy_times_ms's frame
    ms = statistics.median(times)
    return {"bytes": nbytes, "ms": ms, "tbps": copy_bandwidth_tbps(nbytes, ms),
            "rounds_tbps": [copy_bandwidth_tbps(nbytes, t) for t in times]}


def row_config(batch: int, seqlen: int, args, element_size: int) -> dict:
    return {"batch": batch, "seqlen": seqlen, "label": row_label(batch, seqlen),
            "kv_bytes": kv_bytes(batch, seqlen, args.kv_heads, args.headdim, element_size),
            "us": {}, "tbps": {}, "copy_fraction": {}, "max_abs_err": {}, "wrong": {}, "first_call_s": {},
            "status": {}}


def add_figures(row: dict, name: str, ms: float, copy_tbps: Optional[float]) -> None:
    """A method's time (ms) into the row: microseconds, K+V TB/s and the fraction of the copy bandwidth."""
    us = ms * 1e3
    row["us"][name] = us
    row["tbps"][name] = tbps = bandwidth_tbps(row["kv_bytes"], us)
    if copy_tbps:
        row["copy_fraction"][name] = tbps / copy_tbps


def run_row(batch: int, seqlen: int, args, device, dtype, copy_tbps: Optional[float],
            announced: Dict[str, str]) -> dict:
    """Checks and times every method over one (batch, cache length); returns the row. announced: method
    -> why, for methods already known not to run this whole run (not tried again)."""
    row = row_config(batch, seqlen, args, torch.empty((), dtype=dtype).element_size())
    x = Inputs(batch, seqlen, args, device, dtype)
    reference = reference_attention(x.q, x.k, x.v)
    calls = {}
    for name in method_names(args):
        if name in announced:
            row["status"][name] = announced[name]
            continue
        try:
            call = make_method(name, x)
            start = time.perf_counter()
            out = getattr(call, "output", call)()
            _sync(device)
            row["first_call_s"][name] = time.perf_counter() - start
            err = (out.float() - reference).abs().max().item()
            del out
            row["max_abs_err"][name] = err
            if not math.isfinite(err) or err > args.max_err:
                row["wrong"][name] = f"WRONG: max abs error {err:.3e} > {args.max_err:g} (timed all the same)"
            calls[name] = call
        except Exception as exc:  # noqa: BLE001  (a method that fails is reported, never fatal)
            why = str(exc) if isinstance(exc, AnchorUnavailable) else short_error(exc)
            row["status"][name] = ("unavailable: " if isinstance(exc, AnchorUnavailable) else "failed: ") + why
            if args.verbose:
                traceback.print_exc()
        _free_cached(device)
    del reference

    def time_one(name):
        return time_ms(calls[name], args.warmup, args.rep / args.rounds, device)

    for name, ms in rotating_medians(list(calls), time_one, args.rounds, row["status"], args.verbose).items():
        add_figures(row, name, ms, copy_tbps)
    x.release()
    calls.clear()  # the calls hold the pools and layouts too
    _free_cached(device)
    return row


def skipped_row(batch: int, seqlen: int, args, element_size: int, reason: str) -> dict:
    row = row_config(batch, seqlen, args, element_size)
    row["skipped"] = reason
    return row


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def _tbps(value: float) -> str:
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3g}"


def _bandwidth_cell(row: dict, name: str) -> str:
    """"TB/s (x% of copy)", with WRONG after it for a method whose output was off; n/a where it did not
    run or failed, skipped for a row not run, - where it was not asked for."""
    if name in row["tbps"]:
        cell = _tbps(row["tbps"][name])
        if name in row["copy_fraction"]:
            cell += f" ({100 * row['copy_fraction'][name]:.0f}% of copy)"
        return cell + (" WRONG" if name in row["wrong"] else "")
    if row.get("skipped"):
        return "skipped"
    return "n/a" if name in row["status"] else "-"


def _plain_cell(row: dict, name: str, value: Optional[str]) -> str:
    if value is not None:
        return value
    if row.get("skipped"):
        return "skipped"
    return "n/a" if name in row["status"] else "-"


def ratio(row: dict, ours: str, theirs: str) -> Optional[float]:
    """Bandwidth of `ours` over that of `theirs` (their time over ours), or None when either is missing."""
    a, b = row["tbps"].get(ours), row["tbps"].get(theirs)
    return a / b if a and b else None


def _table(head: List[str], body: List[List[str]]) -> List[str]:
    return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)] + \
        ["| " + " | ".join(cells) + " |" for cells in body]


def bandwidth_table(rows: List[dict]) -> List[str]:
    return _table(["batch x length"] + [TITLES[m] for m in METHODS],
                  [[r["label"]] + [_bandwidth_cell(r, m) for m in METHODS] for r in rows])


def ratio_table(rows: List[dict]) -> List[str]:
    body = []
    for r in rows:
        cells = [r["label"]]
        for anchor in ("sdpa", "fa4"):
            value = ratio(r, "flashattn", anchor)
            cells.append(f"{value:.2f}" if value is not None else "skipped" if r.get("skipped") else "-")
        body.append(cells)
    return _table(["batch x length", "flashattn / SDPA", "flashattn / FA4"], body)


def time_table(rows: List[dict]) -> List[str]:
    """Microseconds per call and max abs error of each method."""
    body = []
    for r in rows:
        cells = [r["label"]]
        for m in METHODS:
            us, err = r["us"].get(m), r["max_abs_err"].get(m)
            value = None
            if us is not None:
                value = f"{us:.1f}" + (f" ({err:.1e})" if err is not None else "")
            cells.append(_plain_cell(r, m, value))
        body.append(cells)
    return _table(["batch x length"] + [TITLES[m] for m in METHODS], body)


def splits_table(rows: List[dict], splits: List[int]) -> List[str]:
    names = ["flashattn"] + [f"splits={s}" for s in splits]
    return _table(["batch x length", "flashattn default"] + [f"num_splits={s}" for s in splits],
                  [[r["label"]] + [_bandwidth_cell(r, n) for n in names] for r in rows])


def note_lines(rows: List[dict]) -> List[str]:
    """Why cells are n/a or marked: each (method, reason) once, with the rows it applies to (or every row);
    then the rows that were not run."""
    ran = [r for r in rows if not r.get("skipped")]
    where: Dict[Tuple[str, str], List[str]] = {}
    for r in ran:
        for name, why in list(r["status"].items()) + list(r["wrong"].items()):
            where.setdefault((name, why), []).append(r["label"])
    lines = []
    for (name, why), labels in where.items():
        scope = "every row" if len(labels) == len(ran) and len(ran) > 1 else ", ".join(labels)
        lines.append(f"- {TITLES.get(name, 'flashattn ' + name)} ({scope}): {why}")
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        lines.append(f"- not run ({skipped[0]['skipped']}): " + ", ".join(r["label"] for r in skipped))
    return lines


def _fa4_text(meta: dict, rows: List[dict]) -> str:
    fa4 = meta.get("fa4") or {}
    if "version" in fa4:
        first_calls = [r["first_call_s"][m] for r in rows for m in ("fa4", "fa4_paged") if m in r["first_call_s"]]
        if not first_calls:
            return f"FlashAttention-4 {fa4['version']}"
        return (f"FlashAttention-4 {fa4['version']} (first calls, compiling just in time before the timings: "
                f"{sum(first_calls):.0f} s in all, at most {max(first_calls):.1f} s)")
    if "unavailable" in fa4:
        return f"FlashAttention-4 unavailable ({fa4['unavailable']})"
    return "FlashAttention-4 not asked for"


def _summary(meta: dict, rows: List[dict]) -> str:
    skipped = [r for r in rows if r.get("skipped")]
    parts = [f"Run time {meta['elapsed_s']:.0f} s"] if meta.get("elapsed_s") is not None else []
    if skipped:
        parts.append(f"INCOMPLETE: {len(skipped)} of {len(rows)} rows not run ({skipped[0]['skipped']})")
    elif meta.get("complete") is False:
        parts.append("in progress or interrupted: the rows below are those finished so far")
    else:
        parts.append(f"all {len(rows)} rows ran")
    return "; ".join(parts) + "."


def markdown(meta: dict, args: dict, rows: List[dict]) -> List[str]:
    """bench_decode.md's lines (also what --render prints from a saved JSON)."""
    device = (f"{meta['gpu']} (sm_{str(meta.get('capability')).replace('.', '')})" if meta.get("gpu")
              else meta.get("device", "cpu").upper())
    copy = meta.get("copy") or {}
    copy_text = (f"Copy bandwidth: {_tbps(copy['tbps'])} TB/s (dst.copy_(src) of {copy['bytes'] / MIB:.0f} MiB, read "
                 "and write counted; the median of rounds at " + ", ".join(_tbps(t) for t in copy.get("rounds_tbps", []))
                 + " TB/s)." if copy.get("tbps") else "Copy bandwidth: not measured.")
    lines = [
        f"# Decoding over a KV cache, {device}, {meta['date']}, commit {meta['git_commit']}",
        "",
        f"{args['dtype']}, Hq = {args['heads']}, Hk = {args['kv_heads']}, D = {args['headdim']}, seqlen_q = "
        f"{args['seqlen_q']}, no mask; torch {meta['torch']} (CUDA {meta.get('cuda')}), flashattn "
        f"{meta['flashattn']} (decode op {'on' if meta.get('decode_op') else 'off'}: FLASHATTN_DECODE_OP), "
        f"{_fa4_text(meta, rows)}. Timer: {meta['timer']}, median of {args['rounds']} rotating rounds.",
        "",
        copy_text,
    ]
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`. {_summary(meta, rows)}"]
    if meta.get("device") == "cuda" and "do_bench" not in str(meta.get("timer")):
        lines += ["", "L2 was not flushed between calls (triton is not installed): rows whose K and V fit in L2 "
                      "read faster than from memory."]
    lines += [
        "",
        "K+V bandwidth: 2 * B * L * Hk * D * element size bytes over the time of one call, in TB/s, and as a "
        f"fraction of the copy bandwidth. Paged caches: pages of 16 or 256 rows in random order; FA4 paged uses "
        f"pages of {args['fa4_page_size']}. WRONG: the output's max abs error against a float32 reference is "
        f"above {args['max_err']:g} (the time is still measured). n/a: the method did not run (reasons below).",
        "",
    ]
    lines += bandwidth_table(rows)
    lines += ["", "flashattn contig's bandwidth over the anchor's (above 1: flashattn faster):", ""]
    lines += ratio_table(rows)
    lines += ["", "Time per call, us (max abs error against the float32 reference):", ""]
    lines += time_table(rows)
    if args.get("splits"):
        lines += ["", "flashattn contig with num_splits forced (TB/s):", ""]
        lines += splits_table(rows, args["splits"])
    notes = note_lines(rows)
    if notes:
        lines += ["", "n/a, failed, wrong or skipped:", ""] + notes
    return lines


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), metavar="BxL",
                   help="batch x cache length, such as 8x32768 or 8x32k (default: " + " ".join(DEFAULT_ROWS) + ")")
    p.add_argument("--quick", action="store_true", help="rows " + " and ".join(QUICK_ROWS) + " only")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="default: all")
    p.add_argument("--splits", nargs="+", type=int, default=[], metavar="N",
                   help="also time flashattn contig with num_splits forced to each N (a table of its own)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="default bf16 (fp32: CPU tries only)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads, a divisor of --heads (default 8)")
    p.add_argument("--headdim", "--head-dim", dest="headdim", type=int, default=128, help="default 128")
    p.add_argument("--seqlen-q", type=int, default=1, help="queries per sequence (default 1: one decoding step)")
    p.add_argument("--fa4-page-size", type=int, choices=sorted(PAGE_SIZES.values()), default=256,
                   help="the paged cache FA4 paged reads (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the page order (default 0)")
    p.add_argument("--copy-mib", type=float, default=2048, help="size of the copy that measures bandwidth (default 2048)")
    p.add_argument("--warmup", type=float, default=10, help="warm-up per measurement, ms (default 10)")
    p.add_argument("--rep", type=float, default=150,
                   help="ms of timed calls of one method and row, shared by its rounds (default 150)")
    p.add_argument("--rounds", type=int, default=3, help="rotating rounds; a figure is their median (default 3)")
    p.add_argument("--max-err", type=float, default=2e-2,
                   help="max abs error against the float32 reference before a method is marked WRONG (default 2e-2)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="rows not started after this many seconds are not run; they are reported as skipped")
    p.add_argument("--out", help="folder for bench_decode.md and bench_decode.json (nothing written without it)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (wall clock, small rows: to try the script)")
    p.add_argument("--render", metavar="JSON", help="print the markdown of an earlier run's bench_decode.json")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing methods")
    args = p.parse_args(argv)
    if args.quick:
        args.rows = list(QUICK_ROWS)
    try:
        args.shapes = [parse_row(r) for r in args.rows]
    except ValueError as exc:
        p.error(str(exc))
    if min(args.heads, args.kv_heads, args.headdim, args.seqlen_q) < 1 or args.heads % args.kv_heads:
        p.error(f"--heads, --kv-heads, --headdim and --seqlen-q must be at least 1 and --kv-heads ({args.kv_heads}) "
                f"must divide --heads ({args.heads})")
    if any(s < 1 for s in args.splits):
        p.error("--splits values must be at least 1")
    if args.warmup < 0 or args.rep <= 0 or args.rounds < 1 or args.copy_mib <= 0:
        p.error("--warmup must be at least 0, --rep and --copy-mib more than 0, --rounds at least 1")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error("--time-budget must be more than 0")
    return args


def run(args, device="cuda", meta: Optional[dict] = None, started: Optional[float] = None, on_row=None) -> List[dict]:
    """Measures the copy bandwidth, then every row, printing each as it goes; returns the rows. meta
    receives the copy bandwidth and whether FlashAttention-4 imports; on_row(rows) is called after every
    row with the rows so far."""
    started = time.monotonic() if started is None else started
    device = torch.device(device)
    dtype = DTYPES[args.dtype]
    meta = {} if meta is None else meta
    announced = {}
    meta["decode_op"] = bool(flashattn.kvcache.decode_op_enabled)
    if any(m.startswith("fa4") for m in args.methods):
        meta["fa4"] = fa4_status()
        if "unavailable" in meta["fa4"]:
            print(f"FlashAttention-4: unavailable ({meta['fa4']['unavailable']}); its columns are n/a", flush=True)
            for m in args.methods:
                if m.startswith("fa4"):
                    announced[m] = "unavailable: " + meta["fa4"]["unavailable"]
    with torch.no_grad():
        meta["copy"] = measure_copy(args, device)
        print(f"copy bandwidth: {_tbps(meta['copy']['tbps'])} TB/s", flush=True)
        element_size = torch.empty((), dtype=dtype).element_size()
        rows = []
        skip_reason = None
        print("\n".join(bandwidth_table([])), flush=True)
        for batch, seqlen in args.shapes:
            if skip_reason is None and args.time_budget is not None and time.monotonic() - started >= args.time_budget:
                skip_reason = f"time budget of {args.time_budget:g} s reached"
                print(f"    {skip_reason} after {time.monotonic() - started:.0f} s: the rows left are not run", flush=True)
            if skip_reason is not None:
                rows.append(skipped_row(batch, seqlen, args, element_size, skip_reason))
            else:
                try:
                    rows.append(run_row(batch, seqlen, args, device, dtype, meta["copy"]["tbps"], announced))
                except Exception as exc:  # noqa: BLE001  (the inputs or the reference did not fit, say)
                    if args.verbose:
                        traceback.print_exc()
                    row = row_config(batch, seqlen, args, element_size)
                    row["status"] = {m: "failed: the row's inputs or reference: " + short_error(exc)
                                     for m in method_names(args)}
                    rows.append(row)
                # After the except clause, whose exception held the failed row's tensors through its traceback.
                _free_cached(device)
            print(bandwidth_table(rows[-1:])[-1], flush=True)
            for name, why in list(rows[-1]["status"].items()) + list(rows[-1]["wrong"].items()):
                if why != announced.get(name):
                    print(f"    {name}: {why}", flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.render:
        return render_saved(args.render, markdown)
    device = torch.device(args.device)
    if device.type == "cuda":
        reason = cuda_unusable_reason()
        if reason is not None:
            print(f"bench_decode.py: needs a CUDA GPU of compute capability 8.0+ with flashattn's CUDA kernels: {reason} "
                  "(--device cpu tries the script on the CPU).", file=sys.stderr)
            return 1
    started = time.monotonic()
    torch.manual_seed(args.seed)
    meta = metadata(device)
    meta["command"] = " ".join(["python benchmarks/bench_decode.py"] + ([shlex.join(argv)] if argv else []))
    meta["complete"] = False
    print(f"{meta['gpu'] or 'CPU'}, torch {meta['torch']}, flashattn {meta['flashattn']}, commit {meta['git_commit']}",
          flush=True)
    args_dict = {k: v for k, v in vars(args).items() if k != "shapes"}

    def save(rows, complete):
        meta["elapsed_s"] = round(time.monotonic() - started, 1)
        meta["complete"] = complete
        save_run(args.out, STEM, markdown(meta, args_dict, rows), meta, args_dict, rows)

    rows = run(args, device, meta, started, on_row=(lambda rows: save(rows, False)) if args.out else None)
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    meta["complete"] = not any(r.get("skipped") for r in rows)
    lines = markdown(meta, args_dict, rows)
    if args.out:
        save_run(args.out, STEM, lines, meta, args_dict, rows)
        print(f"wrote {os.path.join(args.out, STEM + '.md')} and {STEM}.json")
    print("\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
