"""benchmarks/bench_varlen.py without a GPU: the length mixes, the useful-FLOP count, the table, --dry-run,
and one tiny case run end to end on the CPU kernels (FlashAttention-4 absent, or a stand-in with its
varlen interface, right or wrong)."""
import json
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_varlen  # noqa: E402


# --------------------------------------------------------------------------------------------------
# Length mixes
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [1, 63, 1000, 16384, 65536, 100003])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_loguniform_sums_to_the_total_within_its_bounds(total, seed):
    lengths = bench_varlen.document_lengths("loguniform", total, seed)
    assert sum(lengths) == total
    low, high = bench_varlen.LOGUNIFORM_LENGTHS
    assert all(low <= n <= high for n in lengths[:-1]), lengths
    assert 1 <= lengths[-1] <= high  # the last one is cut to fit


def test_loguniform_spans_its_range():
    lengths = bench_varlen.document_lengths("loguniform", 1 << 22, 0)[:-1]
    # Log-uniform: as many documents below the geometric middle (724) as above it, both ends reached.
    below = sum(n < 724 for n in lengths)
    assert 0.4 < below / len(lengths) < 0.6
    assert min(lengths) < 80 and max(lengths) > 7000


@pytest.mark.parametrize("total", [2048, 16384, 65536])
def test_equal_is_documents_of_one_length(total):
    assert bench_varlen.document_lengths("equal", total, 0) == [2048] * (total // 2048)
    assert bench_varlen.document_lengths("equal", total, 0, equal_length=512) == [512] * (total // 512)
    with pytest.raises(ValueError, match="multiple"):
        bench_varlen.document_lengths("equal", total + 1, 0)


@pytest.mark.parametrize("total", [600, 16384, 65536, 65535])
@pytest.mark.parametrize("seed", [0, 3])
def test_one_long_is_half_the_total_among_short_documents(total, seed):
    lengths = bench_varlen.document_lengths("one-long", total, seed)
    assert sum(lengths) == total
    assert lengths.count(total // 2) == 1
    shorts = list(lengths)
    shorts.remove(total // 2)
    low, high = bench_varlen.ONE_LONG_SHORT_LENGTHS
    assert all(low <= n <= high for n in shorts[:-1]), shorts
    assert 1 <= shorts[-1] <= high


def test_one_long_document_is_not_always_first_or_last():
    places = {bench_varlen.document_lengths("one-long", 16384, seed).index(8192) for seed in range(8)}
    assert len(places) > 2


@pytest.mark.parametrize("mix", ["loguniform", "one-long"])
def test_mixes_are_reproducible_from_the_seed(mix):
    first = bench_varlen.document_lengths(mix, 65536, 5)
    assert bench_varlen.document_lengths(mix, 65536, 5) == first
    assert bench_varlen.document_lengths(mix, 65536, 6) != first


def test_mix_lengths_are_pinned_for_seed_0():
    # A run's documents must not change between versions of this script (results are compared across runs).
    assert bench_varlen.document_lengths("loguniform", 16384, 0) == [3851, 2531, 493, 225, 765, 457, 2870, 279, 646,
                                                                     1085, 3182]


def test_unknown_mix_is_an_error():
    with pytest.raises(ValueError, match="unknown mix"):
        bench_varlen.document_lengths("zipf", 1024, 0)


def test_cu_seqlens_are_int32_running_offsets():
    offsets = bench_varlen.cu_seqlens([3, 5, 1], "cpu")
    assert offsets.dtype == torch.int32
    assert offsets.tolist() == [0, 3, 8, 9]


# --------------------------------------------------------------------------------------------------
# Useful FLOPs
# --------------------------------------------------------------------------------------------------


def test_useful_flops_count_each_document_by_hand():
    # Documents of 3 and 5 tokens, H=2, D=4: QK^T and PV are 2 * L^2 * D multiply-adds each, per head.
    full = 2 * (2 * 3 * 3 * 4 + 2 * 3 * 3 * 4) + 2 * (2 * 5 * 5 * 4 + 2 * 5 * 5 * 4)
    assert full == 1088
    assert bench_varlen.useful_fwd_flops([3, 5], heads=2, head_dim=4, causal=False) == 1088
    assert bench_varlen.useful_fwd_flops([3, 5], heads=2, head_dim=4, causal=True) == 544
    # Not the packed square: 8 tokens as one sequence would be 4 * 2 * 8^2 * 4 = 2048.
    assert bench_varlen.useful_fwd_flops([8], heads=2, head_dim=4, causal=False) == 2048


def test_useful_flops_match_the_batched_count_at_equal_lengths():
    # harness.py counts 4 * B * H * N^2 * D, halved when causal: the same at B documents of N tokens.
    assert bench_varlen.useful_fwd_flops([2048] * 8, 16, 128, True) == 4 * 8 * 16 * 2048**2 * 128 / 2


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


def _cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


def _fake_row(mix, tflops, ms, peak, status=None, documents=8, max_seqlen=2048):
    return {"mix": mix, "total": 16384, "documents": documents, "max_seqlen": max_seqlen, "heads": 16, "kv_heads": 16,
            "head_dim": 128, "dtype": "bfloat16", "causal": True, "seed": 0, "max_abs_err": {"flashattn": 3.9e-3},
            "tflops": tflops, "ms": ms, "peak_mib": peak, "status": status or {}}


FA4_GONE = "unavailable: flash_attn.cute does not import: ModuleNotFoundError: x"


def _fake_rows():
    equal = _fake_row("equal",
                      {"flashattn": {"fwd": 300.0, "bwd": 250.0, "fwdbwd": 260.0},
                       "fa4": {"fwd": 400.0, "bwd": 200.0, "fwdbwd": 260.0},
                       "batched": {"fwd": 310.0, "bwd": 250.0, "fwdbwd": 265.2}},
                      {"flashattn": {"fwdbwd": 1.85}, "fa4": {"fwdbwd": 1.85}, "batched": {"fwdbwd": 1.8138}},
                      {"flashattn": 96.4, "fa4": 80.0, "batched": 72.0})
    one_long = _fake_row("one-long", {"flashattn": {"fwd": 9.5}}, {"flashattn": {"fwd": 123.0}}, {},
                         status={"fa4": FA4_GONE, "flashattn": "bwd failed: OutOfMemoryError: CUDA out of memory."},
                         documents=52, max_seqlen=8192)
    equal["status"] = {"fa4": "failed: never"}
    return [equal, one_long]


def test_table_has_every_contenders_figures_and_ratios():
    names = ["flashattn", "fa4", "batched"]
    header, rule, equal, one_long = bench_varlen.table_lines(_fake_rows(), names)
    head = _cells(header)
    assert head[:5] == ["mix", "total", "docs", "max len", "max err"]
    assert head[5:9] == ["flashattn fwd TFLOP/s", "flashattn bwd TFLOP/s", "flashattn fwd+bwd ms",
                         "flashattn peak extra MiB"]
    assert head[-6:] == ["flashattn/fa4 fwd", "flashattn/fa4 bwd", "flashattn/fa4 fwd+bwd", "flashattn/batched fwd",
                         "flashattn/batched bwd", "flashattn/batched fwd+bwd"]
    assert len(_cells(rule)) == len(head) == 5 + 3 * 4 + 2 * 3
    cells = dict(zip(head, _cells(equal)))
    assert cells["max err"] == "3.9e-03"
    assert [cells[f"fa4 {t}"] for t in ("fwd TFLOP/s", "bwd TFLOP/s", "fwd+bwd ms", "peak extra MiB")] == \
        ["400", "200", "1.85", "80.0"]
    assert cells["batched fwd+bwd ms"] == "1.81"
    assert [cells[f"flashattn/fa4 {m}"] for m in ("fwd", "bwd", "fwd+bwd")] == ["0.75", "1.25", "1.00"]
    assert cells["flashattn/batched fwd+bwd"] == "0.98"
    cells = dict(zip(head, _cells(one_long)))
    assert (cells["docs"], cells["max len"]) == ("52", "8192")
    # What ran shows; what failed or did not run is n/a; the batched kernel, off the equal mix, is -.
    assert cells["flashattn fwd TFLOP/s"] == "9.5" and cells["flashattn bwd TFLOP/s"] == "n/a"
    assert cells["fa4 fwd TFLOP/s"] == "n/a" and cells["batched fwd TFLOP/s"] == "-"
    assert cells["flashattn/fa4 fwd"] == "-" and cells["flashattn/batched fwd"] == "-"


def test_markdown_gives_the_run_and_the_reasons_once():
    meta = {"date": "2026-12-02 10:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11.0", "flashattn": "0.1.0",
            "git_commit": "abc1234", "timer": "CUDA events", "fa4": {"version": "4.0.0b5"},
            "command": "python benchmarks/bench_varlen.py --out x"}
    rows = _fake_rows()
    rows[0]["status"] = {"fa4": FA4_GONE}
    text = "\n".join(bench_varlen.markdown(meta, rows, ["flashattn", "fa4", "batched"]))
    assert text.startswith("# flashattn packed-document (varlen) attention, 2026-12-02 10:00 UTC\n")
    assert ("NVIDIA H200, torch 2.11.0, flashattn 0.1.0 at commit abc1234, FlashAttention-4 4.0.0b5. "
            "H=16 (kv heads 16), D=128, bfloat16, causal, seed 0.") in text
    assert "Command: `python benchmarks/bench_varlen.py --out x`." in text
    assert f"\n- fa4 (every case): {FA4_GONE}\n" in text
    assert text.count(FA4_GONE) == 1
    assert "\n- flashattn (one-long 16384): bwd failed: OutOfMemoryError: CUDA out of memory." in text


# --------------------------------------------------------------------------------------------------
# --dry-run and the command line
# --------------------------------------------------------------------------------------------------


def test_dry_run_prints_the_documents_and_their_flops(capsys):
    assert bench_varlen.main(["--dry-run", "--totals", "4096", "16384", "--kv-heads", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    summaries, lengths = lines[0::2], lines[1::2]
    assert len(summaries) == 6  # 3 mixes x 2 totals, in that order
    for summary, mix, total in zip(summaries, ["loguniform"] * 2 + ["equal"] * 2 + ["one-long"] * 2, [4096, 16384] * 3):
        assert summary.startswith(f"{mix} total={total}: ")
        assert "H=16 kv heads 4 D=128 causal" in summary
    for line, total in zip(lengths, [4096, 16384] * 3):
        assert line.startswith("  lengths: ")
        assert sum(int(n) for n in line.split(":")[1].split()) == total
    # equal at 4096: two documents of 2048, 4 * 16 * 2048^2 * 128 / 2 FLOPs each.
    assert summaries[2].startswith("equal total=4096: 2 documents, longest 2048;")
    assert f"useful forward {2 * 4 * 16 * 2048**2 * 128 / 2 / 1e9:.2f} GFLOP" in summaries[2]
    assert summaries[2].endswith("contenders flashattn, fa4, batched")
    assert summaries[0].endswith("contenders flashattn, fa4")


def test_dry_run_without_causal_counts_the_full_square(capsys):
    bench_varlen.main(["--dry-run", "--totals", "4096", "--mixes", "equal", "--no-causal", "--contenders", "flashattn"])
    summary = capsys.readouterr().out.splitlines()[0]
    assert "not causal" in summary and summary.endswith("contenders flashattn")
    assert f"useful forward {2 * 4 * 16 * 2048**2 * 128 / 1e9:.2f} GFLOP" in summary


@pytest.mark.parametrize("argv, message", [
    (["--kv-heads", "5"], "must divide"),
    (["--totals", "3000", "--mixes", "equal"], "multiple of --equal-length"),
    (["--iters", "0"], "at least 1"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_varlen.parse_args(argv)
    assert message in capsys.readouterr().err


def test_without_a_gpu_the_run_says_why(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert bench_varlen.main(["--totals", "4096"]) == 1
    assert "--dry-run" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# One tiny case on the CPU
# --------------------------------------------------------------------------------------------------


def _tiny_args(*extra):
    return bench_varlen.parse_args(["--totals", "192", "--equal-length", "64", "--heads", "2", "--kv-heads", "1",
                                    "--head-dim", "8", "--iters", "1", "--rounds", "1", "--max-ms", "50", *extra])


def _packed_attention(q, k, v, cu_seqlens, causal, across_documents=False):
    """Attention over the packed rows with a block-diagonal mask (each row sees its own document), or,
    across_documents, over the whole pack as one sequence (the mistake a varlen call must not make)."""
    doc = torch.repeat_interleave(torch.arange(cu_seqlens.numel() - 1), (cu_seqlens[1:] - cu_seqlens[:-1]).long())
    n = q.shape[0]
    allowed = torch.ones(n, n, dtype=torch.bool) if across_documents else doc[:, None] == doc[None, :]
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed)
    return out.transpose(0, 1)


class FakeFa4Varlen:
    """flash_attn.cute.interface.flash_attn_varlen_func as the benchmark calls it (keywords for the offsets
    and lengths), returning (out, lse) as FlashAttention-4 does."""

    def __init__(self, across_documents=False):
        self.across_documents = across_documents
        self.calls = []

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, causal=False):
        self.calls.append((cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), max_seqlen_q, max_seqlen_k, causal))
        out = _packed_attention(q, k, v, cu_seqlens_q, causal, self.across_documents)
        return out, torch.zeros(q.shape[1], q.shape[0])


def _install_fa4(monkeypatch, fake):
    package, cute, interface = (types.ModuleType(n) for n in ("flash_attn", "flash_attn.cute", "flash_attn.cute.interface"))
    package.__path__, cute.__path__ = [], []
    cute.__version__ = "4.0.0b5"
    interface.flash_attn_varlen_func = fake.flash_attn_varlen_func
    package.cute, cute.interface = cute, interface
    for module in (package, cute, interface):
        monkeypatch.setitem(sys.modules, module.__name__, module)


def test_packed_attention_stand_in_agrees_with_the_reference():
    # The stand-ins below lean on _packed_attention; bench_varlen's own check leans on reference_forward.
    lengths = [5, 11, 3]
    q, k, v = torch.randn(19, 4, 8), torch.randn(19, 2, 8), torch.randn(19, 2, 8)
    offsets = bench_varlen.cu_seqlens(lengths, "cpu")
    for causal in (False, True):
        torch.testing.assert_close(_packed_attention(q, k, v, offsets, causal),
                                   bench_varlen.reference_forward(q, k, v, lengths, causal))
    assert (_packed_attention(q, k, v, offsets, True, across_documents=True)
            - bench_varlen.reference_forward(q, k, v, lengths, True)).abs().max() > 0.1


def test_a_tiny_run_on_the_cpu_times_every_contender_that_applies(monkeypatch, tmp_path, capsys):
    fake = FakeFa4Varlen()
    _install_fa4(monkeypatch, fake)
    args = _tiny_args("--mixes", "equal", "one-long")
    meta = bench_varlen.metadata("cpu")
    rows = bench_varlen.run(args, device="cpu", dtype=torch.float32, meta=meta)
    assert meta["fa4"] == {"version": "4.0.0b5"}
    equal, one_long = rows
    assert equal["lengths"] == [64, 64, 64] and sum(one_long["lengths"]) == 192
    assert equal["status"] == {} and one_long["status"] == {}
    assert set(equal["ms"]) == {"flashattn", "fa4", "batched"} and set(one_long["ms"]) == {"flashattn", "fa4"}
    for row in rows:
        for name, figures in row["ms"].items():
            assert set(figures) == {"fwd", "bwd", "fwdbwd"}
            for mode, ms in figures.items():
                expected = bench_varlen.FLOPS_FACTOR[mode] * row["useful_fwd_flops"] / (ms * 1e-3) / 1e12
                assert row["tflops"][name][mode] == pytest.approx(expected)
        assert all(err < 1e-4 for err in row["max_abs_err"].values()), row["max_abs_err"]
        assert row["peak_mib"] == {}  # not measurable off CUDA
    # FlashAttention-4 got the offsets and the longest document by keyword, causal as asked.
    assert fake.calls[0] == ([0, 64, 128, 192], [0, 64, 128, 192], 64, 64, True)
    assert any(call[2] == 96 for call in fake.calls)  # one-long: the long document is half of 192

    paths = bench_varlen.write_results(str(tmp_path), meta, rows, vars(args), args.contenders)
    assert sorted(os.path.basename(p) for p in paths) == ["bench_varlen.json", "bench_varlen.md"]
    saved = json.loads((tmp_path / "bench_varlen.json").read_text())
    assert saved["meta"]["flash_attn_4"] == "4.0.0b5" and "git_commit" in saved["meta"]
    assert saved["results"][1]["lengths"] == one_long["lengths"]
    assert saved["args"]["totals"] == [192]
    md = (tmp_path / "bench_varlen.md").read_text()
    assert "| equal | 192 | 3 | 64 |" in md and "| one-long | 192 |" in md
    printed = capsys.readouterr().out
    assert "| equal | 192 | 3 | 64 |" in printed


def test_fa4_missing_is_said_once_and_its_cells_are_na(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)
    rows = bench_varlen.run(_tiny_args("--mixes", "loguniform", "equal", "--contenders", "flashattn", "fa4"),
                            device="cpu", dtype=torch.float32)
    out = capsys.readouterr().out
    assert out.count("flash_attn.cute does not import") == 1, out
    for row in rows:
        assert row["status"]["fa4"].startswith("unavailable: flash_attn.cute does not import")
        assert "fa4" not in row["ms"] and row["ms"]["flashattn"]["fwd"] > 0
    cells = dict(zip(_cells(bench_varlen.table_lines(rows, ["flashattn", "fa4"])[0]),
                     _cells(bench_varlen.table_lines(rows, ["flashattn", "fa4"])[2])))
    assert cells["fa4 fwd TFLOP/s"] == "n/a" and cells["flashattn/fa4 fwd"] == "-"


def test_a_contender_with_a_wrong_output_is_not_timed(monkeypatch):
    _install_fa4(monkeypatch, FakeFa4Varlen(across_documents=True))
    (row,) = bench_varlen.run(_tiny_args("--mixes", "equal", "--contenders", "flashattn", "fa4"), device="cpu",
                              dtype=torch.float32)
    assert row["status"]["fa4"].startswith("WRONG: max abs error")
    assert row["max_abs_err"]["fa4"] > 0.05
    assert "fa4" not in row["ms"] and "flashattn" in row["ms"]
