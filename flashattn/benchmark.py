"""Attention throughput and memory: flashattn beside PyTorch's own kernels, all measured in the same run.

``python -m flashattn bench`` (and ``benchmarks/bench.py``, a thin wrapper) run this module.

The standard grid (GUIDE section 5): B * N = 16k tokens and H * D = 2048, so every config does the
same number of tokens and model width; N in 512..16k, D in 64/128/256, causal and not, bf16 and
fp16, modes fwd, bwd (backward alone, after a forward outside the timing) and fwdbwd. ``--batch``
and ``--heads`` fix B and H instead.

Anchors: torch SDPA with each backend forced (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION)
and FlexAttention compiled with torch.compile (causal through a block mask). An anchor that is
unavailable or fails for a config is reported as such; it never stops the run.

Before timing a config, flashattn's output is compared with SDPA's flash backend (max abs error).
FLOPs: forward 4 * B * H * N^2 * D, halved for causal; backward 2.5x the forward.

Memory: for every config and mode, the peak extra memory of one call of each method
(``torch.cuda.max_memory_allocated()`` over the call minus what was allocated before it), plus
torch's math backend, which materializes the N x N scores (sizes that would not fit are skipped).

    python -m flashattn bench --quick --out bench-out
    python -m flashattn bench --dtype bf16 --headdim 128 --seqlen 4096 16384 --causal true --mode fwd bwd

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

import flashattn

TOKENS = 16384
MODEL_DIM = 2048
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ANCHORS = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex"]
# Measured for memory only (never timed): the N x N reference point.
MEMORY_ONLY = ["sdpa_math"]
FLOPS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
# Score-matrix-sized buffers the math backend holds at its peak, per mode (scores, probabilities, their
# gradients, plus the forward's saved probabilities during the backward): a generous estimate used to
# skip sizes that would not fit rather than to predict the measurement.
MATH_SCORE_BUFFERS = {"fwd": 3, "bwd": 6, "fwdbwd": 6}
MIB = 2**20
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------------------------------
# Timing and memory
# --------------------------------------------------------------------------------------------------


def _time_ms_cuda_events(fn, warmup_ms: float, rep_ms: float) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    times = []
    for _ in range(max(5, int(rep_ms / estimate))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _time_ms_wall(fn, warmup_ms: float, rep_ms: float) -> float:
    """Median wall-clock milliseconds (CPU tensors: no events to record)."""
    t0 = time.perf_counter()
    fn()
    estimate = max((time.perf_counter() - t0) * 1e3, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    times = []
    for _ in range(max(3, int(rep_ms / estimate))):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_ms(fn, warmup_ms: float, rep_ms: float, device: torch.device) -> float:
    """Median milliseconds of fn(): triton's do_bench on CUDA (it flushes L2 between runs; CUDA events
    without triton), wall clock on the CPU."""
    if device.type != "cuda":
        return _time_ms_wall(fn, warmup_ms, rep_ms)
    try:
        from triton.testing import do_bench
    except ImportError:
        return _time_ms_cuda_events(fn, warmup_ms, rep_ms)
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def peak_extra_mib(fn, device: torch.device) -> Optional[float]:
    """Peak memory allocated during fn() beyond what was allocated before it, in MiB (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return peak / MIB


def _free_bytes(device: torch.device) -> float:
    if device.type != "cuda":
        return math.inf
    free, _ = torch.cuda.mem_get_info(device)
    # Memory torch's caching allocator holds but does not use is free for this process too.
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# --------------------------------------------------------------------------------------------------
# Implementations: each returns forward(q, k, v) -> out for (B, N, H, D) tensors
# --------------------------------------------------------------------------------------------------


def _flashattn_forward(causal):
    return lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal)


def _sdpa_forward(backend_name, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def forward(q, k, v):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2)

    return forward


def _flex_forward(causal, seqlen, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compilation per config: every shape, mask and grad mode is a recompile, and past dynamo's
    # recompile limit flex_attention silently runs unfused (materializing the scores), which is not the anchor.
    torch._dynamo.reset()
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if causal:
        def causal_mask(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        block_mask = create_block_mask(causal_mask, B=None, H=None, Q_LEN=seqlen, KV_LEN=seqlen, device=device)

    def forward(q, k, v):
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
        return out.transpose(1, 2)

    return forward


def make_impl(name, causal, seqlen, device="cuda"):
    if name == "flashattn":
        return _flashattn_forward(causal)
    if name == "sdpa_flash":
        return _sdpa_forward("FLASH_ATTENTION", causal)
    if name == "sdpa_cudnn":
        return _sdpa_forward("CUDNN_ATTENTION", causal)
    if name == "sdpa_efficient":
        return _sdpa_forward("EFFICIENT_ATTENTION", causal)
    if name == "sdpa_math":
        return _sdpa_forward("MATH", causal)
    if name == "flex":
        return _flex_forward(causal, seqlen, str(device))
    raise ValueError(name)


def timed_fn(forward, mode, q, k, v, dout):
    """The callable to time for `mode`; runs a forward (outside the timing) for bwd."""
    if mode == "fwd":
        return lambda: forward(q, k, v)
    if mode == "bwd":
        out = forward(q, k, v)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    if mode == "fwdbwd":
        return lambda: torch.autograd.grad(forward(q, k, v), (q, k, v), dout)
    raise ValueError(mode)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def short_error(exc: BaseException) -> str:
    """The first line of an exception, with its type, at most 160 characters."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text[:160]


def config_shape(seqlen: int, head_dim: int, batch: Optional[int] = None, heads: Optional[int] = None):
    """(batch, heads) of a config: the standard grid's B = 16k / N and H = 2048 / D unless given."""
    return (batch or max(1, TOKENS // seqlen), heads or max(1, MODEL_DIM // head_dim))


def _measure_memory(row, forwards, causal, mode, q, k, v, dout, device, verbose):
    """Peak extra memory of one `mode` call of each method into row["peak_mib"] (reasons for the missing
    ones into row["memory_status"]). forwards: name -> forward, or None for a method built here."""
    # Counted at 4 bytes an element: the math backend may upcast half-precision scores to float32.
    score_bytes = row["batch"] * row["heads"] * row["seqlen"] ** 2 * 4
    for name, forward in forwards.items():
        if name in MEMORY_ONLY:
            needed = MATH_SCORE_BUFFERS[mode] * score_bytes
            if needed > 0.9 * _free_bytes(device):
                row["memory_status"][name] = f"skipped: would need about {needed / 2**30:.0f} GiB"
                continue
        try:
            if forward is None:
                forward = make_impl(name, causal, row["seqlen"], device)
            mib = peak_extra_mib(timed_fn(forward, mode, q, k, v, dout), device)
            if mib is not None:  # None: not measurable on this device
                row["peak_mib"][name] = mib
        except Exception as exc:  # noqa: BLE001  (a failing method is reported, never fatal)
            row["memory_status"][name] = "failed: " + short_error(exc)
            if verbose:
                traceback.print_exc()
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()


def run_config(dtype_name, head_dim, seqlen, causal, modes, impl_names, opts, device="cuda", batch=None, heads=None):
    """Times one (dtype, head dim, seqlen, causal) config in every mode; one result row per mode.

    opts: an object with warmup, rep, max_err, verbose and memory attributes (the parsed arguments).
    """
    device = torch.device(device)
    dtype = DTYPES[dtype_name]
    batch, heads = config_shape(seqlen, head_dim, batch, heads)
    fwd_flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype)
    config = {"dtype": dtype_name, "head_dim": head_dim, "seqlen": seqlen, "causal": causal, "batch": batch, "heads": heads}

    impls, status = {}, {}
    for name in impl_names:
        try:
            impls[name] = make_impl(name, causal, seqlen, device)
            with torch.no_grad():
                impls[name](q, k, v)  # also triggers compilation / backend selection
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001  (an anchor that fails is reported, never fatal)
            impls.pop(name, None)
            status[name] = "unavailable: " + short_error(exc)
            if opts.verbose:
                traceback.print_exc()

    # Correctness before timing: flashattn against SDPA's flash backend (math backend if that is missing).
    if "flashattn" in impls:
        with torch.no_grad():
            ours = impls["flashattn"](q, k, v).float()
            try:
                ref = make_impl("sdpa_flash", causal, seqlen, device)(q, k, v).float()
                config["checked_against"] = "sdpa_flash"
            except Exception:  # noqa: BLE001
                ref = make_impl("sdpa_math", causal, seqlen, device)(q, k, v).float()
                config["checked_against"] = "sdpa_math"
            max_err = (ours - ref).abs().max().item()
            del ours, ref
        config["max_abs_err"] = max_err
        if not math.isfinite(max_err) or max_err > opts.max_err:
            status["flashattn"] = f"WRONG: max abs error {max_err:.3e} > {opts.max_err:g}; not timed"
            impls.pop("flashattn")

    rows = []
    for mode in modes:
        row = dict(config, mode=mode, ms={}, tflops={}, status=dict(status))
        for name, forward in impls.items():
            try:
                fn = timed_fn(forward, mode, q, k, v, dout)
                ms = time_ms(fn, opts.warmup, opts.rep, device)
                row["ms"][name] = ms
                row["tflops"][name] = FLOPS_FACTOR[mode] * fwd_flops / (ms * 1e-3) / 1e12
            except Exception as exc:  # noqa: BLE001
                row["status"][name] = "failed: " + short_error(exc)
                if opts.verbose:
                    traceback.print_exc()
            finally:
                fn = None
        if getattr(opts, "memory", False):
            row["peak_mib"], row["memory_status"] = {}, {}
            measured = {name: impls[name] for name in impls}
            measured.update({name: None for name in MEMORY_ONLY if name not in impls})  # built when measured
            _measure_memory(row, measured, causal, mode, q, k, v, dout, device, opts.verbose)
        rows.append(row)
    del q, k, v, dout, impls
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------
# Reporting: table, progress, files
# --------------------------------------------------------------------------------------------------


def _cell(row, name):
    if name in row["tflops"]:
        value = row["tflops"][name]
        return f"{value:.1f}" if value >= 10 else f"{value:.3g}"
    return "n/a" if name in row["status"] else "-"


def _ratio(row, anchor):
    ours, theirs = row["tflops"].get("flashattn"), row["tflops"].get(anchor)
    return f"{ours / theirs:.2f}" if ours and theirs else "-"


def table_header(impl_names):
    anchors = [n for n in impl_names if n != "flashattn"]
    cols = ["dtype", "D", "N", "causal", "mode", "max err", "flashattn"] + anchors + [f"x {a}" for a in anchors]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def table_row(row, impl_names):
    anchors = [n for n in impl_names if n != "flashattn"]
    err = row.get("max_abs_err")
    cells = [row["dtype"], str(row["head_dim"]), str(row["seqlen"]), "yes" if row["causal"] else "no", row["mode"],
             f"{err:.1e}" if err is not None else "-", _cell(row, "flashattn")]
    cells += [_cell(row, a) for a in anchors] + [_ratio(row, a) for a in anchors]
    return "| " + " | ".join(cells) + " |"


def memory_names(rows) -> List[str]:
    names: List[str] = []
    for row in rows:
        for name in list(row.get("peak_mib", {})) + list(row.get("memory_status", {})):
            if name not in names:
                names.append(name)
    return names


def memory_table(rows) -> List[str]:
    """Markdown lines: peak extra MiB per row and method (empty when memory was not measured)."""
    names = memory_names(rows)
    if not names:
        return []
    lines = ["| dtype | D | N | causal | mode | " + " | ".join(names) + " |", "|" + "---|" * (5 + len(names))]
    for row in rows:
        cells = [row["dtype"], str(row["head_dim"]), str(row["seqlen"]), "yes" if row["causal"] else "no", row["mode"]]
        for name in names:
            mib = row.get("peak_mib", {}).get(name)
            cells.append(f"{mib:.0f}" if mib is not None else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


class Progress:
    """A progress bar on stderr (tqdm when installed, else one line per step), and a way to print
    table rows to stdout without breaking the bar."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self._bar = total, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, file=sys.stderr, unit="config", dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def start(self, description: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description(description)
        else:
            print(f"[{self.done + 1}/{self.total}] {description}", file=sys.stderr, flush=True)

    def step(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _git_commit() -> str:
    """The short commit of the checkout this package lives in, or "unknown" (FLASHATTN_GIT_COMMIT overrides)."""
    if os.environ.get("FLASHATTN_GIT_COMMIT"):
        return os.environ["FLASHATTN_GIT_COMMIT"]
    checkout = os.path.dirname(PACKAGE_DIR)
    try:
        def git(*args):
            return subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True, timeout=10).stdout.strip()

        # Only a checkout of this project counts, not some repository an installed copy happens to sit in.
        if os.path.realpath(git("rev-parse", "--show-toplevel") or "/nonexistent") != os.path.realpath(checkout):
            return "unknown"
        return git("rev-parse", "--short", "HEAD") or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def metadata(device="cuda") -> Dict[str, object]:
    """Date, commit, device and versions to store beside the results."""
    device = torch.device(device)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": _git_commit(),
        "gpu": torch.cuda.get_device_name(device) if on_cuda else None,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if on_cuda else None,
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "flashattn": flashattn.__version__,
        "timer": ("triton.testing.do_bench median" if triton_version else "CUDA events median") if on_cuda
        else "wall clock median",
    }


def write_results(out_dir, meta, rows, impl_names, args_dict, charts=True) -> List[str]:
    """bench.json, bench.md and (matplotlib permitting) PNG charts in out_dir; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "bench.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "args": args_dict, "results": rows}, f, indent=1)
    written.append(path)
    device = f"GPU {meta['gpu']} (sm_{str(meta['capability']).replace('.', '')})" if meta.get("gpu") else "CPU"
    lines = [
        f"# flashattn benchmark, {meta['date']}",
        "",
        f"{device}, torch {meta['torch']} (CUDA {meta['cuda']}), triton {meta['triton']}, flashattn {meta['flashattn']} "
        f"at commit {meta['git_commit']}. Timer: {meta['timer']}.",
        "",
        "Cells are TFLOP/s (forward 4*B*H*N^2*D, halved when causal; backward 2.5x); `x anchor` is flashattn's "
        "throughput divided by the anchor's. `max err` is max |flashattn - SDPA flash| of the forward output. "
        "n/a: the anchor is unavailable or failed (reasons below). B and H per config are in bench.json.",
        "",
        table_header(impl_names),
    ]
    lines += [table_row(r, impl_names) for r in rows]
    mem_lines = memory_table(rows)
    if mem_lines:
        lines += ["", "Peak extra memory (MiB) of one call: max_memory_allocated over the call minus memory allocated "
                  "before it (inputs, and for bwd the forward's saved tensors). sdpa_math materializes the N x N scores.",
                  ""] + mem_lines
    notes = sorted({f"- {r['dtype']} D={r['head_dim']} N={r['seqlen']} causal={r['causal']}: {n}: {why}"
                    for r in rows for n, why in list(r["status"].items()) + list(r.get("memory_status", {}).items())})
    if notes:
        lines += ["", "Unavailable, failed or skipped:", ""] + notes
    path = os.path.join(out_dir, "bench.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    written.append(path)
    if charts:
        from .charts import MatplotlibMissing, write_charts

        try:
            written += write_charts(rows, out_dir)
        except MatplotlibMissing:
            print("matplotlib is not installed: skipping the PNG charts (pip install matplotlib)", file=sys.stderr)
    return written


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashattn bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "fp16"])
    p.add_argument("--headdim", "--head-dim", dest="headdim", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--seqlen", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--mode", nargs="+", choices=list(FLOPS_FACTOR), default=["fwd", "bwd", "fwdbwd"])
    p.add_argument("--batch", type=int, help=f"fixed batch size (default: {TOKENS} // seqlen)")
    p.add_argument("--heads", type=int, help=f"fixed number of heads (default: {MODEL_DIM} // head dim)")
    p.add_argument("--anchors", nargs="*", choices=ANCHORS, default=ANCHORS, help="anchors to time beside flashattn")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: bf16, D 64/128, N 1024/4096/16384, fwd and bwd")
    p.add_argument("--warmup", type=float, default=25, help="warm-up per measurement, ms")
    p.add_argument("--rep", type=float, default=100, help="measurement time per measurement, ms")
    p.add_argument("--max-err", type=float, default=5e-2, help="max |flashattn - SDPA flash| before a config is marked wrong")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory measurements")
    p.add_argument("--no-charts", dest="charts", action="store_false", help="write no PNG charts")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    p.add_argument("--out", help="folder for bench.json, bench.md and the PNG charts (nothing is written without it)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing anchors")
    args = p.parse_args(argv)
    if args.quick:
        args.dtype, args.headdim, args.seqlen, args.mode = ["bf16"], [64, 128], [1024, 4096, 16384], ["fwd", "bwd"]
    for flag in ("batch", "heads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    return args


def cuda_unusable_reason() -> Optional[str]:
    """Why the benchmark cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    if not flashattn.cuda_kernels_built():
        return "this build of flashattn has no CUDA kernels (rebuild with a CUDA toolkit, FLASHATTN_BUILD_CUDA=1)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"flashattn's CUDA kernels need compute capability 8.0+, this GPU is {major}.{minor}"
    return None


def run(args, device="cuda") -> List[dict]:
    """Runs the grid described by the parsed arguments, printing the table as it goes; returns the rows."""
    impl_names = ["flashattn"] + list(args.anchors)
    causal_values = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    configs = [(d, h, c, n) for d in args.dtype for h in args.headdim for c in causal_values for n in args.seqlen]
    progress = Progress(len(configs), enabled=args.progress)
    progress.write(table_header(impl_names))
    rows = []
    try:
        for dtype_name, head_dim, causal, seqlen in configs:
            progress.start(f"{dtype_name} D={head_dim} N={seqlen} {'causal' if causal else 'full'}")
            new_rows = run_config(dtype_name, head_dim, seqlen, causal, args.mode, impl_names, args, device,
                                  args.batch, args.heads)
            for row in new_rows:
                progress.write(table_row(row, impl_names))
                for name, why in row["status"].items():
                    if row["mode"] == args.mode[0] or why.startswith("failed"):
                        progress.write(f"    {name}: {why}")
            rows += new_rows
            progress.step()
    finally:
        progress.close()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    reason = cuda_unusable_reason()
    if reason is not None:
        print(f"flashattn bench: needs a CUDA GPU of compute capability 8.0+ with flashattn's CUDA kernels: {reason}. "
              "Run `python -m flashattn check` for a correctness pass on the CPU.", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    meta = metadata("cuda")
    print(f"{meta['gpu']}, torch {meta['torch']}, flashattn {meta['flashattn']}, commit {meta['git_commit']}", flush=True)
    rows = run(args)
    if args.out:
        impl_names = ["flashattn"] + list(args.anchors)
        for path in write_results(args.out, meta, rows, impl_names, vars(args), charts=args.charts):
            print(f"wrote {path}")
    else:
        print("(pass --out DIR to save bench.json, bench.md and charts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
