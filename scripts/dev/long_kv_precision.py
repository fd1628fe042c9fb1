"""Error of attention over 8.4M keys (k, v past 2^31 elements) for flashattn's two paths and torch SDPA's
flash and cuDNN backends, against a float64 chunked reference of sampled rows: tells an indexing bug
(only flashattn off) from the precision of accumulating that many keys (every kernel off alike).
README.md's Limits cite it for the accuracy of very long key sequences. On the GPU machine (k and v are
4 GiB each): python3 scripts/dev/long_kv_precision.py"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import flashattn  # noqa: E402,F401
from chunked_reference import reference_rows  # noqa: E402

torch.manual_seed(0)
heads_q, heads_kv, d, lq = 8, 2, 128, 256
lk = 2**31 // (heads_kv * d) + 4096
q = torch.randn(1, lq, heads_q, d, device="cuda", dtype=torch.bfloat16)
k = torch.empty(1, lk, heads_kv, d, device="cuda", dtype=torch.bfloat16)
v = torch.empty_like(k)
for t in (k, v):
    for chunk in t.view(-1).split(1 << 28):
        chunk.normal_()
scale = d ** -0.5
rows = torch.arange(0, lq, 8, device="cuda")
ref_out, ref_lse, _ = reference_rows(q, k, v, None, rows, scale, False, False, dtype=torch.float64)
results = {}
for path in ("sm90", "sm80"):
    os.environ["FLASHATTN_FORCE_SM80"] = "1" if path == "sm80" else "0"
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, False, False)
    results[path] = (out[:, rows], lse[:, :, rows])
for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
    try:
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True).transpose(1, 2)
        results[name] = (o[:, rows], None)
    except Exception as exc:  # noqa: BLE001
        print(f"{name}: unavailable ({type(exc).__name__}: {str(exc)[:120]})")
print(f"max|ref out| {ref_out.abs().max().item():.3e}, mean|ref out| {ref_out.abs().mean().item():.3e}")
for name, (o, lse) in results.items():
    err = (o.double() - ref_out).abs()
    line = f"{name:11s} out max err {err.max().item():.3e} mean err {err.mean().item():.3e}"
    line += f" mean signed (out - ref) * sign(ref) {((o.double() - ref_out) * ref_out.sign()).mean().item():+.3e}"
    if lse is not None:
        line += f" lse max err {(lse.double() - ref_lse).abs().max().item():.3e}"
    print(line)
bf16 = ref_out.to(torch.bfloat16).double()
print(f"rounding ref to bf16 alone: max err {(bf16 - ref_out).abs().max().item():.3e}")
