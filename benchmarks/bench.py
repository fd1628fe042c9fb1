#!/usr/bin/env python3
"""Attention throughput and memory beside torch SDPA's backends, FlexAttention and FlashAttention-4.

A thin wrapper, kept so existing commands work: the harness is benchmarks/harness.py, also run as
``python -m flashattn bench`` from a source checkout. Same flags (``--help``):

    python benchmarks/bench.py --quick --out benchmarks/results/<name>
    python benchmarks/bench.py --dtype bf16 --headdim 128 --seqlen 4096 16384 --causal true --mode fwd bwd

The commit recorded with the results comes from git; in a copy without .git set FLASHATTN_GIT_COMMIT.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from harness import main  # noqa: E402  (benchmarks/harness.py: this script's folder is on sys.path)

if __name__ == "__main__":
    sys.exit(main())
