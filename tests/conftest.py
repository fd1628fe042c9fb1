"""Shared test fixtures: deterministic seeds, the marker that skips GPU tests where they cannot run, the
kernel-path fixture, and the ``large`` marker (tests that allocate tens of GiB of GPU memory)."""
import random

import pytest
import torch

import flashattn


def _cuda_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not flashattn.cuda_kernels_built():
        return "flashattn was built without its CUDA kernels"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"flashattn's CUDA kernels need compute capability 8.0+, this GPU is {major}.{minor}"
    return None


CUDA_SKIP_REASON = _cuda_skip_reason()

# Marks a test that runs flashattn's CUDA kernels.
requires_cuda = pytest.mark.skipif(CUDA_SKIP_REASON is not None, reason=CUDA_SKIP_REASON or "")


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)
    yield




def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "large: allocates tens of GiB of GPU memory (inputs past 2^31 elements, N = 262144); "
        "up to about a minute each on an H200; leave them out with -m 'not large'",
    )


@pytest.fixture
def plan_options():
    """Sets some of the planner's switches for one test (flashattn.plan.set_options, e.g.
    ``plan_options(force_sm80=True)``); they are restored after it."""
    import flashattn.plan

    before = flashattn.plan.current_options()
    yield flashattn.plan.set_options
    flashattn.plan.set_options(**before)


@pytest.fixture(params=["default", "sm80"])
def kernel_path(request, plan_options):
    """Runs a test with the kernels the planner picks (the sm90 ones on Hopper where they apply) and
    again with its force_sm80 option (the sm80 ones)."""
    plan_options(force_sm80=request.param == "sm80")
    return request.param
