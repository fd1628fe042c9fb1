"""Attention throughput and memory: flashattn beside PyTorch's own kernels and FlashAttention-4, all measured
in the same run.

``python benchmarks/bench.py`` (a thin wrapper) and, from a source checkout, ``python -m flashattn bench``
run this module's :func:`main`. It lives beside the package, not in it: an installed flashattn has no
benchmark harness.

The standard grid (GUIDE section 5): B * N = 16k tokens and H * D = 2048, so every config does the
same number of tokens and model width (H = 2048 // D: 21 heads at D = 96, 10 at D = 192); N in
512..16k, D in 64/96/128/192/256, causal and not, bf16 and fp16, modes fwd, bwd (backward alone,
after a forward outside the timing) and fwdbwd. ``--batch`` and ``--heads`` fix B and H instead.

Anchors: torch SDPA with each backend forced (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION),
FlexAttention compiled with torch.compile (causal through a block mask) and FlashAttention-4
(``flash_attn.cute.interface.flash_attn_func`` of the flash-attn-4 package, compiled just in time at its
first call per configuration, which the warm-up absorbs). An anchor that is unavailable or fails for a
config is reported as such; it never stops the run. When flash_attn.cute does not import, the run
says so once and its column is n/a.

Before timing a config, flashattn's output is compared with SDPA's flash backend (max abs error).
FLOPs: forward 4 * B * H * N^2 * D, halved for causal; backward 2.5x the forward.

Timing: triton's do_bench (CUDA events, L2 flushed before each call, median) with a time budget per
measurement: ``--warmup`` ms of warm-up, then as many calls as fit in the measurement's share of
``--rep`` ms (at least one call). The methods of a config are timed in ``--rounds`` rounds (default 3),
every method once per round, round r starting one method later than round r - 1, each measurement
with rep / rounds ms of calls; a figure is the median of the method's rounds. Timing the methods one
after the other instead lets the GPU's clock changes fall on one method: an idle H200 sits at 345 MHz
and needs a moment to come back, and power capping (seen at 1590-1830 MHz in bench runs) follows a
power-hungry stretch. ``--settle`` ms of matrix products before a config's first timing (default 0)
is there to experiment with: at 200 ms it set off power capping that cost the next method 5-13%.

FlexAttention is compiled with dynamic shapes by default: one compilation per (dtype, head dim, heads,
causal) serves every sequence length and mode (dynamo adds one for the batch of 1 at N = 16k, as it
specializes sizes of 1); ``--flex-static`` compiles per shape instead (several times slower to run).
Before the grid starts, those compilations run in parallel worker processes, which fill torch's
on-disk compile caches (inductor, AOTAutograd, Triton) so that this process's own compilations load
from them; every figure is still measured in this process (``--no-flex-prewarm`` skips that step).

Memory: for every config and mode, the peak extra memory of one call of each method
(``torch.cuda.max_memory_allocated()`` over the call minus what was allocated before it), plus
torch's math backend, which materializes the N x N scores (sizes that would not fit are skipped).

``--time-budget SECONDS``: once that much time has passed, the configs not yet started are not run;
they stay in the table, the JSON and bench.md, marked as skipped. With ``--out`` bench.json and
bench.md are rewritten after every config, so a run that is killed still leaves what it measured.

    python -m flashattn bench --quick --out bench-out
    python -m flashattn bench --dtype bf16 --headdim 128 --seqlen 4096 16384 --causal true --mode fwd bwd

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import flashattn

TOKENS = 16384
MODEL_DIM = 2048
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ANCHORS = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "fa4"]
# Measured for memory only (never timed): the N x N reference point.
MEMORY_ONLY = ["sdpa_math"]
FLOPS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
# Score-matrix-sized buffers the math backend holds at its peak, per mode (scores, probabilities, their
# gradients, plus the forward's saved probabilities during the backward): a generous estimate used to
# skip sizes that would not fit rather than to predict the measurement.
MATH_SCORE_BUFFERS = {"fwd": 3, "bwd": 6, "fwdbwd": 6}
MIB = 2**20
# This folder (benchmarks/, for the charts module and the FlexAttention workers) and the folder the flashattn
# being measured is imported from (its checkout, when it runs from one).
BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
FLASHATTN_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
# Worker processes that compile FlexAttention ahead of the grid (each compiles on one core).
FLEX_PREWARM_MAX_WORKERS = 12
FLEX_PREWARM_TIMEOUT_S = 300.0


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


def keep_gpu_busy(device: torch.device, ms: float) -> None:
    """Runs bf16 matrix products on `device` for about `ms` milliseconds of wall time, so that the GPU's
    clocks are up before what is timed next. Does nothing off CUDA or for ms <= 0."""
    if device.type != "cuda" or ms <= 0:
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < ms:
        for _ in range(20):  # about 4 ms on an H100-class GPU
            torch.mm(a, a)
        torch.cuda.synchronize(device)
    del a


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


def flex_causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _configure_compile() -> None:
    # Each group of configs gets a fresh start (FlexAttention.forward), so the limits are never near; past
    # them flex_attention would silently run unfused (materializing the scores), which is not the anchor.
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    # No "duck sizing" (one symbol for dims that happen to be equal, such as B and H at some seqlens): it
    # would tie the batch to the heads, which flex_attention marks static, and cost a compilation per seqlen.
    try:
        import torch.fx.experimental._config as fx_config

        if hasattr(fx_config, "use_duck_shape"):
            fx_config.use_duck_shape = False
    except ImportError:
        pass
    # The bwd mode calls the backward with retain_graph=True, which a backward compiled with donated
    # buffers refuses.
    try:
        import torch._functorch.config as functorch_config

        if hasattr(functorch_config, "donated_buffer"):
            functorch_config.donated_buffer = False
    except ImportError:
        pass


def flex_group(dtype_name: str, head_dim: int, heads: int, causal: bool) -> Tuple[str, int, int, bool]:
    """The configs that share one dynamic-shape compilation of FlexAttention."""
    return (dtype_name, int(head_dim), int(heads), bool(causal))


class FlexAttention:
    """FlexAttention compiled with torch.compile, the anchor.

    dynamic=True: one compilation per group (:func:`flex_group`), reused for every sequence length and
    batch size and every mode (dynamo compiles once more for a batch of 1, as it specializes sizes of 1).
    dynamic=False: one compilation per shape. Either way a new group (or shape) starts from
    ``torch._dynamo.reset()``: dynamo keeps compiled entries on flex_attention's code object across
    torch.compile wrappers, so without it the recompile limit would eventually be reached.
    """

    def __init__(self, dynamic: bool = True):
        self.dynamic = dynamic
        # Groups whose dynamic-shape compilation failed: compiled per shape instead (see run_config).
        self.static_groups = set()
        self._key = None
        self._compiled = None

    def is_dynamic(self, group) -> bool:
        return self.dynamic and tuple(group) not in self.static_groups

    def forward(self, group, causal: bool, seqlen: int, device):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        dynamic = self.is_dynamic(group)
        key = tuple(group) if dynamic else tuple(group) + (seqlen,)
        if key != self._key:
            torch._dynamo.reset()
            _configure_compile()
            self._compiled = torch.compile(flex_attention, dynamic=dynamic)
            self._key = key
        compiled = self._compiled
        block_mask = None
        if causal:
            block_mask = create_block_mask(flex_causal_mask, B=None, H=None, Q_LEN=seqlen, KV_LEN=seqlen,
                                           device=str(device))

        def forward(q, k, v):
            out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
            return out.transpose(1, 2)

        return forward


class AnchorUnavailable(RuntimeError):
    """An anchor that cannot run in this environment; its message is the reason, reported as is."""


def _fa4_interface():
    """flash_attn.cute.interface (FlashAttention-4), or AnchorUnavailable saying why it does not import."""
    try:
        import flash_attn.cute.interface as interface
    except Exception as exc:  # noqa: BLE001  (an ImportError, or whatever its own dependencies raise at import)
        raise AnchorUnavailable("flash_attn.cute does not import: " + short_error(exc)) from exc
    return interface


def _fa4_package_version() -> str:
    """The version of the flash_attn.cute that imported: the flash-attn-4 package's, else its __version__
    (the released wheels' module says 0.0.0, so the package metadata comes first)."""
    import flash_attn.cute

    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        pass
    version = getattr(flash_attn.cute, "__version__", None)
    # Else it imports from a copy without package metadata (a source tree on sys.path).
    return str(version) if version else "unknown"


def fa4_status() -> Dict[str, str]:
    """{"version": ...} when FlashAttention-4 imports, else {"unavailable": why}: what a run records."""
    try:
        _fa4_interface()
    except AnchorUnavailable as exc:
        return {"unavailable": str(exc)}
    return {"version": _fa4_package_version()}


def fa4_version() -> Optional[str]:
    """flash-attn-4's version when flash_attn.cute imports, else None."""
    return fa4_status().get("version")


def _fa4_forward(causal):
    flash_attn_func = _fa4_interface().flash_attn_func

    def forward(q, k, v):
        # Same (B, N, H, D) layout as the harness's inputs. Versions differ in what they return: the output
        # alone or (out, lse).
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, (tuple, list)) else out

    return forward


def make_impl(name, causal, seqlen, device="cuda", flex=None, group=None):
    """forward(q, k, v) -> out of method `name` for (B, N, H, D) tensors. flex: the FlexAttention
    compiler to use (a static one per call by default), group: its group key (see :func:`flex_group`)."""
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
        flex = flex if flex is not None else FlexAttention(dynamic=False)
        return flex.forward(group if group is not None else ("flex", seqlen), causal, seqlen, device)
    if name == "fa4":
        return _fa4_forward(causal)
    raise ValueError(name)


def make_inputs(batch, seqlen, heads, head_dim, dtype, device):
    """q, k, v (requiring grad) and dout, all (B, N, H, D)."""
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype)
    return q, k, v, dout


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(forward, q, k, v, dout, backward: bool, verbose: bool = False) -> float:
    """The first call of a method, made as the timed calls make it (grad mode, and a backward with
    retain_graph=True when a backward mode follows): selects SDPA's kernel, compiles FlexAttention,
    and FlashAttention-4's forward and backward kernels (just in time, seconds per configuration), so
    that no compilation falls inside a timing. Raises when the forward fails; a failing backward is left
    for the bwd and fwdbwd timings to report. Returns the seconds it took (for FlexAttention and
    FlashAttention-4 mostly compilation)."""
    start = time.perf_counter()
    out = forward(q, k, v)
    _sync(q.device)
    if backward:
        try:
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            _sync(q.device)
        except Exception:  # noqa: BLE001
            if verbose:
                traceback.print_exc()
    return time.perf_counter() - start


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


def rotating_medians(names, time_one, rounds, status, verbose=False):
    """Median ms of each name's ``time_one(name)``, called in ``rounds`` rounds of every name in turn,
    round r starting with the name after round r - 1's first. The GPU's clocks move over a run (idle
    clocks after a pause; power capping after a power-hungry stretch, which lowers whatever comes
    next): rounds in turn give every method the same share of each condition. A name whose call
    raises is left out, with its error in status[name]."""
    names = list(names)
    times = {name: [] for name in names}
    for r in range(max(1, rounds)):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            if name not in times:
                continue  # failed in an earlier round
            try:
                times[name].append(time_one(name))
            except Exception as exc:  # noqa: BLE001
                status[name] = "failed: " + short_error(exc)
                del times[name]
                if verbose:
                    traceback.print_exc()
    return {name: statistics.median(ms) for name, ms in times.items()}


def time_round_robin(impls, mode, q, k, v, dout, opts, device, status):
    """Median ms of each method's `mode` call, timed by rotating_medians in ``--rounds`` rounds, each
    round with the whole warm-up and rep / rounds ms of calls."""
    rounds = max(1, getattr(opts, "rounds", 1))

    def time_one(name):
        return time_ms(timed_fn(impls[name], mode, q, k, v, dout), opts.warmup, opts.rep / rounds, device)

    return rotating_medians(impls, time_one, rounds, status, opts.verbose)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def save_run(out_dir: Optional[str], stem: str, lines: List[str], meta: dict, args: dict, rows: List[dict]) -> None:
    """A run's markdown (``lines``) and its figures as ``{"meta", "args", "rows"}`` to out_dir/stem.md and
    out_dir/stem.json (nothing without out_dir): what render_saved reads back."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump({"meta": meta, "args": args, "rows": rows}, f, indent=1)


def render_saved(path: str, markdown) -> int:
    """Prints markdown(meta, args, rows) of a run save_run wrote to ``path`` (its json); returns 0."""
    with open(path) as f:
        saved = json.load(f)
    print("\n".join(markdown(saved["meta"], saved["args"], saved["rows"])))
    return 0


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
            # The peak counts allocated memory only, so blocks the allocator keeps cached do not change it;
            # only the math backend's score-sized blocks are handed back.
            if device.type == "cuda" and name in MEMORY_ONLY:
                torch.cuda.empty_cache()


def run_config(dtype_name, head_dim, seqlen, causal, modes, impl_names, opts, device="cuda", batch=None, heads=None,
               flex=None):
    """Times one (dtype, head dim, seqlen, causal) config in every mode; one result row per mode.

    opts: an object with warmup, rep, max_err, verbose and memory attributes (the parsed arguments).
    flex: the :class:`FlexAttention` compiler shared by the configs of a run (a static one if None).
    """
    device = torch.device(device)
    dtype = DTYPES[dtype_name]
    batch, heads = config_shape(seqlen, head_dim, batch, heads)
    fwd_flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    q, k, v, dout = make_inputs(batch, seqlen, heads, head_dim, dtype, device)
    config = {"dtype": dtype_name, "head_dim": head_dim, "seqlen": seqlen, "causal": causal, "batch": batch,
              "heads": heads, "first_call_s": {}}

    impls, status = {}, {}
    backward = any(mode != "fwd" for mode in modes)
    group = flex_group(dtype_name, head_dim, heads, causal)
    for name in impl_names:
        try:
            impls[name] = make_impl(name, causal, seqlen, device, flex=flex, group=group)
            config["first_call_s"][name] = warm_up(impls[name], q, k, v, dout, backward, opts.verbose)
        except Exception as exc:  # noqa: BLE001  (an anchor that fails is reported, never fatal)
            impls.pop(name, None)
            status[name] = "unavailable: " + (str(exc) if isinstance(exc, AnchorUnavailable) else short_error(exc))
            if opts.verbose:
                traceback.print_exc()
            if name == "flex" and flex is not None and flex.is_dynamic(group):
                # The dynamic-shape compilation failed: this group is compiled per shape from now on.
                flex.static_groups.add(group)
                try:
                    impls[name] = make_impl(name, causal, seqlen, device, flex=flex, group=group)
                    config["first_call_s"][name] = warm_up(impls[name], q, k, v, dout, backward, opts.verbose)
                    status.pop(name)
                    config["notes"] = {name: "compiled for this shape: the dynamic-shape compilation of its group "
                                             "failed (" + short_error(exc) + ")"}
                except Exception as exc2:  # noqa: BLE001
                    impls.pop(name, None)
                    status[name] += "; compiled for this shape: " + short_error(exc2)

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

    keep_gpu_busy(device, getattr(opts, "settle", 0))
    rows = []
    for mode in modes:
        row = dict(config, mode=mode, ms={}, tflops={}, status=dict(status))
        for name, ms in time_round_robin(impls, mode, q, k, v, dout, opts, device, row["status"]).items():
            row["ms"][name] = ms
            row["tflops"][name] = FLOPS_FACTOR[mode] * fwd_flops / (ms * 1e-3) / 1e12
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


def skipped_rows(dtype_name, head_dim, seqlen, causal, modes, impl_names, reason, batch=None, heads=None):
    """The rows of a config that was not run: every method marked with `reason`."""
    batch, heads = config_shape(seqlen, head_dim, batch, heads)
    config = {"dtype": dtype_name, "head_dim": head_dim, "seqlen": seqlen, "causal": causal, "batch": batch,
              "heads": heads, "skipped": reason}
    return [dict(config, mode=mode, ms={}, tflops={}, status={name: "skipped: " + reason for name in impl_names})
            for mode in modes]


# --------------------------------------------------------------------------------------------------
# FlexAttention compilations ahead of the grid, in parallel worker processes
# --------------------------------------------------------------------------------------------------


def flex_compile_units(configs, batch=None, heads=None, dynamic=True) -> List[dict]:
    """The FlexAttention compilations a grid needs, as independent units of work in run order: one per
    group (dynamic) or per shape (static), each {"group": [...], "shapes": [[seqlen, batch, heads], ...]}.
    configs: (dtype, head dim, causal, seqlen) tuples in the order the run makes them."""
    units: Dict[tuple, dict] = {}
    for dtype_name, head_dim, causal, seqlen in configs:
        b, h = config_shape(seqlen, head_dim, batch, heads)
        group = flex_group(dtype_name, head_dim, h, causal)
        key = group if dynamic else group + (seqlen,)
        units.setdefault(key, {"group": list(group), "shapes": []})["shapes"].append([seqlen, b, h])
    return list(units.values())


def _flex_prewarm_worker(spec_path: str) -> int:
    """Worker process: compiles FlexAttention for its units exactly as the run will (same inputs, same
    calls, same order), which leaves the compiled artifacts in torch's on-disk caches."""
    with open(spec_path) as f:
        spec = json.load(f)
    device = torch.device(spec["device"])
    flex = FlexAttention(dynamic=spec["dynamic"])
    failed = 0
    for unit in spec["units"]:
        dtype_name, head_dim, heads, causal = unit["group"]
        for seqlen, batch, _ in unit["shapes"]:
            try:
                q, k, v, dout = make_inputs(batch, seqlen, heads, head_dim, DTYPES[dtype_name], device)
                forward = flex.forward(flex_group(dtype_name, head_dim, heads, causal), causal, seqlen, device)
                seconds = warm_up(forward, q, k, v, dout, spec["backward"], verbose=True)
                print(f"{dtype_name} D={head_dim} H={heads} causal={causal} N={seqlen} B={batch}: {seconds:.1f} s",
                      flush=True)
                del q, k, v, dout, forward
            except Exception:  # noqa: BLE001  (the run compiles it again and reports what fails)
                traceback.print_exc()
                failed += 1
                break
    return 1 if failed else 0


def prewarm_flex(units: List[dict], dynamic: bool, backward: bool, device="cuda", timeout_s: float = FLEX_PREWARM_TIMEOUT_S,
                 max_workers: Optional[int] = None, log: Callable[[str], None] = print) -> dict:
    """Runs the FlexAttention compilations of `units` in parallel worker processes and waits for them
    (at most timeout_s, then stops the workers still running). Compilation is CPU work on one core per
    worker; the GPU work of the workers is a handful of calls, all finished before the run times anything.
    The run then compiles the same graphs itself and finds them in the caches, or compiles them again
    where a worker failed. Returns a summary for the results' metadata."""
    start = time.monotonic()
    if max_workers is None:
        try:
            cores = len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
        except (AttributeError, OSError):
            cores = os.cpu_count() or 2
        max_workers = min(FLEX_PREWARM_MAX_WORKERS, max(1, cores - 2))
    n_workers = max(1, min(len(units), max_workers))
    summary = {"units": len(units), "workers": n_workers, "seconds": None, "failed_workers": 0, "timed_out_workers": 0}
    env = dict(os.environ)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # one core per worker; compile_threads is not part of the cache keys
    # The workers import this harness and the same flashattn as this process.
    paths = [FLASHATTN_PARENT, BENCHMARKS_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    log(f"FlexAttention: compiling {len(units)} {'group' if dynamic else 'shape'}{'s' if len(units) != 1 else ''} "
        f"in {n_workers} worker processes first (fills torch's compile caches; every timing is made in this process)")
    with tempfile.TemporaryDirectory(prefix="flashattn_flex_") as tmp:
        procs = []
        for index in range(n_workers):
            spec_path = os.path.join(tmp, f"spec{index}.json")
            with open(spec_path, "w") as f:
                json.dump({"device": str(device), "dynamic": dynamic, "backward": backward,
                           "units": units[index::n_workers]}, f)
            log_path = os.path.join(tmp, f"worker{index}.log")
            with open(log_path, "w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-c",
                     "import sys; from harness import _flex_prewarm_worker; "
                     "sys.exit(_flex_prewarm_worker(sys.argv[1]))", spec_path],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            procs.append((proc, log_path))
        deadline = start + timeout_s
        for proc, log_path in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                summary["timed_out_workers"] += 1
                continue
            if proc.returncode != 0:
                summary["failed_workers"] += 1
                with open(log_path) as f:
                    lines = [line.rstrip() for line in f if line.strip()]
                log(f"  a FlexAttention worker failed ({lines[-1] if lines else 'exit status ' + str(proc.returncode)}); "
                    "the run compiles its groups itself")
    summary["seconds"] = round(time.monotonic() - start, 1)
    note = ""
    if summary["timed_out_workers"]:
        note = f", {summary['timed_out_workers']} stopped after {timeout_s:.0f} s"
    log(f"FlexAttention: compilation workers done in {summary['seconds']:.0f} s{note}")
    return summary


# --------------------------------------------------------------------------------------------------
# Reporting: table, progress, files
# --------------------------------------------------------------------------------------------------


def _cell(row, name):
    if name in row["tflops"]:
        value = row["tflops"][name]
        return f"{value:.1f}" if value >= 10 else f"{value:.3g}"
    if row.get("skipped"):
        return "skipped"
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
            cells.append(f"{mib:.0f}" if mib is not None else "skipped" if row.get("skipped") else "n/a")
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
    """The short commit of the checkout the measured flashattn package lives in, or "unknown"
    (FLASHATTN_GIT_COMMIT overrides)."""
    if os.environ.get("FLASHATTN_GIT_COMMIT"):
        return os.environ["FLASHATTN_GIT_COMMIT"]
    checkout = FLASHATTN_PARENT
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
    try:
        cudnn_version = torch.backends.cudnn.version() if on_cuda else None
    except Exception:  # noqa: BLE001
        cudnn_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": _git_commit(),
        "gpu": torch.cuda.get_device_name(device) if on_cuda else None,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if on_cuda else None,
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version,
        "triton": triton_version,
        "flashattn": flashattn.__version__,
        "flash_attn_4": fa4_version(),  # None: flash_attn.cute does not import here
        "timer": ("triton.testing.do_bench median" if triton_version else "CUDA events median") if on_cuda
        else "wall clock median",
    }


def _row_notes(row) -> List[Tuple[str, str]]:
    """(method, why) of every cell of a row that is missing or otherwise noted."""
    return list(row["status"].items()) + list(row.get("memory_status", {}).items()) + list(row.get("notes", {}).items())


def _notes(rows) -> List[str]:
    """Markdown list lines: why cells are missing. A reason that every config run shares (an anchor that
    does not import) gets one line, not one per config; configs skipped as a whole get one line each."""
    ran = [r for r in rows if not r.get("skipped")]
    everywhere = set()
    if len({(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]) for r in ran}) > 1:
        everywhere = set.intersection(*(set(_row_notes(r)) for r in ran))
    notes = [f"- every config: {n}: {why}" for n, why in sorted(everywhere)]
    notes += sorted({f"- {r['dtype']} D={r['head_dim']} N={r['seqlen']} causal={r['causal']}: {n}: {why}"
                     for r in ran for n, why in _row_notes(r) if (n, why) not in everywhere})
    skipped = []
    for r in rows:
        if not r.get("skipped"):
            continue
        line = f"- {r['dtype']} D={r['head_dim']} N={r['seqlen']} causal={r['causal']}: not run ({r['skipped']})"
        if line not in skipped:
            skipped.append(line)
    return notes + skipped


def run_summary(meta, rows) -> str:
    """One sentence: how long the run took and whether every config ran."""
    configs = {(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]) for r in rows}
    skipped = {(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]) for r in rows if r.get("skipped")}
    parts = []
    if meta.get("elapsed_s") is not None:
        parts.append(f"Run time {meta['elapsed_s']:.0f} s")
    if skipped:
        reason = next(r["skipped"] for r in rows if r.get("skipped"))
        parts.append(f"INCOMPLETE: {len(skipped)} of {len(configs)} configs not run ({reason})")
    elif meta.get("complete") is False:
        parts.append("in progress or interrupted: the configs below are those finished so far")
    else:
        parts.append(f"all {len(configs)} configs ran")
    return "; ".join(parts) + "."


def _flex_line(meta, rows) -> Optional[str]:
    flex = meta.get("flex")
    if not flex:
        return None
    first_calls = {}
    for r in rows:
        seconds = (r.get("first_call_s") or {}).get("flex")
        if seconds is not None:
            first_calls[(r["dtype"], r["head_dim"], r["seqlen"], r["causal"])] = seconds
    line = (f"FlexAttention: torch.compile(flex_attention, dynamic={flex['dynamic']}), "
            + ("one compilation per dtype, head dim and causal mode (plus one for a batch of 1)"
               if flex["dynamic"] else "one compilation per shape"))
    prewarm = flex.get("prewarm")
    if prewarm:
        line += (f"; compiled first in {prewarm['workers']} worker processes ({prewarm['seconds']:.0f} s"
                 + (f", {prewarm['failed_workers']} failed" if prewarm.get("failed_workers") else "")
                 + (f", {prewarm['timed_out_workers']} stopped" if prewarm.get("timed_out_workers") else "") + ")")
    if first_calls:
        line += f"; first calls in this process (compiling or loading from the cache) {sum(first_calls.values()):.0f} s in all"
    return line + "."


def _fa4_line(meta, rows) -> Optional[str]:
    """One sentence on the FlashAttention-4 anchor of a run: why it is unavailable, or its version and
    what its first calls (just-in-time compilation, outside every timing) took."""
    fa4 = meta.get("fa4")
    if not fa4:
        return None
    if "unavailable" in fa4:
        return f"FlashAttention-4: unavailable ({fa4['unavailable']})."
    line = f"FlashAttention-4: flash_attn.cute.interface.flash_attn_func, flash-attn-4 {fa4.get('version')}"
    first_calls = {}  # per config: its rows (one per mode) share the one first call
    for r in rows:
        seconds = (r.get("first_call_s") or {}).get("fa4")
        if seconds is not None:
            first_calls[(r["dtype"], r["head_dim"], r["seqlen"], r["causal"])] = seconds
    if first_calls:
        line += (f"; first calls (just-in-time compilation, before the timings) {sum(first_calls.values()):.0f} s "
                 f"in all, at most {max(first_calls.values()):.1f} s")
    return line + "."


def write_results(out_dir, meta, rows, impl_names, args_dict, charts=True) -> List[str]:
    """bench.json, bench.md and (matplotlib permitting) PNG charts in out_dir; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "bench.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"meta": meta, "args": args_dict, "results": rows}, f, indent=1)
    os.replace(path + ".tmp", path)  # never a half-written file, even when the run is killed
    written.append(path)
    device = f"GPU {meta['gpu']} (sm_{str(meta['capability']).replace('.', '')})" if meta.get("gpu") else "CPU"
    cudnn = f", cuDNN {meta['cudnn']}" if meta.get("cudnn") else ""
    timing = ""
    if args_dict.get("warmup") is not None and args_dict.get("rep") is not None:
        timing = f" (warm-up {args_dict['warmup']:g} ms, then the calls that fit in {args_dict['rep']:g} ms)"
    lines = [
        f"# flashattn benchmark, {meta['date']}",
        "",
        f"{device}, torch {meta['torch']} (CUDA {meta['cuda']}{cudnn}), triton {meta['triton']}, flashattn {meta['flashattn']} "
        f"at commit {meta['git_commit']}. Timer: {meta['timer']}{timing}.",
    ]
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`. {run_summary(meta, rows)}"]
    for line in (_flex_line(meta, rows), _fa4_line(meta, rows)):
        if line:
            lines += ["", line]
    lines += [
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
    notes = _notes(rows)
    if notes:
        lines += ["", "Unavailable, failed, skipped or otherwise noted:", ""] + notes
    path = os.path.join(out_dir, "bench.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    written.append(path)
    if charts:
        from charts import MatplotlibMissing, write_charts  # benchmarks/charts.py, beside this file

        try:
            written += write_charts(rows, out_dir)
        except MatplotlibMissing:
            print("matplotlib is not installed: skipping the PNG charts (pip install matplotlib)", file=sys.stderr)
    return written


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashattn bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "fp16"])
    p.add_argument("--headdim", "--head-dim", dest="headdim", nargs="+", type=int,
                   default=[64, 96, 128, 192, 256])
    p.add_argument("--seqlen", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--mode", nargs="+", choices=list(FLOPS_FACTOR), default=["fwd", "bwd", "fwdbwd"])
    p.add_argument("--batch", type=int, help=f"fixed batch size (default: {TOKENS} // seqlen)")
    p.add_argument("--heads", type=int, help=f"fixed number of heads (default: {MODEL_DIM} // head dim)")
    p.add_argument("--anchors", nargs="*", choices=ANCHORS, default=ANCHORS,
                   help="anchors to time beside flashattn (default: all; fa4 is FlashAttention-4, n/a when "
                        "flash_attn.cute does not import)")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: bf16, D 64/128, N 1024/4096/16384, fwd and bwd")
    p.add_argument("--warmup", type=float, default=10, help="warm-up per measurement, ms (default 10)")
    p.add_argument("--rep", type=float, default=50,
                   help="time budget of the measured calls of one method and config, ms, shared by its --rounds "
                        "(default 50)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds in which every method of a config is timed in turn, each with rep / rounds ms of "
                        "calls; a figure is the median of its rounds (default 3)")
    p.add_argument("--settle", type=float, default=0,
                   help="ms of matrix products on the GPU before each config's timings (default 0: none; on the "
                        "H200 200 ms of them set off power capping that lowered the next method's figure by 5-13%%)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="configs not started after this many seconds are not run; they are reported as skipped")
    p.add_argument("--flex-static", action="store_true",
                   help="compile FlexAttention once per shape instead of once per (dtype, head dim, causal) with "
                        "dynamic shapes (slower to run)")
    p.add_argument("--no-flex-prewarm", dest="flex_prewarm", action="store_false",
                   help="compile FlexAttention only in this process, not first in parallel worker processes")
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
    if args.warmup < 0 or args.rep <= 0:
        p.error("--warmup must be at least 0 and --rep more than 0")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.settle < 0:
        p.error("--settle must be at least 0")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error("--time-budget must be more than 0")
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


def run(args, device="cuda", started: Optional[float] = None, on_config=None, meta: Optional[dict] = None) -> List[dict]:
    """Runs the grid described by the parsed arguments, printing the table as it goes; returns the rows.

    started: time.monotonic() at the start of the run (for --time-budget; now if None). on_config(rows)
    is called after every config with the rows so far. meta: a dict that receives how FlexAttention was
    compiled and whether FlashAttention-4 imports (:func:`fa4_status`)."""
    started = time.monotonic() if started is None else started
    device = torch.device(device)
    impl_names = ["flashattn"] + list(args.anchors)
    causal_values = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    configs = [(d, h, c, n) for d in args.dtype for h in args.headdim for c in causal_values for n in args.seqlen]
    budget = getattr(args, "time_budget", None)

    flex = None
    if "flex" in impl_names:
        flex = FlexAttention(dynamic=not getattr(args, "flex_static", False))
        if meta is not None:
            meta["flex"] = {"dynamic": flex.dynamic, "prewarm": None}
        units = flex_compile_units(configs, args.batch, args.heads, flex.dynamic)
        if device.type == "cuda" and getattr(args, "flex_prewarm", True) and len(units) > 1:
            timeout = FLEX_PREWARM_TIMEOUT_S if budget is None else min(FLEX_PREWARM_TIMEOUT_S, max(30.0, budget / 3))
            summary = prewarm_flex(units, flex.dynamic, any(mode != "fwd" for mode in args.mode), device, timeout,
                                   log=lambda line: print(line, flush=True))
            if meta is not None:
                meta["flex"]["prewarm"] = summary

    # An anchor that cannot run at all is said once here, not again under every config's row.
    announced = {}
    if "fa4" in impl_names:
        fa4 = fa4_status()
        if meta is not None:
            meta["fa4"] = fa4
        if "unavailable" in fa4:
            print(f"FlashAttention-4: unavailable ({fa4['unavailable']}); its column is n/a", flush=True)
            announced["fa4"] = "unavailable: " + fa4["unavailable"]

    progress = Progress(len(configs), enabled=args.progress)
    progress.write(table_header(impl_names))
    rows = []
    skip_reason = None
    try:
        for dtype_name, head_dim, causal, seqlen in configs:
            budget = getattr(args, "time_budget", None)
            if skip_reason is None and budget is not None and time.monotonic() - started >= budget:
                skip_reason = f"time budget of {budget:g} s reached"
                left = len(configs) - progress.done
                progress.write(f"    {skip_reason} after {time.monotonic() - started:.0f} s: the {left} configs left "
                               "are not run (reported as skipped)")
            if skip_reason is not None:
                new_rows = skipped_rows(dtype_name, head_dim, seqlen, causal, args.mode, impl_names, skip_reason,
                                        args.batch, args.heads)
            else:
                progress.start(f"{dtype_name} D={head_dim} N={seqlen} {'causal' if causal else 'full'}")
                new_rows = run_config(dtype_name, head_dim, seqlen, causal, args.mode, impl_names, args, device,
                                      args.batch, args.heads, flex=flex)
            for row in new_rows:
                progress.write(table_row(row, impl_names))
                for name, why in row["status"].items():
                    if why == announced.get(name):
                        continue
                    if not row.get("skipped") and (row["mode"] == args.mode[0] or why.startswith("failed")):
                        progress.write(f"    {name}: {why}")
            rows += new_rows
            progress.step()
            if on_config is not None:
                on_config(rows)
    finally:
        progress.close()
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    started = time.monotonic()
    args = parse_args(argv)
    reason = cuda_unusable_reason()
    if reason is not None:
        print(f"flashattn bench: needs a CUDA GPU of compute capability 8.0+ with flashattn's CUDA kernels: {reason}. "
              "Run `python -m flashattn check` for a correctness pass on the CPU.", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    meta = metadata("cuda")
    meta["command"] = " ".join(["python -m flashattn bench"] + ([shlex.join(argv)] if argv else []))
    meta["complete"] = False
    print(f"{meta['gpu']}, torch {meta['torch']}, flashattn {meta['flashattn']}, commit {meta['git_commit']}", flush=True)
    impl_names = ["flashattn"] + list(args.anchors)

    def save(rows, final):
        meta["elapsed_s"] = round(time.monotonic() - started, 1)
        meta["complete"] = final and not any(r.get("skipped") for r in rows)
        return write_results(args.out, meta, rows, impl_names, vars(args), charts=final and args.charts)

    rows = run(args, started=started, on_config=(lambda rows: save(rows, False)) if args.out else None, meta=meta)
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    meta["complete"] = not any(r.get("skipped") for r in rows)
    if args.out:
        for path in save(rows, True):
            print(f"wrote {path}")
    else:
        print("(pass --out DIR to save bench.json, bench.md and charts)")
    for line in (_flex_line(meta, rows), _fa4_line(meta, rows)):
        if line:
            print(line)
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    print(run_summary(meta, rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
