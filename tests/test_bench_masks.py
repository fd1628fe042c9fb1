"""benchmarks/bench_masks.py on the CPU at a tiny size: every figure's two methods timed in rotating
rounds (the figure is the median of its rounds), a method that fails reported, not fatal."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_masks  # noqa: E402


def test_figures_are_timed_in_rotating_rounds(monkeypatch):
    monkeypatch.setattr(bench_masks, "TOKENS", 64)
    monkeypatch.setattr(bench_masks, "MODEL_DIM", 64)
    order = []
    fake = {}  # call -> its ms in successive rounds

    def fake_time_ms(fn, warmup, rep, device):
        fn()  # runs the real call once: the CPU kernels and the failing backend
        order.append((fn, rep))
        times = fake.setdefault(fn, [3.0, 1.0, 2.0])
        return times[sum(1 for f, _ in order if f is fn) - 1]

    monkeypatch.setattr(bench_masks, "time_ms", fake_time_ms)
    rows = bench_masks.bench_one(32, 32, warmup=0.0, rep=6.0, rounds=3, dev="cpu")
    # Seven figure pairs; SDPA's efficient backend has no CPU kernel, so the dense-float baseline fails
    # on its first call (before it is recorded here) and is left out of later rounds.
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
