"""scripts/bench_to_readme.py on a synthetic run written by the benchmark's own writer (CPU only)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import harness  # noqa: E402  (benchmarks/harness.py)
SCRIPT = os.path.join(REPO, "scripts", "bench_to_readme.py")
IMPLS = ["flashattn"] + harness.ANCHORS
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _module():
    spec = importlib.util.spec_from_file_location("bench_to_readme", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tflops(method, dtype, head_dim, causal, seqlen, mode):
    """Made-up figures, different per method and config so that every ratio can be checked."""
    base = {"flashattn": 300.0, "sdpa_flash": 320.0, "sdpa_cudnn": 600.0, "sdpa_efficient": 200.0, "flex": 400.0,
            "fa4": 750.0}[method]
    return base * (1 + head_dim / 1000) * (0.9 if causal else 1.0) * (1 + seqlen / 1e5) * (0.7 if mode == "bwd" else 1.0) \
        * (1.01 if dtype == "fp16" else 1.0)


def _rows():
    """Rows shaped as harness.run returns them: the standard grid, with cuDNN unavailable for the D=256
    backward and the last fp16 configs skipped by the time budget."""
    args = harness.parse_args([])
    rows = []
    for dtype in args.dtype:
        for head_dim in args.headdim:
            for causal in (False, True):
                for seqlen in args.seqlen:
                    if dtype == "fp16" and head_dim == 256 and causal:
                        rows += harness.skipped_rows(dtype, head_dim, seqlen, causal, args.mode, IMPLS,
                                                       "time budget of 420 s reached")
                        continue
                    batch, heads = harness.config_shape(seqlen, head_dim)
                    for mode in args.mode:
                        tflops = {m: _tflops(m, dtype, head_dim, causal, seqlen, mode) for m in IMPLS}
                        status = {}
                        if head_dim == 256 and mode != "fwd":
                            del tflops["sdpa_cudnn"]
                            status["sdpa_cudnn"] = "failed: RuntimeError: no kernel"
                        rows.append({"dtype": dtype, "head_dim": head_dim, "seqlen": seqlen, "causal": causal,
                                     "batch": batch, "heads": heads, "first_call_s": {"flashattn": 0.01, "flex": 2.0},
                                     "max_abs_err": 1e-3, "mode": mode, "ms": {}, "tflops": tflops, "status": status,
                                     "peak_mib": {m: seqlen / 64 for m in IMPLS + ["sdpa_math"]}, "memory_status": {}})
    return rows, args


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("results") / "2026-12-01_h200_abc1234"
    rows, args = _rows()
    meta = dict(harness.metadata("cpu"), gpu="NVIDIA H200", capability="9.0", cudnn=91900, git_commit="abc1234",
                date="2026-12-01 10:00 UTC", command="python -m flashattn bench --out /tmp/out/bench --time-budget 420",
                elapsed_s=431.0, complete=False, flex={"dynamic": True, "prewarm": None}, fa4={"version": "4.0.0b5"},
                flash_attn_4="4.0.0b5")
    harness.write_results(str(folder), meta, rows, IMPLS, vars(args), charts=HAS_MATPLOTLIB)
    return folder


def _table(text):
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return lines[0], [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]


def test_section_states_how_the_run_was_made(run_dir):
    text = _module().render(str(run_dir), link_base="benchmarks/results/run")
    assert text.startswith("### Throughput beside PyTorch's kernels (NVIDIA H200, bf16)\n")
    assert "```bash\npython -m flashattn bench --out /tmp/out/bench --time-budget 420\n```" in text
    assert "2026-12-01 10:00 UTC" in text and "`abc1234`" in text
    assert "NVIDIA H200 (sm_90)" in text and "cuDNN 91900" in text
    assert f"torch {harness.torch.__version__}" in text
    assert "run time 7.2 min, 6 of 120 configs not run (time budget of 420 s reached)" in text
    assert "dynamic shapes" in text
    assert "triton " in text and ", flash-attn-4 4.0.0b5;" in text
    assert "; FA4 = FlashAttention-4 (flash_attn.cute of the flash-attn-4 package)." in text


def test_an_unavailable_fa4_is_said_in_its_note(run_dir, tmp_path):
    data = json.loads((run_dir / "bench.json").read_text())
    data["meta"].update(fa4={"unavailable": "flash_attn.cute does not import: ModuleNotFoundError: x"},
                        flash_attn_4=None)
    for row in data["results"]:
        row["tflops"].pop("fa4", None)
        row["status"]["fa4"] = "unavailable: flash_attn.cute does not import: ModuleNotFoundError: x"
    (tmp_path / "bench.json").write_text(json.dumps(data))
    text = _module().render(str(tmp_path), link_base="x")
    assert ("FA4 = FlashAttention-4 (flash_attn.cute of the flash-attn-4 package), unavailable in this run "
            "(flash_attn.cute does not import: ModuleNotFoundError: x).") in text
    assert "flash-attn-4 " not in text.split("Command:")[0]
    header, rows = _table(text)
    assert header.count("vs FA4") == 2
    assert all(r[8] == "-" and r[14] == "-" for r in rows)


def test_ratio_table_layout_and_values(run_dir):
    header, rows = _table(_module().render(str(run_dir), link_base="x"))
    assert header == ("| D | causal | N | fwd TFLOP/s | vs FA2 | vs cuDNN | vs mem-eff | vs Flex | vs FA4 "
                      "| bwd TFLOP/s | vs FA2 | vs cuDNN | vs mem-eff | vs Flex | vs FA4 |")
    body = rows
    assert len(body) == 5 * 2 * 5  # D 64/96/128/192/256, causal and not, N 1k..16k (bf16 only, 512 left out)
    assert [r[2] for r in body[:5]] == ["1k", "2k", "4k", "8k", "16k"]
    row = next(r for r in body if r[:3] == ["128", "yes", "4k"])
    ours = _tflops("flashattn", "bf16", 128, True, 4096, "fwd")
    assert row[3] == f"{ours:.0f}"
    assert row[4:9] == [f"{ours / _tflops(a, 'bf16', 128, True, 4096, 'fwd'):.2f}" for a in harness.ANCHORS]
    assert row[4:9] == ["0.94", "0.50", "1.50", "0.75", "0.40"]
    bwd = _tflops("flashattn", "bf16", 128, True, 4096, "bwd")
    assert row[9] == f"{bwd:.0f}" and row[10] == "0.94"
    d256 = next(r for r in body if r[:3] == ["256", "no", "16k"])
    assert d256[5] != "-" and d256[11] == "-"  # cuDNN's backward failed there: no ratio


def test_skipped_configs_and_other_dtype(run_dir):
    module = _module()
    _, rows = _table(module.render(str(run_dir), dtype="fp16", link_base="x"))
    skipped = [r for r in rows if r[:2] == ["256", "yes"]]
    assert len(skipped) == 5 and all(r[3] == "skipped" and r[9] == "skipped" for r in skipped)
    assert all(r[4] == "-" and r[10] == "-" for r in skipped)
    _, rows = _table(module.render(str(run_dir), modes=["fwdbwd"], headdims=[64], seqlens=[512, 16384], link_base="x"))
    assert [r[:3] for r in rows] == [["64", "no", "512"], ["64", "no", "16k"], ["64", "yes", "512"], ["64", "yes", "16k"]]
    assert all(len(r) == 3 + 1 + len(harness.ANCHORS) for r in rows)


def test_chart_links_point_at_the_results_folder(run_dir):
    text = _module().render(str(run_dir), link_base="benchmarks/results/2026-12-01_h200_abc1234")
    assert "[bench.md](benchmarks/results/2026-12-01_h200_abc1234/bench.md)" in text
    links = [line for line in text.splitlines() if line.startswith("![")]
    if not HAS_MATPLOTLIB:
        assert links == []
        return
    targets = [line[line.index("](") + 2:-1] for line in links]
    assert targets == [f"benchmarks/results/2026-12-01_h200_abc1234/{kind}_bf16_{mode}.png"
                       for kind in ("tflops", "memory") for mode in ("fwd", "bwd", "fwdbwd")]
    for target in targets:
        assert (run_dir / os.path.basename(target)).is_file()


def test_default_links_are_relative_to_the_repository_root():
    module = _module()
    folder = os.path.join(REPO, "benchmarks", "results", "some_run")
    assert module.default_link_base(folder) == "benchmarks/results/some_run"


def test_command_line(run_dir, tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, str(run_dir), "--link-base", "benchmarks/results/r", "--heading", "##"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## Throughput beside PyTorch's kernels")
    assert "| D | causal | N |" in result.stdout
    (tmp_path / "bench.json").write_text(json.dumps({"results": []}))
    result = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "not written by python -m flashattn bench" in result.stderr


def test_charts_redrawn_from_the_json(run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "bench.json").write_text((run_dir / "bench.json").read_text())
    result = subprocess.run([sys.executable, SCRIPT, str(folder), "--write-charts", "--link-base", "r"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert (folder / "tflops_bf16_fwd.png").is_file() and (folder / "memory_fp16_bwd.png").is_file()
    assert "![bf16 forward: throughput](r/tflops_bf16_fwd.png)" in result.stdout
