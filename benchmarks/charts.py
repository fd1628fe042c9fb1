"""PNG charts of benchmark results (matplotlib, an optional dependency).

Input: the result rows of :mod:`harness` (benchmarks/harness.py; the ``results`` list of its bench.json),
each a dict with dtype, head_dim, seqlen, causal, mode, ``tflops`` {method: TFLOP/s} and, when memory
was measured, ``peak_mib`` {method: MiB}.

* ``tflops_<dtype>_<mode>.png``: one panel per (head dim, causal); in each, grouped bars per seqlen
  with one bar per method.
* ``memory_<dtype>_<mode>.png``: one panel per (head dim, causal); peak extra memory against seqlen,
  one line per method (log scales), torch's math backend included where it was measured.
"""
from __future__ import annotations

import math
import os
from typing import Dict, Iterable, List, Tuple

__all__ = ["MatplotlibMissing", "write_charts"]

# Fixed colors so a method looks the same in every chart.
_COLORS = {
    "flashattn": "#d62728",
    "sdpa_flash": "#1f77b4",
    "sdpa_cudnn": "#2ca02c",
    "sdpa_efficient": "#9467bd",
    "flex": "#ff7f0e",
    "fa4": "#e377c2",
    "sdpa_math": "#7f7f7f",
}


class MatplotlibMissing(ImportError):
    """Raised by :func:`write_charts` when matplotlib cannot be imported."""


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MatplotlibMissing("matplotlib is not installed") from exc
    return Figure


def _ordered_methods(rows: Iterable[dict], key: str) -> List[str]:
    methods: List[str] = []
    for row in rows:
        for name in row.get(key, {}) or {}:
            if name not in methods:
                methods.append(name)
    # flashattn first, then the anchors in the order they first appear.
    return sorted(methods, key=lambda n: (n != "flashattn", methods.index(n)))


def _panels(rows: List[dict]) -> List[Tuple[int, bool]]:
    return sorted({(r["head_dim"], bool(r["causal"])) for r in rows})


def _grid(count: int) -> Tuple[int, int]:
    cols = 2 if count == 4 else min(count, 3)
    return math.ceil(count / cols), cols


def _groups(rows: List[dict]) -> Dict[Tuple[str, str], List[dict]]:
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["mode"]), []).append(row)
    return groups


def _color(name: str, index: int) -> str:
    fallback = ["#8c564b", "#bcbd22", "#17becf"]  # the rest of matplotlib's tab10, none of the fixed ones
    return _COLORS.get(name, fallback[index % len(fallback)])


def _mark_missing(ax, panel_rows: List[dict], key: str) -> None:
    """Says so in a panel where no figure was measured (rather than leaving it blank)."""
    if any((r.get(key) or {}) for r in panel_rows):
        return
    reasons = {r["skipped"] for r in panel_rows if r.get("skipped")}
    text = "not run: " + "; ".join(sorted(reasons)) if reasons else "no figure measured"
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize="small", color="#555555")
    ax.set_yticks([])


def _legend_and_title(fig, title: str) -> None:
    """One legend for the figure (every method once), above the panels, under the title."""
    handles, labels = [], []
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.suptitle(title)
    # In inches: the title and each line of the legend take a fixed height above the panels.
    height = fig.get_figheight()
    ncol = max(1, min(len(labels), int(fig.get_figwidth() / 1.3)))
    legend_lines = math.ceil(len(labels) / ncol) if labels else 0
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize="small", frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.3 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.35 + 0.22 * legend_lines) / height))


def _panel_grid(Figure, rows: List[dict]):
    """A figure with one axes per (head dim, causal) panel of ``rows``, the unused cells of the grid
    hidden, and per panel (its axes, head dim, causal, its rows by sequence length)."""
    panels = _panels(rows)
    nrows, ncols = _grid(len(panels))
    fig = Figure(figsize=(5.5 * ncols, 3.8 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for index in range(len(panels), nrows * ncols):
        axes[index // ncols][index % ncols].set_visible(False)
    panel_axes = []
    for index, (head_dim, causal) in enumerate(panels):
        panel_rows = sorted((r for r in rows if r["head_dim"] == head_dim and bool(r["causal"]) == causal),
                            key=lambda r: r["seqlen"])
        panel_axes.append((axes[index // ncols][index % ncols], head_dim, causal, panel_rows))
    return fig, panel_axes


def _throughput_chart(Figure, dtype: str, mode: str, rows: List[dict], path: str) -> None:
    methods = _ordered_methods(rows, "tflops")
    width = 0.8 / max(1, len(methods))
    fig, panel_axes = _panel_grid(Figure, rows)
    for ax, head_dim, causal, panel_rows in panel_axes:
        seqlens = [r["seqlen"] for r in panel_rows]
        for m_index, method in enumerate(methods):
            xs, heights = [], []
            for s_index, row in enumerate(panel_rows):
                value = (row.get("tflops") or {}).get(method)
                if value is not None:
                    xs.append(s_index + (m_index - (len(methods) - 1) / 2) * width)
                    heights.append(value)
            ax.bar(xs, heights, width=width, label=method, color=_color(method, m_index))
        _mark_missing(ax, panel_rows, "tflops")
        ax.set_xticks(range(len(seqlens)))
        ax.set_xticklabels([str(s) for s in seqlens])
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"D={head_dim}, {'causal' if causal else 'not causal'}")
        ax.grid(axis="y", alpha=0.3)
    _legend_and_title(fig, f"attention throughput, {dtype}, {mode}")
    fig.savefig(path, dpi=110)


def _memory_chart(Figure, dtype: str, mode: str, rows: List[dict], path: str) -> None:
    methods = _ordered_methods(rows, "peak_mib")
    fig, panel_axes = _panel_grid(Figure, rows)
    for ax, head_dim, causal, panel_rows in panel_axes:
        for m_index, method in enumerate(methods):
            points = [(r["seqlen"], (r.get("peak_mib") or {}).get(method)) for r in panel_rows]
            points = [(n, mib) for n, mib in points if mib is not None and mib > 0]
            if points:
                ax.plot([n for n, _ in points], [mib for _, mib in points], marker="o", label=method,
                        color=_color(method, m_index))
        ax.set_title(f"D={head_dim}, {'causal' if causal else 'not causal'}")
        if not ax.lines:
            _mark_missing(ax, panel_rows, "peak_mib")
            ax.set_xticks([])
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["seqlen"] for r in panel_rows})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("peak extra memory (MiB)")
        ax.grid(alpha=0.3)
    _legend_and_title(fig, f"peak extra memory of one call, {dtype}, {mode}")
    fig.savefig(path, dpi=110)


def write_charts(rows: List[dict], out_dir: str) -> List[str]:
    """Writes the throughput and memory PNGs for ``rows`` into out_dir; returns their paths.

    Raises :class:`MatplotlibMissing` when matplotlib is not installed. Rows without any TFLOP/s (or
    memory) figure produce no throughput (or memory) chart.
    """
    Figure = _figure_class()
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for (dtype, mode), group in sorted(_groups(rows).items()):
        if any(r.get("tflops") for r in group):
            path = os.path.join(out_dir, f"tflops_{dtype}_{mode}.png")
            _throughput_chart(Figure, dtype, mode, group, path)
            written.append(path)
        if any(r.get("peak_mib") for r in group):
            path = os.path.join(out_dir, f"memory_{dtype}_{mode}.png")
            _memory_chart(Figure, dtype, mode, group, path)
            written.append(path)
    return written
