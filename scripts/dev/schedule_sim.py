"""Arithmetic, no GPU: how evenly the sm90 forward's persistent CTAs share the causal tiles of one
launch, in units of key-block steps (per-tile fixed costs left out). Prints, per shape, the busiest
CTA's work over the mean for
  pairs   the current static schedule (query blocks j and num_m - 1 - j paired, CTA c runs units c,
          c + G, ...);
  tail-S  the pairs of all but the last S heads statically, then the last S heads' tiles one by one,
          heaviest first, each taken by whichever CTA is free first (a dynamic tail: an atomic counter).
Usage: schedule_sim.py [CTAs, default 132]"""
import heapq
import sys

G = int(sys.argv[1]) if len(sys.argv) > 1 else 132


def pairs_then_dynamic_singles(num_m, heads, single_heads):
    loads = [0] * G
    pair_costs = [(num_m - j) + (j + 1 if 2 * j + 1 != num_m else 0)
                  for _ in range(heads - single_heads) for j in range((num_m + 1) // 2)]
    for u, cost in enumerate(pair_costs):
        loads[u % G] += cost
    free = [(load, c) for c, load in enumerate(loads)]
    heapq.heapify(free)
    for level in range(num_m):  # heaviest first
        for _ in range(single_heads):
            load, c = heapq.heappop(free)
            heapq.heappush(free, (load + num_m - level, c))
    busiest = max(load for load, _ in free)
    return busiest / (heads * num_m * (num_m + 1) / 2 / G)


# (label, query blocks per head (128-query tiles), heads x batch) on the standard grid, D = 64
SHAPES = [("causal 512", 4, 1024), ("causal 1k", 8, 512), ("causal 2k", 16, 256), ("causal 4k", 32, 128),
          ("causal 8k", 64, 64), ("causal 16k", 128, 32)]
for label, num_m, heads in SHAPES:
    cells = [f"pairs {pairs_then_dynamic_singles(num_m, heads, 0):.4f}"]
    for s in (16, 33, 66):
        if s <= heads:
            cells.append(f"tail-{s} {pairs_then_dynamic_singles(num_m, heads, s):.4f}")
    print(f"{label:11s} " + "  ".join(cells))
