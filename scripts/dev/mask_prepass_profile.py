"""Per-kernel device times of the sm90 forward with a tril boolean mask against is_causal=True: the mask's
prepasses (tile classes, the causal key-length form) beside the attention kernels, from torch.profiler.

    python3 scripts/dev/mask_prepass_profile.py
"""
import torch

from flashattn import ops

CALLS = 10


def profile(name, call):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    print(f"== {name}")
    for event in prof.key_averages():
        us = event.device_time_total / CALLS
        if us > 0:
            print(f"  {us:9.1f} us  x{event.count // CALLS}  {event.key[:110]}")


def main():
    torch.manual_seed(0)
    for head_dim, seqlen in [(128, 4096), (64, 1024)]:
        batch, heads = 16384 // seqlen, 2048 // head_dim
        q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        tril = torch.ones(seqlen, seqlen, dtype=torch.bool, device="cuda").tril().expand(batch, heads, seqlen, seqlen)
        scale = head_dim**-0.5
        profile(f"D={head_dim} N={seqlen} is_causal", lambda: ops.fwd(q, k, v, scale, True, False, None))
        profile(f"D={head_dim} N={seqlen} tril mask", lambda: ops.fwd(q, k, v, scale, False, False, tril))


if __name__ == "__main__":
    main()
