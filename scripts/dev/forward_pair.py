"""flashattn's forward and SDPA's cuDNN backend on the standard grid's inputs (B * N = 16k, H * D = 2048,
bf16, (B, H, N, D)), for the dev scripts that compare the two config by config."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import flashattn  # noqa: E402

TOKENS, MODEL_DIM = 16384, 2048


def forward_pairs(spec):
    """For each "head_dim:seqlen:causal" in the comma-separated spec: (head_dim, seqlen, causal, flops,
    {"flashattn": call, "sdpa_cudnn": call}), the calls taking no arguments."""
    for config in spec.split(","):
        head_dim, seqlen, causal = map(int, config.split(":"))
        batch, heads = TOKENS // seqlen, MODEL_DIM // head_dim
        q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)

        def ours(q=q, k=k, v=v, causal=bool(causal)):
            flashattn.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def cudnn(q=q, k=k, v=v, causal=bool(causal)):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        yield head_dim, seqlen, causal, flops, {"flashattn": ours, "sdpa_cudnn": cudnn}
