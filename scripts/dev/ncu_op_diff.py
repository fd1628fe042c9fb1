"""Per-iteration SASS opcode counts of two kernels, from the CSVs that `scripts/device_run.sh ncu` writes
(ncu --page source --print-source sass --csv): where a variant's key-block loop executes more
instructions than its twin's. Each kernel's counts are divided by its loop's iteration count, taken as
the execution count that carries the most executed instructions. Try waits (SYNCS.PHASECHK) are left out: they count polls.
Usage: ncu_op_diff.py BASE.csv OTHER.csv"""
import collections
import csv
import sys


def load(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    header = next(csv.reader([line for line in lines if line.startswith('"Address"')]))
    executed = header.index("Instructions Executed")
    rows = [r for r in csv.reader(lines) if r[0] not in ("Address", "Kernel Name")]
    return [(r[1].strip(), int(r[executed])) for r in rows]


def per_iteration(rows):
    shared = collections.Counter(n for _, n in rows if n > 0)
    iterations = max(shared, key=lambda n: n * shared[n])  # the count that carries the most executions
    ops = collections.Counter()
    for sass, n in rows:
        words = sass.split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        if op != "SYNCS" or "PHASECHK" not in sass:
            ops[op] += n / iterations
    return iterations, ops


base_iterations, base = per_iteration(load(sys.argv[1]))
other_iterations, other = per_iteration(load(sys.argv[2]))
print(f"loop iterations: {base_iterations} / {other_iterations}")
print(f"instructions per iteration: {sum(base.values()):.1f} / {sum(other.values()):.1f}")
for op in sorted(set(base) | set(other), key=lambda op: other[op] - base[op], reverse=True):
    if abs(other[op] - base[op]) > 0.5:
        print(f"{op:10s} {base[op]:8.1f} {other[op]:8.1f} {other[op] - base[op]:+8.1f}")
