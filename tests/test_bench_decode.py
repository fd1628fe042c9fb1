"""benchmarks/bench_decode.py without a GPU: the command line and its rows, the bandwidth arithmetic, the
paged cache and the float32 reference, the tables on fabricated results (unavailable anchors as n/a, wrong
outputs marked, skipped rows), and a tiny run end to end on the CPU with FlashAttention-4 absent or
replaced by a stand-in with its interface."""
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_decode  # noqa: E402
import flashattn  # noqa: E402


# --------------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, shape", [("8x32768", (8, 32768)), ("1x8192", (1, 8192)), ("8x32k", (8, 32768)),
                                         ("1X128K", (1, 131072)), (" 64x4096 ", (64, 4096))])
def test_rows_parse(text, shape):
    assert bench_decode.parse_row(text) == shape


@pytest.mark.parametrize("text", ["8*32768", "8x", "x8192", "0x8192", "8x0", "8x32m", "8x3.5k", ""])
def test_bad_rows_are_refused(text):
    with pytest.raises(ValueError, match="row|at least 1"):
        bench_decode.parse_row(text)


def test_defaults():
    args = bench_decode.parse_args([])
    assert args.shapes == [(1, 8192), (1, 131072), (8, 8192), (8, 32768), (64, 4096), (64, 16384)]
    assert (args.dtype, args.heads, args.kv_heads, args.headdim, args.seqlen_q) == ("bf16", 32, 8, 128, 1)
    assert args.methods == list(bench_decode.METHODS) and args.splits == []
    assert args.max_err == 2e-2 and args.rounds == 3 and args.time_budget is None and args.out is None
    assert args.fa4_page_size == 256 and args.copy_mib == 2048


def test_quick_rows_and_chosen_rows():
    assert bench_decode.parse_args(["--quick"]).shapes == [(1, 8192), (8, 8192)]
    args = bench_decode.parse_args(["--rows", "1x8192", "8x32768", "--splits", "1", "4", "16", "--seqlen-q", "4",
                                    "--heads", "16", "--kv-heads", "2", "--headdim", "64", "--dtype", "fp16",
                                    "--time-budget", "120"])
    assert args.shapes == [(1, 8192), (8, 32768)]
    assert args.splits == [1, 4, 16] and args.time_budget == 120
    assert (args.seqlen_q, args.heads, args.kv_heads, args.headdim, args.dtype) == (4, 16, 2, 64, "fp16")
    assert bench_decode.method_names(args) == list(bench_decode.METHODS) + ["splits=1", "splits=4", "splits=16"]
    only = bench_decode.parse_args(["--methods", "sdpa", "flashattn"])
    assert bench_decode.method_names(only) == ["flashattn", "sdpa"]  # column order, not the order given


@pytest.mark.parametrize("argv, message", [
    (["--rows", "8by32768"], "BATCHxLENGTH"),
    (["--kv-heads", "5"], "must divide"),
    (["--splits", "0"], "--splits"),
    (["--rounds", "0"], "--rounds"),
    (["--time-budget", "0"], "--time-budget"),
    (["--methods", "flashinfer"], "invalid choice"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_decode.parse_args(argv)
    assert message in capsys.readouterr().err


def test_without_a_gpu_the_run_says_why(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert bench_decode.main(["--quick"]) == 1
    assert "--device cpu" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------------


def test_kv_bytes_and_bandwidth():
    # 8 x 32768, Hk 8, D 128, bf16: K and V are 512 MiB each.
    assert bench_decode.kv_bytes(8, 32768, 8, 128, 2) == 2**30
    assert bench_decode.kv_bytes(1, 1, 1, 1, 4) == 8
    assert bench_decode.bandwidth_tbps(1e12, 1e6) == pytest.approx(1.0)
    # 1 GiB in 250 us: 4.29 TB/s.
    assert bench_decode.bandwidth_tbps(2**30, 250.0) == pytest.approx(2**30 / 250e-6 / 1e12)
    # A copy of 2 GiB in 1 ms moves 4 GiB: 4.29 TB/s.
    assert bench_decode.copy_bandwidth_tbps(2**31, 1.0) == pytest.approx(2 * 2**31 / 1e-3 / 1e12)


def test_figures_of_a_method():
    args = bench_decode.parse_args([])
    row = bench_decode.row_config(8, 32768, args, 2)
    assert row["kv_bytes"] == 2**30 and row["label"] == "8 x 32768"
    bench_decode.add_figures(row, "flashattn", 0.5, copy_tbps=4.0)
    assert row["us"]["flashattn"] == pytest.approx(500.0)
    assert row["tbps"]["flashattn"] == pytest.approx(2**30 / 500e-6 / 1e12)
    assert row["copy_fraction"]["flashattn"] == pytest.approx(row["tbps"]["flashattn"] / 4.0)
    bench_decode.add_figures(row, "sdpa", 0.25, copy_tbps=None)
    assert "sdpa" not in row["copy_fraction"] and row["tbps"]["sdpa"] == pytest.approx(2 * row["tbps"]["flashattn"])
    assert bench_decode.ratio(row, "flashattn", "sdpa") == pytest.approx(0.5)
    assert bench_decode.ratio(row, "flashattn", "fa4") is None
    # Small figures (a CPU try) keep three digits rather than rounding to 0.00.
    bench_decode.add_figures(row, "paged16", 1e3, copy_tbps=4.0)
    assert bench_decode._bandwidth_cell(row, "paged16") == "0.00107 (0% of copy)"


# --------------------------------------------------------------------------------------------------
# Paged cache and reference
# --------------------------------------------------------------------------------------------------


def test_block_table_is_a_seeded_permutation():
    table = bench_decode.make_block_table(4, 8, seed=0)
    assert table.dtype == torch.int32 and table.shape == (4, 8)
    assert sorted(table.flatten().tolist()) == list(range(32))
    assert torch.equal(table, bench_decode.make_block_table(4, 8, seed=0))
    assert not torch.equal(table, bench_decode.make_block_table(4, 8, seed=1))
    assert table.flatten().tolist() != list(range(32))  # scattered, not in order


@pytest.mark.parametrize("seqlen, page_size", [(64, 16), (64, 64), (50, 16)])
def test_paged_cache_holds_each_sequence_in_its_pages(seqlen, page_size):
    cache = torch.randn(3, seqlen, 2, 4)
    pages = bench_decode.pages_per_sequence(seqlen, page_size)
    assert pages == math.ceil(seqlen / page_size)
    table = bench_decode.make_block_table(3, pages, seed=0)
    pool = bench_decode.paged_cache(cache, table, page_size)
    assert pool.shape == (3 * pages, page_size, 2, 4)
    for b in range(3):
        for t in range(seqlen):
            assert torch.equal(pool[table[b, t // page_size], t % page_size], cache[b, t])
    gathered = pool[table.long()].reshape(3, pages * page_size, 2, 4)
    assert torch.equal(gathered[:, :seqlen], cache)
    assert not gathered[:, seqlen:].any()  # the last page's unused rows are zeros


@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_reference_is_gqa_attention_over_the_whole_cache(seqlen_q):
    q, k, v = torch.randn(3, seqlen_q, 8, 16), torch.randn(3, 40, 2, 16), torch.randn(3, 40, 2, 16)
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(bench_decode.reference_attention(q, k, v), expected)
    # Query head h reads kv head h // 4, written out.
    group = torch.arange(8) // 4
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k[:, :, group]) / 4.0
    by_hand = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v[:, :, group])
    torch.testing.assert_close(bench_decode.reference_attention(q, k, v), by_hand)
    # A few sequences at a time gives the same.
    torch.testing.assert_close(bench_decode.reference_attention(q, k, v, chunk_tokens=40), expected)
    assert bench_decode.reference_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).dtype == torch.float32


# --------------------------------------------------------------------------------------------------
# The tables, on fabricated results
# --------------------------------------------------------------------------------------------------


def _cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


FA4_GONE = "unavailable: flash_attn.cute does not import: ModuleNotFoundError: No module named 'flash_attn'"


def _fake_rows():
    args = bench_decode.parse_args(["--splits", "1", "4"])
    first = bench_decode.row_config(1, 8192, args, 2)
    for name, ms in (("flashattn", 0.02), ("paged16", 0.04), ("sdpa", 0.01), ("splits=1", 0.02),
                     ("splits=4", 0.01)):
        bench_decode.add_figures(first, name, ms, copy_tbps=4.0)
    first["max_abs_err"] = {"flashattn": 1.9e-3, "paged16": 0.5, "sdpa": 2.0e-3, "splits=1": 1.9e-3,
                            "splits=4": 1.9e-3}
    first["wrong"] = {"paged16": "WRONG: max abs error 5.000e-01 > 0.02 (timed all the same)"}
    first["status"] = {"paged256": "failed: NotImplementedError: block_table", "fa4": FA4_GONE, "fa4_paged": FA4_GONE}
    second = bench_decode.row_config(64, 16384, args, 2)
    for name, ms in (("flashattn", 2.0), ("sdpa", 1.0)):
        bench_decode.add_figures(second, name, ms, copy_tbps=4.0)
    second["status"] = {"paged16": "failed: NotImplementedError: block_table", "fa4": FA4_GONE, "fa4_paged": FA4_GONE}
    skipped = bench_decode.skipped_row(8, 32768, args, 2, "time budget of 100 s reached")
    return args, [first, second, skipped]


def test_bandwidth_table_cells():
    _, rows = _fake_rows()
    header, rule, first, second, skipped = bench_decode.bandwidth_table(rows)
    assert _cells(header) == ["batch x length", "flashattn contig", "paged 16", "paged 256", "SDPA", "FA4", "FA4 paged"]
    assert len(_cells(rule)) == 7
    cells = dict(zip(_cells(header), _cells(first)))
    # 1 x 8192 x 8 x 128 bf16, K and V: 33.5 MB in 20 us = 1.68 TB/s, 42% of a 4 TB/s copy.
    assert cells["batch x length"] == "1 x 8192"
    assert cells["flashattn contig"] == "1.68 (42% of copy)"
    assert cells["SDPA"] == "3.36 (84% of copy)"
    assert cells["paged 16"] == "0.84 (21% of copy) WRONG"
    assert cells["paged 256"] == "n/a" and cells["FA4"] == "n/a" and cells["FA4 paged"] == "n/a"
    assert _cells(skipped)[1:] == ["skipped"] * 6


def test_ratio_time_and_splits_tables():
    _, rows = _fake_rows()
    header, _, first, second, skipped = bench_decode.ratio_table(rows)
    assert _cells(header) == ["batch x length", "flashattn / SDPA", "flashattn / FA4"]
    assert _cells(first) == ["1 x 8192", "0.50", "-"] and _cells(second) == ["64 x 16384", "0.50", "-"]
    assert _cells(skipped) == ["8 x 32768", "skipped", "skipped"]
    header, _, first, *_ = bench_decode.time_table(rows)
    cells = dict(zip(_cells(header), _cells(first)))
    assert cells["flashattn contig"] == "20.0 (1.9e-03)" and cells["paged 16"] == "40.0 (5.0e-01)"
    assert cells["FA4"] == "n/a"
    header, _, first, second, skipped = bench_decode.splits_table(rows, [1, 4])
    assert _cells(header) == ["batch x length", "flashattn default", "num_splits=1", "num_splits=4"]
    assert _cells(first)[1:] == ["1.68 (42% of copy)", "1.68 (42% of copy)", "3.36 (84% of copy)"]
    assert _cells(second)[2:] == ["-", "-"]  # asked for, not measured in this fabricated row
    assert _cells(skipped)[1:] == ["skipped"] * 3


def _meta(**extra):
    meta = {"date": "2026-12-04 10:00 UTC", "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "device": "cuda",
            "torch": "2.11.0", "cuda": "13.0", "flashattn": "0.1.0", "git_commit": "abc1234",
            "timer": "triton.testing.do_bench median", "fa4": {"unavailable": FA4_GONE[len("unavailable: "):]},
            "copy": {"bytes": 2**31, "ms": 1.07, "tbps": 4.01, "rounds_tbps": [4.0, 4.01, 4.02]},
            "command": "python benchmarks/bench_decode.py --out x", "elapsed_s": 61.0, "complete": False}
    meta.update(extra)
    return meta


def test_markdown_of_a_fabricated_run():
    args, rows = _fake_rows()
    args_dict = {k: v for k, v in vars(args).items() if k != "shapes"}
    text = "\n".join(bench_decode.markdown(_meta(), args_dict, rows))
    assert text.startswith("# Decoding over a KV cache, NVIDIA H100 80GB HBM3 (sm_90), 2026-12-04 10:00 UTC, "
                           "commit abc1234\n")
    assert "bf16, Hq = 32, Hk = 8, D = 128, seqlen_q = 1" in text
    assert "FlashAttention-4 unavailable (flash_attn.cute does not import" in text
    assert ("Copy bandwidth: 4.01 TB/s (dst.copy_(src) of 2048 MiB, read and write counted; the median of rounds at "
            "4.00, 4.01, 4.02 TB/s).") in text
    assert ("Command: `python benchmarks/bench_decode.py --out x`. Run time 61 s; INCOMPLETE: 1 of 3 rows not "
            "run") in text
    assert "| 1 x 8192 | 1.68 (42% of copy) | 0.84 (21% of copy) WRONG | n/a | 3.36 (84% of copy) | n/a | n/a |" in text
    assert "| num_splits=1 | num_splits=4 |" in text
    # An anchor unavailable on every row is said once; a failure on one row names it.
    assert text.count(FA4_GONE) == 2  # FA4 and FA4 paged, once each
    assert f"\n- FA4 (every row): {FA4_GONE}" in text and f"\n- FA4 paged (every row): {FA4_GONE}" in text
    assert "\n- paged 256 (1 x 8192): failed: NotImplementedError: block_table" in text
    assert "\n- paged 16 (1 x 8192): WRONG: max abs error 5.000e-01" in text
    assert "\n- not run (time budget of 100 s reached): 8 x 32768" in text
    assert "L2 was not flushed" not in text
    without_splits = dict(args_dict, splits=[])
    assert "num_splits" not in "\n".join(bench_decode.markdown(_meta(), without_splits, rows))
    no_triton = "\n".join(bench_decode.markdown(_meta(timer="CUDA events median"), args_dict, rows))
    assert "L2 was not flushed" in no_triton


# --------------------------------------------------------------------------------------------------
# A tiny run on the CPU
# --------------------------------------------------------------------------------------------------


TINY = ["--device", "cpu", "--dtype", "fp32", "--rows", "2x64", "1x48", "--heads", "4", "--kv-heads", "2",
        "--headdim", "16", "--copy-mib", "1", "--rounds", "1", "--warmup", "1", "--rep", "3"]


def _attention_over_pages(q, k_pages, v_pages, table, lengths):
    """Attention of q (B, Sq, Hq, D) over each sequence's first lengths[b] rows of its pages."""
    outs = []
    for b in range(q.size(0)):
        n = int(lengths[b])
        k = k_pages[table[b].long()].flatten(0, 1)[None, :n]
        v = v_pages[table[b].long()].flatten(0, 1)[None, :n]
        outs.append(bench_decode.reference_attention(q[b:b + 1], k, v))
    return torch.cat(outs)


class FakeFa4:
    """flash_attn.cute.interface as the benchmark calls it: flash_attn_func over a contiguous cache and
    flash_attn_varlen_func over pages, both returning (out, lse)."""

    def __init__(self, paged_error=None):
        self.paged_error = paged_error
        self.calls = []

    def flash_attn_func(self, q, k, v, causal=False, num_splits=1):
        self.calls.append(("dense", tuple(q.shape), causal, num_splits))
        return bench_decode.reference_attention(q, k, v).to(q.dtype), None

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q=None, seqused_k=None, max_seqlen_q=None,
                               page_table=None, causal=False):
        self.calls.append(("paged", tuple(q.shape), cu_seqlens_q.tolist(), seqused_k.tolist(), max_seqlen_q,
                           tuple(page_table.shape), page_table.dtype, tuple(k.shape), causal))
        if self.paged_error:
            raise self.paged_error
        batch = cu_seqlens_q.numel() - 1
        qb = q.view(batch, max_seqlen_q, *q.shape[1:])
        return _attention_over_pages(qb, k, v, page_table, seqused_k).reshape(q.shape).to(q.dtype), None


def _install_fa4(monkeypatch, fake):
    names = ("flash_attn", "flash_attn.cute", "flash_attn.cute.interface")
    package, cute, interface = (types.ModuleType(n) for n in names)
    package.__path__, cute.__path__ = [], []
    cute.__version__ = "4.0.0b36"
    interface.flash_attn_func = fake.flash_attn_func
    interface.flash_attn_varlen_func = fake.flash_attn_varlen_func
    package.cute, cute.interface = cute, interface
    for module in (package, cute, interface):
        monkeypatch.setitem(sys.modules, module.__name__, module)


def _check_flashattn_cells(row):
    """flashattn contig always runs on the CPU; its paged calls run or say why they do not (block_table
    support may not exist in this build)."""
    assert row["tbps"]["flashattn"] > 0 and row["max_abs_err"]["flashattn"] < 1e-4
    assert not row["wrong"], row["wrong"]
    for name in ("paged16", "paged256"):
        assert (name in row["tbps"]) != (name in row["status"]), (name, row["status"])
        if name in row["tbps"]:
            assert row["max_abs_err"][name] < 1e-4


def test_tiny_cpu_run_without_fa4_writes_and_renders(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)
    out = tmp_path / "decode"
    assert bench_decode.main(TINY + ["--splits", "1", "2", "--out", str(out)]) == 0
    saved = json.loads((out / "bench_decode.json").read_text())
    assert saved["meta"]["copy"]["tbps"] > 0 and saved["meta"]["complete"] is True
    assert "unavailable" in saved["meta"]["fa4"] and "git_commit" in saved["meta"]
    assert saved["args"]["rows"] == ["2x64", "1x48"]
    first, second = saved["rows"]
    assert (first["batch"], first["seqlen"], first["kv_bytes"]) == (2, 64, 2 * 2 * 64 * 2 * 16 * 4)
    for row in (first, second):
        _check_flashattn_cells(row)
        assert row["tbps"]["sdpa"] > 0 and row["max_abs_err"]["sdpa"] < 1e-4
        assert set(row["copy_fraction"]) == set(row["tbps"])
        for name in ("fa4", "fa4_paged"):
            assert row["status"][name].startswith("unavailable: flash_attn.cute does not import")
        for name in ("splits=1", "splits=2"):
            assert (name in row["tbps"]) != (name in row["status"])
    md = (out / "bench_decode.md").read_text()
    assert "| 2 x 64 |" in md and "| 1 x 48 |" in md
    cells = _cells(next(line for line in md.splitlines() if line.startswith("| 2 x 64 |")))
    assert cells[5:7] == ["n/a", "n/a"]
    printed = capsys.readouterr().out
    assert printed.count("flash_attn.cute does not import") >= 1
    assert "copy bandwidth:" in printed
    rendered = subprocess.run([sys.executable, bench_decode.__file__, "--render", str(out / "bench_decode.json")],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == md


def test_header_says_whether_the_decode_op_ran(tmp_path):
    """The decode op's switch is recorded whichever methods run (without FlashAttention-4's too)."""
    out = tmp_path / "decode"
    assert bench_decode.main(TINY + ["--methods", "flashattn", "--out", str(out)]) == 0
    on = flashattn.kvcache.decode_op_enabled
    assert json.loads((out / "bench_decode.json").read_text())["meta"]["decode_op"] is on
    assert f"decode op {'on' if on else 'off'}" in (out / "bench_decode.md").read_text()


def test_tiny_cpu_run_calls_fa4_as_documented(monkeypatch):
    fake = FakeFa4()
    _install_fa4(monkeypatch, fake)
    meta = {}
    args = bench_decode.parse_args(TINY + ["--rows", "3x40", "--seqlen-q", "2", "--fa4-page-size", "16"])
    (row,) = bench_decode.run(args, "cpu", meta)
    assert meta["fa4"] == {"version": "4.0.0b36"}
    _check_flashattn_cells(row)
    for name in ("fa4", "fa4_paged"):
        assert row["tbps"][name] > 0 and row["max_abs_err"][name] < 1e-4, row
    dense = next(c for c in fake.calls if c[0] == "dense")
    assert dense == ("dense", (3, 2, 4, 16), False, 1)
    paged = next(c for c in fake.calls if c[0] == "paged")
    # Queries packed, two per sequence; every sequence uses its whole cache of 40 rows, 3 pages of 16 each.
    assert paged == ("paged", (6, 4, 16), [0, 2, 4, 6], [40, 40, 40], 2, (3, 3), torch.int32, (9, 16, 2, 16), False)


def test_a_failing_or_wrong_anchor_is_reported_and_the_run_goes_on(monkeypatch):
    fake = FakeFa4(paged_error=AssertionError("page_table is not supported"))
    fake.flash_attn_func = lambda q, k, v, causal=False: (torch.zeros_like(q), None)  # wrong, but runs
    _install_fa4(monkeypatch, fake)
    (row,) = bench_decode.run(bench_decode.parse_args(TINY + ["--rows", "2x32"]), "cpu", {})
    assert row["status"]["fa4_paged"].startswith("failed: AssertionError: page_table is not supported")
    assert "fa4_paged" not in row["tbps"]
    assert row["wrong"]["fa4"].startswith("WRONG: max abs error") and row["tbps"]["fa4"] > 0
    assert _cells(bench_decode.bandwidth_table([row])[-1])[5].endswith(" WRONG")
    assert row["tbps"]["flashattn"] > 0 and row["tbps"]["sdpa"] > 0


def test_time_budget_skips_the_rows_left(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)
    args = bench_decode.parse_args(TINY + ["--time-budget", "1e-9", "--methods", "flashattn"])
    rows = bench_decode.run(args, "cpu", {})
    assert [r.get("skipped") for r in rows] == ["time budget of 1e-09 s reached"] * 2
    assert all(not r["tbps"] for r in rows)
