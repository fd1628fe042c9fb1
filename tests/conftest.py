"""Shared test fixtures: deterministic seeds and the marker that skips GPU tests where they cannot run."""
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
