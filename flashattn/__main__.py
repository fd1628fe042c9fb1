"""Command line: ``python -m flashattn info | check | bench | demo``.

* ``info``: versions, how the extension was built, the GPUs, which code paths are active, the support
  matrix. Meant to be pasted into a bug report.
* ``check``: a quick forward + backward correctness pass on the available device (CUDA when flashattn's
  kernels can run there, else the CPU) against the reference; non-zero exit status on any failure.
* ``bench``: throughput and memory beside torch's SDPA backends, FlexAttention and FlashAttention-4
  (``python -m flashattn bench --help``). Needs a CUDA GPU and a source checkout: it runs the harness in benchmarks/harness.py,
  beside the package, which an installed package does not have.
* ``demo``: one causal attention call, its error against a float32 reference, time and memory beside SDPA.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import struct
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import flashattn
from flashattn import stable_abi
from flashattn.reference import attention_reference

# Compute capability of the GPUs flashattn's CUDA kernels run on (the sm80 path: mma.sync, ldmatrix, cp.async).
MIN_CAPABILITY = (8, 0)


def _gpu_usable() -> bool:
    return (
        torch.cuda.is_available()
        and flashattn.cuda_kernels_built()
        and torch.cuda.get_device_capability() >= MIN_CAPABILITY
    )


# --------------------------------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------------------------------

_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_KIND_PTX, _FATBIN_KIND_SASS = 1, 2


def _elf_section(path: str, wanted: str) -> Optional[bytes]:
    """The bytes of one section of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        (shoff,) = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        f.seek(sections[shstrndx][4])
        names = f.read(sections[shstrndx][5])
        for section in sections:
            name_end = names.find(b"\0", section[0])
            if names[section[0]:name_end].decode(errors="replace") == wanted:
                f.seek(section[4])
                return f.read(section[5])
    return None


def kernel_archs_in_binary(path: str) -> Optional[Dict[str, List[int]]]:
    """SM versions with machine code (SASS) and PTX embedded in a CUDA shared object, read from its
    .nv_fatbin section: ``{"sass": [80, 90], "ptx": []}``. None when there is no such section or it
    cannot be read (not an ELF file, a CPU-only build)."""
    try:
        data = _elf_section(path, ".nv_fatbin")
    except (OSError, struct.error, IndexError):
        return None
    if not data:
        return None
    archs: Dict[str, set] = {"sass": set(), "ptx": set()}
    magic = struct.pack("<I", _FATBIN_MAGIC)
    pos = data.find(magic)
    try:
        while pos >= 0:
            _, _, header_size, body_size = struct.unpack_from("<IHHQ", data, pos)
            entry, end = pos + header_size, min(pos + header_size + body_size, len(data))
            while entry + 32 <= end:
                kind, _, entry_header_size, payload_size = struct.unpack_from("<HHIQ", data, entry)
                (arch,) = struct.unpack_from("<I", data, entry + 28)
                if entry_header_size < 32:
                    break
                if kind == _FATBIN_KIND_SASS:
                    archs["sass"].add(arch)
                elif kind == _FATBIN_KIND_PTX:
                    archs["ptx"].add(arch)
                entry += entry_header_size + payload_size
            pos = data.find(magic, max(end, pos + 1))
    except struct.error:
        pass
    if not archs["sass"] and not archs["ptx"]:
        return None
    return {kind: sorted(values) for kind, values in archs.items()}


def _binary_runs_on(archs: Optional[Dict[str, List[int]]], capability: Tuple[int, int]) -> Optional[str]:
    """How the embedded code can run on a GPU of this capability, "" if it cannot, None if unknown."""
    if archs is None:
        return None
    major, minor = capability
    # SASS runs on GPUs of the same major version and an equal or higher minor version.
    sass = [a for a in archs["sass"] if a // 10 == major and a % 10 <= minor]
    if sass:
        return f"sm_{max(sass)} machine code"
    ptx = [a for a in archs["ptx"] if a <= major * 10 + minor]
    if ptx:
        return f"compute_{max(ptx)} PTX, compiled by the driver at first use"
    return ""


def _build_record_line() -> str:
    """What flashattn/build_record.py (written by setup.py) says the extension was built against."""
    try:
        from flashattn import build_record as r
    except ImportError:
        return "not recorded (a build older than the record); the extension imports only with a torch of the same ABI"
    ptx = f" and compute_{r.CUDA_PTX} PTX" if r.CUDA_PTX else ""
    cuda = f", kernels by nvcc {r.NVCC} for archs {r.CUDA_ARCHS}{ptx}" if r.CUDA_KERNELS else ", no CUDA kernels"
    return f"torch {r.TORCH} (its CUDA {r.TORCH_CUDA or 'none'}){cuda}"


def _package_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # Python < 3.8
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _format_archs(archs: Optional[Dict[str, List[int]]]) -> str:
    if archs is None:
        return "unknown (no .nv_fatbin section could be read from the extension)"
    parts = []
    if archs["sass"]:
        parts.append("machine code for " + ", ".join(f"sm_{a}" for a in archs["sass"]))
    if archs["ptx"]:
        parts.append("PTX for " + ", ".join(f"compute_{a}" for a in archs["ptx"]))
    return "; ".join(parts)


SUPPORT_MATRIX = """\
support matrix
  dtypes          CUDA: float16, bfloat16 (float32/float64 CUDA tensors fall back to torch SDPA)
                  CPU: float16, bfloat16, float32, float64
  GPUs            compute capability 8.0+ (A100, H100/H200, RTX 30xx/40xx, ...): sm80 kernels (mma.sync)
                  on all of them; on compute capability 9.0 (H100/H200) the sm90 path (TMA, wgmma, warp
                  specialisation) runs the forward and the backward for head dims 33..256, given
                  16-byte-aligned strides; sm80 otherwise (FLASHATTN_FORCE_SM80=1, or flashattn.plan's
                  force_sm80 option, forces sm80)
  head dims       any of 1..256 (CUDA: padded inside the kernels to the next compiled tile width);
                  q and k share the head dim; v's may differ (see value dim)
  heads           grouped-query / multi-query attention: heads_q a multiple of heads_kv
  causal masks    top-left (j <= i; scaled_dot_product_attention, torch's convention) and bottom-right
                  (j <= i + Lk - Lq; flash_attn_* API), any Lq and Lk; rows that see no key output 0
  layouts         any strides in batch, sequence and head dims; the last dim must be contiguous
  autograd        dq, dk, dv (the log-sum-exp is not differentiable); torch.compile(fullgraph=True),
                  CUDA graphs, torch.library.opcheck-clean registration
  reproducible    forward: always, bit for bit; backward: on the CPU always, on CUDA with
                  flash_attn_*(deterministic=True) or, for scaled_dot_product_attention, under
                  torch.use_deterministic_algorithms(True) (key blocks take turns at dq; the
                  default adds dq with atomic reductions in no fixed order)
  attention masks bool or additive (float32 or the inputs' dtype), any shape that broadcasts, read in
                  place; a floating mask gets its gradient
  dropout         dropout_p in [0, 1) after the softmax, kept probabilities scaled by 1 / (1 - p); the
                  keep-mask is a Philox function of (seed, offset, b, h, i, j), the same on CPU and CUDA,
                  seeded from torch's generator (torch.manual_seed reproduces it)
  varlen          flash_attn_varlen_* (cu_seqlens, max_seqlen, seqused_q/k): packed rows in place on
                  the CPU and on sm_90 at head dims 33..256 without dropout; elsewhere over a padded
                  copy of the batch (exact, the work and memory of batch * max_seqlen rows)
  KV cache        flash_attn_with_kvcache: in-place appends at cache_seqlens, causal per sequence,
                  rotary embedding, cache_batch_idx, cache_leftpad, paged caches (block_table, any
                  page size; also in flash_attn_varlen_func with seqused_k)
  variants        attention sinks (learnable_sink, transformers' s_aux), softcap (not with a floating
                  mask) and sliding windows (window_size; not with a mask), forward and backward,
                  every path; ALiBi (alibi_slopes, FlashAttention-2 API): a term the sm90 kernels
                  and the decode op add themselves (flash_attn_func, the varlen functions, KV cache),
                  the CPU and sm80 paths an additive mask (causal: a term per key; else S x S);
                  not with softcap
  value dim       a value head dim other than the query's (SDPA drop-in, FlashAttention-2 API, varlen,
                  KV cache, paged caches): zero-padded copies at the larger head dim (exact, its cost;
                  the KV cache takes the batched kernels over a copy of the caches)
  fallbacks       scaled_dot_product_attention passes to torch SDPA (one warning per reason): dropout_p
                  outside [0, 1), an attn_mask of another dtype or device, float32/float64 CUDA tensors,
                  head dim > 256, GPUs older than sm_80, a build without CUDA kernels, broadcast batch
                  dims, nested tensors, other devices.
                  flash_attn_func and friends raise instead."""


def info() -> None:
    print(f"flashattn {flashattn.__version__} ({os.path.dirname(os.path.abspath(flashattn.__file__))})")
    print(f"python {platform.python_version()}, {platform.system()} {platform.machine()}")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}, cuDNN {cudnn or 'none'})")
    optional = ", ".join(f"{name} {_package_version(name) or 'not installed'}"
                         for name in ("triton", "transformers", "matplotlib", "tqdm"))
    print(f"optional packages: {optional}")

    extension = flashattn.ops._C.__file__
    built_cuda = flashattn.cuda_kernels_built()
    archs = kernel_archs_in_binary(extension) if built_cuda else None
    print("build")
    print(f"  extension          {extension}")
    print(f"  CUDA kernels       {'yes' if built_cuda else 'no (CPU-only build: FLASHATTN_BUILD_CUDA=0 or no CUDA toolkit when it was built)'}")
    if built_cuda:
        print(f"  kernel archs       {_format_archs(archs)} (FLASHATTN_CUDA_ARCHS at build time, default 80;90)")
    print(f"  built against      {_build_record_line()}")
    stable = stable_abi.library_path()
    print(f"  stable-ABI library {stable + ' (loads under torch 2.11 and later)' if stable else 'none in this build'}")
    if torch.version.cuda:
        print(f"  torch's own archs  {' '.join(torch.cuda.get_arch_list()) or 'none'} (torch.cuda.get_arch_list(), not flashattn's)")

    print("devices")
    gpu_path = None
    if not torch.cuda.is_available():
        print("  GPU                none visible")
    else:
        for index in range(torch.cuda.device_count()):
            capability = torch.cuda.get_device_capability(index)
            name = torch.cuda.get_device_name(index)
            total = torch.cuda.get_device_properties(index).total_memory / 2**30
            if not built_cuda:
                verdict = "no flashattn kernels (CPU-only build)"
            elif capability < MIN_CAPABILITY:
                verdict = "not supported (flashattn needs compute capability 8.0+)"
            else:
                runs = _binary_runs_on(archs, capability)
                if runs == "":
                    verdict = (f"the extension has no code for sm_{capability[0]}{capability[1]} "
                               "(rebuild with FLASHATTN_CUDA_ARCHS including it): launches will fail")
                else:
                    verdict = "sm80 kernels" + (f" ({runs})" if runs else "")
                    sm90 = capability == (9, 0) and getattr(flashattn.ops._C, "compiled_with_sm90", lambda: False)()
                    if sm90:
                        verdict += "; sm90 kernels (TMA + wgmma)"
                    elif capability[0] >= 9:
                        verdict += "; no sm90 kernels in this build" if capability == (9, 0) else ""
                    gpu_path = gpu_path or (f"sm90 kernels (TMA, wgmma), sm80 where they do not apply, on GPU {index}" if sm90
                                            else f"sm80 kernels (mma.sync, cp.async) on GPU {index}")
            print(f"  GPU {index}              {name}, compute capability {capability[0]}.{capability[1]}, "
                  f"{total:.0f} GiB: {verdict}")
    softmax_form = getattr(flashattn.ops._C, "cpu_softmax_rows_form", lambda: "unknown")()
    print(f"  CPU                {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"vector ISA {torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else 'unknown'} "
          f"(flashattn's softmax step: {softmax_form})")
    bwd_products = getattr(flashattn.ops._C, "cpu_bwd_bf16_products_form", lambda: "unknown")()
    fwd_products = getattr(flashattn.ops._C, "cpu_fwd_bf16_products_form", lambda: "unknown")()
    print(f"  CPU bfloat16       products: forward {fwd_products}, backward {bwd_products}")

    print("active paths")
    if gpu_path:
        print(f"  CUDA float16/bfloat16   {gpu_path}")
    else:
        why = ("no GPU visible" if not torch.cuda.is_available() else
               "built without CUDA kernels" if not built_cuda else "no usable GPU (see above)")
        print(f"  CUDA                    none ({why}): scaled_dot_product_attention falls back to torch SDPA, "
              "flash_attn_func raises")
    if built_cuda and hasattr(flashattn.ops._C, "plan_options"):
        options = flashattn.ops._C.plan_options()
        print("  planner options         " + ", ".join(f"{k}={v}" for k, v in options.items()))
    if built_cuda:
        decode = "on" if flashattn.kvcache.decode_op_enabled else "off (FLASHATTN_DECODE_OP=0 in the environment)"
        print(f"  KV-cache decoding       decode op {decode}")
    print("  CPU (all four dtypes)   CPU implementation (the same tiled online-softmax algorithm; float32 math, float64 for float64)")
    print(SUPPORT_MATRIX)


# --------------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal mode, layout)
CUDA_CASES = [
    (2, 128, 128, 8, 8, 64, "none", "contiguous"),
    (1, 97, 97, 4, 4, 40, "top_left", "contiguous"),
    (2, 113, 203, 8, 2, 128, "bottom_right", "contiguous"),
    (2, 203, 113, 4, 1, 96, "top_left", "bhsd"),
    (1, 1, 17, 2, 1, 72, "bottom_right", "contiguous"),
    (1, 1025, 1025, 2, 2, 256, "top_left", "contiguous"),
    (3, 17, 17, 16, 16, 160, "none", "unaligned"),
]
CPU_CASES = [
    (2, 64, 64, 4, 4, 64, "none", "contiguous"),
    (1, 97, 97, 2, 2, 40, "top_left", "contiguous"),
    (2, 33, 70, 4, 2, 24, "bottom_right", "contiguous"),
    (1, 70, 33, 4, 1, 80, "top_left", "bhsd"),
    (1, 1, 17, 2, 1, 72, "bottom_right", "contiguous"),
    (1, 17, 17, 2, 2, 160, "none", "unaligned"),
]


def _check_device(requested: str) -> Tuple[Optional[torch.device], str]:
    if requested == "cpu":
        return torch.device("cpu"), "CPU (requested)"
    usable = _gpu_usable()
    if requested == "cuda":
        if not usable:
            return None, ("--device cuda, but flashattn's CUDA kernels cannot run here (a GPU of compute capability "
                          "8.0+ and a build with CUDA kernels are needed); see python -m flashattn info")
        return torch.device("cuda"), f"CUDA ({torch.cuda.get_device_name()})"
    if usable:
        return torch.device("cuda"), f"CUDA ({torch.cuda.get_device_name()})"
    return torch.device("cpu"), "CPU (no GPU that flashattn's CUDA kernels can use)"


def check(device_name: str = "auto", seed: int = 0) -> int:
    from flashattn.testing import check_case

    device, description = _check_device(device_name)
    if device is None:
        print(f"flashattn check: {description}", file=sys.stderr)
        return 1
    if device.type == "cuda":
        dtypes, cases = [torch.float16, torch.bfloat16], CUDA_CASES
    else:
        dtypes, cases = [torch.float32, torch.float16, torch.bfloat16], CPU_CASES
    print(f"flashattn {flashattn.__version__} check on {description}: forward and backward against the reference")
    print("rule: max|x - ref| <= 2 x (out) or 3 x (dq, dk, dv) max|baseline - ref| + 1e-5; ref one precision up "
          "(float32 for fp16/bf16, float64 for fp32), baseline the same math in the input dtype")
    print("columns: err / allowed")
    torch.manual_seed(seed)
    failures = 0
    total = 0
    for dtype in dtypes:
        for batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal_mode, layout in cases:
            result = check_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal_mode, dtype, device, layout)
            total += 1
            failures += not result.passed
            verdict = "PASS" if result.passed else "FAIL"
            if result.error is not None:
                detail = f"error: {result.error}"
            else:
                detail = "  ".join(
                    f"{f.name} {f.err:.1e}/{f.bound:.1e}" + ("" if f.finite else " (NaN/inf)") for f in result.figures
                )
            print(f"{verdict}  {result.description:<58} {detail}", flush=True)
    print(f"{total - failures}/{total} cases passed" + (f", {failures} FAILED" if failures else ""))
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------------


def _time_ms(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of fn() in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _peak_extra_mib(fn, device: torch.device):
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def demo() -> None:
    if _gpu_usable():
        device, dtype = torch.device("cuda"), torch.bfloat16
        batch, heads, seqlen, head_dim, repeats = 2, 16, 4096, 128, 20
    else:
        device, dtype = torch.device("cpu"), torch.float32
        batch, heads, seqlen, head_dim, repeats = 1, 4, 512, 64, 3
        print("no usable GPU (CUDA kernels need an sm_80+ GPU and a CUDA build): running on the CPU")
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device=device, dtype=dtype) for _ in range(3))
    print(f"causal attention, (batch, heads, seqlen, head_dim) = ({batch}, {heads}, {seqlen}, {head_dim}), "
          f"{dtype}, {device.type}")

    ours = lambda: flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    ref = attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    rows = []
    for name, fn in (("flashattn", ours), ("torch SDPA", theirs)):
        err = (fn().float() - ref).abs().max().item()
        ms = _time_ms(fn, device, repeats)
        mib = _peak_extra_mib(fn, device)
        rows.append((name, err, ms, mib))
    print(f"{'':<12}{'max |out - fp32 ref|':>22}{'time (ms)':>12}{'peak extra (MiB)':>18}")
    for name, err, ms, mib in rows:
        mem = f"{mib:.1f}" if mib is not None else "n/a"
        print(f"{name:<12}{err:>22.2e}{ms:>12.3f}{mem:>18}")


# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flashattn", description="flashattn command line")
    commands = parser.add_subparsers(dest="command", metavar="{info,check,bench,demo}")
    commands.required = True
    commands.add_parser("info", help="versions, build, GPUs, active paths and the support matrix (for bug reports)")
    check_parser = commands.add_parser("check", help="quick forward + backward correctness pass on this machine")
    check_parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                              help="auto: CUDA when flashattn's kernels can run there, else CPU")
    check_parser.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    commands.add_parser("bench", help="throughput and memory beside torch SDPA, FlexAttention and FlashAttention-4 "
                                      "(CUDA, from a source checkout); python -m flashattn bench --help",
                        add_help=False)
    commands.add_parser("demo", help="run causal attention and compare with torch SDPA")
    return parser


def benchmarks_dir() -> str:
    """Where the benchmark harness is in a source checkout: benchmarks/ beside the flashattn package."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__))), "benchmarks")


def bench(argv: List[str]) -> int:
    """``python -m flashattn bench``: benchmarks/harness.py's main, which is not part of an installed package."""
    folder = benchmarks_dir()
    if not os.path.isfile(os.path.join(folder, "harness.py")):
        print(f"flashattn bench: needs a source checkout of flashattn, with benchmarks/harness.py beside the package "
              f"(not found: {os.path.join(folder, 'harness.py')}); run it from the checkout's root or an editable "
              "install (pip install -e .)", file=sys.stderr)
        return 1
    sys.path.insert(0, folder)
    from harness import main as bench_main

    return bench_main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        return bench(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "info":
        info()
        return 0
    if args.command == "check":
        return check(args.device, args.seed)
    demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
