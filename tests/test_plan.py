"""The planner (csrc/plan.h, flashattn.plan) without a GPU: which path, kernel variant, grid and mask
prepasses a described call gets. Needs a build with the CUDA kernels (CI builds them); no GPU.

The GPU tests (test_gpu_paths.py) run each variant against the oracle; these tests hold the choice of
variant itself to what the kernels and the measurements behind them (docs/perf-log.md) say.
"""
import pytest

import flashattn
import flashattn.plan as plan

pytestmark = pytest.mark.skipif(not flashattn.cuda_kernels_built(), reason="built without the CUDA kernels")

H200 = {"cc": (9, 0), "num_sms": 132, "pair_clusters": 66}


def call(**fields):
    """A bf16 call on an H200: B * N = 16k tokens and H * D = 2048 unless given."""
    seqlen = fields.get("seqlen_q", 1024)
    head_dim = fields.get("head_dim", 128)
    base = {"batch": max(16384 // seqlen, 1), "seqlen_q": seqlen, "heads_q": max(2048 // head_dim, 1),
            "head_dim": head_dim, **H200}
    base.update(fields)
    base.setdefault("heads_kv", base["heads_q"])
    return base


def only_launch(p):
    assert p["path"] == "sm90" and len(p["launches"]) == 1, p
    return p["launches"][0]


# ---- the path ----

@pytest.mark.parametrize("fields,path", [
    ({"cc": (8, 0)}, "sm80"),
    ({"cc": (8, 9)}, "sm80"),
    ({"cc": (9, 0)}, "sm90"),
    ({"cc": (10, 0)}, "sm80"),       # sm_90a kernels run on compute capability 9.0 only
    ({"head_dim": 32}, "sm80"),      # 32-wide tiles: the sm80 path's
    ({"head_dim": 33}, "sm90"),
    ({"head_dim": 256}, "sm90"),
    ({"tma": False}, "sm80"),        # rows TMA cannot describe
    ({"scale": 0.0}, "sm80"),
    ({"scale": -0.5}, "sm80"),
])
def test_forward_path(fields, path):
    assert plan.plan_fwd(call(**fields))["path"] == path


def test_force_sm80_option():
    assert plan.plan_fwd(call(), force_sm80=True)["path"] == "sm80"
    assert plan.plan_fwd(call(), force_sm80=True)["launches"] == []


@pytest.mark.parametrize("fields,path,accum", [
    ({}, "sm90", 128),
    ({"head_dim": 64}, "sm90", 64),
    ({"head_dim": 40}, "sm90", 64),
    ({"head_dim": 96}, "sm90", 96),      # width 96 (in two 64-column blocks)
    ({"head_dim": 80}, "sm90", 96),      # width 96, padded
    ({"head_dim": 192}, "sm90", 192),    # the wide kernel
    ({"head_dim": 136}, "sm90", 192),    # the wide kernel, padded to width 192
    ({"head_dim": 256}, "sm90", 256),
    ({"head_dim": 256, "mask": "bool"}, "sm90", 256),
    ({"head_dim": 160, "dropout": True}, "sm90", 192),
    ({"deterministic": True}, "sm90", 128),
    ({"deterministic": True, "head_dim": 256}, "sm90", 256),
    ({"deterministic": True, "mask": "bool"}, "sm90", 128),  # the masked kernel's form with dq turns
    ({"deterministic": True, "dropout": True, "head_dim": 192}, "sm90", 192),
    ({"mask": "bool"}, "sm90", 128),
    ({"dropout": True, "head_dim": 64}, "sm90", 64),
    ({"tma": False}, "sm80", 128),
    ({"cc": (8, 0)}, "sm80", 128),
])
def test_backward_path(fields, path, accum):
    p = plan.plan_bwd(call(**fields))
    assert (p["path"], p["dq_accum_dim"]) == (path, accum)


@pytest.mark.parametrize("fields,block_m", [
    ({"head_dim": 64}, 128),
    ({"head_dim": 40}, 128),
    ({"head_dim": 64, "is_causal": True}, 128),
    ({"head_dim": 64, "heads_kv": 4}, 128),
    ({"head_dim": 64, "deterministic": True}, 128),  # dq turns for both 64-query blocks of a step
    ({"head_dim": 64, "mask": "bool"}, 64),         # the masked kernel steps 64 queries
    ({"head_dim": 64, "dropout": True}, 64),
    ({"head_dim": 96}, 64),                         # width 96: dK, dV, S^T and dP^T would not fit
    ({}, 64),
    ({"head_dim": 256}, 64),
    ({"cc": (8, 0), "head_dim": 64}, 0),            # the sm80 path
])
def test_backward_query_steps(fields, block_m):
    assert plan.plan_bwd(call(**fields))["sm90_block_m"] == block_m


def test_backward_query_steps_option():
    assert plan.plan_bwd(call(head_dim=64), sm90_bwd_wide_steps=False)["sm90_block_m"] == 64


def test_backward_workspace_width_follows_the_path():
    # The sm80 backward's workspace is its own tile width (96), not the sm90 one's (128).
    p = plan.plan_bwd(call(head_dim=96), force_sm80=True)
    assert (p["path"], p["dq_accum_dim"]) == ("sm80", 96)


# ---- the sm90 forward's variants ----

@pytest.mark.parametrize("head_dim,seqlen,causal,tiles", [
    (64, 1024, False, "prefetch_scores"),
    (64, 1024, True, "prefetch_scores"),
    (64, 2048, False, "long_rows"),      # three consumer warpgroups from 2k keys and queries
    (64, 2048, True, "prefetch_scores"),  # ... and from 4k under causal masking
    (64, 4096, True, "long_rows"),
    (96, 4096, False, "default"),
    (128, 1024, False, "default"),
    (128, 2048, False, "wide_keys_tail128"),  # 2048 = 11 * 176 + 112
    (128, 4096, False, "wide_keys_tail64"),   # 4096 = 23 * 176 + 48
    (128, 8192, False, "wide_keys_tail128"),  # 8192 = 46 * 176 + 96
    (128, 4096, True, "default"),         # wide key blocks lose on the causal diagonal
    (192, 4096, False, "default"),
    (256, 4096, True, "default"),
])
def test_forward_tiles(head_dim, seqlen, causal, tiles):
    launch = only_launch(plan.plan_fwd(call(head_dim=head_dim, seqlen_q=seqlen, is_causal=causal)))
    assert launch["tiles"] == tiles


@pytest.mark.parametrize("seqlen_k,tiles", [
    (2112, "wide_keys"),          # 12 whole blocks: no tail
    (1200, "wide_keys"),          # 6 * 176 + 144: a last block wider than either tail
    (240, "wide_keys_tail64"),    # 176 + 64
    (304, "wide_keys_tail128"),   # 176 + 128
    (176, "wide_keys"),           # one block, no tail after it
])
def test_narrow_tail_choice(seqlen_k, tiles):
    p = plan.plan_fwd(call(seqlen_q=256, seqlen_k=seqlen_k, batch=2, heads_q=4), sm90_wide_key_blocks="on")
    assert only_launch(p)["tiles"] == tiles


def test_wide_key_and_narrow_tail_options():
    c = call(seqlen_q=4096)
    assert only_launch(plan.plan_fwd(c))["tiles"] == "wide_keys_tail64"
    assert only_launch(plan.plan_fwd(c, sm90_narrow_tail=False))["tiles"] == "wide_keys"
    assert only_launch(plan.plan_fwd(c, sm90_wide_key_blocks="off"))["tiles"] == "default"
    # "on" also where the planner would not: causal rows, short rows.
    assert only_launch(plan.plan_fwd(call(seqlen_q=4096, is_causal=True), sm90_wide_key_blocks="on"))["tiles"] == "wide_keys"
    assert only_launch(plan.plan_fwd(call(seqlen_q=512), sm90_wide_key_blocks=True))["tiles"] == "wide_keys"


def test_windows_keep_128_key_blocks():
    """A sliding window (causal at its right bound) keeps the 128-key blocks of causal rows, however wide
    (176-key blocks measured slower at 4096 keys); "on" still gives it the wide ones."""
    wide = call(seqlen_q=32768, is_causal=True, window_span=4095)
    assert only_launch(plan.plan_fwd(wide))["tiles"] == "default"
    assert only_launch(plan.plan_fwd(wide))["window_span"] == 4095
    assert only_launch(plan.plan_fwd(wide, sm90_wide_key_blocks="on"))["tiles"] == "wide_keys"


def test_multicast_choice():
    assert only_launch(plan.plan_fwd(call(seqlen_q=1024)))["multicast"]
    assert not only_launch(plan.plan_fwd(call(seqlen_q=512)))["multicast"]  # below 1024 keys
    assert only_launch(plan.plan_fwd(call(seqlen_q=512), sm90_multicast="on"))["multicast"]
    assert not only_launch(plan.plan_fwd(call(seqlen_q=4096), sm90_multicast="off"))["multicast"]
    assert not only_launch(plan.plan_fwd(call(seqlen_q=4096, is_causal=True)))["multicast"]
    assert not only_launch(plan.plan_fwd(call(seqlen_q=4096, head_dim=64)))["multicast"]  # width 128 only
    # 1100 queries: 9 query tiles, which do not pair up.
    assert not only_launch(plan.plan_fwd(call(seqlen_q=1100, seqlen_k=2048, batch=1)))["multicast"]
    # No pair of SMs for a cluster (a partitioned GPU): single-CTA loads.
    assert not only_launch(plan.plan_fwd(call(seqlen_q=4096, pair_clusters=0)))["multicast"]


def test_multicast_grid_is_whole_resident_clusters():
    launch = only_launch(plan.plan_fwd(call(seqlen_q=4096, pair_clusters=60)))
    assert launch["multicast"] and launch["grid"] == 120


@pytest.mark.parametrize("head_dim,staged", [(64, True), (96, True), (128, True), (192, False), (256, False)])
def test_staged_output(head_dim, staged):
    assert only_launch(plan.plan_fwd(call(head_dim=head_dim, seqlen_q=1024)))["staged_output"] == staged
    assert not only_launch(plan.plan_fwd(call(head_dim=head_dim), sm90_staged_output=False))["staged_output"]
    assert not only_launch(plan.plan_fwd(call(head_dim=head_dim, out_tma=False)))["staged_output"]


def test_wide_key_blocks_store_from_registers():
    assert not only_launch(plan.plan_fwd(call(seqlen_q=4096)))["staged_output"]


# ---- the schedule ----

def test_causal_schedule_pairs_then_dynamic_tail():
    p = plan.plan_fwd(call(head_dim=64, seqlen_q=2048, is_causal=True))
    launch = only_launch(p)
    assert p["tile_counter"]
    assert launch["tiles_per_unit"] == 2 and launch["grid"] == 132 and launch["dynamic_heads"] > 0
    static = only_launch(plan.plan_fwd(call(head_dim=64, seqlen_q=2048, is_causal=True), sm90_dynamic_tail=False))
    assert static["tiles_per_unit"] == 2 and static["dynamic_heads"] == 0


def test_one_wave_needs_no_pairs():
    launch = only_launch(plan.plan_fwd(call(batch=1, heads_q=4, seqlen_q=1024, is_causal=True)))
    assert launch["tiles_per_unit"] == 1 and launch["grid"] == 32 and launch["dynamic_heads"] == 0


def test_no_pairs_without_causal_masking():
    launch = only_launch(plan.plan_fwd(call(head_dim=64, seqlen_q=1024)))
    assert launch["tiles_per_unit"] == 1 and launch["grid"] == 132
    assert not plan.plan_fwd(call(head_dim=64, seqlen_q=1024))["tile_counter"]


def test_dynamic_tail_left_out_at_head_dim_256():
    # Its K/V rows fill the L2 share with so few rows that the tail would be too small to even anything out.
    launch = only_launch(plan.plan_fwd(call(head_dim=256, seqlen_q=16384, is_causal=True)))
    assert launch["tiles_per_unit"] == 2 and launch["dynamic_heads"] == 0


# ---- attention masks ----

def test_padding_mask_runs_its_key_length_form():
    p = plan.plan_fwd(call(head_dim=64, mask="bool", mask_row_stride_zero=True))
    assert p["mask"] == {"tile": (128, 128), "classify": True, "key_form": "padding"}
    assert [(l["rows"], l["tiles"]) for l in p["launches"]] == [("masked", "masked"), ("key_ends", "default")]
    assert not p["tile_counter"]


def test_causal_shaped_mask_runs_its_causal_form():
    p = plan.plan_fwd(call(seqlen_q=1000, seqlen_k=1500, mask="bool"))
    assert p["mask"]["key_form"] == "causal" and p["tile_counter"]
    masked, key_ends = p["launches"]
    assert masked["rows"] == "masked" and not masked["is_causal"]
    assert key_ends["rows"] == "key_ends" and key_ends["is_causal"] and key_ends["causal_offset"] == 500
    assert key_ends["tiles"] == "default" and not key_ends["multicast"]


@pytest.mark.parametrize("fields", [
    {"is_causal": True},           # the call's own causal masking
    {"dropout": True},
    {"mask": "additive"},          # a dense floating mask is not classified (it would be read twice)
])
def test_no_key_length_form(fields):
    c = {"mask": "bool", "mask_row_stride_zero": True, **fields}
    p = plan.plan_fwd(call(**c))
    assert p["mask"]["key_form"] == "none"
    assert [l["rows"] for l in p["launches"]] == ["masked"]


def test_broadcast_floating_mask_is_classified():
    p = plan.plan_fwd(call(mask="additive", mask_head_stride_zero=True))
    assert p["mask"]["classify"] and p["mask"]["key_form"] == "causal"


def test_dropout_alone_runs_the_masked_kernel():
    p = plan.plan_fwd(call(head_dim=64, dropout=True))
    assert [(l["rows"], l["tiles"]) for l in p["launches"]] == [("masked", "masked")]
    assert p["mask"]["tile"] == (0, 0)


def test_mask_tiles_follow_the_kernels_that_read_them():
    assert plan.plan_fwd(call(head_dim=256, mask="bool"))["mask"]["tile"] == (128, 64)
    assert plan.plan_fwd(call(head_dim=192, mask="bool"))["mask"]["tile"] == (128, 96)
    sm80 = plan.plan_fwd(call(head_dim=128, mask="bool"), force_sm80=True)
    assert sm80["path"] == "sm80" and sm80["mask"]["classify"] and sm80["mask"]["key_form"] == "none"
    assert plan.plan_bwd(call(mask="bool"))["mask"]["tile"] == (64, 128)
    assert plan.plan_bwd(call(mask="bool", head_dim=256))["mask"]["tile"] == (64, 128)  # two 64-key blocks a tile


@pytest.mark.parametrize("fields,key_form", [
    ({}, "causal"),
    ({"dmask": True}, "none"),                     # the mask's gradient is written element by element
    ({"heads_kv": 2}, "none"),                     # GQA groups whose heads have their own mask rows
    ({"heads_kv": 2, "mask_head_stride_zero": True}, "causal"),
    ({"deterministic": True}, "none"),             # unclassified: every key block takes its dq turn
    ({"head_dim": 256}, "none"),                   # the wide kernel has no key-length launch
])
def test_backward_key_length_form(fields, key_form):
    p = plan.plan_bwd(call(mask="bool", **fields))
    assert p["mask"]["key_form"] == key_form
    if fields.get("deterministic"):
        assert not p["mask"]["classify"]


# ---- shared memory of the sm80 kernels ----

A100 = {"cc": (8, 0), "num_sms": 108, "smem_per_block": 166912}      # 163 KiB a block
CONSUMER = {"cc": (8, 9), "num_sms": 128, "smem_per_block": 101376}  # 99 KiB (RTX 40xx)


H200_SMEM = 232448


# The sm80 tile configurations each limit gets (fwd, fwd with a mask or dropout, bwd), and whether the
# backward fits: the fastest that fits, the smallest (and a clear error before launch) when none does.
@pytest.mark.parametrize("limit,head_dim,tiles,bwd_fits", [
    (H200_SMEM, 64, (0, 0, 0), True),
    (H200_SMEM, 256, (0, 0, 0), True),
    (A100["smem_per_block"], 32, (0, 0, 0), True),
    (A100["smem_per_block"], 64, (0, 0, 0), True),
    (A100["smem_per_block"], 96, (0, 0, 0), True),
    (A100["smem_per_block"], 128, (0, 0, 1), True),   # one Q/dO buffer: 139 KiB
    (A100["smem_per_block"], 192, (0, 0, 1), True),
    (A100["smem_per_block"], 256, (0, 0, 1), True),
    (CONSUMER["smem_per_block"], 32, (0, 0, 0), True),
    (CONSUMER["smem_per_block"], 64, (0, 0, 1), True),
    (CONSUMER["smem_per_block"], 96, (0, 0, 1), True),
    (CONSUMER["smem_per_block"], 128, (1, 1, 2), True),
    (CONSUMER["smem_per_block"], 192, (1, 1, 1), False),
    (CONSUMER["smem_per_block"], 256, (1, 2, 1), False),  # the keep bits push the masked forward to 32 rows
])
def test_sm80_tiles_chosen_from_the_gpu_shared_memory(limit, head_dim, tiles, bwd_fits):
    gpu = {"cc": (8, 0), "num_sms": 108, "smem_per_block": limit}
    fwd = plan.plan_fwd(call(head_dim=head_dim, **gpu))
    fwd_masked = plan.plan_fwd(call(head_dim=head_dim, dropout=True, **gpu))
    bwd = plan.plan_bwd(call(head_dim=head_dim, **gpu))
    assert fwd["path"] == bwd["path"] == "sm80"
    assert (fwd["sm80_tiles"], fwd_masked["sm80_tiles"], bwd["sm80_tiles"]) == tiles
    assert fwd["smem"]["fits"] and fwd_masked["smem"]["fits"]
    assert bwd["smem"]["fits"] == bwd_fits
    for p in (fwd, fwd_masked, bwd):
        assert p["smem"]["limit"] == limit and 0 < p["smem"]["bytes"]
        assert p["smem"]["bytes"] <= limit or p is bwd


def test_sm80_tiles_shrink_in_order():
    # Each later configuration needs less shared memory: the planner's first fit is the fastest that fits.
    for head_dim in (32, 64, 96, 128, 192, 256):
        needs = [plan.plan_bwd(call(head_dim=head_dim, cc=(8, 0), smem_per_block=limit))["smem"]["bytes"]
                 for limit in (H200_SMEM, A100["smem_per_block"], CONSUMER["smem_per_block"])]
        assert needs == sorted(needs, reverse=True), (head_dim, needs)


def test_sm80_mask_tile_grid_follows_the_tiles():
    # The mask's tile classes are computed on the grid of the configuration that reads them.
    gpu = {"cc": (8, 9), "num_sms": 128, "smem_per_block": CONSUMER["smem_per_block"]}
    assert plan.plan_fwd(call(head_dim=128, mask="bool", **gpu))["mask"]["tile"] == (64, 64)
    assert plan.plan_bwd(call(head_dim=128, mask="bool", **gpu))["mask"]["tile"] == (64, 64)
    assert plan.plan_fwd(call(head_dim=128, mask="bool", cc=(8, 0)))["mask"]["tile"] == (128, 64)
    assert plan.plan_bwd(call(head_dim=128, mask="bool", cc=(8, 0)))["mask"]["tile"] == (64, 128)


def test_masked_sm80_forward_needs_its_keep_bits_too():
    plain = plan.plan_fwd(call(cc=(8, 0)))["smem"]["bytes"]
    assert plan.plan_fwd(call(cc=(8, 0), dropout=True))["smem"]["bytes"] > plain


def test_shared_memory_cap_option_and_the_sm90_path():
    h200 = {**H200, "smem_per_block": 232448}
    assert plan.plan_bwd(call(**h200))["smem"] == {"bytes": 0, "limit": 0, "fits": True}  # sm90 kernels
    forced = plan.plan_bwd(call(**h200), force_sm80=True)
    assert forced["smem"]["fits"] and forced["smem"]["limit"] == 232448
    capped = plan.plan_bwd(call(**h200), force_sm80=True, smem_per_block_cap=A100["smem_per_block"])
    assert capped["smem"]["limit"] == A100["smem_per_block"] and capped["smem"]["fits"]
    assert (forced["sm80_tiles"], capped["sm80_tiles"]) == (0, 1)
    too_small = plan.plan_bwd(call(**h200), force_sm80=True, smem_per_block_cap=64 * 1024)
    assert too_small["smem"]["limit"] == 64 * 1024 and not too_small["smem"]["fits"]
    unknown = plan.plan_bwd(call(cc=(8, 0)))  # a described GPU without a figure: not checked
    assert unknown["smem"]["limit"] == 0 and unknown["smem"]["fits"]


# ---- the options ----

def test_options_round_trip_and_restore():
    before = plan.current_options()
    with plan.options(force_sm80=True, sm90_multicast="off") as inside:
        assert inside["force_sm80"] and inside["sm90_multicast"] == "off"
        assert plan.current_options() == inside
    assert plan.current_options() == before


def test_unknown_option_raises():
    with pytest.raises(RuntimeError, match="unknown name 'q_in_registers'"):
        plan.set_options(q_in_registers=True)
    with pytest.raises(RuntimeError, match="expected 'auto', 'on', 'off'"):
        plan.set_options(sm90_multicast="sometimes")
    with pytest.raises(RuntimeError, match="decode_stages must be 0 \\(the default\\), 2 or 3, got 4"):
        plan.set_options(decode_stages=4)


def test_decode_stages_option_round_trip():
    with plan.options(decode_stages=2) as inside:
        assert inside["decode_stages"] == 2 and plan.current_options()["decode_stages"] == 2
    assert plan.current_options()["decode_stages"] == 0
