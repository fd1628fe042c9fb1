#!/usr/bin/env python3
"""Runs FlashAttention-2's own test file against flashattn through the `flash_attn` stand-in
(tests/fa2_standin; needs a GPU and einops). The test file is not part of this repository: pass the
path of `tests/test_flash_attn.py` from a FlashAttention-2 checkout.

    python3 scripts/fa2_suite.py PATH/test_flash_attn.py --tests kvcache splitkv --sample 300 --out out/fa2

--tests picks test functions by the part of the name after `test_flash_attn_` (an exact match each:
`kvcache` is not `kvcache_paged_block_table_bounds`);
--where and --sample are tests/fa2_standin/fa2_select.py's options. Prints pytest's summary, writes a JUnit
XML under --out, and exits with pytest's status.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDIN = os.path.join(ROOT, "tests", "fa2_standin")


def pytest_command(test_file, tests, sample, seed, where, junit, extra):
    command = [sys.executable, "-m", "pytest", test_file, "-p", "fa2_select", "-p", "no:cacheprovider",
               "-q", "-rfE", "--tb=line", "--fa2-sample", str(sample), "--fa2-seed", str(seed),
               "--rootdir", os.path.dirname(os.path.abspath(test_file))]
    for name in tests:
        command += ["--fa2-function", f"test_flash_attn_{name}"]
    for condition in where:
        command += ["--fa2-where", condition]
    if junit:
        command += ["--junitxml", junit]
    return command + list(extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("test_file", help="FlashAttention-2's tests/test_flash_attn.py")
    parser.add_argument("--tests", nargs="*", default=["kvcache", "splitkv"])
    parser.add_argument("--sample", type=int, default=0, help="cases per test function (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--where", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", default=None, help="folder for junit.xml")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: passed to pytest
    args = parser.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    junit = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        junit = os.path.join(args.out, "junit.xml")
    command = pytest_command(args.test_file, args.tests, args.sample, args.seed, args.where, junit, extra)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [STANDIN, ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    print(" ".join(command), flush=True)
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
