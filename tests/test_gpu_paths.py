"""Both CUDA kernel paths against the oracle on an sm_90 GPU.

On compute capability 9.0 the forward and backward run the sm90 path (TMA + wgmma) for the inputs
they cover and the sm80 path for the rest; the planner's force_sm80 option (flashattn.plan) forces the
sm80 path. The main grid in test_gpu_attention.py runs whatever the default picks; this file runs the
awkward shapes, forward and backward, under both settings so neither path goes untested on a Hopper
GPU, and a third time with sm90_staged_output off, where the sm90 forward writes its output from
registers instead of through shared memory and a TMA store (the setting compute-sanitizer's initcheck
runs under). The sm90 forward's other variants are each run against the oracle and held bit for bit to
the variant they replace.
"""
import itertools

import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.testing import make_qkv
from test_gpu_attention import run_case

pytestmark = requires_cuda

SEQLENS = [(1, 1), (17, 17), (97, 203), (203, 97), (1025, 1025), (128, 1), (1, 300)]
HEAD_DIMS = [40, 64, 72, 96, 128, 160, 192, 256]
LAYOUTS = ["contiguous", "bhsd", "padded", "unaligned"]
HEAD_CONFIGS = [(2, 4, 4), (1, 8, 2)]


def _select_path(plan_options, path):
    if path == "sm80":
        plan_options(force_sm80=True)
    elif path == "direct_output":
        plan_options(sm90_staged_output=False)


def _cases():
    cases = []
    for i, (dtype, seqlens, causal) in enumerate(itertools.product(
            [torch.bfloat16, torch.float16], SEQLENS, ["none", "top_left", "bottom_right"])):
        head_dim = HEAD_DIMS[i % len(HEAD_DIMS)]
        layout = LAYOUTS[i % len(LAYOUTS)]
        heads = HEAD_CONFIGS[i % len(HEAD_CONFIGS)]
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        cases.append(pytest.param(dtype, seqlens, causal, head_dim, layout, heads,
                                  id=f"{name}-{seqlens[0]}x{seqlens[1]}-{causal}-d{head_dim}-{layout}"))
    return cases


@pytest.mark.parametrize("path", ["default", "sm80", "direct_output"])
@pytest.mark.parametrize("dtype,seqlens,causal,head_dim,layout,heads", _cases())
def test_paths_match_oracle(plan_options, path, dtype, seqlens, causal, head_dim, layout, heads):
    _select_path(plan_options, path)
    batch, heads_q, heads_kv = heads
    run_case(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal, layout)


@pytest.mark.parametrize("path", ["default", "sm80"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
def test_paths_on_long_rows(plan_options, path, head_dim, causal):
    # Many key and query blocks per CTA, so the rings of stages wrap several times, Lq != Lk, and GQA.
    _select_path(plan_options, path)
    run_case(1, 2048, 1900, 4, 2, head_dim, torch.bfloat16, causal)


# The sm90 backward at tile width 64 takes 128 queries a step by default (unmasked);
# sm90_bwd_wide_steps off runs the 64-query steps that masked calls take. Query counts on both sides of a 128-query block, short and long rows, Lq != Lk both ways.
@pytest.mark.parametrize("wide_steps", [True, False])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("seqlens,heads,head_dim,dtype", [
    ((1, 1), (1, 2, 2), 64, torch.bfloat16),
    ((127, 129), (2, 4, 2), 64, torch.bfloat16),
    ((129, 127), (2, 4, 4), 40, torch.float16),
    ((200, 1000), (1, 6, 2), 64, torch.float16),
    ((1000, 200), (1, 4, 1), 48, torch.bfloat16),
    ((2100, 2050), (1, 4, 2), 64, torch.bfloat16),
])
def test_backward_query_steps_match_oracle(plan_options, wide_steps, causal, seqlens, heads, head_dim, dtype):
    plan_options(sm90_bwd_wide_steps=wide_steps)
    batch, heads_q, heads_kv = heads
    run_case(batch, seqlens[0], seqlens[1], heads_q, heads_kv, head_dim, dtype, causal)


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("seqlens,head_dim,dtype", [((4096, 4096), 64, torch.bfloat16),
                                                    ((4500, 4173), 40, torch.float16)])
def test_long_row_forward_configuration(causal, seqlens, head_dim, dtype):
    # At tile width 64, rows of at least 2048 queries and keys (4096 under causal masking) run the
    # sm90 forward with 192-query tiles (three consumer warpgroups): 4096 queries leave the last
    # tile's third warpgroup without rows, 4500 leave it part of them; Lq != Lk and GQA.
    run_case(1, seqlens[0], seqlens[1], 4, 2, head_dim, dtype, causal)


def test_sm90_forward_is_built_for_hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not a compute capability 9.0 GPU")
    assert flashattn.ops._C.compiled_with_sm90(), "built without sm_90a: the Hopper forward path is missing"


@pytest.mark.parametrize("seqlens,head_dim,causal", [((300, 300), 64, False), ((1025, 999), 128, True),
                                                     ((97, 203), 96, False), ((4100, 4100), 64, False),
                                                     ((4100, 4100), 40, True)])
def test_staged_and_direct_output_are_identical(plan_options, seqlens, head_dim, causal):
    # The TMA-store epilogue and the stores from registers write the same values: bit for bit equal
    # outputs and LSE (partial last tiles; the three-consumer long-row configuration at 4100 rows).
    torch.manual_seed(0)
    q = torch.randn(2, seqlens[0], 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, seqlens[1], 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    staged = torch.ops.flashattn.fwd(q, k, v, head_dim ** -0.5, causal, False)
    plan_options(sm90_staged_output=False)
    direct = torch.ops.flashattn.fwd(q, k, v, head_dim ** -0.5, causal, False)
    assert torch.equal(staged[0], direct[0]) and torch.equal(staged[1], direct[1])


# Causal shapes with more query tiles than SMs: the sm90 forward deals out pairs of query blocks and
# hands the last (head, batch) rows' tiles out one by one, heaviest first, through a counter
# (csrc/sm90/fwd_schedule.h). (batch, Lq, Lk, heads_q, heads_kv, head dim)
DYNAMIC_TAIL_SHAPES = [
    pytest.param(8, 1024, 1024, 16, 4, 64, id="pairs-then-tail"),
    # Bottom-right alignment with Lq > Lk: the tail's lightest tiles see no key at all.
    pytest.param(8, 1024, 300, 16, 4, 64, id="keyless-tiles"),
    # Three consumer warpgroups (192-query tiles) and so few rows that every tile is dynamic.
    pytest.param(1, 4096, 4096, 8, 8, 64, id="all-dynamic-long-rows"),
    # An odd number of query blocks per row (a single-tile unit in each row's pairs), head dim 128.
    pytest.param(2, 1400, 1400, 48, 16, 128, id="odd-query-blocks"),
]


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim", DYNAMIC_TAIL_SHAPES)
def test_dynamic_tail_matches_oracle(causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim):
    run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, causal)


def _causal_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim):
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim", DYNAMIC_TAIL_SHAPES)
def test_static_and_dynamic_schedules_are_identical(plan_options, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                                    head_dim):
    # Which CTA runs a tile changes nothing in its arithmetic: the dynamic tail, run four times, and the
    # static pairs (sm90_dynamic_tail off) give bit for bit the same output and LSE.
    q, k, v = _causal_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    scale = head_dim ** -0.5
    runs = {f"dynamic {i}": torch.ops.flashattn.fwd(q, k, v, scale, True, True) for i in range(4)}
    plan_options(sm90_dynamic_tail=False)
    runs["static"] = torch.ops.flashattn.fwd(q, k, v, scale, True, True)
    first = runs.pop("dynamic 0")
    for name, other in runs.items():
        same_out, same_lse = torch.equal(first[0], other[0]), torch.equal(first[1], other[1])
        out_diff = (first[0].float() - other[0].float()).abs().max().item()
        assert same_out and same_lse, f"{name} against dynamic 0: out equal {same_out} (max diff {out_diff}), lse equal {same_lse}"


def _assert_graph_replays_match_eager(q, k, v, causal, replays=3):
    """A forward captured in a CUDA graph gives the eager output and LSE at every replay (both filled
    with NaN before each, so each replay must rewrite them whole)."""
    eager = torch.ops.flashattn.fwd(q, k, v, 0.125, causal, False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.flashattn.fwd(q, k, v, 0.125, causal, False)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.flashattn.fwd(q, k, v, 0.125, causal, False)
    for _ in range(replays):
        captured[0].fill_(float("nan"))
        captured[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])


def test_dynamic_tail_replays_in_a_cuda_graph():
    # The counter is zeroed by a memset captured with the kernel: every replay hands out every tile again.
    _assert_graph_replays_match_eager(*_causal_inputs(8, 1024, 1024, 16, 4, 64), causal=True)


# K/V multicast (the sm90 forward at tile width 128 without causal masking, when a row's query tiles
# pair up): each CTA of a cluster of two loads half of every key block into both. On by default from
# 1024 keys; the sm90_multicast option "on" turns it on wherever it fits, "off" off.
MULTICAST_SHAPES = [
    pytest.param(2, 1024, 1024, 16, 16, 128, "contiguous", id="d128"),
    # The last tile's second warpgroup has no rows (900 = 7 * 128 + 4), a partial last key block, GQA.
    pytest.param(1, 900, 777, 8, 2, 128, "contiguous", id="d128-empty-warpgroup-gqa"),
    # A head dim below the tile width (columns zero-filled), long key rows, strided inputs.
    pytest.param(3, 256, 4100, 4, 4, 112, "bhsd", id="d112-long-keys-strided"),
    # Few keys (multicast off by default there). Rows that are not 16-byte aligned would take the sm80
    # path, so every layout here is one TMA can describe.
    pytest.param(2, 512, 300, 8, 8, 128, "padded", id="d128-short-keys"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,layout", MULTICAST_SHAPES)
def test_multicast_matches_oracle(plan_options, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                  layout):
    plan_options(sm90_multicast="on")
    run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "none", layout)


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,layout", MULTICAST_SHAPES)
def test_multicast_and_single_cta_loads_are_identical(plan_options, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                                      head_dim, layout):
    # Where K and V come from changes nothing in the arithmetic: bit for bit the same output and LSE.
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda", layout)
    assert_option_changes_no_bit(plan_options, "sm90_multicast", ("off", "on"), q, k, v, False, bottom_right=False)


def test_multicast_replays_in_a_cuda_graph(plan_options):
    plan_options(sm90_multicast="on")
    _assert_graph_replays_match_eager(*_causal_inputs(2, 1024, 1024, 16, 16, 128), causal=False)


# The default 128-key blocks at tile width 128 (sm90_wide_key_blocks off), where the planner would
# choose 176-key ones, with and without multicast, causal or not.
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,layout", [
    pytest.param(2, 2048, 2048, 8, 8, 128, "contiguous", id="d128"),
    pytest.param(1, 900, 2777, 8, 2, 112, "bhsd", id="d112-gqa-strided"),
])
def test_default_key_blocks_at_width_128_match_oracle(plan_options, causal, batch, seqlen_q, seqlen_k, heads_q,
                                                      heads_kv, head_dim, layout):
    plan_options(sm90_wide_key_blocks="off")
    run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, causal, layout)


def assert_option_changes_no_bit(plan_options, option, settings, q, k, v, causal, bottom_right=True):
    """The forward under each of the planner option's `settings` gives bit for bit the same output and LSE."""
    results = []
    for setting in settings:
        plan_options(**{option: setting})
        results.append(torch.ops.flashattn.fwd(q, k, v, q.shape[-1] ** -0.5, causal, bottom_right))
    for other in results[1:]:
        assert torch.equal(results[0][0], other[0]) and torch.equal(results[0][1], other[1])


# Prefetched scores (tile width 64 with two consumer warpgroups, the unmasked forward over every row):
# a tile's second QK^T GEMM is issued before its first softmax. Tiles of one key block (no second
# GEMM), of two, and longer, causal or not. They are held bit for bit to the default configuration,
# which runs the key-length form of a mask: a mask that keeps every key (or, with causal masking, a
# causal mask) runs there.
PREFETCH_SHAPES = [
    pytest.param(2, 1024, 1024, 8, 8, 64, torch.bfloat16, "contiguous", id="d64"),
    pytest.param(1, 900, 777, 8, 2, 64, torch.float16, "bhsd", id="d64-fp16-gqa-strided"),
    pytest.param(2, 128, 100, 4, 4, 64, torch.bfloat16, "padded", id="d64-one-block"),
    pytest.param(2, 200, 256, 4, 4, 64, torch.bfloat16, "contiguous", id="d64-two-blocks"),
    pytest.param(2, 300, 1500, 4, 4, 64, torch.bfloat16, "padded", id="d64-long-keys"),
]


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,dtype,layout", PREFETCH_SHAPES)
def test_prefetched_scores_match_oracle(causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout):
    run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, layout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,dtype,layout", PREFETCH_SHAPES)
def test_prefetched_scores_change_no_bit(causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype,
                                         layout):
    # The same GEMMs and softmax steps in the same order, only issued earlier: bit for bit the output and
    # LSE of the default configuration. A mask of the key-length form runs the default configuration
    # with key ends; its causal form is aligned bottom-right when Lq <= Lk, top-left otherwise.
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", layout)
    bottom_right = seqlen_q <= seqlen_k
    offset = seqlen_k - seqlen_q if bottom_right else 0
    rows = torch.arange(seqlen_q, device="cuda")[:, None]
    keys = torch.arange(seqlen_k, device="cuda")[None, :]
    keep = (keys <= rows + offset) if causal else torch.ones(1, seqlen_k, dtype=torch.bool, device="cuda")
    mask = keep.expand(seqlen_q, seqlen_k)[None, None].expand(batch, heads_q, seqlen_q, seqlen_k)
    scale = head_dim ** -0.5
    prefetched = torch.ops.flashattn.fwd(q, k, v, scale, causal, bottom_right)
    key_ends = torch.ops.flashattn.fwd(q, k, v, scale, False, False, mask)
    assert torch.equal(prefetched[0], key_ends[0]) and torch.equal(prefetched[1], key_ends[1])


# sm90_wide_key_blocks "on" (tile width 128, the unmasked forward over every row; the default from
# 2048 keys without causal masking): 176 keys per step. Key counts that are not multiples of 176
# end in a partial block; the key block of a causal row's diagonal falls at other offsets than with 128.
# Without causal masking a last block of at most 128 keys runs narrow (sm90_narrow_tail, on by
# default): 777 and 8192 keys end in blocks of 73 and 96 keys (the 128-key tail), 4096 in one of 48
# and 240 in one of 64 (the 64-key tail; 240 has no block between the first and the tail), 304 in one
# of 128; 1024 (144) and 2112 (0) keep the 176-wide last block.
WIDE_KEY_SHAPES = [
    pytest.param(2, 1024, 1024, 8, 8, 128, torch.bfloat16, "contiguous", id="d128"),
    pytest.param(1, 2048, 2112, 4, 4, 128, torch.float16, "contiguous", id="d128-fp16-12-blocks"),
    pytest.param(1, 900, 777, 8, 2, 112, torch.bfloat16, "bhsd", id="d112-gqa-strided"),
    pytest.param(2, 256, 176, 4, 4, 128, torch.bfloat16, "padded", id="d128-one-block"),
    pytest.param(1, 256, 8192, 2, 1, 128, torch.bfloat16, "contiguous", id="d128-8k-keys"),
    pytest.param(1, 300, 4096, 4, 2, 128, torch.float16, "padded", id="d128-fp16-tail-48"),
    pytest.param(2, 256, 240, 4, 4, 128, torch.bfloat16, "contiguous", id="d128-tail-64-after-one"),
    pytest.param(2, 200, 304, 4, 4, 128, torch.bfloat16, "bhsd", id="d128-tail-128-after-one"),
]


@pytest.mark.parametrize("multicast", ["off", "on"])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,dtype,layout", WIDE_KEY_SHAPES)
def test_wide_key_blocks_match_oracle(plan_options, multicast, causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                      head_dim, dtype, layout):
    plan_options(sm90_wide_key_blocks="on", sm90_multicast=multicast)
    run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, layout)


@pytest.mark.parametrize("multicast", ["off", "on"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,dtype,layout",
                         [shape for shape in WIDE_KEY_SHAPES if "tail" in shape.id or shape.values[2] in (777, 8192)])
def test_narrow_tail_changes_no_bit(plan_options, multicast, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                    dtype, layout):
    # The narrow last block leaves out keys whose probabilities are 0 and whose V rows are zeros: bit for
    # bit the same output and LSE as the 176-wide one.
    plan_options(sm90_wide_key_blocks="on", sm90_multicast=multicast)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", layout)
    assert_option_changes_no_bit(plan_options, "sm90_narrow_tail", (False, True), q, k, v, False)
