#!/usr/bin/env python3
"""Markdown for the README from one benchmark run: how it was made, the ratio table, the charts.

Reads the bench.json that ``python -m flashattn bench --out DIR`` writes and prints a section with the
command line, date, commit, GPU and versions, a table of flashattn's forward and backward TFLOP/s with
its ratio to each anchor of the same run (one dtype, default bf16; one row per head dim, causal mode
and sequence length), and image links to the PNG charts found in DIR, relative to the repository
root (where README.md is), so commit the results folder under benchmarks/results/<run>/ first:

    python scripts/bench_to_readme.py benchmarks/results/2026-12-01_h200_abc1234 > section.md

Needs only the Python standard library (``--write-charts`` also needs matplotlib, for benchmarks/charts.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Column titles of the anchors (the keys are the method names the bench uses).
ANCHOR_TITLES = {
    "sdpa_flash": "FA2",
    "sdpa_cudnn": "cuDNN",
    "sdpa_efficient": "mem-eff",
    "flex": "Flex",
    "fa4": "FA4",
}
ANCHOR_NOTES = {
    "sdpa_flash": "FA2 = torch SDPA with the FLASH_ATTENTION backend forced (FlashAttention-2)",
    "sdpa_cudnn": "cuDNN = SDPA with CUDNN_ATTENTION",
    "sdpa_efficient": "mem-eff = SDPA with EFFICIENT_ATTENTION",
    "flex": "Flex = FlexAttention compiled with torch.compile",
    "fa4": "FA4 = FlashAttention-4 (flash_attn.cute of the flash-attn-4 package)",
}
MODE_TITLES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}
DEFAULT_SEQLENS = [1024, 2048, 4096, 8192, 16384]
DEFAULT_HEADDIMS = [64, 96, 128, 192, 256]


def load(results_dir: str) -> dict:
    path = os.path.join(results_dir, "bench.json")
    with open(path) as f:
        data = json.load(f)
    for key in ("meta", "results"):
        if key not in data:
            raise ValueError(f"{path} has no '{key}': not written by python -m flashattn bench")
    return data


def seqlen_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def anchors_of(data: dict) -> List[str]:
    """The anchors of the run, in the bench's order (from its arguments, else from the results)."""
    anchors = list((data.get("args") or {}).get("anchors") or [])
    for row in data["results"]:
        for name in list(row.get("tflops", {})) + list(row.get("status", {})):
            if name != "flashattn" and name not in anchors:
                anchors.append(name)
    return anchors


def _index(rows: List[dict]) -> Dict[Tuple[str, int, bool, int, str], dict]:
    return {(r["dtype"], int(r["head_dim"]), bool(r["causal"]), int(r["seqlen"]), r["mode"]): r for r in rows}


def _tflops_cell(row: Optional[dict]) -> str:
    if row is None:
        return ""
    value = (row.get("tflops") or {}).get("flashattn")
    if value is not None:
        return f"{value:.0f}"
    if row.get("skipped"):
        return "skipped"
    why = (row.get("status") or {}).get("flashattn", "")
    return "WRONG" if why.startswith("WRONG") else "n/a"


def _ratio_cell(row: Optional[dict], anchor: str) -> str:
    if row is None:
        return ""
    tflops = row.get("tflops") or {}
    ours, theirs = tflops.get("flashattn"), tflops.get(anchor)
    if ours and theirs:
        return f"{ours / theirs:.2f}"
    return "-"


def ratio_table(data: dict, dtype: str = "bf16", modes: Sequence[str] = ("fwd", "bwd"),
                headdims: Sequence[int] = DEFAULT_HEADDIMS, seqlens: Sequence[int] = DEFAULT_SEQLENS) -> List[str]:
    """Markdown table lines: per (D, causal, N), for each mode flashattn's TFLOP/s and its ratio to each
    anchor. Rows the run does not have are left out; "-" marks a ratio that cannot be formed."""
    rows = _index(data["results"])
    anchors = anchors_of(data)
    header = ["D", "causal", "N"]
    for mode in modes:
        header += [f"{mode} TFLOP/s"] + [f"vs {ANCHOR_TITLES.get(a, a)}" for a in anchors]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 3 + "--:|" * (len(header) - 3)]
    for head_dim in headdims:
        for causal in (False, True):
            for seqlen in seqlens:
                found = [rows.get((dtype, head_dim, causal, seqlen, mode)) for mode in modes]
                if not any(found):
                    continue
                cells = [str(head_dim), "yes" if causal else "no", seqlen_label(seqlen)]
                for row in found:
                    cells += [_tflops_cell(row)] + [_ratio_cell(row, a) for a in anchors]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def chart_links(results_dir: str, link_base: str, dtype: str) -> List[str]:
    """Markdown image links to the charts of `dtype` that exist in results_dir."""
    links = []
    for kind, title in (("tflops", "throughput"), ("memory", "peak extra memory")):
        for mode in ("fwd", "bwd", "fwdbwd"):
            name = f"{kind}_{dtype}_{mode}.png"
            if os.path.isfile(os.path.join(results_dir, name)):
                links.append(f"![{dtype} {MODE_TITLES[mode]}: {title}]({link_base}/{name})")
    return links


def default_link_base(results_dir: str) -> str:
    """results_dir relative to the repository root, with forward slashes."""
    return os.path.relpath(os.path.abspath(results_dir), REPO).replace(os.sep, "/")


def _versions(meta: dict) -> str:
    gpu = meta.get("gpu") or "no GPU"
    if meta.get("capability"):
        gpu += f" (sm_{str(meta['capability']).replace('.', '')})"
    parts = [f"torch {meta.get('torch')}"]
    extra = [f"CUDA {meta['cuda']}"] if meta.get("cuda") else []
    if meta.get("cudnn"):
        extra.append(f"cuDNN {meta['cudnn']}")
    if extra:
        parts[0] += " (" + ", ".join(extra) + ")"
    if meta.get("triton"):
        parts.append(f"triton {meta['triton']}")
    if meta.get("flash_attn_4"):
        parts.append(f"flash-attn-4 {meta['flash_attn_4']}")
    return f"{gpu}, " + ", ".join(parts)


def _run_state(data: dict) -> str:
    meta, rows = data["meta"], data["results"]
    configs = {(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]) for r in rows}
    skipped = {(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]) for r in rows if r.get("skipped")}
    parts = []
    if meta.get("elapsed_s") is not None:
        parts.append(f"run time {meta['elapsed_s'] / 60:.1f} min")
    if skipped:
        parts.append(f"{len(skipped)} of {len(configs)} configs not run ({next(r['skipped'] for r in rows if r.get('skipped'))})")
    elif meta.get("complete") is False:
        parts.append(f"interrupted after {len(configs)} configs")
    else:
        parts.append(f"{len(configs)} configs")
    return ", ".join(parts)


def render(results_dir: str, dtype: str = "bf16", modes: Sequence[str] = ("fwd", "bwd"),
           headdims: Sequence[int] = DEFAULT_HEADDIMS, seqlens: Sequence[int] = DEFAULT_SEQLENS,
           link_base: Optional[str] = None, heading: str = "###") -> str:
    """The markdown section for the run in results_dir."""
    data = load(results_dir)
    meta = data["meta"]
    link_base = (link_base if link_base is not None else default_link_base(results_dir)).rstrip("/")
    anchors = anchors_of(data)
    command = meta.get("command") or "(not recorded: the arguments are in bench.json)"
    flex = meta.get("flex") or {}
    notes = [ANCHOR_NOTES.get(a, a) for a in anchors]
    if "flex" in anchors and "dynamic" in flex:
        notes[anchors.index("flex")] += (", dynamic shapes: one compilation per dtype, head dim and causal mode"
                                         if flex["dynamic"] else ", one compilation per shape")
    fa4 = meta.get("fa4") or {}
    if "fa4" in anchors and "unavailable" in fa4:
        notes[anchors.index("fa4")] += f", unavailable in this run ({fa4['unavailable']})"
    lines = [
        f"{heading} Throughput beside PyTorch's kernels ({meta.get('gpu') or 'CPU'}, {dtype})",
        "",
        f"Measured {meta.get('date')} at commit `{meta.get('git_commit')}` on {_versions(meta)}; "
        f"{_run_state(data)}. Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{dtype}, B * N = 16k tokens, H * D = 2048 (B and H per row are in bench.json). TFLOP/s is flashattn's "
        "(forward 4 B H N^2 D, halved when causal; backward 2.5x that); each `vs` column is flashattn's "
        "throughput divided by that anchor's, measured in the same run: above 1.00 flashattn is faster. "
        + "; ".join(notes) + ".",
        "",
    ]
    lines += ratio_table(data, dtype, modes, headdims, seqlens)
    links = chart_links(results_dir, link_base, dtype)
    if links:
        lines += ["", "Charts: bars per sequence length, one per method, a panel per head dim and causal mode; "
                  "peak extra memory of one call against sequence length, torch's math backend (which "
                  "materializes the N x N scores) included where it fits.", ""]
        for link in links:
            lines += [link, ""]
        lines.pop()
    else:
        print(f"bench_to_readme: no {dtype} charts in {results_dir} (run with --write-charts to draw them)",
              file=sys.stderr)
    if os.path.isfile(os.path.join(results_dir, "bench.md")):
        lines += ["", f"Every figure of the run (all dtypes and modes, memory, failures): [bench.md]({link_base}/bench.md)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results_dir", help="folder with the bench.json (and charts) of one run")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=list(MODE_TITLES))
    p.add_argument("--headdim", nargs="+", type=int, default=DEFAULT_HEADDIMS)
    p.add_argument("--seqlen", nargs="+", type=int, default=DEFAULT_SEQLENS)
    p.add_argument("--link-base", help="path of results_dir as the README links it (default: relative to the repository root)")
    p.add_argument("--heading", default="###", help="markdown heading marks of the section (default ###)")
    p.add_argument("--write-charts", action="store_true",
                   help="draw the PNG charts from bench.json into results_dir first (for a run that stopped before drawing them)")
    args = p.parse_args(argv)
    if args.write_charts:
        sys.path.insert(0, os.path.join(REPO, "benchmarks"))
        from charts import write_charts

        for path in write_charts(load(args.results_dir)["results"], args.results_dir):
            print(f"wrote {path}", file=sys.stderr)
    sys.stdout.write(render(args.results_dir, args.dtype, args.modes, args.headdim, args.seqlen, args.link_base, args.heading))
    return 0


if __name__ == "__main__":
    sys.exit(main())
