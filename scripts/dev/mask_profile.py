"""Per-kernel CUDA time of the mask figures' calls (bench_masks.py's cases, bf16, B * N = 16k,
H * D = 2048): where a masked call spends the time its unmasked twin does not. A look while changing
the mask paths; benchmarks/bench_masks.py is the measurement of record.
Usage: mask_profile.py [head dim] [seqlen] [case]: with a case name ("padding mask", "no mask", ...),
only that case's forward, three times and without the profiler, for a profiler run from outside
(scripts/device_run.sh ncu)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from flashattn import ops

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
b, h = 16384 // n, 2048 // d
dev = "cuda"
q, k, v = (torch.randn(b, n, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
scale = d ** -0.5
tril = torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(b, h, n, n)
keep = torch.ones(b, 1, 1, n, dtype=torch.bool, device=dev)
keep[::2, ..., n - n // 10:] = False
padding = keep.expand(b, h, n, n)
rng_state = torch.tensor([1234, 5678], dtype=torch.int64, device=dev)
cases = {
    "is_causal": lambda: ops.fwd(q, k, v, scale, True, False)[0],
    "tril mask": lambda: ops.fwd(q, k, v, scale, False, False, tril)[0],
    "no mask": lambda: ops.fwd(q, k, v, scale, False, False)[0],
    "padding mask": lambda: ops.fwd(q, k, v, scale, False, False, padding)[0],
    "dropout 0.1": lambda: ops.attention(q, k, v, scale, False, False, dropout_p=0.1, rng_state=rng_state)[0],
}
if len(sys.argv) > 3:
    with torch.no_grad():
        for _ in range(3):
            cases[sys.argv[3]]()
    torch.cuda.synchronize()
    sys.exit(0)
for name, fn in cases.items():
    for mode in ("fwd", "fwdbwd"):
        def call():
            if mode == "fwd":
                with torch.no_grad():
                    fn()
            else:
                out = fn()
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time_total / 5
        total = sum(kernels.values())
        print(f"d={d} n={n} {name:13s} {mode:6s} total {total:8.1f} us:", flush=True)
        for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:6]:
            print(f"    {us:8.1f} us  {kname[:110]}", flush=True)
