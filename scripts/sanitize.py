#!/usr/bin/env python3
"""Runs NVIDIA compute-sanitizer (memcheck, initcheck, synccheck, racecheck) over flashattn's CUDA kernels.

Each tool runs scripts/sanitize_cases.py once, as
``compute-sanitizer --tool TOOL --error-exitcode 1 python3 scripts/sanitize_cases.py ...``: the forward
and the backward with the dispatch's own choice of kernels and with FLASHATTN_FORCE_SM80=1, the
deterministic backward where the build has one, and flash_attn_with_kvcache's decode cases, over a small grid of awkward shapes (racecheck, the
slowest tool, over a shorter list). The worker's
markers tell which phase and case was running when the tool reported something; the kernel named in
each report is listed beside it. Nothing is filtered out: every report counts, including any about
torch's own kernels. initcheck runs with FLASHATTN_SM90_DIRECT_OUTPUT=1 (the sm90 forward writes its
output from registers, not with a TMA store, which initcheck does not count as a write).

Writes to --out: report.md (tool x path -> clean / N errors, with each tool's summary line and the
first reports) and one full log per tool. Exit status: 0 when every tool ran every item and reported
no error; 1 when a tool reported errors, a run did not finish (time budget, crash) or a result failed
the worker's sanity check; 2 when compute-sanitizer cannot be found.

  python3 scripts/sanitize.py --out /tmp/sanitize            # at most ~4 minutes (--budget 225 s)
  python3 scripts/sanitize.py --tools memcheck --budget 90   # one tool
  python3 scripts/sanitize.py --cases multicast --phases fwd-default --budget 120   # one case list
  python3 scripts/sanitize.py --dry-run --out /tmp/s         # no sanitizer, no GPU: the worker on the CPU
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "scripts", "sanitize_cases.py")
TOOLS = ("memcheck", "initcheck", "synccheck", "racecheck")
# Share of the time budget per tool. A tool may run on into the later tools' shares, but not into the
# RESERVE part of them: each later tool keeps at least that fraction of its share.
BUDGET_SHARE = {"memcheck": 0.27, "initcheck": 0.22, "synccheck": 0.18, "racecheck": 0.33}
RESERVE = 0.6
CASE_SET = {"racecheck": "race"}  # every other tool runs the full list
PHASE_LABELS = {
    "fwd-default": "fwd (default dispatch)",
    "fwd-sm80": "fwd (FLASHATTN_FORCE_SM80=1)",
    "bwd-default": "bwd (default dispatch)",
    "bwd-sm80": "bwd (FLASHATTN_FORCE_SM80=1)",
    "bwd-deterministic": "bwd (deterministic=True)",
    "decode": "decode (flash_attn_with_kvcache)",
    None: "outside the cases (start-up, exit)",
}
MAX_RESTARTS = 3

# Top-level sanitizer lines that are not reports.
_NOT_A_REPORT = ("COMPUTE-SANITIZER", "Process ID", "Target application returned an error", "Note:")
_SUMMARIES = ("ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY")
_KERNEL = re.compile(r"(flashattn::[A-Za-z_][\w:]*)")
_AT = re.compile(r"\bat (?:void )?([^\s(<+]+)")


def find_sanitizer(explicit: Optional[str]) -> Tuple[Optional[str], List[str]]:
    """(path or None, the places looked at)."""
    candidates = []
    if explicit:
        candidates.append(explicit)
    else:
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                candidates.append(os.path.join(os.environ[var], "bin", "compute-sanitizer"))
        on_path = shutil.which("compute-sanitizer")
        candidates.append(on_path or "compute-sanitizer on PATH")
        candidates.append("/usr/local/cuda/bin/compute-sanitizer")
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c, candidates
    return None, candidates


@dataclass
class Report:
    header: str
    phase: Optional[str]
    case: Optional[str]
    lines: List[str] = field(default_factory=list)

    @property
    def is_warning(self) -> bool:
        return self.header.lower().startswith(("warn", "warning"))

    @property
    def kernel(self) -> str:
        for line in [self.header] + self.lines:
            m = _KERNEL.search(line)
            if m:
                return m.group(1)
        for line in [self.header] + self.lines:
            m = _AT.search(line)
            if m:
                return m.group(1)
        return "?"


@dataclass
class ToolRun:
    tool: str
    sanitized: bool = True
    returncodes: List[int] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    finished: bool = False
    items_total: int = 0
    items_done: set = field(default_factory=set)
    phases_begun: set = field(default_factory=set)
    phases: List[str] = field(default_factory=list)  # as the worker announced them
    last_begun: str = ""
    reports: List[Report] = field(default_factory=list)
    summaries: List[str] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)
    device: str = ""
    log_path: str = ""

    def errors(self) -> List[Report]:
        return [r for r in self.reports if not r.is_warning]

    def summary_errors(self) -> int:
        """Errors counted by the summary lines: "ERROR SUMMARY: N errors" (memcheck, initcheck,
        synccheck) or "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"."""
        total = 0
        for s in self.summaries:
            m = re.search(r"ERROR SUMMARY: (\d+) error", s) or re.search(r"RACECHECK SUMMARY: .*\((\d+) error", s)
            if m:
                total += int(m.group(1))
        return total


def parse_output(text: str, run: ToolRun) -> int:
    """Reads one sanitizer run's combined output into ``run``; returns the index of the last item begun."""
    phase = case = None
    last_begun = -1
    current: Optional[Report] = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("@@ "):
            current = None
            parts = line.split(" ", 4)
            if parts[1] == "begin":
                last_begun = int(parts[2])
                phase, case = parts[3], parts[4] if len(parts) > 4 else ""
                run.phases_begun.add(phase)
                run.last_begun = line[len("@@ begin "):]
            elif parts[1] == "end":
                run.items_done.add(int(parts[2]))
            elif parts[1] == "fail":
                run.failures.append(line[len("@@ fail "):])
            elif parts[1] == "finished":
                run.finished = True
                phase = case = None
            elif parts[1] == "items":
                run.items_total = max(run.items_total, int(parts[2]))
            elif parts[1] == "phases":
                run.phases = run.phases or parts[2].split(",")
            elif parts[1] in ("device", "fatal"):
                if parts[1] == "fatal":
                    run.failures.append(line[3:])
                else:
                    run.device = line[len("@@ device "):]
            continue
        if not line.startswith("========="):
            continue
        body = line[len("========="):]
        if body.startswith("  "):  # an indented detail line of the current report
            if current is not None:
                current.lines.append(body.strip())
            continue
        body = body.strip()
        if not body:
            current = None
            continue
        if body.startswith(_SUMMARIES):
            run.summaries.append(body)
            current = None
            continue
        if body.startswith(_NOT_A_REPORT):
            current = None
            continue
        current = Report(body, phase, case)
        run.reports.append(current)
    return last_begun


def run_tool(tool: str, sanitizer: Optional[str], deadline: float, out_dir: str, phases: str,
             worker_device: str, case_set: Optional[str] = None) -> ToolRun:
    cases = case_set or CASE_SET.get(tool, "full")
    run = ToolRun(tool, sanitized=sanitizer is not None)
    run.log_path = os.path.join(out_dir, f"{tool}.log")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("FLASHATTN_FORCE_SM80", None)
    env.pop("FLASHATTN_SM90_DIRECT_OUTPUT", None)
    if tool == "initcheck":
        # initcheck does not count the sm90 forward's TMA stores of the output as writes: every byte of
        # an output written that way is reported when it is copied to the host. The kernel writes the
        # output from its registers instead (the other tools and the tests cover the TMA store).
        env["FLASHATTN_SM90_DIRECT_OUTPUT"] = "1"
    skip = 0
    start = time.time()
    with open(run.log_path, "w") as log:
        for attempt in range(MAX_RESTARTS + 1):
            worker = [sys.executable, WORKER, "--cases", cases, "--phases", phases, "--skip", str(skip),
                      "--device", worker_device]
            cmd = worker if sanitizer is None else [sanitizer, "--tool", tool, "--error-exitcode", "1"] + worker
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            remaining = deadline - time.time()
            if remaining <= 1:
                run.timed_out = True
                break
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    cwd=REPO, env=env, start_new_session=True)
            try:
                text, _ = proc.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the sanitizer and the python it started
                text, _ = proc.communicate()
                run.timed_out = True
            log.write(text)
            log.flush()
            run.returncodes.append(proc.returncode)
            last_begun = parse_output(text, run)
            if run.finished or run.timed_out or last_begun < skip:
                break
            skip = last_begun + 1  # the worker died inside item last_begun: go on after it
            if skip >= run.items_total:
                break
    run.seconds = time.time() - start
    return run


def cell(run: ToolRun, phase: str) -> str:
    errors = [r for r in run.errors() if r.phase == phase]
    warnings = len([r for r in run.reports if r.phase == phase and r.is_warning])
    note = f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else ""
    if errors:
        return f"**{len(errors)} error{'s' if len(errors) != 1 else ''}**{note}"
    if phase not in run.phases_begun:
        return "not run" + (" (time budget)" if run.timed_out else "")
    if not run.finished:
        return "clean so far (run incomplete)" + note
    return "clean" + note


def tool_ok(run: ToolRun) -> bool:
    return (run.finished and not run.timed_out and not run.errors() and run.summary_errors() == 0
            and (bool(run.summaries) or not run.sanitized)
            and not run.failures and all(rc == 0 for rc in run.returncodes))


def write_report(runs: List[ToolRun], out_dir: str, sanitizer: Optional[str], version: str, budget: float,
                 case_set: Optional[str] = None) -> str:
    lines = ["# compute-sanitizer over flashattn's CUDA kernels", ""]
    device = next((r.device for r in runs if r.device), "unknown")
    commit = os.environ.get("FLASHATTN_GIT_COMMIT") or _git_commit()
    tool_line = f"- compute-sanitizer: {sanitizer or 'none (dry run on the CPU)'} {version}".rstrip()
    lines += [f"- device: {device}", tool_line, f"- commit: {commit}",
              f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}, time budget {budget:.0f} s",
              "- worker: scripts/sanitize_cases.py (`--list` prints its cases); "
              + (f"every tool runs `--cases {case_set}`" if case_set else "racecheck runs `--cases race`"),
              "- per-path counts are of the reports printed (compute-sanitizer stops printing at its --print-limit);"
              " each tool's summary line counts them all", ""]
    lines += ["| tool | path | result | kernels named in the reports |", "|---|---|---|---|"]
    for run in runs:
        stray = sorted({r.phase for r in run.errors()} - set(run.phases) - {None})
        for phase in run.phases + stray + [None]:
            errors = [r for r in run.errors() if r.phase == phase]
            if phase is None and not errors:
                continue
            kernels = sorted({r.kernel for r in errors})
            label = PHASE_LABELS.get(phase, phase)
            lines.append(f"| {run.tool} | {label} | {cell(run, phase)} | {', '.join(kernels)} |")
    lines += ["", "## Per tool", ""]
    for run in runs:
        status = "clean" if tool_ok(run) else "NOT CLEAN"
        lines.append(f"### {run.tool}: {status}")
        lines.append("")
        earlier = len(run.summaries) - 1
        lines.append(f"- summary line: `{run.summaries[-1] if run.summaries else 'none printed'}`"
                     + (f" (and {earlier} earlier, from restarted runs)" if earlier > 0 else ""))
        lines.append(f"- exit status: {', '.join(map(str, run.returncodes)) or 'not started'};"
                     f" {run.seconds:.0f} s; items done {len(run.items_done)}/{run.items_total}"
                     + ("; **stopped at the time budget**" if run.timed_out else "")
                     + ("" if run.finished or run.timed_out else "; **the worker did not finish**"))
        if not run.finished and run.last_begun:
            lines.append(f"- last item begun: `{run.last_begun}`")
        warnings = [r for r in run.reports if r.is_warning]
        if warnings:
            lines.append(f"- warnings (not errors): {len(warnings)}")
        for failure in run.failures[:10]:
            lines.append(f"- worker failure: `{failure}`")
        shown = {}
        for r in run.reports:
            key = (r.header, r.kernel, r.phase)
            shown.setdefault(key, [r, 0])[1] += 1
        if shown:
            lines.append("- reports (distinct header, kernel and phase; first case seen):")
            for (header, kernel, phase), (r, count) in list(shown.items())[:20]:
                label = PHASE_LABELS.get(phase, phase)
                lines.append(f"  - {count}x `{header}` in `{kernel}` during {label}, case `{r.case}`")
        lines.append(f"- full log: {os.path.basename(run.log_path)}")
        lines.append("")
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return "\n".join(lines)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (set FLASHATTN_GIT_COMMIT)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="sanitize-out",
                        help="folder for report.md and the logs (default: sanitize-out)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ", ".join(TOOLS))
    parser.add_argument("--phases", default="all",
                        help="the worker's phases (default: all it has; see sanitize_cases.py --help)")
    parser.add_argument("--cases", default=None,
                        help="one of sanitize_cases.py's case lists for every tool (default: full, race for racecheck)")
    parser.add_argument("--budget", type=float, default=225.0,
                        help="total seconds for all tools (default 225); a tool still running when only the later "
                        "tools' reserve is left is stopped")
    parser.add_argument("--sanitizer",
                        help="path to compute-sanitizer (default: $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run the worker on the CPU without a sanitizer (checks this script and the cases)")
    parser.add_argument("--worker-device", default=None, help=argparse.SUPPRESS)  # for tests: cpu with a fake sanitizer
    args = parser.parse_args(argv)

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        parser.error(f"unknown tool(s) {bad}; expected some of {TOOLS}")
    os.makedirs(args.out, exist_ok=True)

    sanitizer, version = None, ""
    if not args.dry_run:
        sanitizer, looked = find_sanitizer(args.sanitizer)
        if sanitizer is None:
            message = ("compute-sanitizer NOT FOUND (looked at: " + ", ".join(looked) + "). It ships with the CUDA "
                       "toolkit; pass --sanitizer PATH or set CUDA_HOME. Nothing was checked.")
            print(message, file=sys.stderr)
            with open(os.path.join(args.out, "report.md"), "w") as f:
                f.write("# compute-sanitizer over flashattn's CUDA kernels\n\n" + message + "\n")
            return 2
        try:
            version = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60).stdout
            version = next((l.strip() for l in version.splitlines() if "ersion" in l), version.strip())
        except (OSError, subprocess.SubprocessError):
            version = "(version unknown)"
        print(f"compute-sanitizer: {sanitizer} {version}", flush=True)
    worker_device = args.worker_device or ("cpu" if args.dry_run else "cuda")

    start = time.time()
    runs = []
    total_share = sum(BUDGET_SHARE[t] for t in tools)
    for i, tool in enumerate(tools):
        reserved = sum(BUDGET_SHARE[t] for t in tools[i + 1:]) / total_share * RESERVE * args.budget
        deadline = start + args.budget - reserved
        print(f"[{time.time() - start:5.0f} s] {tool} ...", flush=True)
        run = run_tool(tool, sanitizer, deadline, args.out, args.phases, worker_device, args.cases)
        runs.append(run)
        print(f"[{time.time() - start:5.0f} s] {tool}: {'clean' if tool_ok(run) else 'NOT CLEAN'}"
              f" ({run.summaries[-1] if run.summaries else 'no summary line'};"
              f" {len(run.items_done)}/{run.items_total} items)", flush=True)
    print(write_report(runs, args.out, sanitizer, version, args.budget, args.cases))
    print(f"report: {os.path.join(args.out, 'report.md')}")
    return 0 if all(tool_ok(r) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
