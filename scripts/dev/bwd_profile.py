"""One backward call of flash_attn_func, three times, for a profiler run from outside
(scripts/device_run.sh ncubwd): bf16, B * N = 16k, H * D = 2048, the bench grid's shapes.
Usage: bwd_profile.py [head dim] [seqlen] [causal: 0 or 1]

Each call runs the preprocess, the main kernel and the dq conversion; the forward that makes out and
the LSE runs once, before them, so ``-k "regex:bwd_(wide_)?kernel" --launch-skip 1 --launch-count 1`` picks the
second call's main kernel (the first one's pays for module loading)."""
import sys

import torch

import flashattn

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
causal = len(sys.argv) > 3 and sys.argv[3] == "1"
b, h = max(16384 // n, 1), 2048 // d
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flashattn.flash_attn_func(q, k, v, causal=causal)
dout = torch.randn_like(out)
for _ in range(3):
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
print(f"backward D={d} N={n} causal={causal}: ran")
