"""The FlashAttention-4 anchor of the benchmark (flash_attn.cute), on the CPU: reported as unavailable when
it does not import, and, through a stand-in module with its interface, timed, tabled and charted as the
other anchors are. These tests need neither a GPU nor flashattn's compiled extension."""
import importlib.util
import os
import sys
import time
import types

import pytest
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "benchmarks")
sys.path.insert(0, BENCHMARKS)


def _load_harness():
    """benchmarks/harness.py under a name of its own (monkeypatching here touches no other test's copy).
    It imports flashattn at the top; where the extension is not built, a stand-in package with only the
    attributes the harness reads while loading and reporting takes its place for that import."""
    stand_in = None
    try:
        import flashattn  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("flashattn")
        stand_in.__version__ = "0+no-extension"
        stand_in.__file__ = os.path.join(REPO, "flashattn", "__init__.py")
        sys.modules["flashattn"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("_harness_fa4_tests", os.path.join(BENCHMARKS, "harness.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if stand_in is not None:
            del sys.modules["flashattn"]
    return module


harness = _load_harness()

# What a missing FlashAttention-4 reports. None in sys.modules makes the import raise, whether or not a
# flash_attn package is installed.
MISSING = ("flash_attn.cute does not import: ModuleNotFoundError: import of flash_attn.cute.interface halted; "
           "None in sys.modules")


@pytest.fixture
def no_fa4(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)


class FakeFa4:
    """flash_attn.cute.interface.flash_attn_func as FlashAttention-4 calls it ((B, N, H, D) tensors), computed
    by torch's SDPA. Like FlashAttention-4 it takes `compile_s` seconds at the first forward and the first
    backward of a (dtype, head dim, causal) configuration, its just-in-time compilation."""

    def __init__(self, returns_tuple=True, compile_s=0.0):
        self.returns_tuple, self.compile_s = returns_tuple, compile_s
        self.compiled = set()
        self.calls = []

    def _compile(self, key):
        if key not in self.compiled:
            time.sleep(self.compile_s)
            self.compiled.add(key)

    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False):
        key = (q.dtype, q.shape[-1], causal)
        self.calls.append(key)
        self._compile(("fwd",) + key)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal).transpose(1, 2)
        if out.requires_grad:
            out.register_hook(lambda grad: self._compile(("bwd",) + key))
        lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return (out, lse) if self.returns_tuple else out


def _install(monkeypatch, fake, version="4.0.0b5"):
    """Puts flash_attn, flash_attn.cute (with __version__ unless version is None) and its interface in
    sys.modules."""
    package = types.ModuleType("flash_attn")
    package.__path__ = []
    cute = types.ModuleType("flash_attn.cute")
    cute.__path__ = []
    if version is not None:
        cute.__version__ = version
    interface = types.ModuleType("flash_attn.cute.interface")
    interface.flash_attn_func = fake.flash_attn_func
    package.cute, cute.interface = cute, interface
    for module in (package, cute, interface):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return fake


def _args(*extra):
    return harness.parse_args(
        ["--dtype", "bf16", "--headdim", "16", "--seqlen", "32", "64", "--causal", "true", "--mode", "fwd", "bwd",
         "--batch", "1", "--heads", "2", "--warmup", "1", "--rep", "2", "--rounds", "1", "--no-progress",
         "--no-memory", *extra])


def _cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


# --------------------------------------------------------------------------------------------------
# The anchor and its command line
# --------------------------------------------------------------------------------------------------


def test_fa4_is_an_anchor_and_in_the_default_selection():
    assert "fa4" in harness.ANCHORS
    assert "fa4" in harness.parse_args([]).anchors
    assert harness.parse_args(["--anchors", "fa4"]).anchors == ["fa4"]
    assert "fa4" not in harness.parse_args(["--anchors", "sdpa_flash", "flex"]).anchors


# --------------------------------------------------------------------------------------------------
# flash_attn.cute does not import
# --------------------------------------------------------------------------------------------------


def test_fa4_missing_is_unavailable_with_its_reason(no_fa4):
    assert harness.fa4_status() == {"unavailable": MISSING}
    assert harness.fa4_version() is None
    assert harness.metadata("cpu")["flash_attn_4"] is None
    with pytest.raises(harness.AnchorUnavailable, match="flash_attn.cute does not import"):
        harness.make_impl("fa4", True, 32, "cpu")


def test_fa4_missing_leaves_its_cells_na_and_the_run_going(no_fa4):
    rows = harness.run_config("bf16", 16, 32, True, ["fwd", "bwd"], ["sdpa_flash", "fa4"], _args(), "cpu",
                              batch=1, heads=2)
    names = ["flashattn", "sdpa_flash", "fa4"]
    header = _cells(harness.table_header(names).splitlines()[0])
    for row in rows:
        assert row["status"]["fa4"] == "unavailable: " + MISSING
        assert "fa4" not in row["tflops"] and row["tflops"]["sdpa_flash"] > 0
        cells = dict(zip(header, _cells(harness.table_row(row, names))))
        assert cells["fa4"] == "n/a" and cells["x fa4"] == "-"


def test_run_says_once_that_fa4_is_unavailable(no_fa4, tmp_path, capsys):
    args = _args("--anchors", "fa4")
    meta = harness.metadata("cpu")
    rows = harness.run(args, device="cpu", meta=meta)
    assert meta["fa4"] == {"unavailable": MISSING}
    out = capsys.readouterr().out
    assert out.count("flash_attn.cute does not import") == 1, out
    assert f"FlashAttention-4: unavailable ({MISSING}); its column is n/a" in out
    assert len(rows) == 4 and all(r["status"]["fa4"] == "unavailable: " + MISSING for r in rows)

    harness.write_results(str(tmp_path), meta, rows, ["flashattn", "fa4"], vars(args), charts=False)
    text = (tmp_path / "bench.md").read_text()
    assert f"\nFlashAttention-4: unavailable ({MISSING}).\n" in text
    assert "| flashattn | fa4 | x fa4 |" in text
    # Among the notes, one line for every config rather than one per config.
    assert f"\n- every config: fa4: unavailable: {MISSING}\n" in text
    assert text.count("fa4: unavailable") == 1


def test_notes_give_a_reason_shared_by_every_config_one_line():
    def row(seqlen, mode, status):
        return {"dtype": "bf16", "head_dim": 64, "seqlen": seqlen, "causal": False, "mode": mode, "status": status}

    gone = {"fa4": "unavailable: flash_attn.cute does not import: x"}
    rows = [row(512, "fwd", dict(gone)), row(512, "bwd", dict(gone, flex="failed: y")), row(1024, "fwd", dict(gone)),
            dict(row(2048, "fwd", {"fa4": "skipped: time budget"}), skipped="time budget")]
    assert harness._notes(rows) == [
        "- every config: fa4: unavailable: flash_attn.cute does not import: x",
        "- bf16 D=64 N=512 causal=False: flex: failed: y",
        "- bf16 D=64 N=2048 causal=False: not run (time budget)",
    ]
    # A single config keeps its own lines.
    assert harness._notes(rows[:2]) == ["- bf16 D=64 N=512 causal=False: fa4: unavailable: flash_attn.cute does not "
                                        "import: x", "- bf16 D=64 N=512 causal=False: flex: failed: y"]


# --------------------------------------------------------------------------------------------------
# flash_attn.cute imports (a stand-in with its interface)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("returns_tuple", [True, False])
def test_fa4_forward_is_the_output_of_a_tuple_or_a_tensor(monkeypatch, returns_tuple):
    fake = _install(monkeypatch, FakeFa4(returns_tuple=returns_tuple))
    q, k, v, _ = harness.make_inputs(2, 24, 3, 8, torch.float32, "cpu")
    out = harness.make_impl("fa4", True, 24, "cpu")(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    assert fake.calls == [(torch.float32, 8, True)]


def test_fa4_compilation_at_the_first_call_stays_out_of_the_timings(monkeypatch):
    # Half a second of "compilation" at the first forward and at the first backward: both fall in the
    # warm-up (first_call_s), none in the figures.
    _install(monkeypatch, FakeFa4(compile_s=0.5))
    rows = harness.run_config("bf16", 16, 32, True, ["fwd", "bwd", "fwdbwd"], ["fa4"], _args(), "cpu",
                              batch=1, heads=2)
    for row in rows:
        assert "fa4" not in row["status"]
        assert row["first_call_s"]["fa4"] >= 1.0
        assert row["ms"]["fa4"] < 100, row["ms"]
        assert row["tflops"]["fa4"] > 0


def test_fa4_version_is_recorded(monkeypatch):
    _install(monkeypatch, FakeFa4(), version="4.0.0b5")
    assert harness.fa4_status() == {"version": "4.0.0b5"}
    assert harness.metadata("cpu")["flash_attn_4"] == "4.0.0b5"


def test_fa4_version_from_the_package_metadata_without_dunder_version(monkeypatch):
    _install(monkeypatch, FakeFa4(), version=None)
    real = harness.importlib.metadata.version
    monkeypatch.setattr(harness.importlib.metadata, "version",
                        lambda name: "4.0.0b2" if name == "flash-attn-4" else real(name))
    assert harness.fa4_version() == "4.0.0b2"


def test_run_records_fa4_and_its_first_calls(monkeypatch, tmp_path, capsys):
    _install(monkeypatch, FakeFa4(compile_s=0.05))
    args = _args("--anchors", "sdpa_flash", "fa4")
    meta = harness.metadata("cpu")
    rows = harness.run(args, device="cpu", meta=meta)
    assert meta["fa4"] == {"version": "4.0.0b5"} and meta["flash_attn_4"] == "4.0.0b5"
    assert "FlashAttention-4: unavailable" not in capsys.readouterr().out
    assert all(r["tflops"]["fa4"] > 0 for r in rows)
    line = harness._fa4_line(meta, rows)
    assert line.startswith("FlashAttention-4: flash_attn.cute.interface.flash_attn_func, flash-attn-4 4.0.0b5; "
                           "first calls (just-in-time compilation, before the timings) ")
    harness.write_results(str(tmp_path), meta, rows, ["flashattn"] + args.anchors, vars(args), charts=False)
    assert line in (tmp_path / "bench.md").read_text()


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------


def test_table_has_the_fa4_column_and_its_ratio():
    names = ["flashattn"] + harness.ANCHORS
    header = _cells(harness.table_header(names).splitlines()[0])
    assert header[-2:] == ["x flex", "x fa4"] and "fa4" in header
    row = {"dtype": "bf16", "head_dim": 128, "seqlen": 4096, "causal": True, "mode": "fwd", "max_abs_err": 1e-3,
           "tflops": {"flashattn": 300.0, "sdpa_flash": 250.0, "fa4": 400.0}, "status": {}}
    cells = dict(zip(header, _cells(harness.table_row(row, names))))
    assert cells["fa4"] == "400.0" and cells["x fa4"] == "0.75"
    assert cells["flex"] == "-" and cells["x flex"] == "-"


# --------------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------------


def _chart_rows(fa4_everywhere=True):
    rows = []
    for seqlen in (512, 1024):
        for mode in ("fwd", "bwd"):
            tflops = {"flashattn": 300.0, "sdpa_flash": 250.0}
            if fa4_everywhere or seqlen == 512:
                tflops["fa4"] = 420.0
            rows.append({"dtype": "bf16", "head_dim": 128, "seqlen": seqlen, "causal": True, "mode": mode,
                         "tflops": tflops, "status": {}, "peak_mib": {"flashattn": seqlen / 64, "fa4": seqlen / 60}})
    return rows


def test_charts_draw_fa4_in_its_own_color(tmp_path):
    pytest.importorskip("matplotlib")
    import charts  # benchmarks/charts.py
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure

    figures = []

    class Recording(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    rows = _chart_rows(fa4_everywhere=False)  # fa4 missing at N=1024: its bar is left out there
    charts._throughput_chart(Recording, "bf16", "fwd", [r for r in rows if r["mode"] == "fwd"], str(tmp_path / "t.png"))
    charts._memory_chart(Recording, "bf16", "fwd", [r for r in rows if r["mode"] == "fwd"], str(tmp_path / "m.png"))
    throughput, memory = figures
    assert [t.get_text() for t in throughput.legends[0].texts] == ["flashattn", "sdpa_flash", "fa4"]
    (fa4_bars,) = [c for c in throughput.axes[0].containers if c.get_label() == "fa4"]
    assert [bar.get_height() for bar in fa4_bars] == [420.0]
    assert fa4_bars[0].get_facecolor()[:3] == to_rgb(charts._COLORS["fa4"])
    assert "fa4" in [t.get_text() for t in memory.legends[0].texts]
    assert len(set(charts._COLORS.values())) == len(charts._COLORS)  # no two methods share a color

    names = sorted(os.path.basename(p) for p in charts.write_charts(_chart_rows(), str(tmp_path)))
    assert names == ["memory_bf16_bwd.png", "memory_bf16_fwd.png", "tflops_bf16_bwd.png", "tflops_bf16_fwd.png"]

