#!/usr/bin/env python3
"""Attention throughput: flashattn beside PyTorch's own kernels, all timed in the same run.

The grid (GUIDE section 5): B * N = 16k tokens and H * D = 2048, so every config does the same
number of tokens and model width; N in 512..16k, D in 64/128/256, causal and not, bf16 and fp16,
modes fwd, bwd (backward alone, after a forward outside the timing) and fwdbwd.

Anchors: torch SDPA with each backend forced (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION)
and FlexAttention compiled with torch.compile (causal through a block mask). An anchor that is
unavailable or fails for a config is reported as such; it never stops the run.

Before timing a config, flashattn's output is compared with SDPA's flash backend (max abs error).
FLOPs: forward 4 * B * H * N^2 * D, halved for causal; backward 2.5x the forward.

    python benchmarks/bench.py --quick --out benchmarks/results/<name>
    python benchmarks/bench.py --dtype bf16 --headdim 128 --seqlen 4096 16384 --causal true --mode fwd bwd

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import flashattn  # noqa: E402

TOKENS = 16384
MODEL_DIM = 2048
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ANCHORS = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex"]
FLOPS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


# --------------------------------------------------------------------------------------------------
# Timing
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
    times.sort()
    return times[len(times) // 2]


def time_ms(fn, warmup_ms: float, rep_ms: float) -> float:
    """Median milliseconds of fn() (triton's do_bench, which flushes L2 between runs; else CUDA events)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _time_ms_cuda_events(fn, warmup_ms, rep_ms)
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


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


def _flex_forward(causal, seqlen):
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

        block_mask = create_block_mask(causal_mask, B=None, H=None, Q_LEN=seqlen, KV_LEN=seqlen, device="cuda")

    def forward(q, k, v):
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
        return out.transpose(1, 2)

    return forward


def make_impl(name, causal, seqlen):
    if name == "flashattn":
        return _flashattn_forward(causal)
    if name == "sdpa_flash":
        return _sdpa_forward("FLASH_ATTENTION", causal)
    if name == "sdpa_cudnn":
        return _sdpa_forward("CUDNN_ATTENTION", causal)
    if name == "sdpa_efficient":
        return _sdpa_forward("EFFICIENT_ATTENTION", causal)
    if name == "flex":
        return _flex_forward(causal, seqlen)
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


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text[:160]


def run_config(dtype_name, head_dim, seqlen, causal, modes, impl_names, args):
    dtype = DTYPES[dtype_name]
    batch, heads = max(1, TOKENS // seqlen), max(1, MODEL_DIM // head_dim)
    fwd_flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype)
    config = {"dtype": dtype_name, "head_dim": head_dim, "seqlen": seqlen, "causal": causal, "batch": batch, "heads": heads}

    impls, status = {}, {}
    for name in impl_names:
        try:
            impls[name] = make_impl(name, causal, seqlen)
            with torch.no_grad():
                impls[name](q, k, v)  # also triggers compilation / backend selection
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001  (an anchor that fails is reported, never fatal)
            impls.pop(name, None)
            status[name] = "unavailable: " + _short_error(exc)
            if args.verbose:
                traceback.print_exc()

    # Correctness before timing: flashattn against SDPA's flash backend (math backend if that is missing).
    max_err = None
    if "flashattn" in impls:
        with torch.no_grad():
            ours = impls["flashattn"](q, k, v).float()
            try:
                ref = make_impl("sdpa_flash", causal, seqlen)(q, k, v).float()
                config["checked_against"] = "sdpa_flash"
            except Exception:  # noqa: BLE001
                ref = _sdpa_forward("MATH", causal)(q, k, v).float()
                config["checked_against"] = "sdpa_math"
            max_err = (ours - ref).abs().max().item()
        config["max_abs_err"] = max_err
        if not math.isfinite(max_err) or max_err > args.max_err:
            status["flashattn"] = f"WRONG: max abs error {max_err:.3e} > {args.max_err:g}; not timed"
            impls.pop("flashattn")

    rows = []
    for mode in modes:
        row = dict(config, mode=mode, ms={}, tflops={}, status=dict(status))
        for name, forward in impls.items():
            try:
                fn = timed_fn(forward, mode, q, k, v, dout)
                ms = time_ms(fn, args.warmup, args.rep)
                row["ms"][name] = ms
                row["tflops"][name] = FLOPS_FACTOR[mode] * fwd_flops / (ms * 1e-3) / 1e12
            except Exception as exc:  # noqa: BLE001
                row["status"][name] = "failed: " + _short_error(exc)
                if args.verbose:
                    traceback.print_exc()
        rows.append(row)
        _print_row(row, impl_names)
    del q, k, v, dout, impls
    torch.cuda.empty_cache()
    return rows


def _cell(row, name):
    if name in row["tflops"]:
        return f"{row['tflops'][name]:.1f}"
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


_printed_header = False


def _print_row(row, impl_names):
    global _printed_header
    if not _printed_header:
        print(table_header(impl_names), flush=True)
        _printed_header = True
    print(table_row(row, impl_names), flush=True)
    for name, why in row["status"].items():
        if row["mode"] == "fwd" or why.startswith("failed"):
            print(f"    {name}: {why}", flush=True)


def metadata():
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        commit = "unknown"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": os.environ.get("FLASHATTN_GIT_COMMIT", commit),
        "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "flashattn": flashattn.__version__,
        "timer": "triton.testing.do_bench median" if triton_version else "CUDA events median",
    }


def write_results(out_dir, meta, rows, impl_names, args):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"meta": meta, "args": vars(args), "results": rows}, f, indent=1)
    lines = [
        f"# flashattn benchmark, {meta['date']}",
        "",
        f"GPU {meta['gpu']} (sm_{meta['capability'].replace('.', '')}), torch {meta['torch']} (CUDA {meta['cuda']}), "
        f"triton {meta['triton']}, flashattn {meta['flashattn']} at commit {meta['git_commit']}. Timer: {meta['timer']}.",
        "",
        f"B * N = {TOKENS} tokens, H * D = {MODEL_DIM}. Cells are TFLOP/s (forward 4*B*H*N^2*D, halved when causal; "
        "backward 2.5x); `x anchor` is flashattn's throughput divided by the anchor's. `max err` is max |flashattn - "
        "SDPA flash| of the forward output. n/a: the anchor is unavailable or failed (reasons below).",
        "",
        table_header(impl_names),
    ]
    lines += [table_row(r, impl_names) for r in rows]
    notes = sorted({f"- {r['dtype']} D={r['head_dim']} N={r['seqlen']} causal={r['causal']}: {n}: {why}"
                    for r in rows for n, why in r["status"].items()})
    if notes:
        lines += ["", "Unavailable or failed:", ""] + notes
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out_dir}/bench.json and bench.md")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "fp16"])
    p.add_argument("--headdim", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--seqlen", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--mode", nargs="+", choices=list(FLOPS_FACTOR), default=["fwd", "bwd", "fwdbwd"])
    p.add_argument("--anchors", nargs="*", choices=ANCHORS, default=ANCHORS, help="anchors to time beside flashattn")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: bf16, D 64/128, N 1024/4096/16384, fwd and bwd")
    p.add_argument("--warmup", type=float, default=25, help="warm-up per measurement, ms")
    p.add_argument("--rep", type=float, default=100, help="measurement time per measurement, ms")
    p.add_argument("--max-err", type=float, default=5e-2, help="max |flashattn - SDPA flash| before a config is marked wrong")
    p.add_argument("--out", help="folder for bench.json and bench.md")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing anchors")
    args = p.parse_args(argv)
    if args.quick:
        args.dtype, args.headdim, args.seqlen, args.mode = ["bf16"], [64, 128], [1024, 4096, 16384], ["fwd", "bwd"]
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU")
        return 1
    if not flashattn.cuda_kernels_built():
        print("flashattn was built without its CUDA kernels")
        return 1
    torch.manual_seed(0)
    impl_names = ["flashattn"] + list(args.anchors)
    causal_values = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    meta = metadata()
    print(f"{meta['gpu']}, torch {meta['torch']}, commit {meta['git_commit']}", flush=True)
    rows = []
    for dtype_name in args.dtype:
        for head_dim in args.headdim:
            for causal in causal_values:
                for seqlen in args.seqlen:
                    rows += run_config(dtype_name, head_dim, seqlen, causal, args.mode, impl_names, args)
    if args.out:
        write_results(args.out, meta, rows, impl_names, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
