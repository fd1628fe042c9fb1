"""The build record (flashattn/build_record.py, written by setup.py's build_ext): what the extension was
built against, and the one-line error of an extension built against another torch."""
import os
import subprocess
import sys

import pytest
import torch

import flashattn
from flashattn import build_record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_record_is_this_build():
    assert build_record.TORCH == torch.__version__
    assert build_record.TORCH_CUDA == torch.version.cuda
    assert build_record.CUDA_KERNELS == flashattn.cuda_kernels_built()
    if build_record.CUDA_KERNELS:
        assert build_record.NVCC and build_record.CUDA_ARCHS
    else:
        assert build_record.NVCC is None and build_record.CUDA_ARCHS == "" and build_record.CUDA_PTX == ""


def test_the_binary_holds_the_recorded_code():
    # Read from the extension's fatbin (no GPU needed): machine code for every recorded arch, and the
    # PTX newer GPUs compile at first use.
    if not build_record.CUDA_KERNELS:
        pytest.skip("a CPU-only build")
    from flashattn.__main__ import kernel_archs_in_binary

    archs = kernel_archs_in_binary(flashattn.ops._C.__file__)
    assert archs is not None
    recorded = [int(a.rstrip("a")) for a in build_record.CUDA_ARCHS.split(";")]
    assert sorted(archs["sass"]) == sorted(recorded), archs
    assert sorted(archs["ptx"]) == sorted(int(a) for a in build_record.CUDA_PTX.split(";") if a), archs


def _import_with(recorded_torch):
    """`import flashattn` in a new process whose extension cannot load, with a build record saying
    `recorded_torch`: its stderr and exit status."""
    code = (
        "import sys, types\n"
        "record = types.ModuleType('flashattn.build_record')\n"
        f"record.TORCH = {recorded_torch!r}\n"
        "sys.modules['flashattn.build_record'] = record\n"
        "sys.modules['flashattn._C'] = None  # its load fails as an incompatible library's does: ImportError\n"
        "import flashattn\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    return run.returncode, run.stderr.strip().splitlines()[-1]


def test_another_torch_is_named_in_one_line():
    status, last = _import_with("1.0.0")
    assert status != 0
    assert last.startswith("ImportError: flashattn: its compiled extension was built against torch 1.0.0 but this "
                           f"is torch {torch.__version__}; rebuild flashattn with this torch"), last
    assert "flashattn._C" in last  # what the loader said, on the same line


def test_the_same_torch_gets_the_loader_error_as_it_is():
    status, last = _import_with(torch.__version__)
    assert status != 0
    assert "built against" not in last and "flashattn._C" in last, last


def test_info_prints_the_record():
    run = subprocess.run([sys.executable, "-m", "flashattn", "info"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert f"built against      torch {torch.__version__} (its CUDA {torch.version.cuda or 'none'})" in run.stdout
