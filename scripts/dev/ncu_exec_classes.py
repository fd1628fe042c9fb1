"""Stall samples and executed instructions of an ncu per-SASS CSV (scripts/device_run.sh ncu writes
ncu_source_*.csv), grouped by how many times each instruction ran. In the persistent sm90 forward the
groups separate the code that runs once per key block (the loop) from the code that runs once per
tile (prologue, first block, last PV GEMM, epilogue) and the producer's.
With --regions it lists instead the runs of consecutive instructions that ran equally often (one
region of code: the first block's softmax, the epilogue, a barrier's retry loop...) holding at least
0.4% of the samples, in program order, with their first instruction and top stall reasons.
Usage: ncu_exec_classes.py FILE.csv [top groups, default 10] [--regions]"""
import collections
import csv
import sys


def load(path, with_stalls=False):
    """(samples, executed) per SASS instruction; with_stalls adds its source text and stall counts."""
    rows = list(csv.reader(open(path)))
    header = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    names = rows[header]
    samples = names.index("Warp Stall Sampling (All Samples)")
    executed = names.index("Instructions Executed")
    stalls = [i for i, n in enumerate(names) if n.startswith("stall_") and "Not Issued" not in n]
    for r in rows[header + 1:]:
        if len(r) > max(samples, executed):
            if with_stalls:
                yield (float(r[samples] or 0), int(float(r[executed] or 0)), r[names.index("Source")].strip(),
                       {names[i][len("stall_"):]: float(r[i] or 0) for i in stalls})
            else:
                yield float(r[samples] or 0), int(float(r[executed] or 0))


def regions(path):
    rows = list(load(path, with_stalls=True))
    total = sum(r[0] for r in rows)
    start = 0
    print(f"{path}: {total:.0f} stall samples")
    print("instructions | runs each | share | top stalls | first instruction")
    for i in range(1, len(rows) + 1):
        if i < len(rows) and rows[i][1] == rows[start][1]:
            continue
        part = rows[start:i]
        samples = sum(r[0] for r in part)
        if samples / total >= 0.004:
            reasons = collections.Counter()
            for r in part:
                reasons.update(r[3])
            top = ", ".join(f"{k} {v:.0f}" for k, v in reasons.most_common(3))
            print(f"{start:5d}-{i - 1:<5d} | {rows[start][1]:9d} | {100 * samples / total:4.1f}% | {top} | {part[0][2][:48]}")
        start = i


def main():
    args = [a for a in sys.argv[1:] if a != "--regions"]
    path = args[0]
    if "--regions" in sys.argv:
        regions(path)
        return
    top = int(args[1]) if len(args) > 1 else 10
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
