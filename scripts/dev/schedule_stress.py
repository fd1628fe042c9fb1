#!/usr/bin/env python3
"""Repeats one causal sm90 forward launch many times under each setting of the planner's switches and
counts the runs whose output or LSE is not bit-for-bit the first run's (the forward is deterministic,
so any count above 0 is a defect). For a run that differs it prints where: how many output elements,
and the (batch, head, query tile) of the first few, so that a race can be placed in the schedule.

So that a race cannot hide behind memory that already holds the right answer, the runs alternate
between two sets of inputs (each compared with its own first run: shared memory a CTA reads too early
then holds another input's tiles), each run's output and LSE are filled with NaN before they go back
to the allocator (an element a run fails to write stays NaN), and with --perturb two other launches
come before each: a head-dim-64 causal forward of random length on the same stream (another kernel's
shared-memory layout left behind on the SMs) and a matmul of random size on a second stream, so that
the two share the SMs for a while and the launch's CTAs start at different times. Each setting's
first runs are also compared with the first setting's (printed, not counted: two kernels may round
differently).

  python3 scripts/dev/schedule_stress.py [--runs 200] [--shape 2:1400:1400:48:16:128] \\
      [--settings "-;sm90_dynamic_tail=0"]

--shape is batch:seqlen_q:seqlen_k:heads_q:heads_kv:head_dim (bf16, causal, bottom-right alignment);
the default is the shape of test_static_and_dynamic_schedules_are_identical[odd-query-blocks]. Each
setting is a comma-separated list of OPTION=VALUE ("-" for none; scripts/dev/env_settings.py).
sm90_dynamic_tail=0 in a setting runs the static schedule instead of the dynamic tail.
"""
import argparse

import torch

import flashattn._C  # noqa: F401
from env_settings import apply, switches_of

QUERY_TILE = 128


def identical(first, other):
    """Whether two (out, lse) results are equal bit for bit."""
    return torch.equal(first[0], other[0]) and torch.equal(first[1], other[1])


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
    parser.add_argument("--settings", default="-;sm90_dynamic_tail=0")
    parser.add_argument("--perturb", action="store_true", help="a matmul of random size on a second stream beside each launch")
    args = parser.parse_args()
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = (int(x) for x in args.shape.split(":"))
    torch.manual_seed(0)
    inputs = []
    for _ in range(2):
        q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        inputs.append((q, k, v))
    scale = head_dim ** -0.5
    noise = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    other_kernel = torch.randn(1, 4096, 8, 64, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    reference = None
    settings = args.settings.split(";")
    switches = switches_of(settings)
    print(f"shape {args.shape}, {args.runs} runs per setting{', perturbed' if args.perturb else ''}")
    for setting in settings:
        apply(setting, switches)
        firsts = [torch.ops.flashattn.fwd(q, k, v, scale, True, True) for q, k, v in inputs]
        if reference is None:
            reference = firsts
        else:
            same = all(identical(a, b) for a, b in zip(reference, firsts))
            print(f"{setting}: first runs {'equal' if same else 'differ from'} the first setting's")
        mismatches = 0
        for run in range(1, args.runs):
            if args.perturb:
                length = int(torch.randint(128, 4096, ()).item())
                x = other_kernel[:, :length]
                torch.ops.flashattn.fwd(x, x, x, 0.125, True, True)
                size = int(torch.randint(256, 4096, ()).item())
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    noise[:size, :size] @ noise[:size, :size]
            which = run % 2
            other = torch.ops.flashattn.fwd(*inputs[which], scale, True, True)
            first = firsts[which]
            if not identical(first, other):
                mismatches += 1
                if mismatches <= 3:
                    print(f"  {setting}: run {run} differs from input {which}'s first run: {describe(first, other)}")
            for t in other:
                t.fill_(float("nan"))
            del other
            torch.cuda.current_stream().wait_stream(side)
        print(f"{setting}: {mismatches} of {args.runs - 1} runs differ from their input's first run", flush=True)
    apply(None, switches)


if __name__ == "__main__":
    main()
