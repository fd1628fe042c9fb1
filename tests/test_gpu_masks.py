"""Attention masks on the CUDA kernels against the oracle (GUIDE section 4).

Every case draws fresh inputs and a mask, runs torch.ops.flashattn.fwd with the mask through autograd
(so bwd runs too, with the mask's own gradient when it is floating and requires grad), and checks out,
dq, dk, dv (and dmask) with the FlashAttention-2 rule against a float32 reference that applies the
same mask. Mask shapes are broadcast views, as the SDPA drop-in passes them: never copied.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import flashattn
from flashattn import ops
from flashattn.reference import attention_reference
from flashattn.testing import CAUSAL_MODES, GRAD_FACTOR, OUT_FACTOR, assert_oracle, make_qkv

from conftest import requires_cuda

pytestmark = requires_cuda


def make_mask(kind, shape_name, batch, heads_q, seqlen_q, seqlen_k, dtype, device="cuda"):
    """A mask of the named broadcast shape, expanded (stride 0) to [B, Hq, Lq, Lk]: see make_mask_source."""
    source, view = make_mask_source(kind, shape_name, batch, heads_q, seqlen_q, seqlen_k, dtype, device)
    return view(source)


def make_mask_source(kind, shape_name, batch, heads_q, seqlen_q, seqlen_k, dtype, device="cuda"):
    """(source, view): a mask tensor and the function that turns it (or a copy of it that requires
    grad) into the [B, Hq, Lq, Lk] view the op takes, by slicing and expanding only.

    kind: "bool" (random, ~70% True), "float" (randn, ~20% -inf), "float32" (the same in float32),
    "finfo_min" (torch.finfo(dtype).min where the bool mask is False, as transformers builds masks) and
    "minus_1e9" (-1e9, float32): both with rows whose every key carries the huge value (every fourth
    row; the next row also excludes every third key with -inf, the one after carries a larger value
    on half its keys), rows whose LSE is saturated (the value swallows log(sum) in float32).
    shape_name: "qk" (Lq, Lk), "11qk", "b11k" (a padding mask), "bhqk" (dense), "strided" (a dense
    mask whose last dim has stride 2), "offset" (rows sliced out of wider ones at an odd element
    offset, so that no row starts 2-byte aligned), "causal" (a lower-triangular bool), "blocks"
    (whole 64 x 64 tiles False), "empty_rows" (some rows fully masked), "tiles" (each 128 x 128 tile
    all False, all True or random: every class of mask tile, on every kernel's tile grid), "prefix"
    (a (B, 1, 1, Lk) padding mask keeping each sequence's first keys: True / 0, else False / -inf, so
    the kernels' tiles are key prefixes), "prefix_rows" (the same per query row, (B, 1, Lq, Lk), with
    row lengths that differ inside a tile, which is then no key prefix), "padding_rows" and
    "padding_heads" ((B, 1, 1, Lk) and (B, H, 1, Lk) masks whose rows cycle through key prefixes of
    length 0, Lk, a random length and a whole number of 128-key blocks, which the sm90 forward runs as
    plain attention over the prefix, and rows that are no prefix: one with a hole in its prefix, one
    that keeps the last key after its padding or, for float masks, carries a value other than 0 / -inf),
    "causal_rows" ((B, 1, Lq, Lk) causal masks on the diagonal the sm90 forward tests for, bottom-right
    when Lq <= Lk, else top-left: batch entries cycle through causal alone, causal with right padding
    at a random length, at length 0 and at a whole number of 128-key blocks, which that forward runs as
    causal attention over the key prefix, and masks that are not of that form: causal with padding and
    a hole in one row, causal with one row keeping a key past the diagonal).
    """
    full = (batch, heads_q, seqlen_q, seqlen_k)
    base_shape = {"qk": (seqlen_q, seqlen_k), "11qk": (1, 1, seqlen_q, seqlen_k), "b11k": (batch, 1, 1, seqlen_k),
                  "bhqk": full, "strided": full, "offset": (batch, 1, seqlen_q, seqlen_k),
                  "causal": (seqlen_q, seqlen_k), "blocks": (1, 1, seqlen_q, seqlen_k),
                  "empty_rows": (batch, 1, seqlen_q, seqlen_k), "tiles": (1, 1, seqlen_q, seqlen_k),
                  "prefix": (batch, 1, 1, seqlen_k), "prefix_rows": (batch, 1, seqlen_q, seqlen_k),
                  "padding_rows": (batch, 1, 1, seqlen_k), "padding_heads": (batch, heads_q, 1, seqlen_k),
                  "causal_rows": (batch, 1, seqlen_q, seqlen_k)}[shape_name]
    alloc = (base_shape[:-1] + (2 * seqlen_k,) if shape_name == "strided" else
             base_shape[:-1] + (seqlen_k + 2,) if shape_name == "offset" else base_shape)
    keep = torch.rand(alloc, device=device) < 0.7
    if shape_name == "causal":
        keep = torch.ones(alloc, dtype=torch.bool, device=device).tril()
    if shape_name == "blocks":
        tiles = torch.rand((math.ceil(seqlen_q / 64), math.ceil(seqlen_k / 64)), device=device) < 0.5
        keep = keep & tiles.repeat_interleave(64, 0).repeat_interleave(64, 1)[:seqlen_q, :seqlen_k]
    if shape_name == "tiles":
        state = torch.randint(0, 3, (math.ceil(seqlen_q / 128), math.ceil(seqlen_k / 128)), device=device)
        state = state.repeat_interleave(128, 0).repeat_interleave(128, 1)[:seqlen_q, :seqlen_k]
        keep = (state == 1) | ((state == 2) & keep)
    if shape_name in ("prefix", "prefix_rows"):
        lengths = torch.randint(1, seqlen_k + 1, alloc[:-1] + (1,), device=device)
        lengths[0] = seqlen_k  # one sequence without padding
        keep = torch.arange(seqlen_k, device=device) < lengths
    padding_row_kind = None
    if shape_name in ("padding_rows", "padding_heads"):
        rows = math.prod(alloc[:-1])
        padding_row_kind = torch.arange(rows, device=device).reshape(alloc[:-1] + (1,)) % 6
        lengths = torch.randint(1, seqlen_k + 1, alloc[:-1] + (1,), device=device)
        lengths = torch.where(padding_row_kind == 0, 0, lengths)
        lengths = torch.where(padding_row_kind == 1, seqlen_k, lengths)
        lengths = torch.where(padding_row_kind == 3, max(seqlen_k // 256, 1) * 128 if seqlen_k > 128 else seqlen_k, lengths)
        keys = torch.arange(seqlen_k, device=device)
        keep = keys < lengths
        keep = keep & ~((padding_row_kind == 4) & (keys == lengths // 2))  # a hole (a row of length 1 loses it)
        keep = keep | ((padding_row_kind == 5) & (keys == seqlen_k - 1))  # a key after the padding
    if shape_name == "causal_rows":
        offset = seqlen_k - seqlen_q if seqlen_q <= seqlen_k else 0
        kind_of = torch.arange(batch, device=device).reshape(batch, 1, 1, 1) % 6
        lengths = torch.randint(1, seqlen_k + 1, (batch, 1, 1, 1), device=device)
        lengths = torch.where((kind_of == 0) | (kind_of == 5), seqlen_k, lengths)
        lengths = torch.where(kind_of == 2, 0, lengths)
        lengths = torch.where(kind_of == 4, max(seqlen_k // 256, 1) * 128 if seqlen_k > 128 else seqlen_k, lengths)
        queries = torch.arange(seqlen_q, device=device).reshape(seqlen_q, 1)
        keys = torch.arange(seqlen_k, device=device)
        keep = (keys <= queries + offset) & (keys < lengths)
        keep = keep & ~((kind_of == 3) & (queries == seqlen_q // 2) & (keys == 0))  # a hole
        keep = keep | ((kind_of == 5) & (queries == seqlen_q // 3) & (keys == seqlen_k - 1))  # past the diagonal
    if shape_name == "b11k":
        keep[..., 0] = True  # a padding mask keeps at least one key per sequence
    if shape_name == "empty_rows":
        keep[:, :, ::3, :] = False
    if kind == "bool":
        mask = keep
    elif kind in ("finfo_min", "minus_1e9"):
        mask_dtype = dtype if kind == "finfo_min" else torch.float32
        value = torch.finfo(mask_dtype).min if kind == "finfo_min" else -1e9
        mask = torch.randn(alloc, device=device, dtype=mask_dtype).masked_fill(~keep, value)
        mask[..., 0::4, :] = value
        mask[..., 1::4, :] = value
        mask[..., 1::4, ::3] = float("-inf")
        mask[..., 2::4, :] = value
        # Half of each such row's keys carry a larger value (the others then drop out of its softmax):
        # -5e8, or -1e20 for finfo.min (half of finfo.min would be raised to the same floor on CUDA).
        mask[..., 2::4, ::2] = max(value / 2, -1e20)
    else:
        mask = torch.randn(alloc, device=device, dtype=torch.float32 if kind == "float32" else dtype)
        mask = mask.masked_fill(~keep & (torch.rand(alloc, device=device) < 0.3), float("-inf"))
        if shape_name in ("causal", "blocks", "empty_rows", "tiles"):
            mask = mask.masked_fill(~keep, float("-inf"))
        if shape_name in ("prefix", "prefix_rows", "padding_rows", "padding_heads", "causal_rows"):
            mask = torch.zeros_like(mask).masked_fill(~keep, float("-inf"))
        if padding_row_kind is not None:  # rows of kind 5 also carry a value other than 0 / -inf
            mask = mask.masked_fill((padding_row_kind == 5) & (torch.arange(seqlen_k, device=device) == 0), 0.5)
    def view(t):
        if shape_name == "offset":
            return t[..., 1:seqlen_k + 1].expand(full)
        return (t[..., ::2] if shape_name == "strided" else t).expand(full)

    return mask, view


def _leaf(t):
    return t.detach().clone().requires_grad_()


def check_masked(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, kind, shape_name,
                 mask_grad=False, layout="contiguous"):
    is_causal, bottom_right = CAUSAL_MODES[causal]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", layout)
    source, view = make_mask_source(kind, shape_name, batch, heads_q, seqlen_q, seqlen_k, dtype)
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    scale = head_dim**-0.5
    mask_grad = mask_grad and kind != "bool"

    def run(attention, cast):
        """Result and grads (q, k, v and, with mask_grad, the mask source) of `attention` on copies of
        the inputs and the mask source cast by `cast` (bool masks stay bool)."""
        leaves = [cast(t).detach().clone().requires_grad_() for t in (q, k, v)]
        mask_source = source if source.dtype == torch.bool else cast(source).detach().clone()
        mask_source.requires_grad_(mask_grad)
        result = attention(leaves, view(mask_source))
        out = result[0] if isinstance(result, tuple) else result
        grads = torch.autograd.grad(out, leaves + ([mask_source] if mask_grad else []), dout.to(out.dtype))
        return result, grads

    (out, lse), grads = run(lambda ls, m: ops.attention(*ls, scale, is_causal, bottom_right, False, m), lambda t: t)
    (ref_out, ref_lse), ref_grads = run(
        lambda ls, m: attention_reference(*ls, scale, is_causal, bottom_right, return_lse=True, attn_mask=m),
        lambda t: t.float())
    base_out, base_grads = run(
        lambda ls, m: attention_reference(*ls, scale, is_causal, bottom_right, upcast=False, attn_mask=m),
        lambda t: t.to(dtype))

    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dmask"), grads, ref_grads, base_grads):
        assert g.dtype == (source.dtype if name == "dmask" else dtype)
        assert_oracle(name, g, r, b, GRAD_FACTOR)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf rows differ from the reference"
    # Mask values below about -6.9e29 are raised to it on CUDA (README, Limits): rows that only see
    # such values report an LSE near the floor, not the reference's.
    floored = ref_lse < -6.9e29
    torch.testing.assert_close(lse[~empty & ~floored], ref_lse[~empty & ~floored], atol=1e-3, rtol=1e-3)
    # A row with no key: zero output and zero dq, never NaN.
    rows_empty = empty.transpose(1, 2)  # [B, Lq, Hq]
    assert (out[rows_empty] == 0).all() and (grads[0][rows_empty] == 0).all()


SHAPES = ["qk", "11qk", "b11k", "bhqk", "strided", "offset", "causal", "blocks", "empty_rows", "tiles", "prefix",
          "prefix_rows"]
SEQLENS = [(1, 1), (17, 17), (97, 203), (203, 97), (256, 256), (1025, 1025)]


def _cases():
    cases = []
    heads = [(2, 4, 4), (1, 8, 2)]
    head_dims = [40, 64, 128, 256, 96, 192, 72]
    i = 0
    for shape_name in SHAPES:
        for kind in ("bool", "float"):
            for seqlens in SEQLENS:
                dtype = [torch.bfloat16, torch.float16][i % 2]
                causal = ["none", "top_left", "bottom_right"][i % 3]
                b, hq, hk = heads[i % 2]
                d = head_dims[i % len(head_dims)]
                name = f"{kind}-{shape_name}-{seqlens[0]}x{seqlens[1]}-{causal}-d{d}-h{hq}/{hk}"
                cases.append(pytest.param(b, seqlens, hq, hk, d, dtype, causal, kind, shape_name, id=name))
                i += 1
    return cases


@pytest.mark.parametrize("batch,seqlens,heads_q,heads_kv,head_dim,dtype,causal,kind,shape_name", _cases())
def test_mask_oracle(batch, seqlens, heads_q, heads_kv, head_dim, dtype, causal, kind, shape_name):
    check_masked(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal, kind, shape_name,
                 mask_grad=kind == "float")


@pytest.mark.parametrize("batch,seqlens,heads_q,heads_kv,head_dim,dtype,causal,kind,shape_name", _cases()[::4])
def test_mask_oracle_on_the_sm80_path(batch, seqlens, heads_q, heads_kv, head_dim, dtype, causal, kind, shape_name,
                                      plan_options):
    """Every fourth case again with the planner's force_sm80 option: on Hopper the masked forward otherwise runs
    the sm90 kernel, so this keeps the sm80 masked forward under the oracle there too."""
    plan_options(force_sm80=True)
    check_masked(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal, kind, shape_name,
                 mask_grad=kind == "float")


@pytest.mark.parametrize("kind,shape_name,seqlens,heads,head_dim,causal", [
    ("bool", "tiles", (300, 5000), (8, 2), 64, "none"),
    ("float", "tiles", (1100, 2300), (8, 2), 128, "bottom_right"),
    ("bool", "causal", (2100, 2100), (4, 4), 64, "top_left"),
    ("float", "tiles", (700, 2600), (4, 1), 256, "none"),
])
def test_mask_classes_over_many_tiles(kind, shape_name, seqlens, heads, head_dim, causal):
    """Rows of more than 16 key tiles and more than 16 backward steps per key block: the kernels read
    tile classes 16 at a time (the forward per query tile, the backward per key block over its steps),
    so these cross several class windows, with tiles skipped, tiles read unmasked and tiles masked."""
    check_masked(1, seqlens[0], seqlens[1], heads[0], heads[1], head_dim, torch.bfloat16, causal, kind, shape_name,
                 mask_grad=kind == "float")


@pytest.mark.parametrize("kind,mask_grad", [("bool", False), ("float", False), ("float", True)])
@pytest.mark.parametrize("shape_name,heads", [("padding_rows", (4, 2)), ("padding_heads", (4, 4))])
@pytest.mark.parametrize("head_dim,seqlens,dtype", [
    (64, (97, 203), torch.bfloat16), (64, (2100, 2100), torch.float16), (96, (256, 300), torch.bfloat16),
    (128, (300, 1100), torch.float16), (192, (1, 700), torch.bfloat16), (256, (517, 333), torch.float16),
    (40, (200, 200), torch.bfloat16),
])
def test_padding_mask_rows(kind, mask_grad, shape_name, heads, head_dim, seqlens, dtype):
    """Padding masks whose rows are key prefixes (run by the sm90 forward, and by the sm90 backward
    where a GQA group's heads share the row and no mask gradient is asked for, as plain attention over
    the prefix in the unmasked kernels) beside rows that are not (run by the masked kernels in launches
    of their own), rows without keys among them (6 batch entries: every kind of row at least once):
    out, LSE and grads against the reference. (2100, 2100) at head dim 64 takes the forward's
    three-consumer tiles of long rows."""
    check_masked(6, seqlens[0], seqlens[1], heads[0], heads[1], head_dim, dtype, "none", kind, shape_name,
                 mask_grad=mask_grad)


@pytest.mark.parametrize("kind,mask_grad", [("bool", False), ("float", False), ("float", True)])
@pytest.mark.parametrize("head_dim,seqlens,heads,dtype", [
    (64, (97, 203), (4, 2), torch.bfloat16), (64, (2100, 2100), (2, 2), torch.float16),
    (96, (300, 300), (4, 4), torch.bfloat16), (128, (203, 97), (4, 1), torch.float16),
    (128, (1100, 1100), (2, 2), torch.bfloat16), (192, (1, 700), (2, 2), torch.bfloat16),
    (256, (333, 517), (2, 1), torch.float16), (40, (200, 200), (2, 2), torch.bfloat16),
])
def test_causal_mask_rows(kind, mask_grad, head_dim, seqlens, heads, dtype):
    """Causal masks, alone and with right padding (run by the sm90 forward as causal attention over the
    key prefix in its unmasked kernel), beside masks of the same shape that are not of that form (run
    by the masked kernel in a launch of its own), batch entries without keys among them: out, LSE and
    grads against the reference. (2100, 2100) at head dim 64 takes the causal forward's long-row tiles;
    (203, 97) the top-left diagonal, (1, 700) a single query (the padding form's case)."""
    check_masked(6, seqlens[0], seqlens[1], heads[0], heads[1], head_dim, dtype, "none", kind, "causal_rows",
                 mask_grad=mask_grad)


@pytest.mark.parametrize("shape_name", ["11qk", "b11k", "bhqk", "strided"])
@pytest.mark.parametrize("seqlens", [(97, 203), (300, 300)])
def test_float32_mask_with_bf16_inputs(shape_name, seqlens):
    check_masked(2, seqlens[0], seqlens[1], 4, 2, 64, torch.bfloat16, "none", "float32", shape_name, mask_grad=True)


@pytest.mark.parametrize("layout", ["bhsd", "unaligned"])
def test_mask_with_strided_inputs(layout):
    check_masked(2, 130, 250, 4, 2, 80, torch.bfloat16, "bottom_right", "float", "b11k", True, layout)


def test_deterministic_backward_with_mask_is_bitwise_reproducible():
    q, k, v = make_qkv(2, 300, 300, 4, 2, 64, torch.bfloat16, "cuda")
    source, view = make_mask_source("float", "blocks", 2, 4, 300, 300, torch.bfloat16)
    dout = torch.randn_like(q)

    def grads():
        leaves = [_leaf(t) for t in (q, k, v, source)]
        out, _ = ops.attention(*leaves[:3], 0.125, False, False, True, view(leaves[3]))
        return torch.autograd.grad(out, leaves, dout)

    first, second = grads(), grads()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# Masks and dropout in deterministic mode: the masked kernel's form with the dq turns, at every sm90
# tile width (64, 96, 128, 192 and 256), with causal masking beside a mask or dropout.
DETERMINISTIC_MASKED = [
    # (head_dim, causal mode, mask (kind, shape) or None, dropout_p)
    (64, "none", ("bool", "bhqk"), 0.0),
    (64, "bottom_right", None, 0.1),
    (80, "none", ("float", "blocks"), 0.1),
    (128, "top_left", ("bool", "11qk"), 0.0),
    (128, "none", ("float", "b11k"), 0.1),
    (160, "bottom_right", None, 0.1),
    (192, "none", ("float", "bhqk"), 0.0),
    (256, "top_left", ("bool", "b11k"), 0.1),
]


@pytest.mark.parametrize("head_dim,causal,mask,dropout_p", DETERMINISTIC_MASKED)
def test_deterministic_backward_with_mask_or_dropout(head_dim, causal, mask, dropout_p):
    """Three deterministic runs give the same bits; dk, dv (and a float mask's gradient) are the default
    backward's bits (only dq's order of additions differs); and the deterministic gradients pass the
    oracle (check_dropout, which also covers dropout_p = 0)."""
    from test_gpu_dropout import check_dropout

    is_causal, bottom_right = CAUSAL_MODES[causal]
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = 2, 700, 900, 4, 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    source, view = (None, None) if mask is None else make_mask_source(*mask, batch, heads_q, seqlen_q, seqlen_k,
                                                                     torch.bfloat16)
    with_mask_grad = source is not None and source.dtype != torch.bool
    rng_state = torch.tensor([5, 11], dtype=torch.int64, device="cuda")

    def grads(deterministic):
        leaves = [_leaf(t) for t in (q, k, v)]
        mask_leaf = _leaf(source) if with_mask_grad else source
        attn_mask = None if source is None else view(mask_leaf)
        out, _ = ops.attention(*leaves, head_dim**-0.5, is_causal, bottom_right, deterministic, attn_mask,
                               dropout_p=dropout_p, rng_state=rng_state)
        return torch.autograd.grad(out, leaves + ([mask_leaf] if with_mask_grad else []), dout)

    runs = [grads(True) for _ in range(3)]
    names = ("dq", "dk", "dv", "dmask")
    for run in runs[1:]:
        for name, a, b in zip(names, run, runs[0]):
            assert torch.equal(a, b), f"{name} differs between deterministic runs"
    default = grads(False)
    for name, a, b in list(zip(names, runs[0], default))[1:]:
        assert torch.equal(a, b), f"{name} differs from the default backward's"
    check_dropout(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, causal, dropout_p,
                  mask=mask, deterministic=True)


def test_finfo_min_mask_rows_match_the_reference():
    """Masks built with torch.finfo(dtype).min (as transformers builds them): a row whose every key
    carries it gets the reference's uniform softmax, not NaN or zeros."""
    dtype = torch.bfloat16
    q, k, v = make_qkv(1, 70, 90, 2, 2, 64, dtype, "cuda")
    keep = torch.rand(1, 1, 70, 90, device="cuda") < 0.5
    keep[:, :, 5] = False
    mask = torch.zeros(1, 1, 70, 90, dtype=dtype, device="cuda").masked_fill(~keep, torch.finfo(dtype).min)
    mask = mask.expand(1, 2, 70, 90)
    out, _ = ops.fwd(q, k, v, 0.125, False, False, mask)
    ref = attention_reference(q.float(), k.float(), v.float(), 0.125, attn_mask=mask.float())
    base = attention_reference(q, k, v, 0.125, upcast=False, attn_mask=mask)
    assert_oracle("out", out, ref, base, OUT_FACTOR)


@pytest.mark.parametrize("kind,shape_name,seqlens,heads,head_dim,dtype,causal", [
    ("finfo_min", "bhqk", (97, 203), (4, 2), 64, torch.bfloat16, "none"),
    ("finfo_min", "11qk", (300, 300), (2, 2), 128, torch.float16, "top_left"),
    ("finfo_min", "b11k", (130, 250), (4, 4), 64, torch.float16, "bottom_right"),
    ("finfo_min", "bhqk", (97, 203), (2, 1), 256, torch.bfloat16, "none"),
    ("finfo_min", "11qk", (203, 97), (2, 2), 40, torch.bfloat16, "bottom_right"),
    ("minus_1e9", "bhqk", (300, 300), (4, 2), 64, torch.bfloat16, "none"),
    ("minus_1e9", "11qk", (97, 203), (2, 2), 128, torch.bfloat16, "top_left"),  # -1e9 is -inf in float16
    ("minus_1e9", "bhqk", (130, 250), (2, 1), 192, torch.bfloat16, "none"),
])
def test_saturated_rows_gradients(kind, shape_name, seqlens, heads, head_dim, dtype, causal):
    """Rows whose every key carries a huge negative value (finfo.min, -1e9): the LSE has no room for
    log(sum) in float32, so the backward rebalances those rows (csrc/cuda/saturated_rows.h). Out and
    every gradient, the mask's included, against the oracle."""
    check_masked(2, seqlens[0], seqlens[1], heads[0], heads[1], head_dim, dtype, causal, kind, shape_name,
                 mask_grad=True)


@pytest.mark.parametrize("kind", ["finfo_min", "minus_1e9"])
def test_saturated_rows_gradients_on_the_sm80_path(kind, plan_options):
    plan_options(force_sm80=True)
    check_masked(2, 97, 203, 4, 2, 64, torch.bfloat16, "bottom_right", kind, "bhqk", mask_grad=True)


def test_nan_in_mask_propagates():
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.float16, "cuda")
    mask = torch.zeros(1, 2, 64, 64, dtype=torch.float16, device="cuda")
    mask[0, 1, 7, 3] = float("nan")
    out, lse = ops.fwd(q, k, v, 0.125, False, False, mask)
    assert torch.isnan(out[0, 7, 1]).all() and torch.isnan(lse[0, 1, 7])
    assert torch.isfinite(out[0, :, 0]).all() and torch.isfinite(out[0, 6, 1]).all()


def test_mask_equal_to_causal_matches_is_causal():
    """A boolean tril mask and is_causal (top-left) select the same keys: the outputs agree to rounding
    (the masked kernel runs the sm80 path; is_causal may run the sm90 one)."""
    q, k, v = make_qkv(2, 1000, 1000, 4, 4, 128, torch.bfloat16, "cuda")
    tril = torch.ones(1000, 1000, dtype=torch.bool, device="cuda").tril().expand(2, 4, 1000, 1000)
    masked, _ = ops.fwd(q, k, v, 0.1, False, False, tril)
    causal, _ = ops.fwd(q, k, v, 0.1, True, False)
    ref = attention_reference(q.float(), k.float(), v.float(), 0.1, is_causal=True)
    base = attention_reference(q, k, v, 0.1, is_causal=True, upcast=False)
    assert_oracle("masked", masked, ref, base, OUT_FACTOR)
    assert_oracle("causal", causal, ref, base, OUT_FACTOR)


@pytest.mark.parametrize("mask_shape", [(256, 300), (2, 1, 1, 300), (2, 4, 256, 300), (4, 1, 300)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_drop_in_with_mask(mask_shape, kind, recwarn):
    """flashattn.scaled_dot_product_attention with attn_mask runs on flashattn (no fallback warning) and
    matches torch's SDPA (math backend, float32) under the oracle, gradients included."""
    dtype = torch.float16
    q = torch.randn(2, 4, 256, 64, dtype=dtype, device="cuda")
    k, v = (torch.randn(2, 4, 300, 64, dtype=dtype, device="cuda") for _ in range(2))
    if kind == "bool":
        mask = torch.rand(mask_shape, device="cuda") < 0.8
    else:
        mask = torch.randn(mask_shape, device="cuda", dtype=dtype).requires_grad_()
    dout = torch.randn_like(q)
    leaves = [_leaf(t) for t in (q, k, v)]
    out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=mask)
    assert not [w for w in recwarn.list if "falling back" in str(w.message)]
    wrt = leaves + ([mask] if kind == "float" else [])
    grads = torch.autograd.grad(out, wrt, dout)

    def torch_sdpa(cast):
        ls = [t.detach().to(cast).requires_grad_() for t in (q, k, v)]
        m = mask.detach().to(cast).requires_grad_() if kind == "float" else mask
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            o = F.scaled_dot_product_attention(*ls, attn_mask=m)
        return o, torch.autograd.grad(o, ls + ([m] if kind == "float" else []), dout.to(cast))

    ref_out, ref_grads = torch_sdpa(torch.float32)
    base_out, base_grads = torch_sdpa(dtype)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv", "dmask"), grads, ref_grads, base_grads):
        assert g.shape == r.shape
        assert_oracle(name, g, r, b, GRAD_FACTOR)


def test_sdpa_mask_with_is_causal_raises_like_torch():
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal=True"):
        flashattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool, device="cuda"),
                                               is_causal=True)


def test_long_rows_run_in_key_ranges_with_a_mask():
    """Past 2^20 keys the forward merges per-range results; a padding mask that is narrowed per range
    gives the reference answer (sampled rows, float32 reference over all keys)."""
    seqlen_k = (1 << 20) + 4099
    dtype = torch.bfloat16
    q = torch.randn(1, 64, 2, 64, dtype=dtype, device="cuda")
    k, v = (torch.randn(1, seqlen_k, 1, 64, dtype=dtype, device="cuda") for _ in range(2))
    keep = torch.rand(1, 1, 1, seqlen_k, device="cuda") < 0.5
    mask = keep.expand(1, 2, 64, seqlen_k)
    out, lse = ops.fwd(q, k, v, 0.125, True, True, mask)
    ref_out, ref_lse = attention_reference(q.float(), k.float(), v.float(), 0.125, True, True, return_lse=True,
                                           attn_mask=mask)
    err = (out.float() - ref_out).abs().max().item()
    assert err <= 1e-2 * ref_out.abs().max().item() + 1e-5, err
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)
