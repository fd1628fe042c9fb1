"""benchmarks/bench_cpu.py end to end on a tiny grid: every cell timed, flashattn's forward as accurate
as torch's, both result files written."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_cpu  # noqa: E402

from flashattn.ops import cuda_kernels_built  # noqa: E402,F401  (the package imports with its extension)


def test_tiny_grid_runs_and_writes_its_results(tmp_path):
    out = tmp_path / "bench"
    assert bench_cpu.main(["--seqlen", "70", "--headdim", "16", "--threads", "1", "--iters", "1", "--rounds", "2",
                           "--out", str(out)]) == 0
    rows = json.loads((out / "bench_cpu.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 2  # dtypes x causal x modes
    for row in rows:
        assert row["flashattn_ms"] > 0 and row["torch_ms"] > 0
        assert row["max_err"] < (2e-2 if row["dtype"] == "bfloat16" else 1e-5), row
    table = (out / "bench_cpu.md").read_text()
    assert table.count("\n| float32 |") == 4 and table.count("\n| bfloat16 |") == 4


def test_unknown_dtype_is_refused():
    with pytest.raises(SystemExit):
        bench_cpu.parse_args(["--dtype", "float8"])
