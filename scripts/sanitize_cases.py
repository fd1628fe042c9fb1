#!/usr/bin/env python3
"""The workload that scripts/sanitize.py runs under each compute-sanitizer tool.

Every case (a small shape with an awkward size, head dim, causal alignment, dtype or memory layout)
runs in these phases, in this order, each over all cases before the next begins:

  fwd-default        torch.ops.flashattn.fwd as the planner chooses: the kernel the dispatch
                     picks (on Hopper the sm90 kernel where it applies, the sm80 one elsewhere)
  fwd-sm80           the same calls with the planner's force_sm80 option (flashattn.plan)
  bwd-default        torch.ops.flashattn.bwd, likewise, on out and lse from flashattn's CPU implementation
  bwd-sm80           the same with force_sm80
  bwd-deterministic  bwd(..., deterministic=True), where the op has that argument
  decode             flash_attn_with_kvcache on cases of its own (DECODE_CASES: contiguous and paged
                     caches, split keys, GQA, windows), which on CUDA run the decode op

Inputs are drawn on the CPU and copied to the GPU (a memcpy, no kernel), strided views are taken on
the GPU, and results are copied back and compared with the CPU implementation there, so nearly every
kernel the sanitizer sees is one of flashattn's. The comparison is a loose sanity check (a few percent
of the largest value) that catches garbage, not the oracle: tests/ hold the kernels to the oracle.

Lines starting with "@@" are markers for sanitize.py: "@@ items N", "@@ phases P,Q,...",
"@@ begin I PHASE CASE", "@@ end I", "@@ fail I MESSAGE", "@@ finished". Exit status 0 when every
item ran and passed its check, 1 when a check failed, 3 when a CUDA error left the context unusable
(sanitize.py then resumes with --skip).

  python3 scripts/sanitize_cases.py --list            # the cases
  python3 scripts/sanitize_cases.py --dry-run         # every item on the CPU implementation, no GPU
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn  # noqa: E402  (registers torch.ops.flashattn)
import flashattn.plan  # noqa: E402

PHASES = ("fwd-default", "fwd-sm80", "bwd-default", "bwd-sm80", "bwd-deterministic", "decode")
CAUSAL_MODES = {"none": (False, False), "top_left": (True, False), "bottom_right": (True, True)}
F16, BF16 = torch.float16, torch.bfloat16


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: str  # a key of CAUSAL_MODES
    layout: str  # "contiguous", "bhsd" (a transposed [B, H, S, D] tensor) or "unaligned"
    # "none"; "bool" (a (B, 1, Lq, Lk) random mask with whole tiles excluded, broadcast over heads);
    # "float" (a (1, Hq, Lq, Lk) additive mask with -inf entries, broadcast over batch, whose gradient
    # the backward writes); "prefix" (a (B, 1, 1, Lk) boolean padding mask keeping each sequence's first
    # keys: key-prefix tiles); "padding" (a (3, 1, 1, Lk) boolean padding mask whose rows keep all keys,
    # no key, and half the keys but one: the sm90 forward runs the first two in its unmasked kernel
    # and the last in its masked kernel, each launch leaving the other's rows alone); "causal_padding"
    # (a (3, 1, Lq, Lk) boolean causal mask on the bottom-right diagonal (Lq <= Lk): alone, with right
    # padding, and with a hole in one row: the sm90 kernels run the first two as causal attention over
    # their key prefix and the last in their masked kernels)
    mask: str = "none"
    dropout_p: float = 0.0  # with a fixed rng_state, so the CPU and GPU keep-masks are the same
    sink: bool = False  # attention sinks (one logit per query head) in fwd, and their gradient in bwd
    softcap: float = 0.0  # scores capped to softcap * tanh(score / softcap) (0: none)
    window: Tuple[int, int] = (-1, -1)  # a sliding window (window_left, window_right; -1 unbounded)
    alibi: str = "none"  # ALiBi's slopes: "none", "heads" ((Hq,) slopes) or "batch" ((B, Hq) slopes)


def _case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, layout="contiguous", mask="none",
          dropout_p=0.0, sink=False, softcap=0.0, window=(-1, -1), alibi="none"):
    dtype_name = "fp16" if dtype == F16 else "bf16"
    name = (f"b{batch}-q{seqlen_q}-k{seqlen_k}-h{heads_q}/{heads_kv}-d{head_dim}-{dtype_name}-{causal}"
            + ("" if layout == "contiguous" else f"-{layout}") + ("" if mask == "none" else f"-{mask}mask")
            + ("" if dropout_p == 0.0 else f"-dropout{dropout_p}") + ("-sink" if sink else "")
            + ("" if softcap == 0.0 else f"-softcap{softcap:g}")
            + ("" if window == (-1, -1) else f"-window{window[0]}/{window[1]}")
            + ("" if alibi == "none" else f"-alibi_{alibi}"))
    return Case(name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, layout, mask, dropout_p,
                sink, softcap, window, alibi)


# memcheck, initcheck, synccheck: seqlen 1, 17, 97, 1025, Lq != Lk both ways, every compiled head-dim
# tile (32, 64, 96, 128, 192, 256; 40 and 72 are padded), GQA and MQA, both causal alignments (and rows
# that see no key), fp16 and bf16, transposed views and rows that are not 16-byte aligned (the
# element-wise load path). Batch and heads stay tiny: the sanitizers slow kernels 10-100x.
FULL_CASES = [
    _case(1, 1, 1, 2, 2, 64, F16, "none"),
    _case(1, 17, 17, 2, 2, 40, BF16, "top_left"),
    _case(1, 97, 97, 4, 2, 72, F16, "bottom_right"),
    _case(1, 1025, 1025, 2, 2, 128, BF16, "top_left"),
    _case(1, 17, 1025, 4, 2, 256, F16, "bottom_right"),
    _case(1, 1025, 97, 2, 1, 64, BF16, "bottom_right"),  # 928 rows see no key
    _case(2, 97, 17, 2, 2, 128, F16, "top_left"),
    _case(1, 1, 97, 2, 2, 32, BF16, "none"),
    _case(1, 97, 97, 2, 2, 192, F16, "none"),
    _case(1, 97, 1025, 4, 2, 256, BF16, "none", "bhsd"),
    _case(1, 97, 97, 2, 2, 64, F16, "top_left", "bhsd"),
    _case(1, 1025, 97, 2, 2, 40, F16, "bottom_right", "unaligned"),
    _case(1, 97, 97, 4, 2, 72, BF16, "top_left", "unaligned"),
    _case(1, 17, 1025, 2, 2, 256, F16, "none", "unaligned"),
    # long rows: the sm90 forward with three consumer warpgroups at tile width 64
    _case(1, 2100, 2048, 1, 1, 64, BF16, "none"),
    _case(1, 4096, 4096, 1, 1, 40, F16, "bottom_right"),
    # causal with more tiles than SMs: pairs, then the sm90 forward's dynamic tail, whose last tiles see no key
    _case(1, 1024, 300, 80, 16, 64, BF16, "bottom_right"),
    # attention masks: the masked kernels of both paths, tile skipping, the mask gradient
    _case(2, 97, 300, 2, 1, 64, BF16, "none", mask="bool"),
    _case(1, 300, 97, 2, 2, 128, F16, "bottom_right", mask="float"),
    _case(1, 1025, 1025, 2, 2, 256, BF16, "top_left", "bhsd", mask="bool"),
    _case(1, 97, 203, 4, 2, 40, F16, "none", "unaligned", mask="float"),
    _case(2, 97, 300, 2, 1, 64, BF16, "none", mask="prefix"),
    _case(2, 150, 300, 2, 2, 128, F16, "top_left", mask="prefix"),
    _case(3, 300, 300, 2, 2, 128, BF16, "none", mask="padding"),
    _case(3, 300, 300, 2, 2, 128, BF16, "none", mask="causal_padding"),
    _case(3, 129, 300, 2, 2, 64, F16, "none", mask="causal_padding"),
    # dropout: the keep-mask regenerated in the forward (both paths) and the backward
    _case(2, 97, 300, 2, 1, 64, BF16, "none", dropout_p=0.2),
    _case(1, 300, 97, 2, 2, 128, F16, "bottom_right", mask="float", dropout_p=0.5),
    _case(1, 17, 1025, 2, 2, 256, BF16, "top_left", "unaligned", dropout_p=0.1),
    _case(1, 97, 97, 4, 2, 32, F16, "top_left", dropout_p=0.3),
    # the sm90 wide backward (tile widths 256 and 192, whose consumers own 128 and 64 head dims) with a
    # mask, its gradient and dropout
    _case(1, 300, 200, 2, 1, 256, BF16, "bottom_right", mask="float", dropout_p=0.2),
    _case(1, 200, 300, 2, 2, 160, F16, "top_left", mask="float", dropout_p=0.2),
    # K/V multicast (sm90 forward, tile width 128, no causal masking, an even number of query tiles)
    _case(1, 200, 1025, 4, 2, 112, BF16, "none"),
    # attention sinks: the forwards' epilogues (rows without keys among them) and the gradient's reduction
    _case(1, 300, 97, 4, 2, 64, BF16, "bottom_right", sink=True),
    _case(1, 200, 300, 2, 1, 256, F16, "none", mask="float", sink=True),
    # score soft-capping: the tanh after every QK^T product and the backward's chain factor
    _case(1, 300, 97, 4, 2, 64, BF16, "bottom_right", softcap=2.0),
    _case(1, 200, 300, 2, 1, 256, F16, "top_left", mask="bool", dropout_p=0.2, softcap=2.0),
    _case(2, 97, 300, 2, 1, 128, BF16, "none", mask="prefix", softcap=2.0),
    # sliding windows: key blocks skipped on both sides, blocks cut at both edges, rows without keys
    _case(1, 700, 500, 4, 2, 64, BF16, "bottom_right", window=(90, 0)),
    _case(1, 300, 600, 2, 1, 128, F16, "none", window=(60, 130)),
    _case(1, 500, 500, 2, 2, 256, BF16, "none", dropout_p=0.2, window=(100, 40)),
    # ALiBi's term in the sm90 kernels (the slopes read per batch and head), with a window, dropout, sinks
    _case(2, 300, 517, 4, 2, 128, BF16, "bottom_right", alibi="batch"),
    _case(1, 517, 300, 2, 1, 64, F16, "none", dropout_p=0.2, window=(100, 40), alibi="heads"),
    _case(2, 200, 300, 2, 1, 256, BF16, "none", sink=True, alibi="batch"),
]

# racecheck (the slowest tool): one short case per head-dim tile, long enough to cross the query and
# key tiles of both kernels and to run several steps of the backward's double buffer (GQA group 2),
# and the element-wise load path twice.
RACE_CASES = [
    _case(1, 129, 150, 2, 1, 32, F16, "top_left"),
    _case(1, 129, 150, 2, 1, 40, BF16, "bottom_right"),
    _case(1, 150, 129, 2, 1, 72, F16, "top_left"),
    _case(1, 300, 150, 2, 1, 96, BF16, "none"),  # width 96's alternating dQ owners, ten steps
    _case(1, 129, 150, 2, 1, 128, BF16, "none"),
    _case(1, 129, 150, 2, 1, 192, F16, "bottom_right"),
    _case(1, 129, 150, 2, 1, 256, BF16, "top_left"),
    _case(1, 129, 150, 2, 1, 40, F16, "top_left", "unaligned"),
    _case(1, 150, 129, 2, 1, 128, BF16, "bottom_right", "unaligned"),
    _case(1, 2048, 2048, 1, 1, 64, F16, "none"),  # three consumers; the last tile's third without rows
    _case(1, 512, 512, 40, 8, 64, F16, "top_left"),  # more tiles than SMs: every tile from the dynamic tail
    _case(1, 129, 300, 2, 1, 64, F16, "none", mask="bool"),
    _case(1, 150, 300, 2, 1, 128, BF16, "top_left", mask="float"),
    _case(2, 129, 300, 2, 1, 64, F16, "none", mask="prefix"),
    _case(3, 129, 300, 2, 1, 64, F16, "none", mask="padding"),
    _case(3, 129, 300, 2, 2, 64, F16, "none", mask="causal_padding"),
    _case(1, 129, 300, 2, 1, 64, BF16, "none", dropout_p=0.2),
    _case(1, 129, 300, 2, 1, 256, F16, "top_left", mask="bool", dropout_p=0.2),  # the masked wide backward
    _case(1, 256, 300, 2, 1, 128, BF16, "none", "bhsd"),  # K/V multicast, both tiles' rows full
    _case(1, 150, 129, 2, 1, 128, F16, "bottom_right", sink=True),
    _case(1, 129, 150, 2, 1, 64, BF16, "none", dropout_p=0.2, softcap=2.0),
    _case(1, 600, 600, 2, 1, 128, BF16, "bottom_right", window=(150, 0)),
    _case(2, 129, 300, 2, 1, 96, BF16, "bottom_right", alibi="batch"),
]

# The sm90 forward's K/V multicast (clusters of two CTAs): the cases of the lists above that run it
# (tile width 128 by default), and one with 192-query tiles (tile width 64 runs it only when
# FLASHATTN_SM90_MULTICAST=1, which sanitize.py passes through from its environment).
MULTICAST_CASES = [
    _case(1, 200, 1025, 4, 2, 112, BF16, "none"),
    _case(1, 129, 150, 2, 1, 128, BF16, "none"),  # the second tile's second warpgroup has no rows
    _case(1, 256, 300, 2, 1, 128, BF16, "none", "bhsd"),
    _case(2, 512, 300, 4, 2, 128, F16, "none"),
    _case(1, 4096, 2048, 1, 1, 64, BF16, "none"),
]

CASE_SETS = {"full": FULL_CASES, "race": RACE_CASES, "multicast": MULTICAST_CASES}


def _make(case: Case, seqlen: int, heads: int, gen: torch.Generator, device) -> torch.Tensor:
    """A [B, S, H, D] tensor in the case's layout: the storage is drawn on the CPU and copied whole."""
    b, d = case.batch, case.head_dim
    if case.layout == "contiguous":
        return torch.randn(b, seqlen, heads, d, generator=gen).to(case.dtype).to(device)
    if case.layout == "bhsd":
        return torch.randn(b, heads, seqlen, d, generator=gen).to(case.dtype).to(device).transpose(1, 2)
    if case.layout == "unaligned":
        # Rows start at an odd element and the row stride H * (D + 3) is not a multiple of 8 elements.
        base = torch.randn(b, seqlen, heads, d + 3, generator=gen).to(case.dtype).to(device)
        return base[..., 1 : d + 1]
    raise ValueError(case.layout)


def _inputs(case: Case, seed: int, device):
    gen = torch.Generator().manual_seed(seed)
    q = _make(case, case.seqlen_q, case.heads_q, gen, device)
    k = _make(case, case.seqlen_k, case.heads_kv, gen, device)
    v = _make(case, case.seqlen_k, case.heads_kv, gen, device)
    dout = torch.randn(case.batch, case.seqlen_q, case.heads_q, case.head_dim, generator=gen).to(case.dtype).to(device)
    return q, k, v, dout, _mask(case, gen, device)


def _mask(case: Case, gen: torch.Generator, device):
    """The case's attention mask as the [B, Hq, Lq, Lk] broadcast view the ops take, or None."""
    if case.mask == "none":
        return None
    lq, lk = case.seqlen_q, case.seqlen_k
    full = (case.batch, case.heads_q, lq, lk)
    if case.mask == "prefix":
        lengths = torch.randint(1, lk + 1, (case.batch, 1, 1, 1), generator=gen)
        return (torch.arange(lk) < lengths).to(device).expand(full)
    if case.mask == "padding":
        keep = torch.arange(lk) < torch.tensor([lk, 0, lk // 2]).reshape(3, 1, 1, 1)
        keep[2, ..., lk // 4] = False
        return keep.to(device).expand(full)
    if case.mask == "causal_padding":
        queries, keys = torch.arange(lq).reshape(lq, 1), torch.arange(lk)
        keep = (keys <= queries + lk - lq) & (keys < torch.tensor([lk, lk // 2, lk]).reshape(3, 1, 1, 1))
        keep[2, :, lq // 2, 0] = False
        return keep.to(device).expand(full)
    keep = torch.rand(lq, lk, generator=gen) < 0.7
    # Whole 64 x 64 tiles excluded, so both kernels skip tiles.
    tiles = torch.rand((lq + 63) // 64, (lk + 63) // 64, generator=gen) < 0.6
    keep &= tiles.repeat_interleave(64, 0).repeat_interleave(64, 1)[:lq, :lk]
    if case.mask == "bool":
        return keep.expand(case.batch, 1, lq, lk).clone().to(device).expand(full)
    bias = torch.randn(case.heads_q, lq, lk, generator=gen).masked_fill(~keep, float("-inf"))
    return bias.to(case.dtype).to(device).unsqueeze(0).expand(full)


def _sink(case: Case, device):
    """The case's sink logits (heads_q,) float32, or None."""
    if not case.sink:
        return None
    return torch.linspace(-1.0, 2.0, case.heads_q).to(device)


def _alibi(case: Case, device):
    """The case's ALiBi slopes, float32 (Hq,) or (B, Hq), or None."""
    if case.alibi == "none":
        return None
    slopes = torch.exp2(-8.0 * torch.arange(1, case.heads_q + 1) / case.heads_q)
    if case.alibi == "batch":
        slopes = slopes * torch.linspace(1.0, 0.5, case.batch)[:, None]
    return slopes.contiguous().to(device)


def _dsink(sink):
    return None if sink is None else torch.empty_like(sink)


def _dmask(mask):
    """A buffer for the mask's gradient (a floating mask only), or None."""
    if mask is None or mask.dtype == torch.bool:
        return None
    return torch.empty(mask.shape, dtype=mask.dtype, device=mask.device)


def _args(case: Case):
    is_causal, bottom_right = CAUSAL_MODES[case.causal]
    return 1.0 / math.sqrt(case.head_dim), is_causal, bottom_right


def _dropout(case: Case, index: int, device):
    """(dropout_p, rng_state) of the case: a fixed seed per item, so the CPU and GPU drop the same."""
    if case.dropout_p == 0.0:
        return 0.0, None
    return case.dropout_p, torch.tensor([1000 + index, 7], dtype=torch.int64, device=device)


class Expected:
    """flashattn's CPU results for each case (the bwd phase's inputs and the sanity check's reference)."""

    def __init__(self):
        self._cache = {}

    def __call__(self, index: int, case: Case):
        if index not in self._cache:
            q, k, v, dout, mask = _inputs(case, index, "cpu")
            scale, is_causal, bottom_right = _args(case)
            p, rng = _dropout(case, index, "cpu")
            sink, alibi = _sink(case, "cpu"), _alibi(case, "cpu")
            out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right, mask, p, rng, False, sink,
                                               case.softcap, *case.window, alibi_slopes=alibi)
            dmask, dsink = _dmask(mask), _dsink(sink)
            grads = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, bottom_right, False, mask, dmask,
                                            p, rng, sink, dsink, case.softcap, *case.window, alibi_slopes=alibi)
            self._cache[index] = (out, lse, grads + tuple(t for t in (dmask, dsink) if t is not None))
        return self._cache[index]


def _check(name: str, got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    got = got.detach().cpu().double()
    want = want.double()
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if got.numel() == 0:
        return
    if name == "lse":  # -inf exactly where a row sees no key
        empty = torch.isneginf(want)
        if not torch.equal(torch.isneginf(got), empty):
            raise AssertionError("lse: -inf rows differ from the CPU implementation")
        got, want = got[~empty], want[~empty]
        if got.numel() == 0:
            return
    if not torch.isfinite(got).all():
        raise AssertionError(f"{name}: NaN or inf")
    err = (got - want).abs().max().item()
    bound = rel * max(1.0, want.abs().max().item())
    if err > bound:
        raise AssertionError(f"{name}: max|gpu - cpu| = {err:.3e} > {bound:.3e}")


def has_deterministic_bwd() -> bool:
    return any(a.name == "deterministic" for a in torch.ops.flashattn.bwd.default._schema.arguments)


def run_item(phase: str, index: int, case: Case, expected: Expected, device) -> None:
    scale, is_causal, bottom_right = _args(case)
    q, k, v, dout, mask = _inputs(case, index, device)
    p, rng = _dropout(case, index, device)
    out_cpu, lse_cpu, grads_cpu = expected(index, case)
    sink, alibi = _sink(case, device), _alibi(case, device)
    flashattn.plan.set_options(force_sm80=phase.endswith("-sm80"))
    try:
        if phase.startswith("fwd"):
            out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right, mask, p, rng, False, sink,
                                               case.softcap, *case.window, alibi_slopes=alibi)
        else:
            out, lse = out_cpu.to(device), lse_cpu.to(device)
            dmask, dsink = _dmask(mask), _dsink(sink)
            grads = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, bottom_right,
                                            phase == "bwd-deterministic", mask, dmask, p, rng, sink, dsink,
                                            case.softcap, *case.window, alibi_slopes=alibi)
            grads = grads + tuple(t for t in (dmask, dsink) if t is not None)
    finally:
        flashattn.plan.set_options(force_sm80=False)
    if phase.startswith("fwd"):
        _check("out", out, out_cpu, 0.02)
        _check("lse", lse, lse_cpu, 0.01)
    else:
        names = ("dq", "dk", "dv") + (("dmask",) if case.mask == "float" else ()) + (("dsink",) if case.sink else ())
        for name, g, want in zip(names, grads, grads_cpu):
            _check(name, g, want, 0.05)


@dataclass(frozen=True)
class DecodeCase:
    name: str
    batch: int
    seqlen_q: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    page_size: int = 0  # 0: a contiguous cache
    num_splits: int = 0
    window_left: int = -1
    leftpad: bool = False
    capacity: int = 200  # keys a sequence can hold
    alibi: bool = False  # (batch, heads_q) ALiBi slopes


# Each names what it reaches in the decode kernel: row blocks past the group (MQA), splits larger than the
# key blocks, pages of one row and of a size that is not a power of two, the padded head-dim widths.
DECODE_CASES = [
    DecodeCase("gqa4-d128-contiguous", 4, 1, 8, 2, 128, BF16, False),
    DecodeCase("gqa4-d128-splits64", 4, 1, 8, 2, 128, BF16, False, num_splits=64),
    DecodeCase("mqa-d64-causal-q3", 3, 3, 16, 1, 64, F16, True, num_splits=3),
    DecodeCase("d80-paged48", 3, 1, 4, 4, 80, BF16, False, page_size=48, num_splits=5),
    DecodeCase("d256-paged1-window", 3, 2, 4, 2, 256, BF16, True, page_size=1, window_left=20),
    DecodeCase("d192-leftpad-paged16", 3, 1, 6, 2, 192, F16, False, page_size=16, leftpad=True, num_splits=2),
    DecodeCase("d96-long", 1, 1, 8, 8, 96, BF16, False, num_splits=0, capacity=5000),
    DecodeCase("gqa4-d128-alibi-paged16-causal-q2", 3, 2, 8, 2, 128, BF16, True, page_size=16, num_splits=3,
               alibi=True),
]


def run_decode_item(index: int, case: DecodeCase, device) -> None:
    flashattn.kvcache.decode_op_enabled = True  # this phase is the decode op's, whatever FLASHATTN_DECODE_OP says
    gen = torch.Generator().manual_seed(5000 + index)
    lengths = torch.tensor([case.capacity, 0, 37, case.capacity - 1][:case.batch], dtype=torch.int32)
    q = torch.randn(case.batch, case.seqlen_q, case.heads_q, case.head_dim, generator=gen).to(case.dtype)
    k = torch.randn(case.batch, case.capacity, case.heads_kv, case.head_dim, generator=gen).to(case.dtype)
    v = torch.randn(case.batch, case.capacity, case.heads_kv, case.head_dim, generator=gen).to(case.dtype)
    leftpad = torch.minimum(lengths, torch.tensor(5, dtype=torch.int32)) if case.leftpad else None
    kwargs = dict(causal=case.causal, window_size=(case.window_left, -1), num_splits=case.num_splits,
                  return_softmax_lse=True)
    if case.alibi:
        kwargs["alibi_slopes"] = torch.rand(case.batch, case.heads_q, generator=gen) * 0.3
    want_out, want_lse = flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, cache_leftpad=leftpad,
                                                           **kwargs)
    block_table = None
    if case.page_size:
        pages_per_seq = -(-case.capacity // case.page_size)
        order = torch.randperm(case.batch * pages_per_seq, generator=gen)
        block_table = order.view(case.batch, pages_per_seq).to(torch.int32)
        padded = pages_per_seq * case.page_size
        pool_k = torch.zeros(case.batch * pages_per_seq, case.page_size, case.heads_kv, case.head_dim, dtype=case.dtype)
        pool_v = torch.zeros_like(pool_k)
        pool_k[order] = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, padded - case.capacity)).view(pool_k.shape)
        pool_v[order] = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, padded - case.capacity)).view(pool_v.shape)
        k, v = pool_k, pool_v
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    if case.alibi:
        kwargs["alibi_slopes"] = kwargs["alibi_slopes"].to(device)
    out, lse = flashattn.flash_attn_with_kvcache(to(q), to(k), to(v), cache_seqlens=to(lengths),
                                                 cache_leftpad=to(leftpad), block_table=to(block_table), **kwargs)
    _check("out", out, want_out, 0.02)
    _check("lse", lse, want_lse, 0.01)


def _is_cuda_error(exc: BaseException) -> bool:
    return "CUDA error" in str(exc) or type(exc).__name__ in ("AcceleratorError", "CudaError")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", choices=sorted(CASE_SETS), default="full", help="which case list (default: full)")
    parser.add_argument("--phases", default="all",
                        help="all (default: every phase the build has) or a comma-separated subset of "
                        + ", ".join(PHASES))
    parser.add_argument("--skip", type=int, default=0, help="skip the first N items (resume after a crash)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dry-run", action="store_true", help="run every item on the CPU implementation (no GPU)")
    parser.add_argument("--list", action="store_true", help="print the items and exit")
    args = parser.parse_args(argv)

    device = "cpu" if args.dry_run else args.device
    available = [p for p in PHASES if p != "bwd-deterministic" or has_deterministic_bwd()]
    phases = available if args.phases == "all" else [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in available]
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; this build has {available}")
    cases = CASE_SETS[args.cases]
    items = [(phase, i, case) for phase in phases if phase != "decode" for i, case in enumerate(cases)]
    if "decode" in phases:
        items += [("decode", i, case) for i, case in enumerate(DECODE_CASES)]
    if args.list:
        for n, (phase, _, case) in enumerate(items):
            print(f"{n:3d} {phase:<17} {case.name}")
        return 0

    if device == "cuda":
        if not torch.cuda.is_available() or not flashattn.cuda_kernels_built():
            print("@@ fatal no usable CUDA device or flashattn was built without its CUDA kernels", flush=True)
            return 3
        major, minor = torch.cuda.get_device_capability()
        print(f"@@ device {torch.cuda.get_device_name()} sm_{major}{minor} torch {torch.__version__}", flush=True)
    else:
        print(f"@@ device cpu torch {torch.__version__}", flush=True)

    print(f"@@ items {len(items)}", flush=True)
    print(f"@@ phases {','.join(phases)}", flush=True)
    expected = Expected()
    failed = False
    previous_phase = None
    for n, (phase, index, case) in enumerate(items):
        if n < args.skip:
            continue
        if device == "cuda" and phase != previous_phase and previous_phase is not None:
            time.sleep(0.5)  # let the sanitizer print what the last phase produced before the next begins
        previous_phase = phase
        print(f"@@ begin {n} {phase} {case.name}", flush=True)
        try:
            if phase == "decode":
                run_decode_item(index, case, device)
            else:
                run_item(phase, index, case, expected, device)
            if device == "cuda":
                torch.cuda.synchronize()
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001  (reported to sanitize.py, then go on or stop)
            message = " ".join(str(exc).split())[:300]
            print(f"@@ fail {n} {type(exc).__name__}: {message}", flush=True)
            failed = True
            if _is_cuda_error(exc):
                return 3  # the context is unusable; sanitize.py resumes with --skip n+1
            continue
        print(f"@@ end {n}", flush=True)
    print("@@ finished", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
