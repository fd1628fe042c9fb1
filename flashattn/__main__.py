"""Command line: ``python -m flashattn info`` and ``python -m flashattn demo``."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn.reference import attention_reference


def _gpu_usable() -> bool:
    return (
        torch.cuda.is_available()
        and flashattn.cuda_kernels_built()
        and torch.cuda.get_device_capability()[0] >= 8
    )


def info() -> None:
    print(f"flashattn {flashattn.__version__}")
    print(f"CUDA kernels built: {flashattn.cuda_kernels_built()}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    if not torch.cuda.is_available():
        print("GPU: none visible")
        return
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        supported = "supported" if major >= 8 else "not supported (needs sm_80+)"
        print(f"GPU {index}: {torch.cuda.get_device_name(index)}, compute capability {major}.{minor}, {supported}")


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn", description="flashattn command line")
    parser.add_argument("command", choices=["info", "demo"], help="info: versions and GPU; demo: run and compare")
    args = parser.parse_args(argv)
    {"info": info, "demo": demo}[args.command]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
