"""benchmarks/bench_window.py end to end on a tiny CPU cell: the window and the chunked runs are checked and
timed, FlashAttention-4 reported as unavailable, the visible pairs counted exactly, and --render gives back
the markdown the run wrote."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_window  # noqa: E402


def test_window_pairs_count_the_band():
    for n, w in ((12, 4), (8, 8), (10, 3)):
        band = sum(1 for i in range(n) for j in range(n) if i - w < j <= i)
        assert bench_window.window_pairs(n, w) == band


def test_tiny_cpu_cell_runs_and_renders(tmp_path):
    out = tmp_path / "window"
    assert bench_window.main(["--device", "cpu", "--seqlen", "256", "--window", "64", "--heads", "2", "--headdim",
                              "16", "--rounds", "1", "--warmup", "1", "--rep", "3", "--out", str(out)]) == 0
    saved = json.loads((out / "bench_window.json").read_text())
    (row,) = saved["rows"]
    assert (row["seqlen"], row["window"]) == (256, 64)
    for mode in ("fwd", "bwd", "fwdbwd"):
        for name in ("flashattn", "causal W", "full W"):
            assert row["ms"][mode][name] > 0
    assert row["max_err"]["flashattn"] < 1e-5
    if "fa4" not in row["ms"]["fwd"]:
        assert "fa4" in row["status"]  # unavailable here, with its reason
    table = (out / "bench_window.md").read_text()
    assert table.count("\n| 256 | 64 |") == 3
    rendered = subprocess.run([sys.executable, bench_window.__file__, "--render", str(out / "bench_window.json")],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == table
