"""The CPU implementation on the numerics cases of test_gpu_reliability.py: a NaN in q, k or v shows up
as NaN in the outputs and gradients that depend on it (not hidden as 0 or -inf), and bf16 scores of
1e4 pass the oracle."""
import pytest

from test_gpu_reliability import check_bf16_scores_of_1e4, check_nan_propagates


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_nan_propagates_on_cpu(which):
    check_nan_propagates(which, backward=True, device="cpu")


def test_bf16_scores_of_1e4_on_cpu():
    check_bf16_scores_of_1e4(device="cpu")
