"""Arithmetic, no GPU: how evenly the sm90 forward's persistent CTAs share the causal tiles of one
launch. A tile of n key blocks costs n + F key-block steps (F: the per-tile fixed cost; 2.0 from the
short-row fit in docs/perf-log.md, 327f0f6). Prints, per shape on the standard grid (B * N = 16k, H * D =
2048, 128-query tiles), the busiest CTA's work over the mean for
  pairs    the static schedule (query blocks j and num_m - 1 - j paired, CTA c runs units c, c + G, ...);
  dynamic  pairs for all but the last S (head, batch) rows, then those rows' tiles one by one,
           heaviest first, each taken by whichever CTA is free first, with S as the kernel's host code
           picks it (fwd_dynamic_heads in csrc/sm90/fwd_schedule.h: about four tiles per CTA, capped so
           the S rows' K and V fit in 24 MiB; none when the cap leaves fewer than two per CTA);
  all      every tile dynamic (S = all rows; best balance, but K and V of every row read at once).
The model behind the tail size S in csrc/sm90/fwd_schedule.h and its prediction in docs/perf-log.md
(753ffdb); rerun it when the schedule or the tile costs change.
Usage: schedule_sim.py [CTAs, default 132] [F, default 2.0]"""
import heapq
import math
import sys

G = int(sys.argv[1]) if len(sys.argv) > 1 else 132
F = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0


def busiest_over_mean(num_m, rows, single_rows):
    loads = [0.0] * G
    pair_costs = [(num_m - j + F) + (j + 1 + F if 2 * j + 1 != num_m else 0)
                  for _ in range(rows - single_rows) for j in range((num_m + 1) // 2)]
    for u, cost in enumerate(pair_costs):
        loads[u % G] += cost
    free = [(load, c) for c, load in enumerate(loads)]
    heapq.heapify(free)
    for level in range(num_m):  # heaviest first
        for _ in range(single_rows):
            load, c = heapq.heappop(free)
            heapq.heappush(free, (load + num_m - level + F, c))
    busiest = max(load for load, _ in free)
    return busiest / (rows * (num_m * (num_m + 1) / 2 + F * num_m) / G)


def dynamic_rows(num_m, rows, seqlen_k, head_dim, grid=G, group=1):
    """fwd_dynamic_heads."""
    for_balance = math.ceil(4 * grid / num_m)
    for_l2 = max(1, (24 << 20) // (4 * seqlen_k * head_dim)) * group
    s = min(rows, for_balance, for_l2)
    return s if s * num_m >= 2 * grid else 0


for head_dim in (64, 128, 256):
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        num_m, rows = math.ceil(n / 128), (16384 // n) * (2048 // head_dim)
        s = dynamic_rows(num_m, rows, n, head_dim)
        print(f"D={head_dim:3d} causal {n:5d}: pairs {busiest_over_mean(num_m, rows, 0):.4f}  "
              f"dynamic S={s:3d} {busiest_over_mean(num_m, rows, s):.4f}  all {busiest_over_mean(num_m, rows, rows):.4f}")
