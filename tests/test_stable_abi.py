"""flashattn._C_stable, the library built against torch's stable ABI alone (flashattn.stable_abi):
it loads, its op matches the main extension's, its errors name the argument, and it uses no C++ symbol
of torch (only the C shims, which keep their ABI across torch versions)."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import flashattn
from flashattn import stable_abi

pytestmark = pytest.mark.skipif(stable_abi.library_path() is None, reason="this build has no flashattn._C_stable")

# A mangled name inside namespace c10, at or torch (nested-name, template-argument or substitution forms).
TORCH_CXX_NAME = re.compile(r"[NZKS](3c10|2at|5torch)[0-9A-Z_]")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashattn.cuda_kernels_built() else [])


@pytest.fixture(scope="module", autouse=True)
def loaded():
    assert stable_abi.load()
    assert stable_abi.load()  # a second load is a no-op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,p", [((2, 3, 33, 70), 0.3), ((1, 1, 1, 1), 0.5), ((2, 4, 40, 129), 0.1),
                                     ((1, 2, 0, 5), 0.2), ((2, 2, 16, 16), 0.0), ((1, 1, 17, 300), 0.9)])
def test_keep_mask_matches_main_extension(device, shape, p):
    rng_state = torch.tensor([987654321, 12345], dtype=torch.long, device=device)
    got = torch.ops.flashattn_stable.dropout_keep_mask(rng_state, *shape, p)
    want = torch.ops.flashattn.dropout_keep_mask(rng_state, *shape, p)
    assert got.dtype == torch.bool and got.shape == shape and got.device == rng_state.device
    assert torch.equal(got, want)


def test_keep_mask_is_a_function_of_seed_and_offset():
    a = torch.ops.flashattn_stable.dropout_keep_mask(torch.tensor([1, 2]), 1, 2, 64, 64, 0.5)
    b = torch.ops.flashattn_stable.dropout_keep_mask(torch.tensor([1, 3]), 1, 2, 64, 64, 0.5)
    assert not torch.equal(a, b)
    assert 0.4 < a.float().mean().item() < 0.6


@pytest.mark.parametrize("args,needle", [
    ((torch.tensor([1, 2]), -1, 1, 4, 4, 0.1), "must be >= 0"),
    ((torch.tensor([1, 2]), 1, 1, 4, 4, 1.0), "dropout_p must be in [0, 1)"),
    ((torch.tensor([1, 2]), 1, 1, 4, 4, -0.5), "dropout_p must be in [0, 1)"),
    ((torch.tensor([1, 2], dtype=torch.int32), 1, 1, 4, 4, 0.1), "rng_state must be a contiguous [2] int64"),
    ((torch.tensor([1, 2, 3]), 1, 1, 4, 4, 0.1), "rng_state must be a contiguous [2] int64"),
    ((torch.tensor([1, 2]), 1, 1, 2**31, 4, 0.1), "below 2^31"),
])
def test_bad_arguments_name_the_argument(args, needle):
    with pytest.raises(RuntimeError, match="flashattn_stable.dropout_keep_mask") as info:
        torch.ops.flashattn_stable.dropout_keep_mask(*args)
    assert needle in str(info.value)


def test_opcheck():
    rng_state = torch.tensor([5, 6], dtype=torch.long)
    torch.library.opcheck(torch.ops.flashattn_stable.dropout_keep_mask.default, (rng_state, 2, 3, 8, 24, 0.25))


def test_torch_compile_fullgraph():
    def keep(rng_state):
        return torch.ops.flashattn_stable.dropout_keep_mask(rng_state, 1, 2, 16, 48, 0.3).sum()

    rng_state = torch.tensor([7, 8], dtype=torch.long)
    assert torch.compile(keep, fullgraph=True, backend="eager")(rng_state) == keep(rng_state)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_library_uses_no_cxx_symbol_of_torch():
    """Undefined symbols of c10::, at:: or torch:: (mangled _ZN3c10, _ZN2at, _ZN5torch, and their
    nested and template forms) would tie the library to one torch build; the stable ABI's C shims
    (torch_*, aoti_torch_*) do not."""
    out = subprocess.run(["nm", "-D", "--undefined-only", stable_abi.library_path()], capture_output=True, text=True,
                         check=True).stdout
    tied = [line.split()[-1] for line in out.splitlines() if TORCH_CXX_NAME.search(line)]
    assert not tied, tied[:10]
    assert any("aoti_torch_" in line or "torch_" in line for line in out.splitlines())


@pytest.mark.skipif(not os.environ.get("FLASHATTN_OTHER_TORCH_PYTHON"),
                    reason="set FLASHATTN_OTHER_TORCH_PYTHON to a Python with another torch (2.11 or later)")
def test_loads_under_another_torch():
    """The same library file under another torch and Python (FLASHATTN_OTHER_TORCH_PYTHON, e.g. a venv
    with torch 2.11 and CPython 3.12): the CPU op gives the bits it gives here."""
    script = ("import sys, torch; torch.ops.load_library(sys.argv[1]); "
              "k = torch.ops.flashattn_stable.dropout_keep_mask(torch.tensor([3, 4]), 2, 3, 20, 50, 0.3); "
              "print(torch.__version__); print(''.join('1' if x else '0' for x in k.flatten().tolist()))")
    out = subprocess.run([os.environ["FLASHATTN_OTHER_TORCH_PYTHON"], "-c", script, stable_abi.library_path()],
                         capture_output=True, text=True, check=True).stdout.split()
    here = torch.ops.flashattn_stable.dropout_keep_mask(torch.tensor([3, 4]), 2, 3, 20, 50, 0.3)
    assert out[0] != torch.__version__, "the other Python runs the same torch"
    assert out[1] == "".join("1" if x else "0" for x in here.flatten().tolist())
