"""The command line (python -m flashattn info | check | bench) and the benchmark's reporting, on the CPU."""
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest
import torch

import flashattn
from flashattn import __main__ as cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import charts  # noqa: E402  (benchmarks/charts.py)
import harness  # noqa: E402  (benchmarks/harness.py)


def _run(*args, hide_gpus=True, timeout=300):
    env = dict(os.environ)
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # behave as on a machine without a GPU, wherever the test runs
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_info_exits_zero_and_reports_build_and_paths():
    result = _run("-m", "flashattn", "info")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"flashattn {flashattn.__version__}" in out
    assert f"torch {torch.__version__}" in out
    for heading in ("build", "devices", "active paths", "support matrix"):
        assert f"\n{heading}\n" in out, heading
    assert "CUDA kernels" in out
    assert "GPU                none visible" in out
    assert "CPU implementation" in out
    assert "sm90 path" in out


def test_check_on_cpu_passes_every_case():
    result = _run("-m", "flashattn", "check")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    case_lines = [line for line in lines if line.startswith(("PASS", "FAIL"))]
    assert len(case_lines) == 3 * len(cli.CPU_CASES)  # fp32, fp16, bf16
    assert all(line.startswith("PASS  cpu") for line in case_lines), "\n".join(case_lines)
    for dtype in ("fp32", "fp16", "bf16"):
        assert any(f" {dtype} " in line for line in case_lines)
    # Forward and backward figures on every line.
    assert all(all(f" {name} " in line for name in ("out", "dq", "dk", "dv")) for line in case_lines)
    assert f"{len(case_lines)}/{len(case_lines)} cases passed" in result.stdout


def test_check_fails_with_nonzero_status_when_results_are_wrong(monkeypatch, capsys):
    import flashattn.testing as testing

    real = testing.run_attention

    def off_by_a_bit(q, k, v, dout, scale, is_causal, bottom_right):
        out, grads = real(q, k, v, dout, scale, is_causal, bottom_right)
        return out, (grads[0] + 0.1, grads[1], grads[2])  # dq wrong

    monkeypatch.setattr(testing, "run_attention", off_by_a_bit)
    assert cli.main(["check", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "PASS" not in out
    assert "FAILED" in out.splitlines()[-1]


def test_check_reports_a_raising_case_as_failed(monkeypatch, capsys):
    import flashattn.testing as testing

    def broken(*args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(testing, "run_attention", broken)
    assert cli.main(["check", "--device", "cpu"]) == 1
    assert "error: RuntimeError: kernel exploded" in capsys.readouterr().out


def test_check_nan_never_passes():
    from flashattn.testing import oracle_figure

    ref = torch.zeros(4)
    result = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    figure = oracle_figure("out", result, ref + 1.0, ref + 1.0, 2.0)
    assert not figure.passed


@pytest.mark.skipif(cli._gpu_usable(), reason="flashattn's CUDA kernels can run here")
def test_check_cuda_requested_without_usable_gpu_exits_nonzero(capsys):
    assert cli.main(["check", "--device", "cuda"]) == 1
    assert "cannot run here" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["-m", "flashattn", "bench"], ["benchmarks/bench.py", "--quick"]])
def test_bench_without_cuda_exits_nonzero_with_a_message(command):
    result = _run(*command)
    assert result.returncode != 0
    assert "needs a CUDA GPU" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_bench_help_lists_the_grid_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--dtype", "--headdim", "--seqlen", "--causal", "--mode", "--batch", "--heads", "--anchors", "--out"):
        assert flag in out


def test_bench_without_a_source_checkout_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: str(tmp_path / "benchmarks"))
    assert cli.main(["bench", "--help"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "needs a source checkout" in lines[0]
    assert str(tmp_path / "benchmarks" / "harness.py") in lines[0]


def test_installed_package_alone_runs_info_and_explains_bench(tmp_path):
    # The package directory by itself, as a non-editable install has it: no benchmarks/ beside it.
    shutil.copytree(os.path.dirname(os.path.abspath(flashattn.__file__)), tmp_path / "flashattn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    run = lambda *args: subprocess.run([sys.executable, "-m", "flashattn", *args], capture_output=True,  # noqa: E731
                                       text=True, timeout=300, env=env, cwd=tmp_path)
    info = run("info")
    assert info.returncode == 0 and str(tmp_path / "flashattn") in info.stdout, info.stdout + info.stderr
    result = run("bench", "--help")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "needs a source checkout" in result.stderr, result.stderr


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["nonsense"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# The benchmark's pipeline (run on the CPU here: timing, anchors that are unavailable, files)
# --------------------------------------------------------------------------------------------------


def test_bench_args_quick_and_overrides():
    args = harness.parse_args(["--quick", "--batch", "3", "--heads", "5"])
    assert args.dtype == ["bf16"] and args.mode == ["fwd", "bwd"]
    assert harness.config_shape(4096, 128, args.batch, args.heads) == (3, 5)
    assert harness.config_shape(4096, 128) == (harness.TOKENS // 4096, harness.MODEL_DIM // 128)
    with pytest.raises(SystemExit):
        harness.parse_args(["--batch", "0"])


def test_bench_pipeline_on_cpu_writes_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHATTN_GIT_COMMIT", "abc1234")
    args = harness.parse_args(
        ["--dtype", "bf16", "--headdim", "16", "--seqlen", "32", "64", "--causal", "true", "--mode", "fwd", "bwd",
         "--anchors", "sdpa_flash", "sdpa_cudnn", "--batch", "1", "--heads", "2", "--warmup", "1", "--rep", "2",
         "--no-progress"]
    )
    rows = harness.run(args, device="cpu")
    assert [(r["seqlen"], r["mode"]) for r in rows] == [(32, "fwd"), (32, "bwd"), (64, "fwd"), (64, "bwd")]
    for row in rows:
        assert row["tflops"]["flashattn"] > 0
        assert row["max_abs_err"] < args.max_err
        # cuDNN does not run on CPU tensors: reported, not fatal.
        assert "sdpa_cudnn" not in row["tflops"] and row["status"]["sdpa_cudnn"].startswith("unavailable")

    meta = harness.metadata("cpu")
    assert meta["git_commit"] == "abc1234"
    written = harness.write_results(str(tmp_path), meta, rows, ["flashattn"] + args.anchors, vars(args), charts=False)
    saved = json.loads((tmp_path / "bench.json").read_text())
    for key in ("date", "git_commit", "torch", "gpu", "flashattn"):
        assert key in saved["meta"]
    assert saved["meta"]["torch"] == torch.__version__
    assert len(saved["results"]) == 4
    table = (tmp_path / "bench.md").read_text()
    assert "| x sdpa_flash |" in table.splitlines()[6] or "x sdpa_flash" in table
    assert "sdpa_cudnn: unavailable" in table
    assert sorted(os.path.basename(p) for p in written) == ["bench.json", "bench.md"]


def test_bench_memory_measurement_path(tmp_path, monkeypatch):
    # Peak memory is only measurable on CUDA; here a stand-in measurement runs every method's call, and the
    # free memory is set so that the math backend fits at N=32 and is skipped at N=64.
    measured = []

    def fake_peak(fn, device):
        fn()
        measured.append(device.type)
        return 2.0

    monkeypatch.setattr(harness, "peak_extra_mib", fake_peak)
    monkeypatch.setattr(harness, "_free_bytes", lambda device: 2.0 * 6 * 2 * 32 * 32 * 4)
    args = harness.parse_args(
        ["--dtype", "fp16", "--headdim", "8", "--seqlen", "32", "64", "--causal", "false", "--mode", "fwdbwd",
         "--anchors", "sdpa_flash", "sdpa_efficient", "--batch", "2", "--heads", "1", "--warmup", "1", "--rep", "2",
         "--no-progress"]
    )
    rows = harness.run(args, device="cpu")
    assert rows[0]["peak_mib"] == {"flashattn": 2.0, "sdpa_flash": 2.0, "sdpa_math": 2.0}
    assert rows[1]["peak_mib"] == {"flashattn": 2.0, "sdpa_flash": 2.0}
    assert rows[1]["memory_status"]["sdpa_math"].startswith("skipped: would need")
    assert "sdpa_efficient" not in rows[0]["peak_mib"]  # unavailable on CPU tensors: not measured either
    assert len(measured) == 5
    written = harness.write_results(str(tmp_path), harness.metadata("cpu"), rows,
                                      ["flashattn"] + args.anchors, vars(args), charts=False)
    table = (tmp_path / "bench.md").read_text()
    assert "| dtype | D | N | causal | mode | flashattn | sdpa_flash | sdpa_math |" in table
    assert "sdpa_math: skipped" in table
    if importlib.util.find_spec("matplotlib") is not None:
        names = [os.path.basename(p) for p in charts.write_charts(rows, str(tmp_path))]
        assert names == ["tflops_fp16_fwdbwd.png", "memory_fp16_fwdbwd.png"]
    assert len(written) == 2


def test_bench_timing_defaults_measure_at_least_25_ms():
    args = harness.parse_args([])
    # do_bench runs floor(rep / t) calls (at least one): with rep = 50 ms that covers >= 25 ms for any t.
    assert (args.warmup, args.rep) == (10, 50)
    for t in (0.05, 0.3, 4.9, 12.6, 24.9, 25.1, 80.0):
        assert max(1, int(args.rep / t)) * t >= 25
    assert args.time_budget is None and not args.flex_static and args.flex_prewarm
    args = harness.parse_args(["--time-budget", "420", "--flex-static", "--no-flex-prewarm"])
    assert args.time_budget == 420 and args.flex_static and not args.flex_prewarm
    for bad in (["--time-budget", "0"], ["--rep", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            harness.parse_args(bad)


def _tiny_args(*extra):
    return harness.parse_args(
        ["--dtype", "bf16", "--headdim", "16", "--seqlen", "32", "64", "--causal", "both", "--mode", "fwd", "bwd",
         "--anchors", "sdpa_flash", "--batch", "1", "--heads", "2", "--warmup", "1", "--rep", "2", "--no-progress",
         "--no-memory", *extra]
    )


def test_bench_time_budget_reports_the_configs_not_run(tmp_path, capsys):
    args = _tiny_args("--time-budget", "1000")
    seen = []

    def after_config(rows):
        seen.append(len(rows))
        args.time_budget = 1e-9  # spent: the configs after the first are not started

    rows = harness.run(args, device="cpu", on_config=after_config)
    assert seen == [2, 4, 6, 8]  # called after every config, skipped ones included
    assert [(r["seqlen"], r["causal"], bool(r.get("skipped"))) for r in rows[::2]] == [
        (32, False, False), (64, False, True), (32, True, True), (64, True, True)]
    for row in rows[2:]:
        assert row["tflops"] == {} and row["skipped"] == "time budget of 1e-09 s reached"
        assert row["status"] == {"flashattn": "skipped: time budget of 1e-09 s reached",
                                 "sdpa_flash": "skipped: time budget of 1e-09 s reached"}
        cells = [c.strip() for c in harness.table_row(row, ["flashattn", "sdpa_flash"]).strip("|").split("|")]
        assert cells[6:8] == ["skipped", "skipped"]
    assert "the 3 configs left are not run (reported as skipped)" in capsys.readouterr().out

    meta = dict(harness.metadata("cpu"), command="python -m flashattn bench --time-budget 1000", elapsed_s=12.0,
                complete=False)
    harness.write_results(str(tmp_path), meta, rows, ["flashattn", "sdpa_flash"], vars(args), charts=False)
    table = (tmp_path / "bench.md").read_text()
    assert "INCOMPLETE: 3 of 4 configs not run (time budget of 1e-09 s reached)" in table
    assert "- bf16 D=16 N=64 causal=True: not run (time budget of 1e-09 s reached)" in table
    assert "Command: `python -m flashattn bench --time-budget 1000`" in table
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert sum(1 for r in saved["results"] if r.get("skipped")) == 6


def test_bench_time_budget_spent_before_the_start_runs_nothing():
    args = _tiny_args("--time-budget", "5")
    rows = harness.run(args, device="cpu", started=time.monotonic() - 10)
    assert len(rows) == 8 and all(r.get("skipped") for r in rows)


def test_bench_flex_failure_is_reported_after_the_per_shape_retry(monkeypatch):
    # FlexAttention has no CPU backward (torch 2.14): the dynamic-shape compilation fails, the run retries the
    # shape with a per-shape compilation, and reports both errors without stopping.
    made = []
    real = harness.FlexAttention.forward

    def recording_forward(self, group, causal, seqlen, device):
        made.append((group, seqlen, self.is_dynamic(group)))
        return real(self, group, causal, seqlen, device)

    monkeypatch.setattr(harness.FlexAttention, "forward", recording_forward)
    args = harness.parse_args(
        ["--dtype", "bf16", "--headdim", "16", "--seqlen", "32", "64", "--causal", "true", "--mode", "fwd", "bwd",
         "--anchors", "flex", "--batch", "1", "--heads", "2", "--warmup", "1", "--rep", "2", "--no-progress",
         "--no-memory"]
    )
    meta = {}
    rows = harness.run(args, device="cpu", meta=meta)
    assert meta["flex"] == {"dynamic": True, "prewarm": None}  # no worker processes on the CPU
    group = ("bf16", 16, 2, True)
    assert made == [(group, 32, True), (group, 32, False), (group, 64, False)]
    for row in rows:
        assert row["tflops"].keys() == {"flashattn"}
        why = row["status"]["flex"]
        assert why.startswith("unavailable: NotImplementedError")
        # Only the first config of the group tried both ways; the next ones go straight to per-shape.
        assert ("; compiled for this shape: " in why) == (row["seqlen"] == 32)


def test_flex_compile_units_of_the_standard_grid():
    args = harness.parse_args([])
    configs = [(d, h, c, n) for d in args.dtype for h in args.headdim for c in (False, True) for n in args.seqlen]
    assert args.headdim == [64, 96, 128, 192, 256]
    units = harness.flex_compile_units(configs)
    assert len(units) == 20  # one dynamic-shape compilation per dtype, head dim and causal mode
    assert units[0]["group"] == ["bf16", 64, 32, False]
    assert units[0]["shapes"] == [[512, 32, 32], [1024, 16, 32], [2048, 8, 32], [4096, 4, 32], [8192, 2, 32],
                                  [16384, 1, 32]]
    assert units[-1]["group"] == ["fp16", 256, 8, True]
    assert len(harness.flex_compile_units(configs, dynamic=False)) == 120
    assert len(harness.flex_compile_units(configs, batch=2, heads=4)) == 20


def test_flex_prewarm_reports_failing_and_stopped_workers(capsys):
    # The workers are real subprocesses importing this checkout. On the CPU FlexAttention has no backward
    # (torch 2.14), so they fail inside FlexAttention; the summary and the log say so and the caller goes on.
    units = harness.flex_compile_units([("bf16", 16, True, 128), ("bf16", 16, False, 128)], batch=1, heads=2)
    lines = []
    summary = harness.prewarm_flex(units, True, True, device="cpu", timeout_s=240, max_workers=2, log=lines.append)
    assert summary["workers"] == 2 and summary["timed_out_workers"] == 0
    failures = [line for line in lines if "a FlexAttention worker failed" in line]
    assert len(failures) == summary["failed_workers"]
    assert all("FlexAttention does not support backward on CPU" in line for line in failures), failures
    assert "compilation workers done" in lines[-1]
    summary = harness.prewarm_flex(units, True, True, device="cpu", timeout_s=0, max_workers=2, log=lines.append)
    assert summary["timed_out_workers"] == 2


def test_table_marks_unavailable_anchors_and_ratios():
    row = {"dtype": "bf16", "head_dim": 64, "seqlen": 1024, "causal": True, "mode": "fwd", "max_abs_err": 1e-3,
           "tflops": {"flashattn": 200.0, "sdpa_flash": 250.0}, "status": {"sdpa_cudnn": "unavailable: x"}}
    line = harness.table_row(row, ["flashattn", "sdpa_flash", "sdpa_cudnn", "flex"])
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[6:] == ["200.0", "250.0", "n/a", "-", "0.80", "-", "-"]


def _synthetic_rows():
    rows = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in (512, 1024, 2048):
                for mode in ("fwd", "bwd"):
                    peak = {"flashattn": seqlen / 64, "sdpa_flash": seqlen / 60}
                    if seqlen < 2048:
                        peak["sdpa_math"] = seqlen**2 / 1e4  # the largest size skipped, as on a full GPU
                    rows.append({"dtype": "bf16", "head_dim": head_dim, "seqlen": seqlen, "causal": causal, "mode": mode,
                                 "tflops": {"flashattn": 100.0 + seqlen / 100, "sdpa_flash": 110.0, "flex": 90.0},
                                 "status": {"sdpa_cudnn": "unavailable: test"}, "peak_mib": peak,
                                 "memory_status": {} if seqlen < 2048 else {"sdpa_math": "skipped: test"}})
    return rows


def _assert_png(path):
    assert os.path.isfile(path), path
    assert os.path.getsize(path) > 1000, path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_charts_written_for_synthetic_results(tmp_path):
    pytest.importorskip("matplotlib")
    written = charts.write_charts(_synthetic_rows(), str(tmp_path))
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["memory_bf16_bwd.png", "memory_bf16_fwd.png", "tflops_bf16_bwd.png", "tflops_bf16_fwd.png"]
    for path in written:
        _assert_png(path)


def test_charts_for_rows_without_memory(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _synthetic_rows()
    for row in rows:
        del row["peak_mib"]
    names = sorted(os.path.basename(p) for p in charts.write_charts(rows, str(tmp_path)))
    assert names == ["tflops_bf16_bwd.png", "tflops_bf16_fwd.png"]


def test_results_without_matplotlib_skip_the_charts(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(charts.MatplotlibMissing):
        charts.write_charts(_synthetic_rows(), str(tmp_path / "c"))
    meta = harness.metadata("cpu")
    written = harness.write_results(str(tmp_path), meta, _synthetic_rows(), ["flashattn", "sdpa_flash", "flex"], {})
    assert sorted(os.path.basename(p) for p in written) == ["bench.json", "bench.md"]
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert "sdpa_math" in (tmp_path / "bench.md").read_text()  # the memory table


def test_progress_without_tqdm_counts_on_stderr(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    progress = harness.Progress(2)
    progress.start("first")
    progress.write("| row |")
    progress.step()
    progress.start("second")
    progress.step()
    progress.close()
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["[1/2] first", "[2/2] second"]
    assert captured.out == "| row |\n"


# --------------------------------------------------------------------------------------------------
# info: the kernel architectures read from the extension binary
# --------------------------------------------------------------------------------------------------


def _fatbin(entries):
    """A fatbin container holding (kind, arch, payload size) entries."""
    body = b""
    for kind, arch, size in entries:
        header = struct.pack("<HHIQ", kind, 0x0101, 64, size) + bytes(12) + struct.pack("<I", arch)
        body += header.ljust(64, b"\0") + bytes(size)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf_with_section(name, data):
    """A minimal 64-bit little-endian ELF file with one named section (plus the null and name sections)."""
    names = b"\0" + name.encode() + b"\0.shstrtab\0"
    data_offset = 64
    names_offset = data_offset + len(data)
    shoff = names_offset + len(names)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
    null = bytes(64)
    section = struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, data_offset, len(data), 0, 0, 8, 0)
    strtab = struct.pack("<IIQQQQIIQQ", 2 + len(name), 3, 0, 0, names_offset, len(names), 0, 0, 1, 0)
    return header + data + names + null + section + strtab


def test_kernel_archs_read_from_a_fatbin_section(tmp_path):
    path = tmp_path / "fake.so"
    containers = _fatbin([(2, 80, 128), (2, 90, 96)]) + _fatbin([(1, 90, 40), (2, 80, 16)])
    path.write_bytes(_elf_with_section(".nv_fatbin", containers))
    archs = cli.kernel_archs_in_binary(str(path))
    assert archs == {"sass": [80, 90], "ptx": [90]}
    assert cli._binary_runs_on(archs, (8, 6)) == "sm_80 machine code"
    assert cli._binary_runs_on(archs, (9, 0)) == "sm_90 machine code"
    assert cli._binary_runs_on(archs, (12, 0)).startswith("compute_90 PTX")
    assert cli._binary_runs_on({"sass": [80, 90], "ptx": []}, (10, 0)) == ""
    assert cli._binary_runs_on(None, (9, 0)) is None


def test_kernel_archs_absent_without_cuda_code(tmp_path):
    path = tmp_path / "plain.so"
    path.write_bytes(_elf_with_section(".text", b"\x90" * 32))
    assert cli.kernel_archs_in_binary(str(path)) is None
    (tmp_path / "not_elf.so").write_bytes(b"hello")
    assert cli.kernel_archs_in_binary(str(tmp_path / "not_elf.so")) is None
    if not flashattn.cuda_kernels_built():
        assert cli.kernel_archs_in_binary(flashattn.ops._C.__file__) is None


def test_bench_settles_the_gpu_before_each_configs_first_timing(monkeypatch):
    # keep_gpu_busy must run once per config, before that config's first timed call, with --settle's ms.
    events = []
    real_time_ms = harness.time_ms
    monkeypatch.setattr(harness, "keep_gpu_busy", lambda device, ms: events.append(("settle", ms)))
    monkeypatch.setattr(harness, "time_ms", lambda *a, **kw: events.append(("time",)) or real_time_ms(*a, **kw))
    rows = harness.run(_tiny_args("--settle", "7"), device="cpu")
    assert len(rows) == 8  # 2 seqlens x 2 causal x 2 modes
    settles = [i for i, e in enumerate(events) if e[0] == "settle"]
    assert len(settles) == 4 and all(events[i] == ("settle", 7.0) for i in settles)
    assert all(events[i + 1] == ("time",) for i in settles)
    assert harness.parse_args([]).settle == 0
    with pytest.raises(SystemExit):
        harness.parse_args(["--settle", "-1"])


def test_keep_gpu_busy_is_a_no_op_off_cuda():
    start = time.perf_counter()
    harness.keep_gpu_busy(torch.device("cpu"), 5000)
    assert time.perf_counter() - start < 1


def test_bench_times_the_methods_in_rotating_rounds(monkeypatch):
    # Every method is timed once per round, each round starting one method later, with rep / rounds ms;
    # a figure is the median of its method's rounds.
    calls = []
    fake_ms = {"a": [5.0, 1.0, 2.0], "b": [7.0, 9.0, 8.0], "c": [3.0, 3.0, 30.0]}
    forwards = {name: (lambda q, k, v, name=name: name) for name in fake_ms}

    def fake_time_ms(fn, warmup, rep, device):
        name = fn()
        calls.append((name, rep))
        return fake_ms[name][sum(1 for c in calls if c[0] == name) - 1]

    monkeypatch.setattr(harness, "time_ms", fake_time_ms)
    opts = _tiny_args("--rounds", "3", "--rep", "6")
    status = {}
    ms = harness.time_round_robin(forwards, "fwd", None, None, None, None, opts, "cpu", status)
    assert [c[0] for c in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(rep == 2.0 for _, rep in calls)
    assert ms == {"a": 2.0, "b": 8.0, "c": 3.0} and status == {}


def test_bench_round_robin_drops_a_failing_method(monkeypatch):
    def fake_time_ms(fn, warmup, rep, device):
        if fn() == "bad":
            raise RuntimeError("boom")
        return 1.0

    monkeypatch.setattr(harness, "time_ms", fake_time_ms)
    forwards = {"good": lambda q, k, v: "good", "bad": lambda q, k, v: "bad"}
    status = {}
    ms = harness.time_round_robin(forwards, "fwd", None, None, None, None, _tiny_args("--rounds", "2"), "cpu",
                                    status)
    assert ms == {"good": 1.0} and status["bad"].startswith("failed: RuntimeError: boom")
    with pytest.raises(SystemExit):
        harness.parse_args(["--rounds", "0"])
