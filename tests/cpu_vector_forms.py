"""Running a worker script under each vector form of the CPU code (FLASHATTN_CPU_VECTOR is read once per
process, so each form runs in a process of its own): shared by the tests of the CPU row passes."""
import json
import os
import subprocess
import sys


def run_in_form(worker, cap, timeout):
    """Runs `worker` (Python source that prints one JSON line last) with FLASHATTN_CPU_VECTOR set to `cap`
    (None: unset, the widest form the CPU runs); returns that line, parsed."""
    env = dict(os.environ)
    env.pop("FLASHATTN_CPU_VECTOR", None)
    if cap is not None:
        env["FLASHATTN_CPU_VECTOR"] = cap
    done = subprocess.run([sys.executable, "-c", worker], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
