"""One small variable-length call on the sm90 kernels, checked against torch's SDPA per
sequence: for running under compute-sanitizer one case per process.

  python3 scripts/dev/varlen_probe.py --head-dim 64 --causal --backward --lengths 100,37,300
"""
import argparse

import torch
import torch.nn.functional as F

import flashattn
import flashattn.varlen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--heads", default="4,4", help="heads_q,heads_kv")
    ap.add_argument("--lengths", default="100,37,300")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    a = ap.parse_args()
    hq, hk = (int(x) for x in a.heads.split(","))
    lengths = [int(x) for x in a.lengths.split(",")]
    total = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(total, h, a.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = mk(hq).requires_grad_(), mk(hk).requires_grad_(), mk(hk).requires_grad_()
    assert flashattn.varlen._in_kernels(q, k, v, 0.0, None), "the kernels do not serve this call"
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=a.causal,
                                           deterministic=a.deterministic)
    torch.cuda.synchronize()
    print("forward ran", flush=True)
    dout = torch.randn_like(out)
    if a.backward:
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        print("backward ran", flush=True)
    # Reference: float32 SDPA per sequence.
    worst = {}
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        start += n
        if n == 0:
            continue
        qs, ks, vs = (t[sl].detach().float().transpose(0, 1).requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=a.causal, enable_gqa=hq != hk)
        pairs = [("out", out[sl], ref.transpose(0, 1))]
        if a.backward:
            rg = torch.autograd.grad(ref, (qs, ks, vs), dout[sl].float().transpose(0, 1))
            pairs += [(nm, gr[sl], r.transpose(0, 1)) for nm, gr, r in zip(("dq", "dk", "dv"), grads, rg)]
        for nm, got, want in pairs:
            worst[nm] = max(worst.get(nm, 0.0), (got.float() - want).abs().max().item())
    print("max abs error:", {k: round(v, 4) for k, v in worst.items()}, flush=True)


if __name__ == "__main__":
    main()
