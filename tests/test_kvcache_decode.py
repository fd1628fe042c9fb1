"""flash_attn_with_kvcache as a decoding kernel: split keys (num_splits), paged caches (block_table), the
serving options combined with splits, long caches, CUDA graph replay and torch.compile, against the float64
oracle (flashattn.testing), on the CPU and on CUDA.

The expected values are written out here independently of flashattn/kvcache.py: a boolean mask of the cache
rows each query sees (FlashAttention-2's rules: keys cache_leftpad[b] <= j < L_b, the causal diagonal and the
window around query i's position L_b - seqlen_q + i) and attention_reference over the sequence's contiguous
rows, once in float64 (the reference) and once in the inputs' dtype (the baseline the oracle scales by).

The parametrizations are picked lists, not cross products: each list names every value of an axis at least
once (the decode op's head-dim widths and an odd head dim, GQA groups, dtypes, seqlen_q, num_splits, page sizes), paired so that the
quantities the kernels tile by vary together (rows per kv head = group * seqlen_q, the decode kernel's
16-row blocks and its 64-row limit; keys per split; page size against the key block). A full product would
be thousands of cases for little more coverage.
"""
import functools

import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.reference import attention_reference
from flashattn.testing import OUT_FACTOR, assert_oracle

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


@pytest.fixture(autouse=True)
def _decode_op_on(monkeypatch):
    """These tests are the decode op's: on CUDA they run it whatever FLASHATTN_DECODE_OP says."""
    monkeypatch.setattr(flashattn.kvcache, "decode_op_enabled", True)

# A block_table entry that is not a page: it fills the columns past each sequence's pages. Reading it would
# fault on CUDA (2^30 pages of even one row are far past any allocation) or raise on the CPU, so a correct
# result proves those entries are never dereferenced.
GARBAGE_PAGE = 2 ** 30

BF16, FP16 = torch.bfloat16, torch.float16


# ---- the expected values ----


def _visible(seqlen_q, seqlen_cache, ends, starts=None, causal=False, window=(-1, -1)):
    """Boolean (batch, 1, seqlen_q, seqlen_cache): the cache rows query i of sequence b attends to. Keys
    starts[b] <= j < ends[b] (ends: the length after any append); query i sits at diagonal position
    d = ends[b] - seqlen_q + i: causal keeps j <= d, the window d - left <= j <= d + right (-1: unbounded;
    causal makes right 0, as in FlashAttention-2)."""
    device = ends.device
    keys = torch.arange(seqlen_cache, device=device)
    ends = ends.long()
    diagonal = (ends[:, None] - seqlen_q + torch.arange(seqlen_q, device=device))[:, :, None]  # (B, Lq, 1)
    visible = (keys < ends[:, None, None]).expand(-1, seqlen_q, -1)
    if starts is not None:
        visible = visible & (keys >= starts.long()[:, None, None])
    left, right = window
    if causal:
        right = 0
    if right >= 0:
        visible = visible & (keys <= diagonal + right)
    if left >= 0:
        visible = visible & (keys >= diagonal - left)
    return visible[:, None]


def _oracle(q, k_rows, v_rows, visible, scale=None, softcap=0.0):
    """(ref_out, ref_lse, base_out): float64 reference out and lse, and the baseline out (the same math in
    q's dtype), of q over each sequence's contiguous cache rows k_rows / v_rows (batch, seqlen_cache,
    heads_kv, headdim) under the visible mask (None: every row). Computed on the inputs' device."""
    ref_out, ref_lse = attention_reference(q.double(), k_rows.double(), v_rows.double(), scale, attn_mask=visible,
                                           softcap=softcap, return_lse=True)
    base_out = attention_reference(q, k_rows, v_rows, scale, attn_mask=visible, softcap=softcap, upcast=False)
    return ref_out, ref_lse, base_out


def _assert_matches(out, lse, q, expected):
    """out and lse against the oracle: out within OUT_FACTOR of the baseline's error; lse -inf on exactly the
    rows that see no key (their out exactly 0), elsewhere float32-close to the float64 lse."""
    ref_out, ref_lse, base_out = expected
    batch, seqlen_q, heads_q, _ = q.shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse: the -inf rows differ from the reference's"
    assert not torch.isnan(lse).any(), "lse has NaN"
    assert (out.permute(0, 2, 1, 3)[empty] == 0).all(), "a row that sees no key must be 0"
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty], rtol=0, atol=2e-3)


def _bits(t):
    """The raw bits of a 16-bit float tensor, so that equality also holds between NaN fillers."""
    return t.view(torch.int16)


# ---- paged caches ----


def _paginate(k_rows, v_rows, ends, page_size, spare=2):
    """Lays contiguous per-sequence caches k_rows / v_rows (batch, capacity, heads_kv, headdim), capacity a
    multiple of page_size, out in pages: (k_pages, v_pages, block_table). Sequence b gets ceil(ends[b] /
    page_size) pages at random places (a permutation: neighbours in a sequence are not neighbours in
    memory), each holding the same rows as the contiguous layout (including the rows past ends[b] on its
    last page, so the two layouts are the same input); its table entries past them are GARBAGE_PAGE.

    The pages no sequence uses are NaN, and they include page 0 and the last page, the places an
    implementation might clamp a garbage entry to: a masked key loaded from them anyway (a NaN value
    times a zero probability is NaN) shows up in the result. On the CPU it shows as a bitwise mismatch
    with the contiguous layout even where the result stays right: a non-finite value anywhere in a masked
    call's k or v moves the CPU op to its untiled path (csrc/cpu/attention_cpu_fwd_plain.h,
    tiles_take_mask), which rounds differently."""
    batch, capacity = k_rows.shape[:2]
    assert capacity % page_size == 0 and spare >= 2
    used = [-(-n // page_size) for n in ends.tolist()]
    num_pages = sum(used) + spare
    inner = (torch.randperm(num_pages - 2) + 1).tolist()  # pages 1 .. num_pages - 2, shuffled
    shape = (num_pages, page_size) + tuple(k_rows.shape[2:])
    k_pages = torch.full(shape, float("nan"), dtype=k_rows.dtype, device=k_rows.device)
    v_pages = torch.full(shape, float("nan"), dtype=v_rows.dtype, device=v_rows.device)
    table = torch.full((batch, capacity // page_size), GARBAGE_PAGE, dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        ids = inner[start:start + n]
        start += n
        if n:
            table[b, :n] = torch.tensor(ids, dtype=torch.int32)
            k_pages[ids] = k_rows[b, :n * page_size].reshape((n, page_size) + shape[2:])
            v_pages[ids] = v_rows[b, :n * page_size].reshape((n, page_size) + shape[2:])
    return k_pages, v_pages, table.to(k_rows.device)


# ---- 1. decoding and short query chunks over caches of different lengths ----

# (seqlen_q, heads_q, heads_kv, head_dim, dtype, causal, num_splits). Every head dim (64, 96, 128, 192, 256,
# and 80, not a multiple of 16), GQA group (1, 4, 8, and MQA: 1 kv head for 32 query heads), seqlen_q (1, 2, 4,
# 7), dtype, causal flag and num_splits (0 = heuristic, 1, 3, 64 = more splits than the 300-key cache has key
# blocks) appears several times; the rows per kv head (group * seqlen_q) run 1, 4, 7, 8, 16, 32, 56, 64 (the
# decode path's limit today) and 224 (past it: the batched fallback), so both CUDA paths are judged.
DECODE_CASES = [
    (1, 8, 8, 64, BF16, False, 0),
    (1, 32, 8, 128, FP16, False, 1),
    (1, 32, 4, 128, BF16, True, 3),
    (1, 32, 1, 128, BF16, False, 64),  # MQA: 32 rows of one kv head, two 16-row blocks
    (1, 32, 1, 64, FP16, True, 3),
    (1, 16, 2, 256, FP16, False, 3),
    (1, 8, 2, 96, BF16, False, 64),
    (1, 8, 8, 192, BF16, True, 0),
    (1, 8, 2, 80, FP16, False, 3),  # head dim 80 may take a fallback path
    (2, 32, 1, 128, BF16, True, 3),  # MQA, 64 rows
    (2, 8, 8, 96, FP16, True, 64),
    (4, 32, 4, 128, FP16, True, 64),
    (4, 8, 2, 192, BF16, False, 1),
    (4, 16, 2, 256, BF16, True, 0),
    (4, 32, 8, 64, BF16, False, 3),
    (7, 8, 8, 64, BF16, True, 1),
    (7, 16, 2, 256, FP16, True, 3),
    (7, 32, 1, 128, BF16, True, 0),  # MQA, 224 rows
    (7, 8, 1, 80, BF16, True, 64),
    (7, 32, 4, 192, FP16, False, 64),
]


def _decode_id(case):
    seqlen_q, heads_q, heads_kv, head_dim, dtype, causal, splits = case
    return (f"q{seqlen_q}-h{heads_q}/{heads_kv}-d{head_dim}-{'bf16' if dtype == BF16 else 'fp16'}-"
            f"{'causal' if causal else 'full'}-s{splits}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=_decode_id)
def test_decode_matches_oracle(device, case):
    """Four sequences of 0, 1, 157 and 300 (the whole cache) keys: an empty sequence (every row -inf and 0),
    one shorter than seqlen_q (with causal, its first rows see no key), a partial last key block and a full
    cache. The cache is not written (no append)."""
    seqlen_q, heads_q, heads_kv, head_dim, dtype, causal, num_splits = case
    batch, seqlen_cache = 4, 300
    lengths = torch.tensor([0, 1, 157, seqlen_cache], dtype=torch.int32, device=device)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, seqlen_cache, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=causal,
                                                 num_splits=num_splits, return_softmax_lse=True)
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)
    _assert_matches(out, lse, q, _oracle(q, k_cache, v_cache, _visible(seqlen_q, seqlen_cache, lengths,
                                                                          causal=causal)))


def test_cpu_ignores_num_splits():
    """On the CPU num_splits changes nothing: every value gives the same bits."""
    q = torch.randn(3, 2, 8, 64, dtype=BF16)
    k_cache, v_cache = (torch.randn(3, 200, 2, 64, dtype=BF16) for _ in range(2))
    lengths = torch.tensor([0, 77, 200], dtype=torch.int32)
    results = [flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True,
                                                 num_splits=n, return_softmax_lse=True) for n in (0, 1, 3, 64)]
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


# ---- 2. paged caches ----

PAGE_SIZES = [1, 16, 48, 64, 256]  # 48: not a power of two, not a multiple of the kernels' key blocks

# (seqlen_q, causal, dtype, num_splits): a decoding step with the heuristic's splits and with more splits
# than key blocks, and a causal chunk of 5 queries (8 * 5 = 40 rows per kv head) with 3 splits.
PAGED_CASES = [(1, False, BF16, 0), (5, True, FP16, 3), (1, False, BF16, 64)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("case", PAGED_CASES, ids=lambda c: f"q{c[0]}-{'causal' if c[1] else 'full'}-s{c[3]}")
def test_paged_matches_contiguous_and_oracle(device, page_size, case):
    """The same caches laid out contiguously and in shuffled pages, with GARBAGE_PAGE past each sequence's
    pages (all of an empty sequence's entries, none of a full one's), give the same bits, and match the
    oracle. The pages are not written."""
    seqlen_q, causal, dtype, num_splits = case
    batch, heads_q, heads_kv, head_dim = 4, 16, 2, 128
    capacity = -(-300 // page_size) * page_size
    lengths = torch.tensor([0, 137, capacity - 1 - page_size // 2, capacity], dtype=torch.int32, device=device)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_pages, v_pages, table = _paginate(k_rows, v_rows, lengths, page_size)
    k_pages_before, v_pages_before = k_pages.clone(), v_pages.clone()
    kwargs = dict(cache_seqlens=lengths, causal=causal, num_splits=num_splits, return_softmax_lse=True)

    out_p, lse_p = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, **kwargs)
    out_c, lse_c = flashattn.flash_attn_with_kvcache(q, k_rows, v_rows, **kwargs)

    # Bitwise equal: the contiguous cache's capacity is the table's (pages_per_seq * page_size), so any
    # choice made from the shapes (num_splits=0's heuristic, the split boundaries) is the same, and the kernel
    # then sees the same keys in the same order, in the same key blocks and splits: a page only changes
    # the address a key row is loaded from, never the arithmetic. (The keys past a sequence's length are
    # masked in both: their values, which differ, contribute exactly zero.)
    assert torch.equal(out_p, out_c), "paged and contiguous outputs differ"
    assert torch.equal(lse_p, lse_c), "paged and contiguous lse differ"
    assert torch.equal(_bits(k_pages), _bits(k_pages_before)) and torch.equal(_bits(v_pages), _bits(v_pages_before))
    _assert_matches(out_p, lse_p, q, _oracle(q, k_rows, v_rows, _visible(seqlen_q, capacity, lengths, causal=causal)))


def test_get_scheduler_metadata_form_and_errors():
    md = flashattn.get_scheduler_metadata(4, 1, 8192, 32, 8, 128, num_splits=6)
    assert md.dtype == torch.int32 and md.device.type == "cpu" and md.tolist() == [6]
    md = flashattn.get_scheduler_metadata(4, 1, 8192, 32, 8, 128, cache_seqlens=torch.zeros(4, dtype=torch.int32),
                                          causal=True, pack_gqa=True)
    assert md.dtype == torch.int32 and md.shape == (1,) and md.item() >= 1
    if not flashattn.cuda_kernels_built() or not torch.cuda.is_available():
        assert md.item() == 1  # no GPU: no split
    with pytest.raises(NotImplementedError, match="attention_chunk"):
        flashattn.get_scheduler_metadata(4, 1, 8192, 32, 8, 128, attention_chunk=1024)
    # A value head dim of its own takes the batched kernels, which split no keys.
    assert flashattn.get_scheduler_metadata(4, 1, 8192, 32, 8, 192, headdim_v=128).tolist() == [1]
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        flashattn.get_scheduler_metadata(4, 1, 8192, 30, 8, 128)
    with pytest.raises(ValueError, match="max_seqlen_k must be an int"):
        flashattn.get_scheduler_metadata(4, 1, -1, 32, 8, 128)


@pytest.mark.parametrize("device", DEVICES)
def test_scheduler_metadata_sets_num_splits(device):
    """scheduler_metadata's count is the decode op's num_splits (same bits as passing it directly), in
    flash_attn_with_kvcache and the paged flash_attn_varlen_func; a num_splits above 0 wins; anything but
    get_scheduler_metadata's form raises."""
    dtype = BF16 if device == "cuda" else torch.float32
    batch, heads_q, heads_kv, head_dim, capacity = 2, 8, 2, 64, 1024
    lengths = torch.tensor([1000, 333], dtype=torch.int32, device=device)
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    md = flashattn.get_scheduler_metadata(batch, 1, capacity, heads_q, heads_kv, head_dim, num_splits=3)
    via_md = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, scheduler_metadata=md)
    direct = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=3)
    assert torch.equal(via_md, direct)
    other = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=1,
                                             scheduler_metadata=md)
    assert torch.equal(other, flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                                num_splits=1))
    k_pages, v_pages, table = _paginate(k_cache, v_cache, lengths, 64)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    varlen_md = flashattn.flash_attn_varlen_func(q[:, 0], k_pages, v_pages, cu_q, None, 1, capacity, seqused_k=lengths,
                                                 block_table=table, scheduler_metadata=md)
    varlen_direct = flashattn.flash_attn_varlen_func(q[:, 0], k_pages, v_pages, cu_q, None, 1, capacity,
                                                     seqused_k=lengths, block_table=table, num_splits=3)
    assert torch.equal(varlen_md, varlen_direct)
    for bad in (md.float(), md.to(device) if device == "cuda" else torch.zeros(2, dtype=torch.int32), 3):
        with pytest.raises(ValueError, match="scheduler_metadata must be what"):
            flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, scheduler_metadata=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_page_table_is_block_table(device):
    """FlashAttention-3's name page_table reaches the same paged path as block_table, in
    flash_attn_with_kvcache and flash_attn_varlen_func; both at once raise."""
    batch, heads_q, heads_kv, head_dim, page_size = 2, 8, 2, 64, 16
    dtype = BF16 if device == "cuda" else torch.float32
    lengths = torch.tensor([40, 17], dtype=torch.int32, device=device)
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(batch, 48, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_pages, v_pages, table = _paginate(k_rows, v_rows, lengths, page_size)
    by_block = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table)
    by_page = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths, page_table=table)
    assert torch.equal(by_block, by_page)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    varlen = flashattn.flash_attn_varlen_func(q[:, 0], k_pages, v_pages, cu_q, None, 1, 48, seqused_k=lengths,
                                              page_table=table)
    torch.testing.assert_close(varlen, by_block[:, 0])  # another path to the same attention (CPU: rounding)
    with pytest.raises(ValueError, match="block_table or page_table"):
        flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
                                          page_table=table)
    with pytest.raises(ValueError, match="block_table or page_table"):
        flashattn.flash_attn_varlen_func(q[:, 0], k_pages, v_pages, cu_q, None, 1, 48, seqused_k=lengths,
                                         block_table=table, page_table=table)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16, 48, 256])
@pytest.mark.parametrize("seqlen_new,num_splits", [(1, 0), (5, 3)])
def test_paged_append(device, page_size, seqlen_new, num_splits):
    """New k and v (seqlen_new rows per sequence, attended by as many causal queries) written into the pages:
    each at row (L + t) % page_size of page block_table[b, (L + t) // page_size], nothing else in the pages
    changed (the NaN spare pages included), the output equal to the same append on a contiguous cache and
    to the oracle. The cached lengths put the new rows at a page's start (0), across a page boundary
    (page_size - 1: with page_size 1 every new row is on a page of its own), at the very end of the capacity,
    and mid-page."""
    dtype = BF16
    batch, heads_q, heads_kv, head_dim = 4, 8, 2, 64
    capacity = (-(-300 // page_size) + 1) * page_size
    before = torch.tensor([0, page_size - 1, capacity - seqlen_new, 37], dtype=torch.int32, device=device)
    ends = before + seqlen_new
    q = torch.randn(batch, seqlen_new, heads_q, head_dim, dtype=dtype, device=device)
    k_new, v_new = (torch.randn(batch, seqlen_new, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_pages, v_pages, table = _paginate(k_rows, v_rows, ends, page_size)

    k_pages_expected, v_pages_expected = k_pages.clone(), v_pages.clone()
    k_rows_expected, v_rows_expected = k_rows.clone(), v_rows.clone()
    for b, n in enumerate(before.tolist()):
        for t in range(seqlen_new):
            page, row = int(table[b, (n + t) // page_size]), (n + t) % page_size
            k_pages_expected[page, row], v_pages_expected[page, row] = k_new[b, t], v_new[b, t]
            k_rows_expected[b, n + t], v_rows_expected[b, n + t] = k_new[b, t], v_new[b, t]

    kwargs = dict(cache_seqlens=before, causal=True, num_splits=num_splits, return_softmax_lse=True)
    out_p, lse_p = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, block_table=table, **kwargs)
    out_c, lse_c = flashattn.flash_attn_with_kvcache(q, k_rows, v_rows, k_new, v_new, **kwargs)

    assert torch.equal(_bits(k_pages), _bits(k_pages_expected)), "k pages: wrong rows written or others changed"
    assert torch.equal(_bits(v_pages), _bits(v_pages_expected)), "v pages: wrong rows written or others changed"
    assert torch.equal(k_rows, k_rows_expected) and torch.equal(v_rows, v_rows_expected)
    # Same keys in the same order after the append (see test_paged_matches_contiguous_and_oracle).
    assert torch.equal(out_p, out_c) and torch.equal(lse_p, lse_c)
    _assert_matches(out_p, lse_p, q, _oracle(q, k_rows_expected, v_rows_expected,
                                             _visible(seqlen_new, capacity, ends, causal=True)))


# ---- 3. window, softcap, cache_leftpad, cache_batch_idx, with splits ----

# Each option alone with two split counts, then combined; the paged ones (not with leftpad or batch_idx,
# which FlashAttention-2 does not combine with a block table either) use page sizes 16 and 48. A window's
# right bound only shows when it is smaller than the queries after the row's diagonal: (16, 2) with 7
# queries. softcap 2 and 5 (scores here are about N(0, 1)) bend the scores visibly.
FEATURE_CASES = [
    pytest.param(dict(seqlen_q=4, causal=True, window=(32, -1), num_splits=3), id="window-left-causal-s3"),
    pytest.param(dict(seqlen_q=1, window=(50, -1), num_splits=64), id="window-left-decode-s64"),
    pytest.param(dict(seqlen_q=7, window=(16, 2), num_splits=64), id="window-left-right-s64"),
    pytest.param(dict(seqlen_q=1, window=(50, 0), num_splits=0, dtype=FP16), id="window-left-right0-s0"),
    pytest.param(dict(seqlen_q=1, softcap=2.0, scale=0.3, num_splits=3), id="softcap-scale-s3"),
    pytest.param(dict(seqlen_q=4, causal=True, softcap=5.0, num_splits=64, dtype=FP16), id="softcap-causal-s64"),
    pytest.param(dict(seqlen_q=1, leftpad=True, num_splits=3), id="leftpad-s3"),
    pytest.param(dict(seqlen_q=4, causal=True, leftpad=True, num_splits=64), id="leftpad-causal-s64"),
    pytest.param(dict(seqlen_q=1, batch_idx=True, num_splits=0), id="batch_idx-s0"),
    pytest.param(dict(seqlen_q=4, causal=True, batch_idx=True, num_splits=3, dtype=FP16), id="batch_idx-causal-s3"),
    pytest.param(dict(seqlen_q=4, causal=True, window=(40, -1), softcap=3.0, leftpad=True, batch_idx=True,
                      num_splits=64), id="all-causal-s64"),
    pytest.param(dict(seqlen_q=2, window=(100, 1), softcap=3.0, leftpad=True, batch_idx=True, num_splits=3),
                 id="all-full-s3"),
    pytest.param(dict(seqlen_q=1, window=(64, -1), softcap=4.0, paged=16, num_splits=3),
                 id="paged16-window-softcap-s3"),
    pytest.param(dict(seqlen_q=4, causal=True, window=(20, -1), paged=48, num_splits=0), id="paged48-window-causal-s0"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FEATURE_CASES)
def test_serving_options_with_splits(device, case):
    """Sequences of 0, 33, 250 and 384 keys; with cache_leftpad they start at 0, 5, 100 and 17, the rows
    before that holding values that would dominate any row attending to them; with cache_batch_idx they
    use cache rows 5, 0, 3, 1 of 6, the two unused rows NaN (never to be read)."""
    c = dict(seqlen_q=1, causal=False, window=(-1, -1), softcap=0.0, scale=None, leftpad=False, batch_idx=False,
             paged=None, num_splits=0, dtype=BF16)
    c.update(case)
    dtype, seqlen_q = c["dtype"], c["seqlen_q"]
    batch, heads_q, heads_kv, head_dim, capacity = 4, 16, 4, 128, 384  # 384: 24 pages of 16, 8 of 48
    lengths = torch.tensor([0, 33, 250, capacity], dtype=torch.int32, device=device)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    rows = list(range(batch))
    cache_batch = batch
    if c["batch_idx"]:
        rows, cache_batch = [5, 0, 3, 1], 6
    k_cache, v_cache = (torch.randn(cache_batch, capacity, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    for r in set(range(cache_batch)) - set(rows):
        k_cache[r], v_cache[r] = float("nan"), float("nan")
    leftpad = None
    if c["leftpad"]:
        leftpad = torch.tensor([0, 5, 100, 17], dtype=torch.int32, device=device)
        for b, n in enumerate(leftpad.tolist()):
            k_cache[rows[b], :n], v_cache[rows[b], :n] = 30.0, 1e3
    batch_idx = torch.tensor(rows, dtype=torch.int32, device=device) if c["batch_idx"] else None
    k_rows, v_rows = k_cache[rows], v_cache[rows]  # each sequence's rows, contiguous, for the oracle

    kwargs = dict(cache_seqlens=lengths, cache_leftpad=leftpad, softmax_scale=c["scale"], causal=c["causal"],
                  window_size=c["window"], softcap=c["softcap"], num_splits=c["num_splits"], return_softmax_lse=True)
    if c["paged"]:
        k_pages, v_pages, table = _paginate(k_rows, v_rows, lengths, c["paged"])
        out, lse = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, **kwargs)
        out_c, lse_c = flashattn.flash_attn_with_kvcache(q, k_rows, v_rows, **kwargs)
        assert torch.equal(out, out_c) and torch.equal(lse, lse_c)  # as in test_paged_matches_contiguous_and_oracle
    else:
        out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=batch_idx, **kwargs)
    visible = _visible(seqlen_q, capacity, lengths, starts=leftpad, causal=c["causal"], window=c["window"])
    _assert_matches(out, lse, q, _oracle(q, k_rows, v_rows, visible, c["scale"], c["softcap"]))


# ---- 4. long caches: the split paths on CUDA ----


@requires_cuda
@pytest.mark.parametrize("num_splits", [0, 16])
@pytest.mark.parametrize("length,page_size", [(32768, None), (30001, None), (30001, 256)],
                         ids=["full-contiguous", "partial-contiguous", "partial-paged256"])
def test_long_cache_split_kv(num_splits, length, page_size):
    """One sequence, a 32768-row cache, 8 kv heads (32 query heads): the case split-KV exists for. The oracle
    runs one kv head at a time (its 4 query heads over that head's keys), so the float64 copies stay about
    a hundred MiB instead of GiBs."""
    device, dtype = "cuda", BF16
    heads_q, heads_kv, head_dim, capacity = 32, 8, 128, 32768
    group = heads_q // heads_kv
    q = torch.randn(1, 1, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(1, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    lengths = torch.tensor([length], dtype=torch.int32, device=device)
    if page_size is None:
        out, lse = flashattn.flash_attn_with_kvcache(q, k_rows, v_rows, cache_seqlens=lengths, num_splits=num_splits,
                                                     return_softmax_lse=True)
    else:
        k_pages, v_pages, table = _paginate(k_rows, v_rows, lengths, page_size)
        out, lse = flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
                                                     num_splits=num_splits, return_softmax_lse=True)
        del k_pages, v_pages
    parts = [_oracle(q[:, :, h * group:(h + 1) * group], k_rows[:, :length, h:h + 1], v_rows[:, :length, h:h + 1],
                     None) for h in range(heads_kv)]
    expected = (torch.cat([p[0] for p in parts], dim=2), torch.cat([p[1] for p in parts], dim=1),
                torch.cat([p[2] for p in parts], dim=2))
    _assert_matches(out, lse, q, expected)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("stages", [2, 3])
def test_decode_ring_depths_agree(plan_options, head_dim, stages):
    """The decode kernel's shallower ring forms (the planner's decode_stages) give the default form's result
    bit for bit with the same splits (each warp adds its key blocks in the same order whatever the depth),
    over a paged cache with a partial last block and causal rows; a width without the form keeps its own."""
    torch.manual_seed(head_dim + stages)
    device, dtype = "cuda", BF16
    batch, heads_q, heads_kv, capacity = 3, 8, 2, 704
    q = torch.randn(batch, 3, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    lengths = torch.tensor([700, 333, 17], dtype=torch.int32, device=device)
    k_pages, v_pages, table = _paginate(k_rows, v_rows, lengths, 16)

    def run():
        return flashattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
                                                 causal=True, num_splits=3, return_softmax_lse=True)

    want = run()
    plan_options(decode_stages=stages)
    got = run()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# ---- 5. CUDA graphs ----


@requires_cuda
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged64"])
@pytest.mark.parametrize("num_splits", [0, 3])
def test_cuda_graph_replay_honors_new_cache_seqlens(paged, num_splits):
    """A decoding step captured once with a cache_seqlens tensor, replayed after writing new lengths into
    that tensor in place (longer, shorter, zero, the full cache): each replay equals the eager call for those
    lengths and the oracle. Capture itself fails on a host synchronization, so the path has none; and the
    lengths are read on the device at replay, not baked in at capture."""
    device, dtype = "cuda", BF16
    batch, heads_q, heads_kv, head_dim, capacity, page_size = 3, 16, 2, 128, 512, 64
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    seqlens = torch.tensor([5, 300, 77], dtype=torch.int32, device=device)
    table = None
    k_cache, v_cache = k_rows, v_rows
    if paged:  # every sequence owns all its pages: the lengths may grow to the capacity at replay
        full = torch.full((batch,), capacity, dtype=torch.int32, device=device)
        k_cache, v_cache, table = _paginate(k_rows, v_rows, full, page_size)

    def step():
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 num_splits=num_splits, return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (lazy initialisation, caches)
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_lse = step()

    for lengths in ([5, 300, 77], [capacity, 0, 129], [1, 64, 511]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        eager_out, eager_lse = step()
        # The same kernels on the same inputs: num_splits=0's choice comes from the shapes (a graph cannot
        # read the lengths on the host), so eager and replay pick the same and agree bit for bit.
        assert torch.equal(graph_out, eager_out), f"replay differs from eager for lengths {lengths}"
        assert torch.equal(graph_lse, eager_lse), f"replay's lse differs from eager for lengths {lengths}"
        _assert_matches(graph_out, graph_lse, q, _oracle(q, k_rows, v_rows, _visible(1, capacity, seqlens)))


# ---- 6. torch.compile ----


@pytest.mark.skipif(flashattn.ops.cuda_kernels_built() and not torch.cuda.is_available(),
                    reason="a CUDA build answers from the GPU's properties")
def test_decode_head_dim_query_traces_as_a_constant():
    """The build's answer to "does the decode op serve this head dim" is a constant under
    torch.compile(fullgraph=True): dynamo cannot call the extension function itself (on the CPU, what the
    CUDA compile tests below need of it)."""
    from flashattn import kvcache
    fn = torch.compile(lambda x: x + 1 if kvcache._decode_op_serves_head_dim(128, True, 0) else x - 1,
                       fullgraph=True, backend="eager")
    expected = 1.0 if kvcache._decode_op_serves_head_dim(128, True, 0) else -1.0
    assert fn(torch.zeros(2)).tolist() == [expected, expected]


@requires_cuda
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged64"])
def test_torch_compile_fullgraph_matches_eager(paged):
    """A function calling flash_attn_with_kvcache (no append) compiles with fullgraph=True and gives the eager
    result, for two sets of lengths through the same compiled function (the lengths are tensor data, not
    guarded constants)."""
    torch._dynamo.reset()
    device, dtype = "cuda", BF16
    batch, seqlen_q, heads_q, heads_kv, head_dim, capacity, page_size = 3, 2, 16, 2, 128, 512, 64
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    table = None
    k_cache, v_cache = k_rows, v_rows
    if paged:
        full = torch.full((batch,), capacity, dtype=torch.int32, device=device)
        k_cache, v_cache, table = _paginate(k_rows, v_rows, full, page_size)

    def step(q, k_cache, v_cache, seqlens, table):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 causal=True, num_splits=0, return_softmax_lse=True)

    compiled = torch.compile(step, fullgraph=True)
    for lengths in ([5, 300, 77], [capacity, 0, 129]):
        seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
        out_c, lse_c = compiled(q, k_cache, v_cache, seqlens, table)
        out_e, lse_e = step(q, k_cache, v_cache, seqlens, table)
        # Exact: the compiled graph runs the same attention kernel on the same tensors; what inductor
        # generates around it (lengths, masks, index arithmetic) is integer or boolean, hence exact.
        torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
        torch.testing.assert_close(lse_c, lse_e, rtol=0, atol=0)
        _assert_matches(out_c, lse_c, q, _oracle(q, k_rows, v_rows, _visible(seqlen_q, capacity, seqlens, causal=True)))


# ---- 7. bad arguments ----


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_name_the_argument(device):
    """Each bad block_table / page layout / num_splits raises an error whose message names the argument."""
    dtype = BF16
    q = torch.randn(2, 1, 4, 64, dtype=dtype, device=device)
    pages = torch.randn(6, 16, 2, 64, dtype=dtype, device=device)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=device)
    lengths = torch.tensor([10, 40], dtype=torch.int32, device=device)
    call = functools.partial(flashattn.flash_attn_with_kvcache, q, pages, pages.clone(), cache_seqlens=lengths)
    errors = (ValueError, RuntimeError)

    with pytest.raises(errors, match="block_table"):
        call(block_table=table.long())  # int64
    with pytest.raises(errors, match="block_table"):
        call(block_table=table.to(torch.int16))
    with pytest.raises(errors, match="block_table"):
        call(block_table=table.flatten())  # rank 1
    with pytest.raises(errors, match="block_table"):
        call(block_table=table[None])  # rank 3
    with pytest.raises(errors, match="block_table"):
        call(block_table=table[:1])  # one row for two sequences
    other = "meta" if device == "cpu" else "cpu"  # a second device this machine surely has
    with pytest.raises(errors, match="block_table"):
        call(block_table=table.to(other))
    with pytest.raises(errors, match="block_table"):
        call(block_table=table, cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32, device=device))
    # Pages of 16 rows for k, of 8 for v (the same number of elements, so only the page size differs).
    v_pages = torch.randn(12, 8, 2, 64, dtype=dtype, device=device)
    with pytest.raises(errors, match="v_cache"):
        flashattn.flash_attn_with_kvcache(q, pages, v_pages, cache_seqlens=lengths, block_table=table)

    cache = torch.randn(2, 50, 2, 64, dtype=dtype, device=device)
    for bad in (-1, -64):
        with pytest.raises(errors, match="num_splits"):
            flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths, num_splits=bad)


# ---- 8. flash_attn_varlen_func over a paged cache (the call a serving engine makes for a mixed batch) ----

# (query counts per sequence, key counts, page size, causal, heads_q, heads_kv, head_dim). Query counts
# include 0 and a sequence longer than its keys; the decode op takes max_seqlen_q * group <= 64 on CUDA, the
# last case (16 queries x group 8) the padded variable-length path.
VARLEN_PAGED_CASES = [
    ([1, 1, 1, 1], [300, 0, 17, 64], 16, True, 8, 2, 128),
    ([3, 0, 1, 2], [45, 10, 200, 2], 48, True, 8, 8, 64),
    ([2, 5, 1], [99, 4, 150], 64, False, 4, 1, 96),
    ([16, 4], [150, 40], 16, True, 8, 1, 64),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", VARLEN_PAGED_CASES, ids=lambda c: f"q{'-'.join(map(str, c[0]))}-p{c[2]}")
def test_varlen_paged_matches_oracle(device, case):
    q_counts, k_counts, page_size, causal, heads_q, heads_kv, head_dim = case
    batch, dtype = len(q_counts), BF16
    capacity = -(-max(k_counts) // page_size) * page_size
    ends = torch.tensor(k_counts, dtype=torch.int32, device=device)
    k_rows, v_rows = (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_pages, v_pages, table = _paginate(k_rows, v_rows, ends, page_size)
    cu_q = torch.tensor([0] + list(torch.tensor(q_counts).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(int(cu_q[-1]), heads_q, head_dim, dtype=dtype, device=device)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, None, max(q_counts), capacity, causal=causal, block_table=table, seqused_k=ends,
        return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (heads_q, q.size(0))
    for b, (nq, nk) in enumerate(zip(q_counts, k_counts)):
        if nq == 0:
            continue
        rows = slice(int(cu_q[b]), int(cu_q[b]) + nq)
        q_b = q[rows].unsqueeze(0)
        visible = _visible(nq, capacity, ends[b:b + 1], causal=causal)
        expected = _oracle(q_b, k_rows[b:b + 1], v_rows[b:b + 1], visible)
        _assert_matches(out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0), q_b, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4, 0])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_varlen_with_sink(device, num_splits, causal):
    """flash_attn_varlen_func over a paged cache with a learnable_sink (no gradient), the call a gpt-oss
    decoding step makes: on CUDA the decode op, whose single-split merge or split combine adds each head's
    sink to the denominator once. out and the LSE (which includes the sink) against the reference per
    sequence, a sequence with no keys included (its out 0, its LSE the sink)."""
    torch.manual_seed(11)
    dtype = BF16 if device == "cuda" else torch.float32
    lengths_q, used, heads_q, heads_kv, head_dim, page, pages_per_seq = [1, 2, 1], [300, 0, 77], 8, 2, 64, 16, 20
    batch = len(lengths_q)
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lengths_q), heads_q, head_dim, dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(batch * pages_per_seq, page, heads_kv, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    order = torch.randperm(batch * pages_per_seq, generator=torch.Generator().manual_seed(2))
    block_table = order.view(batch, pages_per_seq).to(torch.int32).to(device)
    sink = torch.randn(heads_q, device=device) * 2
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, None, max(lengths_q), None, causal=causal, block_table=block_table,
        seqused_k=torch.tensor(used, dtype=torch.int32, device=device), learnable_sink=sink, num_splits=num_splits,
        return_attn_probs=True)
    for b in range(batch):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys, values = (c[block_table[b].long()].reshape(-1, heads_kv, head_dim)[:used[b]][None]
                        .repeat_interleave(heads_q // heads_kv, 2) for c in (k_cache, v_cache))
        args = dict(is_causal=causal, causal_bottom_right=True, return_lse=True)
        ref, ref_lse = attention_reference(q[rows][None].double(), keys.double(), values.double(), head_dim ** -0.5,
                                           sink=sink.double(), **args)
        base, _ = attention_reference(q[rows][None], keys, values, head_dim ** -0.5, upcast=False,
                                      sink=sink.to(dtype), **args)
        assert_oracle(f"out[{b}]", out[rows][None], torch.nan_to_num(ref), torch.nan_to_num(base), OUT_FACTOR)
        torch.testing.assert_close(lse[:, rows].double(), ref_lse[0].to(lse.device), rtol=0, atol=2e-3)
