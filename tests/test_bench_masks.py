"""benchmarks/bench_masks.py on the CPU at a tiny size: every figure's methods timed in rotating
rounds (the figure is the median of its rounds), a method that fails reported, not fatal."""
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_masks  # noqa: E402


@pytest.fixture
def fake_timer(monkeypatch):
    """A tiny grid, and a time_ms that runs the real call once and returns 3, 1, 2 ms in a call's
    successive rounds; yields the list of (call, rep) it was given, in order."""
    monkeypatch.setattr(bench_masks, "TOKENS", 64)
    monkeypatch.setattr(bench_masks, "MODEL_DIM", 64)
    order = []

    def fake_time_ms(fn, warmup, rep, device):
        fn()  # runs the real call once: the CPU kernels
        order.append((fn, rep))
        return [3.0, 1.0, 2.0][sum(1 for f, _ in order if f is fn) - 1]

    monkeypatch.setattr(bench_masks, "time_ms", fake_time_ms)
    return order


def test_figures_are_timed_in_rotating_rounds(fake_timer):
    order = fake_timer
    rows = bench_masks.bench_one(32, 32, warmup=0.0, rep=6.0, rounds=3, dev="cpu",
                                 figures=["causal_mask", "padding_mask", "dropout", "dense_float"])
    # Seven figure pairs; SDPA's efficient backend has no CPU kernel, so the dense-float baseline fails
    # on its first call, before the rounds, and is left out of them.
    assert len(order) == 6 * 2 * 3 + 1 * 3
    assert all(rep == 2.0 for _, rep in order)
    # Within a pair, round r starts with the method after round r - 1's first.
    first_pair = [fn for fn, _ in order[:6]]
    assert first_pair[0] is first_pair[3] and first_pair[1] is first_pair[2] and first_pair[0] is not first_pair[1]
    timed = [r for r in rows if "ms" in r]
    assert len(timed) == 13 and all(r["ms"] == 2.0 for r in timed)  # the median of 3, 1, 2
    failed = [r for r in rows if "error" in r]
    assert [r["method"] for r in failed] == ["SDPA efficient dense float mask"]
    assert failed[0]["error"].startswith("failed: RuntimeError")
    ratios = {(r["figure"], r["mode"]): r["ratio"] for r in bench_masks.ratios(rows)}
    assert ratios[("causal_mask", "fwd")] == pytest.approx(1.0) and ratios[("dense_float", "fwdbwd")] is None


def test_dropout_anchors_report_a_refusing_backend_as_na(fake_timer):
    """On the CPU both forced SDPA backends refuse dropout: each is n/a in every cell (causal and not,
    fwd and fwdbwd), left out of the rounds, its error said once in the markdown; flashattn is timed."""
    order = fake_timer
    rows = bench_masks.bench_one(32, 32, warmup=0.0, rep=6.0, rounds=3, dev="cpu", figures=["dropout_anchors"])
    assert {r["figure"] for r in rows} == {"dropout_anchors"}
    assert len(rows) == 2 * 2 * 3 and len(order) == 2 * 2 * 3  # 4 cells; flashattn alone in 3 rounds each
    ours = [r for r in rows if r["method"] == "flashattn p=0.1"]
    assert len(ours) == 4 and all(r["ms"] == 2.0 for r in ours)
    assert {(r["mode"], r["causal"]) for r in ours} == {(m, c) for m in ("fwd", "fwdbwd") for c in (False, True)}
    # Causal counts half the FLOPs: same time, half the TFLOP/s.
    by_cell = {(r["mode"], r["causal"]): r["tflops"] for r in ours}
    assert by_cell[("fwd", True)] == pytest.approx(by_cell[("fwd", False)] / 2)
    failed = [r for r in rows if "error" in r]
    assert sorted({r["method"] for r in failed}) == ["SDPA FA2 p=0.1", "SDPA cuDNN p=0.1"] and len(failed) == 8
    assert all(r["error"].startswith("failed: RuntimeError") for r in failed)
    entries = bench_masks.anchor_ratios(rows)
    assert len(entries) == 4
    assert all(e["flashattn"] and e["anchors"] == {"cuDNN": None, "FA2": None}
               and e["ratios"] == {"cuDNN": None, "FA2": None} for e in entries)
    result = dict(gpu="cpu", torch="t", commit="c", date="d", rows=rows, ratios=bench_masks.ratios(rows),
                  anchor_ratios=entries)
    assert result["ratios"] == []
    md = "\n".join(bench_masks.markdown(result))
    assert "| mode | D | N | causal | flashattn TFLOP/s | cuDNN TFLOP/s | FA2 TFLOP/s | x cuDNN | x FA2 |" in md
    assert md.count("- SDPA cuDNN p=0.1, 4 cells: failed: RuntimeError") == 1
    assert md.count("- SDPA FA2 p=0.1, 4 cells: failed: RuntimeError") == 1


def test_anchor_ratios_divide_flashattn_by_each_anchor():
    base = dict(figure="dropout_anchors", mode="fwdbwd", head_dim=64, seqlen=1024, causal=True)
    rows = [dict(base, method="flashattn p=0.1", tflops=300.0), dict(base, method="SDPA cuDNN p=0.1", tflops=250.0),
            dict(base, method="SDPA FA2 p=0.1", tflops=200.0)]
    (entry,) = bench_masks.anchor_ratios(rows)
    assert entry["ratios"] == {"cuDNN": pytest.approx(1.2), "FA2": pytest.approx(1.5)}
    md = bench_masks.markdown(dict(gpu="g", torch="t", commit="c", date="d", rows=rows, ratios=[],
                                   anchor_ratios=[entry]))
    assert "| fwdbwd | 64 | 1024 | yes | 300.0 | 250.0 | 200.0 | 1.20 | 1.50 |" in md


def test_first_call_keeps_the_warned_reason():
    def refuses():
        warnings.warn("Backend kernel not used because: (Triggered internally at x.cpp:1.)")
        warnings.warn("dropout probability resolution is limited to 1/16. (Triggered internally at x.cpp:2.)")
        raise RuntimeError("No available kernel.  Aborting execution.")

    assert bench_masks.first_call(lambda: None, "cpu") is None
    assert bench_masks.first_call(refuses, "cpu") == (
        "failed: RuntimeError: No available kernel.  Aborting execution. (Backend kernel not used because: "
        "dropout probability resolution is limited to 1/16.)")
