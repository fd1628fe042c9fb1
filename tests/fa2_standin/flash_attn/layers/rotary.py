"""``flash_attn.layers.rotary.apply_rotary_emb`` over flashattn's rotary embedding (the one
``flash_attn_with_kvcache`` applies to the queries and the new keys)."""
import torch

from flashattn.kvcache import _rotate


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, heads, headdim), or packed (total, heads, headdim) with cu_seqlens (batch + 1,), its
    first rotary_dim = 2 * cos.size(1) dims rotated by the angles of row ``seqlen_offsets + t`` of cos / sin
    (seqlen_ro, rotary_dim / 2) for the t-th token of each sequence. seqlen_offsets: an int or a (batch,)
    tensor. Interleaved: dims (0, 1), (2, 3), ... rotate together; else d and d + rotary_dim / 2."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).reshape(-1, 1)
        positions = offsets.long() + torch.arange(seqlen, device=x.device)  # (batch or 1, seqlen)
        out = _rotate(x, cos, sin, positions.expand(batch, seqlen), interleaved)
    else:
        starts = cu_seqlens[:-1].long()
        total = x.shape[0]
        sequence = torch.bucketize(torch.arange(total, device=x.device), cu_seqlens[1:].long(), right=True)
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1)
        offsets = offsets[sequence] if offsets.numel() > 1 else offsets.expand(total)
        positions = torch.arange(total, device=x.device) - starts[sequence] + offsets  # (total,)
        out = _rotate(x.unsqueeze(0), cos, sin, positions.unsqueeze(0), interleaved).squeeze(0)
    if inplace:
        x.copy_(out)
        return x
    return out
