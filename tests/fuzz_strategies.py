"""Hypothesis strategies, settings profiles and checks for the property-based tests in test_fuzz.py.

A drawn case describes shapes, memory layouts, a scale and a causal mode; the tensors themselves are
made from a drawn seed with a torch.Generator, so every example is reproducible from its printed
description alone.

Profiles (environment variable FLASHATTN_FUZZ_PROFILE, default ``ci``):

* ``ci``: 200 examples per test (400 for the two masked tests), derandomized (the same examples on
  every run), sequence lengths up to 70; tests/test_fuzz.py takes about 40 s on 2 CPU cores (the
  masked tests about 20 s of it).
* ``gpu``: 1,000 examples per test (2,000 for the masked ones), derandomized, sequence lengths up to
  300 so the GPU kernels' 64/128-row tiles are crossed several times; only the CUDA variants run (the
  CPU ones skip), with float16/bfloat16 tensors (and masks) drawn on the GPU and judged by the oracle
  of flashattn.testing: ``FLASHATTN_FUZZ_PROFILE=gpu python -m pytest tests/test_fuzz.py`` (7,750
  examples over the six tests; a few minutes on an H200 by estimate).
* ``long``: 2,000 random (not derandomized) examples per test, for a local soak (about 20 minutes
  on 2 cores); a failure prints the case, which then belongs in test_fuzz.py as a plain test.

FLASHATTN_FUZZ_EXAMPLES=N replaces the profile's number of examples per test (before the per-test
weights), e.g. ``FLASHATTN_FUZZ_PROFILE=gpu FLASHATTN_FUZZ_EXAMPLES=3000`` for a longer GPU run.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Tuple

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

PROFILE_ENV = "FLASHATTN_FUZZ_PROFILE"
EXAMPLES_ENV = "FLASHATTN_FUZZ_EXAMPLES"

_COMMON = dict(
    deadline=None,
    database=None,  # nothing written into the checkout; failures print a reproducible description
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile("flashattn-ci", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("flashattn-gpu", max_examples=1000, derandomize=True, **_COMMON)
settings.register_profile("flashattn-long", max_examples=2000, derandomize=False, **_COMMON)

PROFILE = os.environ.get(PROFILE_ENV, "ci").strip().lower() or "ci"
if PROFILE not in ("ci", "gpu", "long"):
    raise ValueError(f"{PROFILE_ENV}={PROFILE!r}: expected one of ci, gpu, long")
BASE_SETTINGS = settings.get_profile(f"flashattn-{PROFILE}")
if os.environ.get(EXAMPLES_ENV, "").strip():
    BASE_SETTINGS = settings(BASE_SETTINGS, max_examples=int(os.environ[EXAMPLES_ENV]))
MAX_SEQLEN = 70 if PROFILE == "ci" else 300


def fuzz_settings(weight: float = 1.0) -> settings:
    """The active profile, with max_examples scaled by ``weight`` (heavier tests draw fewer examples)."""
    return settings(BASE_SETTINGS, max_examples=max(1, round(BASE_SETTINGS.max_examples * weight)))


# --------------------------------------------------------------------------------------------------
# Memory layouts
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a tensor of a given logical shape sits in memory.

    The storage is allocated with its dims in ``order`` (a permutation of the logical dims, so a
    transposed view results unless it is the identity), each dim ``step`` times longer than needed plus
    ``pad`` elements; the view starts ``offset`` (< pad + 1) elements in and takes every ``step``-th
    element. Dims in ``expand`` get a single element in storage and are broadcast with stride 0.
    """

    order: Tuple[int, ...]
    pad: Tuple[int, ...]
    offset: Tuple[int, ...]
    step: Tuple[int, ...]
    expand: Tuple[int, ...] = ()

    def storage_shape(self, shape: Sequence[int]) -> Tuple[int, ...]:
        logical = [(1 if d in self.expand else n) * self.step[d] + self.pad[d] for d, n in enumerate(shape)]
        return tuple(logical[d] for d in self.order)

    def view(self, storage: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """The logical view of ``storage`` (allocated with :meth:`storage_shape`)."""
        inverse = [self.order.index(d) for d in range(len(shape))]
        t = storage.permute(inverse)
        for d, n in enumerate(shape):
            length = 1 if d in self.expand else n
            start = self.offset[d]
            t = t.narrow(d, start, (length - 1) * self.step[d] + 1 if length else 0)
            if self.step[d] > 1:
                t = t[(slice(None),) * d + (slice(None, None, self.step[d]),)]
        return t.expand(*shape) if self.expand else t


def contiguous_layout(rank: int) -> Layout:
    return Layout(tuple(range(rank)), (0,) * rank, (0,) * rank, (1,) * rank)


@st.composite
def layouts(draw, rank: int, expandable: Sequence[int] = (), last_dim_strided: bool = False):
    """A Layout for a rank-``rank`` tensor: contiguous (often), or any mix of transposed storage,
    padded slices with a storage offset, strided slices and stride-0 broadcasts of the ``expandable``
    dims. The last dim stays contiguous unless ``last_dim_strided``."""
    if draw(st.booleans()):
        return contiguous_layout(rank)
    leading = draw(st.permutations(range(rank - 1)))
    order = tuple(leading) + (rank - 1,)
    pad = tuple(draw(st.integers(0, 3)) for _ in range(rank))
    offset = tuple(draw(st.integers(0, p)) for p in pad)
    step = tuple(draw(st.sampled_from([1, 1, 2])) for _ in range(rank - 1))
    step += (draw(st.sampled_from([1, 2])) if last_dim_strided else 1,)
    expand = tuple(sorted(d for d in expandable if draw(st.integers(0, 3)) == 0))
    return Layout(order, pad, offset, step, expand)


def make_storage(layout: Layout, shape, dtype, device, gen: torch.Generator) -> torch.Tensor:
    """Random normal storage for ``layout`` (never zeros), drawn in float64 then cast: on the CPU from
    ``gen`` for CPU tensors; on the GPU from a generator seeded by ``gen`` for CUDA tensors (drawing
    there and copying took most of a GPU example's time)."""
    size = layout.storage_shape(shape)
    if torch.device(device).type == "cpu":
        storage = torch.randn(size, generator=gen, dtype=torch.float64)
    else:
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        device_gen = torch.Generator(device=device).manual_seed(seed)
        storage = torch.randn(size, generator=device_gen, dtype=torch.float64, device=device)
    return storage.to(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# Sizes, scales, dtypes
# --------------------------------------------------------------------------------------------------

# Mostly small head dims (cheap, and odd ones exercise the padding); sometimes the awkward larger ones.
head_dims = st.one_of(
    st.integers(1, 16),
    st.integers(1, 16),
    st.integers(17, 64),
    st.sampled_from([72, 80, 96, 100, 128, 160, 192, 255, 256]),
)


def _signed(magnitudes):
    return st.builds(lambda magnitude, negative: -magnitude if negative else magnitude, magnitudes, st.booleans())


# Explicit softmax scales: zero, negative and large ones too.
explicit_scales = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 1e-3, -0.3, 4.0, -4.0, 16.0, 64.0]),
    # Magnitudes from 1e-3 (not smaller: a float32 kernel rounds a tiny scale to 0 where the float64
    # reference does not) to 3, either sign.
    _signed(st.floats(1e-3, 3.0)),
)
# None is the API's default (1/sqrt(D)).
scales = st.one_of(st.none(), explicit_scales)

batches = st.integers(0, 3)
seeds = st.integers(0, 2**31 - 1)


def seqlens(min_value: int = 0):
    return st.integers(min_value, MAX_SEQLEN)


@st.composite
def head_counts(draw):
    """(heads_q, heads_kv) with heads_q a multiple of heads_kv (MHA, GQA and MQA)."""
    heads_kv = draw(st.integers(1, 3))
    ratio = draw(st.sampled_from([1, 1, 2, 3, 4]))
    return heads_kv * ratio, heads_kv


# On the CPU mostly float32/float64, which get the tight check; float16/bfloat16 (slow on the CPU, and
# judged by the looser oracle) a third of the time.
CPU_DTYPES = (torch.float64, torch.float32, torch.float64, torch.float32, torch.float16, torch.bfloat16)
CUDA_DTYPES = (torch.float16, torch.bfloat16)


def dtypes_for(device: str):
    return st.sampled_from(CUDA_DTYPES if device == "cuda" else CPU_DTYPES)


# Where the fp16/bf16 oracle of GUIDE section 4 can judge a gradient. FlashAttention's backward takes
# delta = rowsum(dout * out) from the low-precision out, while the oracle's baseline (PyTorch's softmax
# backward in the low dtype) cancels the same rounding exactly; when a row's softmax is close to one-hot
# (a large |scale| * q.k) or spread over a few keys (tiny shapes, the first rows of a top-left causal
# mask with a short query) that difference decides dq/dk, and the kernel misses the oracle although it
# computes the algorithm faithfully (see LOW_PRECISION_LIMITS in test_fuzz.py). Low-precision cases
# therefore keep |scale| within 1/sqrt(D) and sequence lengths and head dims of at least
# LOW_PRECISION_MIN_SIZE (no miss in 4,000 random CPU cases there); float32/float64 cases cover every
# scale and size.
LOW_PRECISION = (torch.float16, torch.bfloat16)
LOW_PRECISION_MIN_SIZE = 8
low_precision_head_dims = st.one_of(
    st.integers(LOW_PRECISION_MIN_SIZE, 64),
    st.sampled_from([72, 80, 96, 100, 128, 160, 192, 255, 256]),
)


def head_dims_for(dtype):
    return low_precision_head_dims if dtype in LOW_PRECISION else head_dims


def min_seqlen(dtype) -> int:
    return LOW_PRECISION_MIN_SIZE if dtype in LOW_PRECISION else 0


def draw_scale(draw, dtype, head_dim: int, allow_default: bool = True) -> Optional[float]:
    """A softmax scale for a case of ``dtype``: None (the API default) only when ``allow_default``."""
    if dtype not in LOW_PRECISION:
        return draw(scales if allow_default else explicit_scales)
    options = [st.sampled_from([0.0, 1.0, -1.0]), _signed(st.floats(1e-3, 1.0))]
    factor = draw(st.one_of(st.none(), *options) if allow_default else st.one_of(*options))
    return None if factor is None else factor / math.sqrt(head_dim)


# --------------------------------------------------------------------------------------------------
# Drawn cases: plain dataclasses whose repr is valid Python, so a counterexample pastes into a test
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCase:
    """One call of torch.ops.flashattn.fwd (through its autograd) or flash_attn_func: ``(B, S, H, D)``."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    scale: Optional[float]
    causal: bool
    bottom_right: bool
    layout_q: Layout
    layout_k: Layout
    layout_v: Layout
    layout_dout: Layout
    seed: int


@dataclass(frozen=True)
class PackedCase:
    """One call of flash_attn_kvpacked_func (``packed="kv"``) or flash_attn_qkvpacked_func (``"qkv"``)."""

    packed: str
    batch: int
    seqlen_q: int
    seqlen_k: int  # equal to seqlen_q for "qkv"
    heads_q: int
    heads_kv: int  # equal to heads_q for "qkv"
    head_dim: int
    dtype: torch.dtype
    scale: Optional[float]
    causal: bool
    layout_q: Layout  # unused for "qkv"
    layout_packed: Layout
    layout_dout: Layout
    seed: int


@dataclass(frozen=True)
class SdpaCase:
    """One call of flashattn.scaled_dot_product_attention: query ``(*lead, Hq, L, E)``, key/value
    ``(*lead, Hk, S, E)``; ``heads_q is None`` means 2-dim ``(L, E)`` inputs (no head dim)."""

    lead: Tuple[int, ...]
    heads_q: Optional[int]
    heads_kv: Optional[int]
    enable_gqa: bool
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype
    scale: Optional[float]
    is_causal: bool
    layout_q: Layout
    layout_k: Layout
    layout_v: Layout
    layout_dout: Layout
    seed: int

    def shapes(self):
        heads = lambda h: () if h is None else (h,)  # noqa: E731
        q = self.lead + heads(self.heads_q) + (self.seqlen_q, self.head_dim)
        kv = self.lead + heads(self.heads_kv) + (self.seqlen_k, self.head_dim)
        return q, kv, kv


@st.composite
def op_cases(draw, device: str, flash_api: bool = False):
    """Raw-op cases (both causal alignments) or, with ``flash_api``, flash_attn_func cases (bottom-right)."""
    heads_q, heads_kv = draw(head_counts())
    causal = draw(st.booleans())
    dtype = draw(dtypes_for(device))
    head_dim = draw(head_dims_for(dtype))
    expandable = (0, 2)  # stride-0 broadcast over batch and heads
    return OpCase(
        batch=draw(batches),
        seqlen_q=draw(seqlens(min_seqlen(dtype))),
        seqlen_k=draw(seqlens(min_seqlen(dtype))),
        heads_q=heads_q,
        heads_kv=heads_kv,
        head_dim=head_dim,
        dtype=dtype,
        scale=draw_scale(draw, dtype, head_dim, allow_default=flash_api),
        causal=causal,
        bottom_right=True if flash_api else (causal and draw(st.booleans())),
        layout_q=draw(layouts(4, expandable)),
        layout_k=draw(layouts(4, expandable)),
        layout_v=draw(layouts(4, expandable)),
        layout_dout=draw(layouts(4, expandable, last_dim_strided=True)),
        seed=draw(seeds),
    )


@st.composite
def packed_cases(draw, device: str):
    packed = draw(st.sampled_from(["kv", "qkv"]))
    heads_q, heads_kv = draw(head_counts())
    dtype = draw(dtypes_for(device))
    head_dim = draw(head_dims_for(dtype))
    if packed == "qkv":
        seqlen_q = seqlen_k = draw(seqlens(min_seqlen(dtype)))
        heads_kv = heads_q
    else:
        seqlen_q, seqlen_k = draw(seqlens(min_seqlen(dtype))), draw(seqlens(min_seqlen(dtype)))
    return PackedCase(
        packed=packed,
        batch=draw(batches),
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads_q=heads_q,
        heads_kv=heads_kv,
        head_dim=head_dim,
        dtype=dtype,
        scale=draw_scale(draw, dtype, head_dim),
        causal=draw(st.booleans()),
        layout_q=draw(layouts(4, (0, 2))),
        layout_packed=draw(layouts(5, (0, 3))),
        layout_dout=draw(layouts(4, (0, 2), last_dim_strided=True)),
        seed=draw(seeds),
    )


@st.composite
def sdpa_cases(draw, device: str):
    rank = draw(st.sampled_from([2, 3, 4, 4, 4, 5]))
    if rank == 2:
        heads_q = heads_kv = None
        enable_gqa = draw(st.booleans())
        lead = ()
    else:
        mode = draw(st.sampled_from(["same", "gqa", "single_kv_head"]))
        heads_q, heads_kv = draw(head_counts())
        enable_gqa = mode == "gqa" or draw(st.booleans())
        if mode == "same":
            heads_kv = heads_q
        elif mode == "single_kv_head":  # torch broadcasts a single key/value head, enable_gqa or not
            heads_kv = 1
        elif heads_q == heads_kv:
            heads_q = 2 * heads_kv
        lead = tuple(draw(batches) for _ in range(rank - 3))
        if rank == 5:
            lead = (lead[0], draw(st.integers(1, 2)))
    n = rank
    expandable = tuple(range(n - 2))  # every batch dim and the head dim
    dtype = draw(dtypes_for(device))
    head_dim = draw(head_dims_for(dtype))
    return SdpaCase(
        lead=lead,
        heads_q=heads_q,
        heads_kv=heads_kv,
        enable_gqa=enable_gqa,
        seqlen_q=draw(seqlens(min_seqlen(dtype))),
        seqlen_k=draw(seqlens(min_seqlen(dtype))),
        head_dim=head_dim,
        dtype=dtype,
        scale=draw_scale(draw, dtype, head_dim),
        is_causal=draw(st.booleans()),
        # The drop-in copies an input whose last dim is strided, so those are drawn too.
        layout_q=draw(layouts(n, expandable, last_dim_strided=True)),
        layout_k=draw(layouts(n, expandable, last_dim_strided=True)),
        layout_v=draw(layouts(n, expandable, last_dim_strided=True)),
        layout_dout=draw(layouts(n, expandable, last_dim_strided=True)),
        seed=draw(seeds),
    )


# --------------------------------------------------------------------------------------------------
# Attention masks
# --------------------------------------------------------------------------------------------------

# "bool" (True = the key takes part), "float" (additive, of q's dtype), "float32" (additive). "none" is
# rare here: the unmasked tests draw nothing else. (Hypothesis favours the first of a sampled_from and
# the low end of integers, hence the orders below.)
MASK_KINDS = ("bool", "float", "float32", "bool", "float", "float32", "none")
FLOAT_MASK_KINDS = ("float", "float32")

# Broadcast shapes of a mask, aligned to the right of the attention weights (B, H, Lq, Lk) as torch
# broadcasts them: a named dim is the weights' own size, "1" broadcasts. SDPA inputs with fewer dims
# take the trailing dims of a shape; a 5-dim SDPA case may add its first batch dim (see mask_cases).
MASK_DIMS = (
    ("lk",),
    ("lq", "lk"),
    ("1", "1", "lq", "lk"),
    ("b", "1", "1", "lk"),
    ("b", "1", "lq", "lk"),
    ("1", "h", "lq", "lk"),
    ("b", "h", "lq", "lk"),
)


@dataclass(frozen=True)
class MaskCase:
    """An attention mask: its kind, broadcast shape (``dims``, see MASK_DIMS) and memory layout (a
    strided last dim sometimes); a float mask holds ``magnitude * randn`` values. A fraction
    ``excluded`` of the entries is False / -inf, and with ``empty_rows`` about a third of the mask's
    rows (every key of them; the whole mask for a ``("lk",)`` one) too. ``requires_grad``: a float
    mask whose gradient is checked."""

    kind: str
    dims: Tuple[str, ...] = ()
    layout: Optional[Layout] = None
    magnitude: float = 0.0
    excluded: float = 0.0
    empty_rows: bool = False
    requires_grad: bool = False
    seed: int = 0

    def dtype(self, q_dtype: torch.dtype) -> Optional[torch.dtype]:
        return {"none": None, "bool": torch.bool, "float": q_dtype, "float32": torch.float32}[self.kind]

    def shape(self, weights_shape: Sequence[int]) -> Tuple[int, ...]:
        """The mask's shape for attention weights of ``weights_shape``: ``dims`` aligned to its right."""
        full = tuple(weights_shape)
        assert len(self.dims) <= len(full), (self.dims, full)
        lead = len(full) - len(self.dims)
        return tuple(1 if name == "1" else full[lead + i] for i, name in enumerate(self.dims))


@st.composite
def mask_cases(draw, dtype, weights_rank: int = 4) -> MaskCase:
    """A mask for attention weights of rank ``weights_rank`` (4 for the op; 2 to 5 for SDPA): a shape
    of MASK_DIMS cut to that rank, and for rank 5 sometimes with the first batch dim ("a") too."""
    kind = draw(st.sampled_from(MASK_KINDS))
    if kind == "none":
        return MaskCase("none")
    dims = draw(st.sampled_from(MASK_DIMS))
    dims = dims[max(0, len(dims) - weights_rank):]
    if weights_rank == 5 and len(dims) == 4 and draw(st.booleans()):
        dims = ("a",) + dims
    low = dtype in LOW_PRECISION
    # Low precision stays where the FA2 oracle can judge a gradient (see LOW_PRECISION above): masks
    # that make the softmax close to one-hot (large values) or leave rows only a few keys stay out,
    # and so do short sequences (low_precision_mask_seqlens).
    magnitudes = [0.5, 1.0] if low else [0.5, 1.0, 4.0, 16.0]
    fractions = [0.0, 0.1, 0.3] if low else [0.0, 0.1, 0.5, 0.9]
    is_float = kind in FLOAT_MASK_KINDS
    return MaskCase(
        kind=kind,
        dims=dims,
        layout=draw(layouts(len(dims), last_dim_strided=True)),
        magnitude=draw(st.sampled_from(magnitudes)) if is_float else 0.0,
        excluded=draw(st.sampled_from(fractions)),
        empty_rows=draw(st.booleans()),
        requires_grad=is_float and draw(st.integers(0, 2)) < 2,
        seed=draw(seeds),
    )


def _generator_on(device, gen: torch.Generator) -> torch.Generator:
    if torch.device(device).type == "cpu":
        return gen
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.Generator(device=device).manual_seed(seed)


def make_mask(case: MaskCase, shape, q_dtype, device) -> Optional[torch.Tensor]:
    """The mask of ``case`` with the given (broadcast) shape, a view in ``case.layout`` of a storage
    whose other elements are NaN (float) or random (bool), so that reading outside the view shows;
    a float mask with ``requires_grad`` is a view of a leaf that requires grad. Drawn on the device
    from ``case.seed`` (as make_storage does)."""
    if case.kind == "none":
        return None
    dtype = case.dtype(q_dtype)
    gen = _generator_on(device, torch.Generator().manual_seed(case.seed))
    shape = tuple(shape)
    uniform = lambda size: torch.rand(size, generator=gen, dtype=torch.float64, device=device)  # noqa: E731
    excluded = uniform(shape) < case.excluded
    if case.empty_rows:
        excluded |= (uniform(shape[:-1]) < 1 / 3).unsqueeze(-1)
    if dtype == torch.bool:
        values = ~excluded
        storage = uniform(case.layout.storage_shape(shape)) < 0.5
    else:
        values = torch.randn(shape, generator=gen, dtype=torch.float64, device=device) * case.magnitude
        values = values.masked_fill(excluded, float("-inf")).to(dtype)
        storage = torch.full(case.layout.storage_shape(shape), float("nan"), dtype=dtype, device=device)
    case.layout.view(storage, shape).copy_(values)
    if case.requires_grad:
        storage.requires_grad_()
    mask = case.layout.view(storage, shape)
    assert tuple(mask.shape) == shape and torch.equal(mask.detach(), values)
    return mask


@dataclass(frozen=True)
class OpMaskCase:
    """torch.ops.flashattn.fwd (``api="fwd"``) or flashattn.ops.attention (``"attention"``, and
    ``"attention_deterministic"``) with a mask, expanded to ``[B, Hq, Lq, Lk]`` for the call."""

    api: str
    op: OpCase
    mask: MaskCase


@dataclass(frozen=True)
class SdpaMaskCase:
    """flashattn.scaled_dot_product_attention with ``attn_mask`` in torch's broadcast convention."""

    sdpa: SdpaCase
    mask: MaskCase


# float16/bfloat16 masked cases draw sequence lengths of at least this (or 0): on shorter ones the
# gradient of a float mask (dS, summed over the rows a broadcast mask covers) misses the FA2 oracle now
# and then although the kernel computes the FlashAttention backward faithfully (FlashAttention's delta
# from the low-precision out; tests/test_mask_regressions.py). For an (Lk,) mask with 3/8 of the keys
# -inf, Lq = Lk = D = 8 missed in 13 of 600 seeds, Lq = Lk = 16 in 1 of 600, 24 and 32 in none; with
# 16 as the minimum the fuzzer still found a miss (Lk = 18, top-left causal) in 3,000 random cases,
# with 24 none in 4,000 random cases whose float mask requires grad. float32/float64 cover the rest.
LOW_PRECISION_MASK_MIN_SEQLEN = 24


@st.composite
def low_precision_mask_seqlens(draw):
    return 0 if draw(st.integers(0, 7)) == 7 else draw(seqlens(LOW_PRECISION_MASK_MIN_SEQLEN))


@st.composite
def op_mask_cases(draw, device: str):
    op = draw(op_cases(device))
    mask = draw(mask_cases(op.dtype))
    if op.dtype in LOW_PRECISION and mask.kind != "none":
        op = replace(op, seqlen_q=draw(low_precision_mask_seqlens()), seqlen_k=draw(low_precision_mask_seqlens()))
    return OpMaskCase(api=draw(st.sampled_from(["fwd", "attention", "attention_deterministic"])), op=op, mask=mask)


@dataclass(frozen=True)
class OpDropoutCase:
    """An OpMaskCase (its mask may be "none") run with dropout: probability ``dropout_p`` and the
    keep-mask of ``rng_state`` = (seed, offset)."""

    case: OpMaskCase
    dropout_p: float
    rng_state: Tuple[int, int]


@st.composite
def op_dropout_cases(draw, device: str):
    case = draw(op_mask_cases(device))
    if case.op.dtype in LOW_PRECISION:
        # The masked cases' floor, for the same reason: the FlashAttention backward's delta comes from
        # the rounded output, which dropout scales by 1 / (1 - p).
        case = replace(case, op=replace(case.op, seqlen_q=draw(low_precision_mask_seqlens()),
                                        seqlen_k=draw(low_precision_mask_seqlens())))
    int64 = st.integers(-(2**63), 2**63 - 1)
    return OpDropoutCase(case=case, dropout_p=draw(st.sampled_from([0.1, 0.25, 0.5, 0.9])),
                         rng_state=(draw(int64), draw(int64)))


@st.composite
def sdpa_mask_cases(draw, device: str):
    sdpa = draw(sdpa_cases(device))
    mask = draw(mask_cases(sdpa.dtype, weights_rank=len(sdpa.shapes()[0])))
    if sdpa.dtype in LOW_PRECISION and mask.kind != "none":
        sdpa = replace(sdpa, seqlen_q=draw(low_precision_mask_seqlens()), seqlen_k=draw(low_precision_mask_seqlens()))
    if mask.kind != "none":
        # torch (and the drop-in) reject attn_mask with is_causal=True: drawn rarely, it checks the error.
        sdpa = replace(sdpa, is_causal=draw(st.integers(0, 7)) == 7)
    return SdpaMaskCase(sdpa=sdpa, mask=mask)


# --------------------------------------------------------------------------------------------------
# The correctness check
# --------------------------------------------------------------------------------------------------

# float32 and float64 results are held to a rounding budget: this many epsilons of the dtype times the
# size of the quantities each result is summed from (rounding_magnitudes), times a condition factor.
# Measured on a few thousand random cases, the worst result used about a quarter of it.
ROUNDING_BUDGET_EPS = 16.0


def visible_keys(seqlen_q: int, seqlen_k: int, is_causal: bool, bottom_right: bool, attn_mask=None, device=None):
    """Bool, True where a key takes part in a query's row: ``[Lq, Lk]``, or ``[B, Hq, Lq, Lk]`` with a
    ``[B, Hq, Lq, Lk]`` attn_mask (bool, or additive: -inf excludes)."""
    if is_causal:
        offset = seqlen_k - seqlen_q if bottom_right else 0
        visible = torch.arange(seqlen_k)[None, :] <= torch.arange(seqlen_q)[:, None] + offset
    else:
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    visible = visible.to(device)
    if attn_mask is not None:
        visible = visible & (attn_mask if attn_mask.dtype == torch.bool else attn_mask != float("-inf"))
    return visible


def rounding_magnitudes(q, k, v, dout, scale: float, is_causal: bool, bottom_right: bool, attn_mask=None,
                        sum_to_mask=None):
    """How large the float32/float64 rounding error of each result may get, for inputs with no error.

    q ``[B, Lq, Hq, D]``, k/v ``[B, Lk, Hk, D]``, dout like q, float64; attn_mask (optional) the
    ``[B, Hq, Lq, Lk]`` mask as the kernels see it, bool or float64. The same sums as the attention
    forward and backward, evaluated on absolute values (the classical running error bound): out is
    ``P |v|``; dv ``P^T |dout|``; dq and dk ``|scale| dS_abs |k|`` and ``|scale| dS_abs^T |q|`` with
    ``dS_abs = P (|dout| |v|^T + |dout . out|)``; the mask's gradient ``dS_abs`` summed by
    ``sum_to_mask`` over the dims the mask broadcasts. A score's rounding error grows with
    ``|scale| |q| . |k| + |mask|`` and a sum's with the square root of its length, hence the condition factor.

    Returns (condition factor, {"out": ..., "q": ..., "k": ..., "v": ..., "mask": ...}) of maxima.
    """
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // max(heads_kv, 1)
    k_rep, v_rep = (t.repeat_interleave(group, dim=2) for t in (k, v))
    q_abs, k_abs, v_abs, dout_abs = q.abs(), k_rep.abs(), v_rep.abs(), dout.abs()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k_rep) * scale
    scores_abs = torch.einsum("bqhd,bkhd->bhqk", q_abs, k_abs) * abs(scale)
    visible = visible_keys(seqlen_q, seqlen_k, is_causal, bottom_right, attn_mask, q.device)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        additive = torch.where(visible, attn_mask, 0.0)
        scores = scores + additive
        scores_abs = scores_abs + additive.abs()
    empty = ~visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~(visible | empty), float("-inf")), dim=-1).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v_rep)
    out_abs = torch.einsum("bhqk,bkhd->bqhd", probs, v_abs)
    dp_abs = torch.einsum("bqhd,bkhd->bhqk", dout_abs, v_abs)
    delta_abs = (dout_abs * out.abs()).sum(-1).transpose(1, 2).unsqueeze(-1)  # [B, Hq, Lq, 1]
    ds_abs = probs * (dp_abs + delta_abs)
    dq_abs = abs(scale) * torch.einsum("bhqk,bkhd->bqhd", ds_abs, k_abs)
    dk_abs = abs(scale) * torch.einsum("bhqk,bqhd->bkhd", ds_abs, q_abs)
    dv_abs = torch.einsum("bhqk,bqhd->bkhd", probs, dout_abs)
    if group > 1:  # dk/dv sum over the query heads of a group
        dk_abs = dk_abs.unflatten(2, (heads_kv, group)).sum(3)
        dv_abs = dv_abs.unflatten(2, (heads_kv, group)).sum(3)

    def amax(t):
        return t.max().item() if t.numel() else 0.0

    score = amax(scores_abs * visible)
    factor = 1.0 + score + math.sqrt(max(seqlen_q * group, seqlen_k, 1))
    magnitudes = {"out": amax(out_abs), "q": amax(dq_abs), "k": amax(dk_abs), "v": amax(dv_abs)}
    if sum_to_mask is not None:
        magnitudes["mask"] = amax(sum_to_mask(ds_abs))
    return factor, magnitudes


def _max_err(result: torch.Tensor, ref: torch.Tensor) -> float:
    if result.numel() == 0:
        return 0.0
    return (result.double() - ref.double()).abs().max().item()


def check_rounding(name: str, result: torch.Tensor, ref: torch.Tensor, magnitude: float, factor: float) -> None:
    """float32/float64: finite, and within the rounding budget of the float64 reference."""
    assert result.shape == ref.shape, f"{name}: shape {tuple(result.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(result).all(), f"{name}: result has NaN or inf"
    budget = ROUNDING_BUDGET_EPS * torch.finfo(result.dtype).eps * magnitude * factor
    err = _max_err(result, ref)
    assert err <= budget, (
        f"{name}: max|result - ref| = {err:.3e} exceeds the rounding budget {budget:.3e} "
        f"({ROUNDING_BUDGET_EPS:g} eps x magnitude {magnitude:.3e} x condition {factor:.3e})"
    )


def check_lse(lse: torch.Tensor, ref_lse: torch.Tensor, factor: float) -> None:
    """-inf exactly where the reference row sees no key; within a rounding budget elsewhere."""
    assert not torch.isnan(lse).any(), "lse has NaN"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf rows differ from the reference"
    assert torch.isfinite(lse[~empty]).all(), "lse: +inf or -inf in a row that sees keys"
    budget = ROUNDING_BUDGET_EPS * torch.finfo(lse.dtype).eps * factor
    err = _max_err(lse[~empty], ref_lse[~empty])
    assert err <= budget, f"lse: max|lse - ref| = {err:.3e} exceeds the rounding budget {budget:.3e}"


def bf16_products_rounded(dtype):
    """The dtype the CPU backward rounds P and dS to for their products (flash_backward_emulation's
    round_products) for inputs of ``dtype``: bfloat16 where it multiplies bfloat16 operands
    (flashattn._C.cpu_bwd_bf16_products_form() other than "float32"), else None."""
    from flashattn import _C
    if dtype != torch.bfloat16 or _C.cpu_bwd_bf16_products_form() == "float32":
        return None
    return torch.bfloat16


def flash_backward_emulation(q, k, v, dout, out, scale: float, is_causal: bool, bottom_right: bool, attn_mask=None,
                             round_products=None):
    """(dq, dk, dv) the way FlashAttention's backward defines them, in float64: exact softmax and
    products, except delta = rowsum(dout * out) taken from the given ``out`` (the kernel's
    low-precision output). ``[B, L, H, D]`` tensors; a row that sees no key has zero gradients.
    With ``attn_mask`` (``[B, Hq, Lq, Lk]``, bool or additive) the scores are masked as the kernels
    mask them, and a fourth result is dS ``[B, Hq, Lq, Lk]``, the gradient of a floating mask.
    ``round_products`` (a dtype, or None): P and dS rounded to it as operands of their products
    (dV = P^T dO; dQ = dS K, dK = dS^T Q), as the kernels with 16-bit products round them; dS itself
    (the mask's gradient) and the dS from P stay exact."""
    q, k, v, dout, out = (t.detach().double() for t in (q, k, v, dout, out))
    seqlen_q, heads_q = q.shape[1], q.shape[2]
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    k_rep, v_rep = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k_rep) * scale
    mask = None if attn_mask is None else attn_mask.detach()
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    visible = visible_keys(seqlen_q, seqlen_k, is_causal, bottom_right, mask, q.device)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + torch.where(visible, mask, 0.0)
    empty = ~visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~(visible | empty), float("-inf")), dim=-1).masked_fill(empty, 0.0)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, v_rep)
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # [B, Hq, Lq, 1]
    ds = probs * (dp - delta)
    rounded = (lambda t: t) if round_products is None else (lambda t: t.to(round_products).double())
    dq = torch.einsum("bhqk,bkhd->bqhd", rounded(ds), k_rep) * scale
    dk = (torch.einsum("bhqk,bqhd->bkhd", rounded(ds), q) * scale).unflatten(2, (heads_kv, group)).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", rounded(probs), dout).unflatten(2, (heads_kv, group)).sum(3)
    if attn_mask is not None:
        return dq, dk, dv, ds
    return dq, dk, dv
