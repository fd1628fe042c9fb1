"""Stall samples and executed instructions of an ncu per-SASS CSV (scripts/device_run.sh ncu writes
ncu_source_*.csv), grouped by how many times each instruction ran. In the persistent sm90 forward the
groups separate the code that runs once per key block (the loop) from the code that runs once per
tile (prologue, first block, last PV GEMM, epilogue) and the producer's.
Usage: ncu_exec_classes.py FILE.csv [top groups, default 10]"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    header = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    names = rows[header]
    samples = names.index("Warp Stall Sampling (All Samples)")
    executed = names.index("Instructions Executed")
    for r in rows[header + 1:]:
        if len(r) > max(samples, executed):
            yield float(r[samples] or 0), int(float(r[executed] or 0))


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    groups = collections.defaultdict(lambda: [0, 0.0, 0])  # instructions, samples, executed
    total = 0.0
    for samples, executed in load(path):
        g = groups[executed]
        g[0] += 1
        g[1] += samples
        g[2] += executed
        total += samples
    print(f"{path}: {total:.0f} stall samples")
    print("runs per instruction | instructions | stall samples | share | executed")
    for runs, (count, samples, executed) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{runs:20d} | {count:12d} | {samples:13.0f} | {100 * samples / total:4.1f}% | {executed:.3g}")


if __name__ == "__main__":
    main()
