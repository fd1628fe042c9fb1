"""benchmarks/bench_variants.py end to end on a tiny CPU grid: every contender that can run is checked and
timed, FlashAttention-4 reported as unavailable, and --render gives back the markdown the run wrote."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_variants  # noqa: E402


def test_tiny_cpu_grid_runs_and_renders(tmp_path):
    out = tmp_path / "variants"
    assert bench_variants.main(["--device", "cpu", "--seqlen", "64", "--tokens", "128", "--heads", "2", "--headdim",
                                "16", "--rounds", "1", "--warmup", "1", "--rep", "3", "--out", str(out)]) == 0
    saved = json.loads((out / "bench_variants.json").read_text())
    rows = saved["rows"]
    assert [(r["variant"], r["causal"]) for r in rows] == [("sink", False), ("sink", True), ("softcap", False),
                                                            ("softcap", True), ("alibi", False), ("alibi", True)]
    for row in rows:
        assert row["batch"] == 2
        variant = "flashattn+" + row["variant"]
        for mode in ("fwd", "bwd", "fwdbwd"):
            assert row["ms"][mode]["flashattn"] > 0 and row["ms"][mode][variant] > 0
        assert row["max_err"][variant] < 1e-5
        if "fa4" not in row["ms"]["fwd"]:
            assert "fa4" in row["status"]  # unavailable here, with its reason
    table = (out / "bench_variants.md").read_text()
    assert table.count("\n| sink | 64 |") == 6 and table.count("\n| softcap | 64 |") == 6
    assert table.count("\n| alibi | 64 |") == 6
    rendered = subprocess.run([sys.executable, bench_variants.__file__, "--render", str(out / "bench_variants.json")],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == table
