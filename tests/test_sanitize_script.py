"""scripts/sanitize.py without a GPU: a stand-in compute-sanitizer runs the worker on the CPU and prints
reports in compute-sanitizer's format, so the attribution, the restart after a crash, the report and
the exit status are checked here; the real tool runs on the GPU machine."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "sanitize.py")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import sanitize_cases  # noqa: E402  (the worker's case lists)

import flashattn  # noqa: E402
import pytest  # noqa: E402

# The worker's backward phases plan their cases with the GPU planner, which a CPU-only build has not.
needs_planner = pytest.mark.skipif(not flashattn.cuda_kernels_built(),
                                   reason="the worker's backward phases need the GPU planner (a build with the CUDA kernels)")

# Mimics `compute-sanitizer --tool T --error-exitcode N cmd...`: passes the program's output through,
# adds a memcheck-style report when the third case of phase FAKE_PHASE begins, or kills the program there
# (FAKE_MODE=crash), then prints the summary line and exits N on errors.
FAKE = textwrap.dedent("""\
    import os, subprocess, sys
    args = sys.argv[1:]
    tool = args[args.index("--tool") + 1]
    exitcode = int(args[args.index("--error-exitcode") + 1])
    cmd = args[args.index("--error-exitcode") + 2:]
    mode, phase = os.environ.get("FAKE_MODE", "error"), os.environ.get("FAKE_PHASE", "fwd-sm80")
    CASE = "b1-q97-k97-h4/2-d72-fp16-bottom_right"  # the worker's third case
    print("========= COMPUTE-SANITIZER", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    errors = 0
    for line in proc.stdout:
        print(line, end="", flush=True)
        item = line.split()
        if item[:2] == ["@@", "begin"] and item[3:] == [phase, CASE] and cmd[cmd.index("--skip") + 1] == "0":
            if mode == "crash":
                proc.kill()
                break
            errors += 1
            print("========= Invalid __global__ read of size 16 bytes")
            print("=========     at void flashattn::sm80::fwd_kernel<__half, "
                  "flashattn::sm80::FwdConfig<64, 4, 2, 64, true, 2>>(flashattn::FwdParams)+0x1a30")
            print("=========     by thread (3,0,0) in block (0,0,0)")
            print("=========     Address 0x7f0000000010 is out of bounds")
            print("=========")
    rc = proc.wait()
    print(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}")
    sys.exit(exitcode if errors else (1 if rc < 0 else rc))
""")


def _run(tmp_path, mode, phase="fwd-sm80", phases="fwd-default,fwd-sm80"):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!" + sys.executable + "\n" + FAKE)
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, FAKE_MODE=mode, FAKE_PHASE=phase)
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--sanitizer", str(fake), "--tools", "memcheck", "--phases", phases,
         "--out", str(out), "--worker-device", "cpu", "--budget", "300"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )
    return proc, (out / "report.md").read_text()


def test_report_attributes_an_error_to_its_phase_and_kernel(tmp_path):
    proc, report = _run(tmp_path, "error")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "| memcheck | fwd (default dispatch) | clean |" in report
    assert "| memcheck | fwd (FLASHATTN_FORCE_SM80=1) | **1 error** | flashattn::sm80::fwd_kernel |" in report
    assert "`ERROR SUMMARY: 1 error`" in report
    assert "Invalid __global__ read of size 16 bytes" in report and "b1-q97-k97-h4/2-d72-fp16-bottom_right" in report


@needs_planner
def test_clean_run_exits_zero(tmp_path):
    proc, report = _run(tmp_path, "error", phase="nowhere", phases="bwd-default")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| memcheck | bwd (default dispatch) | clean |" in report and "### memcheck: clean" in report


@needs_planner
def test_a_crashed_worker_is_resumed_after_the_item(tmp_path):
    proc, report = _run(tmp_path, "crash", phase="bwd-sm80", phases="bwd-sm80")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (tmp_path / "out" / "memcheck.log").read_text()
    assert "--skip 3" in log and "@@ finished" in log
    cases = len(sanitize_cases.FULL_CASES)  # one phase: one item per case, the crashed one not done
    assert f"items done {cases - 1}/{cases}" in report and "### memcheck: NOT CLEAN" in report


def test_missing_sanitizer_is_reported(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--sanitizer", str(tmp_path / "nope"), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "compute-sanitizer NOT FOUND" in proc.stderr
    assert "NOT FOUND" in (tmp_path / "report.md").read_text()


def test_racecheck_output_is_parsed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sanitize", SCRIPT)
    sanitize = importlib.util.module_from_spec(spec)
    sys.modules["sanitize"] = sanitize  # dataclasses look their module up there
    spec.loader.exec_module(sanitize)
    run = sanitize.ToolRun("racecheck")
    sanitize.parse_output(textwrap.dedent("""\
        ========= COMPUTE-SANITIZER
        @@ phases fwd-default,bwd-default
        @@ begin 0 fwd-default case-a
        ========= Error: Race reported between Write access at void flashattn::sm90::fwd_kernel<__half>()+0x10
        =========     and Read access at void flashattn::sm90::fwd_kernel<__half>()+0x20 in f.cuh:250 [32 hazards]
        =========
        @@ end 0
        @@ begin 1 bwd-default case-b
        ========= Warning: Race reported between Write access at flashattn::sm80::bwd_kernel+0x1
        @@ end 1
        @@ finished
        ========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
        """), run)
    assert run.summary_errors() == 1 and run.finished and run.phases == ["fwd-default", "bwd-default"]
    assert [(r.phase, r.kernel, r.is_warning) for r in run.reports] == [
        ("fwd-default", "flashattn::sm90::fwd_kernel", False), ("bwd-default", "flashattn::sm80::bwd_kernel", True)]
    assert sanitize.cell(run, "fwd-default") == "**1 error**"
    assert sanitize.cell(run, "bwd-default") == "clean (1 warning)"
