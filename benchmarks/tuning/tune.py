#!/usr/bin/env python3
"""Times every kernel configuration listed in *_variants_*.cu (bf16, B*N = 16k tokens, H*D = 2048)
beside SDPA's flash backend, after checking each against the package's own kernels. Development tool:
  python3 benchmarks/tuning/tune.py [fwd|bwd|both|sm90]
sm90 times the Hopper configurations (forward head dims 64/128/256, backward 64/128) beside SDPA's
flash and cuDNN backends; the others time the sm80 configurations (forward head dims 64/128, backward
64/128/256) beside the flash backend. A head dim without variants of the mode is left out."""
import os
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.cpp_extension import load
from triton.testing import do_bench

import flashattn._C  # noqa: F401

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
arch = os.environ.get("TUNE_ARCH", "90a")  # 90a: wgmma and setmaxnreg
mod = load(name="flashattn_tuning",
           sources=[str(p) for p in [HERE / "bindings.cpp", *sorted(HERE.glob("*_variants_*.cu")),
                                     ROOT / "csrc" / "sm90" / "tensor_map.cu"]],
           extra_include_paths=[str(ROOT / "csrc"), str(HERE)],
           extra_cflags=["-O3", "-std=c++20"],
           extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "--expt-relaxed-constexpr",
                              f"-gencode=arch=compute_{arch},code=sm_{arch}"])
which = sys.argv[1] if len(sys.argv) > 1 else "both"
is_sm90 = lambda name: name.startswith("sm90")  # noqa: E731
bench = lambda fn: do_bench(fn, warmup=30, rep=150, return_mode="median")  # noqa: E731


def sdpa_times(q, k, v, causal, backend=SDPBackend.FLASH_ATTENTION):
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        g = torch.randn_like(o)
        tf = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        tb = bench(lambda: o.backward(g, retain_graph=True))
    return tf, tb


for n in (1024, 4096, 16384):
    for causal in (False, True):
        for d in (64, 128, 256):
            has_fwd = any(vd == d and is_sm90(name) == (which == "sm90") for vd, name in mod.fwd_variants())
            has_bwd = any(vd == d and is_sm90(name) == (which == "sm90") for vd, name in mod.bwd_variants())
            if not (has_fwd and which in ("fwd", "both", "sm90") or has_bwd and which in ("bwd", "both", "sm90")):
                continue
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            scale = d ** -0.5
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, False)
            dout = torch.randn_like(out)
            ref_grads = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, False)
            tf, tb = sdpa_times(q, k, v, causal)
            head = f"n={n:5d} causal={int(causal)} d={d:3d}"
            if which in ("fwd", "both", "sm90") and has_fwd:
                line = [f"{head} fwd FA2 {flops / tf / 1e9:6.1f}"]
                if which == "sm90":
                    tf_cudnn, _ = sdpa_times(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)
                    line.append(f"cuDNN {flops / tf_cudnn / 1e9:6.1f}")
                line.append("|")
                for i, (vd, name) in enumerate(mod.fwd_variants()):
                    if vd != d or is_sm90(name) != (which == "sm90"):
                        continue
                    o, lse_i = mod.fwd(i, q, k, v, scale, causal)
                    err = max((o.float() - out.float()).abs().max().item(),
                              (lse_i - lse).abs().max().item())
                    t = bench(lambda: mod.fwd(i, q, k, v, scale, causal))
                    line.append(f"f{i} {flops / t / 1e9:6.1f}{'' if err < 2e-2 else ' BAD'}")
                print(" ".join(line), flush=True)
            if which in ("bwd", "both", "sm90") and has_bwd:
                line = [f"{head} bwd FA2 {2.5 * flops / tb / 1e9:6.1f}"]
                if which == "sm90":
                    _, tb_cudnn = sdpa_times(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)
                    line.append(f"cuDNN {2.5 * flops / tb_cudnn / 1e9:6.1f}")
                line.append("|")
                for i, (vd, name) in enumerate(mod.bwd_variants()):
                    if vd != d or is_sm90(name) != (which == "sm90"):
                        continue
                    grads = mod.bwd(i, dout, q, k, v, out, lse, scale, causal)
                    err = max((a.float() - r.float()).abs().max().item() for a, r in zip(grads, ref_grads))
                    t = bench(lambda: mod.bwd(i, dout, q, k, v, out, lse, scale, causal))
                    line.append(f"b{i} {2.5 * flops / t / 1e9:6.1f}{'' if err < 5e-2 else f' BAD {err:.2g}'}")
                print(" ".join(line), flush=True)
for i, (d, name) in enumerate(mod.fwd_variants()):
    print(f"f{i}: {name}")
for i, (d, name) in enumerate(mod.bwd_variants()):
    print(f"b{i}: {name}")
