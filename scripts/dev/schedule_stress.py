#!/usr/bin/env python3
"""Repeats one causal sm90 forward launch many times under each setting of the environment switches and
counts the runs whose output or LSE is not bit-for-bit the first run's (the forward is deterministic,
so any count above 0 is a defect). For a run that differs it prints where: how many output elements,
and the (batch, head, query tile) of the first few, so that a race can be placed in the schedule.

  python3 scripts/dev/schedule_stress.py [--runs 200] [--shape 2:1400:1400:48:16:128] \\
      [--settings "FLASHATTN_SM90_Q_REGISTERS=0;FLASHATTN_SM90_Q_REGISTERS=1"]

--shape is batch:seqlen_q:seqlen_k:heads_q:heads_kv:head_dim (bf16, causal, bottom-right alignment);
the default is the shape of test_static_and_dynamic_schedules_are_identical[odd-query-blocks]. Each
setting is a comma-separated list of NAME=VALUE ("-" for none). FLASHATTN_SM90_STATIC_SCHEDULE=1 in a
setting times the static schedule instead of the dynamic tail.
"""
import argparse

import torch

import flashattn._C  # noqa: F401
from env_settings import apply, switches_of

QUERY_TILE = 128


def describe(first, other):
    """Where `other` differs from `first`: counts and the first (batch, head, query tile) triples."""
    out_a, out_b = first[0], other[0]  # (B, L, H, D)
    differs = (out_a != out_b) & ~(out_a.isnan() & out_b.isnan())
    rows = differs.any(dim=-1)  # (B, L, H)
    where = rows.nonzero().tolist()
    tiles = sorted({(b, h, q // QUERY_TILE) for b, q, h in where})
    lse_rows = int((first[1] != other[1]).sum().item())
    diff = (out_a.float() - out_b.float()).abs().max().item()
    return (f"{int(differs.sum().item())} output elements in {len(where)} rows (max diff {diff:.3g}), "
            f"{lse_rows} LSE values; (batch, head, query tile): {tiles[:8]}{' ...' if len(tiles) > 8 else ''}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--shape", default="2:1400:1400:48:16:128")
    parser.add_argument("--settings", default="FLASHATTN_SM90_Q_REGISTERS=0;FLASHATTN_SM90_Q_REGISTERS=1")
    args = parser.parse_args()
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = (int(x) for x in args.shape.split(":"))
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = head_dim ** -0.5
    settings = args.settings.split(";")
    switches = switches_of(settings)
    print(f"shape {args.shape}, {args.runs} runs per setting")
    for setting in settings:
        apply(setting, switches)
        first = torch.ops.flashattn.fwd(q, k, v, scale, True, True)
        mismatches = 0
        for run in range(1, args.runs):
            other = torch.ops.flashattn.fwd(q, k, v, scale, True, True)
            if not (torch.equal(first[0], other[0]) and torch.equal(first[1], other[1])):
                mismatches += 1
                if mismatches <= 3:
                    print(f"  {setting}: run {run} differs from run 0: {describe(first, other)}")
        print(f"{setting}: {mismatches} of {args.runs - 1} runs differ from run 0", flush=True)
    apply(None, switches)


if __name__ == "__main__":
    main()
