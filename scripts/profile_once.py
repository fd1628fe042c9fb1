#!/usr/bin/env python3
"""One forward and one backward of flashattn and of SDPA's flash backend (bf16), for ncu to profile:
  ncu -k regex:'fwd_kernel|bwd_kernel|flash_fwd|flash_bwd' python3 scripts/profile_once.py [D] [N]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn._C  # noqa: F401

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
b, h = 16384 // n, 2048 // d
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out, lse = torch.ops.flashattn.fwd(q, k, v, d ** -0.5, False, False)
dout = torch.randn_like(out)
torch.ops.flashattn.bwd(dout, q, k, v, out, lse, d ** -0.5, False, False)
qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(qt, kt, vt)
    o.backward(dout.transpose(1, 2))
torch.cuda.synchronize()
