"""Attention references for sequences too long for flashattn.attention_reference: exact math (float32
or float64) on a chosen subset of query rows or key columns, streaming over the other side in
chunks, so nothing N x N is ever materialized. Tensors are ``[B, S, H, D]`` like the flashattn ops;
query head h reads key/value head ``h // (Hq // Hk)``. Checked against attention_reference in
tests/test_chunked_reference.py; used by tests/test_gpu_reliability.py.
"""
from __future__ import annotations

import torch


def _visible(rows, keys, seqlen_q, seqlen_k, is_causal, bottom_right):
    """Bool ``[len(rows), len(keys)]``: key j visible to query i (absolute indices)."""
    if not is_causal:
        return torch.ones(rows.numel(), keys.numel(), dtype=torch.bool, device=rows.device)
    offset = seqlen_k - seqlen_q if bottom_right else 0
    return keys[None, :] <= rows[:, None] + offset


def _grouped(t, heads_kv):
    """``[B, S, Hq, D]`` -> ``[B, S, Hk, G, D]`` (a view)."""
    b, s, h, d = t.shape
    return t.reshape(b, s, heads_kv, h // heads_kv, d)


def reference_rows(q, k, v, dout, rows, scale, is_causal=False, bottom_right=False, dtype=torch.float32,
                   key_chunk=1 << 16):
    """out, lse and dq of the query rows ``rows`` (all heads), over every key in chunks of ``key_chunk``.

    Returns ``out [B, R, Hq, D]``, ``lse [B, Hq, R]`` (-inf for a row that sees no key, whose out and
    dq are 0) and ``dq [B, R, Hq, D]`` (None when ``dout`` is None), all in ``dtype``. dq uses the exact
    delta = rowsum(dout * out) of the reference out.
    """
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    rows = torch.as_tensor(rows, device=q.device)
    q_rows = _grouped(q[:, rows].to(dtype), heads_kv)  # [B, R, Hk, G, D]
    shape = (batch, heads_kv, heads_q // heads_kv, rows.numel())  # [B, Hk, G, R]
    row_max = torch.full(shape, float("-inf"), dtype=dtype, device=q.device)
    row_sum = torch.zeros(shape, dtype=dtype, device=q.device)
    acc = torch.zeros(shape + (head_dim,), dtype=dtype, device=q.device)

    def chunks():
        for k0 in range(0, seqlen_k, key_chunk):
            k1 = min(k0 + key_chunk, seqlen_k)
            keys = torch.arange(k0, k1, device=q.device)
            visible = _visible(rows, keys, seqlen_q, seqlen_k, is_causal, bottom_right)  # [R, K]
            k_c, v_c = k[:, k0:k1].to(dtype), v[:, k0:k1].to(dtype)
            scores = torch.einsum("brhgd,bkhd->bhgrk", q_rows, k_c) * scale
            yield scores.masked_fill(~visible, float("-inf")), k_c, v_c

    for scores, _, v_c in chunks():  # online softmax
        new_max = torch.maximum(row_max, scores.amax(-1))
        base = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
        correction = torch.exp(row_max - base)
        probs = torch.exp(scores - base[..., None])
        row_sum = row_sum * correction + probs.sum(-1)
        acc = acc * correction[..., None] + torch.einsum("bhgrk,bkhd->bhgrd", probs, v_c)
        row_max = new_max
    seen = row_sum > 0
    lse = torch.where(seen, row_max + torch.log(torch.where(seen, row_sum, torch.ones_like(row_sum))),
                      torch.full_like(row_sum, float("-inf")))
    out = torch.where(seen[..., None], acc / torch.where(seen, row_sum, torch.ones_like(row_sum))[..., None], 0.0)

    def to_bshd(t):  # [B, Hk, G, R, D] -> [B, R, Hq, D]
        return t.permute(0, 3, 1, 2, 4).reshape(batch, rows.numel(), heads_q, head_dim)

    dq = None
    if dout is not None:
        dout_rows = _grouped(dout[:, rows].to(dtype), heads_kv).permute(0, 2, 3, 1, 4)  # [B, Hk, G, R, D]
        delta = (dout_rows * out).sum(-1)  # [B, Hk, G, R]
        lse_safe = torch.where(seen, lse, torch.full_like(lse, float("inf")))  # P = 0 for an empty row
        dq = torch.zeros_like(acc)
        for scores, k_c, v_c in chunks():
            probs = torch.exp(scores - lse_safe[..., None])
            dp = torch.einsum("bhgrd,bkhd->bhgrk", dout_rows, v_c)
            dq += torch.einsum("bhgrk,bkhd->bhgrd", probs * (dp - delta[..., None]), k_c)
        dq = to_bshd(dq * scale)
    return to_bshd(out), lse.reshape(batch, heads_q, rows.numel()), dq


def reference_keys(q, k, v, dout, out, lse, keys, scale, is_causal=False, bottom_right=False, dtype=torch.float32,
                   query_chunk=1 << 16):
    """dk and dv of the key rows ``keys`` (all heads), over every query in chunks of ``query_chunk``.

    As FlashAttention's backward defines them: P from the given ``lse [B, Hq, Lq]`` and delta =
    rowsum(dout * out) from the given ``out`` (pass the forward's own, checked on their own). Returns
    ``dk, dv [B, K, Hk, D]`` in ``dtype``.
    """
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    keys = torch.as_tensor(keys, device=q.device)
    k_sel, v_sel = k[:, keys].to(dtype), v[:, keys].to(dtype)  # [B, K, Hk, D]
    dk = torch.zeros_like(k_sel)
    dv = torch.zeros_like(v_sel)
    for q0 in range(0, seqlen_q, query_chunk):
        q1 = min(q0 + query_chunk, seqlen_q)
        rows = torch.arange(q0, q1, device=q.device)
        visible = _visible(rows, keys, seqlen_q, seqlen_k, is_causal, bottom_right)  # [C, K]
        q_c = _grouped(q[:, q0:q1].to(dtype), heads_kv)  # [B, C, Hk, G, D]
        dout_c = _grouped(dout[:, q0:q1].to(dtype), heads_kv)
        delta = (dout_c * _grouped(out[:, q0:q1].to(dtype), heads_kv)).sum(-1).permute(0, 2, 3, 1)  # [B, Hk, G, C]
        lse_c = lse[:, :, q0:q1].to(dtype).reshape(batch, heads_kv, group, q1 - q0)
        lse_c = torch.where(torch.isneginf(lse_c), torch.full_like(lse_c, float("inf")), lse_c)
        scores = torch.einsum("bchgd,bkhd->bhgck", q_c, k_sel) * scale
        probs = torch.exp(scores - lse_c[..., None]).masked_fill(~visible, 0.0)
        dp = torch.einsum("bchgd,bkhd->bhgck", dout_c, v_sel)
        dv += torch.einsum("bhgck,bchgd->bkhd", probs, dout_c)
        dk += torch.einsum("bhgck,bchgd->bkhd", probs * (dp - delta[..., None]), q_c)
    return dk * scale, dv
