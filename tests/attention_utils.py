"""Kept for test modules that import the oracle from here: it now lives in flashattn.testing."""
from flashattn.testing import (  # noqa: F401
    ABS_SLACK,
    CAUSAL_MODES,
    GRAD_FACTOR,
    OUT_FACTOR,
    ZERO_REF_SLACK,
    assert_oracle,
    make_qkv,
    max_abs_diff,
    reference_and_baseline,
)
