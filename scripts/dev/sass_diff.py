#!/usr/bin/env python3
"""Compares the sm_90a SASS of kernel translation units between two trees, kernel by kernel, on a
machine without a GPU: the project's check that a code move or refactor leaves the kernels' SASS
unchanged, and the evidence behind "every other kernel is unchanged instruction for instruction" in
docs/perf-log.md and in commit messages.

  python3 scripts/dev/sass_diff.py --base ba35c95 fwd_bf16_hdim64_sm90 fwd_bf16_hdim128_sm90
  python3 scripts/dev/sass_diff.py --base HEAD~3 --head HEAD fwd_masked_bf16_hdim128_sm90
  python3 scripts/dev/sass_diff.py --base HEAD~1 --sub 9flashattn4sm80=9flashattn sm80/mask_tiles:cuda/mask_tiles

Each tree's csrc/ (--base and --head are git revisions; --head defaults to the working tree) is
compiled with the build's nvcc flags, disassembled with cuobjdump, and split into kernels. Addresses
are dropped before comparing, so a kernel that only moved compares equal. Kernels are matched by their
mangled names, after removing a configuration template argument that equals its default (see
--normalize). Per kernel it prints: identical or the number of differing lines, the HGMMA and wgmma
wait counts, the highest register and the local-memory loads and stores of the head tree; then the
head tree's ptxas spill and C75xx (wgmma serialisation) messages.
"""
import argparse
import collections
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC_FLAGS = ["-O3", "-std=c++17", "--use_fast_math", "--expt-relaxed-constexpr",
              "-gencode=arch=compute_90a,code=sm_90a", "-DFLASHATTN_SM90", "-Xptxas", "-v"]


def cuda_tool(name):
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = os.path.join(home, "bin", name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found:
        return found
    try:  # triton's wheel ships cuobjdump
        import triton
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    sys.exit(f"{name} not found (set CUDA_HOME)")


def tree_of(rev, workdir):
    """A directory holding csrc/ at git revision `rev` (None: the working tree)."""
    if rev is None:
        return REPO
    data = subprocess.run(["git", "-C", REPO, "archive", rev, "csrc"], check=True, capture_output=True).stdout
    root = os.path.join(workdir, rev.replace("/", "_").replace("~", "_").replace("^", "_"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(root)
    return root


def unit_source(root, unit):
    """csrc/instantiations/<unit>.cu, or csrc/<unit>.cu for a unit given as a path (one with a '/')."""
    return os.path.join(root, "csrc", *(() if "/" in unit else ("instantiations",)), unit + ".cu")


def compile_unit(root, unit, workdir, tag):
    from torch.utils.cpp_extension import include_paths
    obj = os.path.join(workdir, f"{tag}_{unit.replace('/', '_')}.o")
    cmd = [cuda_tool("nvcc"), *NVCC_FLAGS, f"-I{os.path.join(root, 'csrc')}",
           *(f"-I{p}" for p in include_paths()), "-c", unit_source(root, unit), "-o", obj]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"nvcc failed on {unit} ({tag}):\n{run.stderr[-3000:]}")
    sass = subprocess.run([cuda_tool("cuobjdump"), "-sass", obj], check=True, capture_output=True, text=True).stdout
    return sass, run.stderr


def kernels(sass, normalize, subs=()):
    out = {}
    for chunk in re.split(r"\n\s+Function : ", sass)[1:]:
        name, _, body = chunk.partition("\n")
        name = name.strip()
        for pattern, replacement in subs:
            name = re.sub(pattern, replacement, name)
        if subs:  # a renamed scope renumbers the name's substitutions (S_, S0_, ...): compare without them
            name = re.sub(r"S[0-9A-Z]*_", "S?_", name)
        # An anonymous namespace's mangled name carries hashes of the file's path: drop them.
        name = re.sub(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_(\w+?)_cu_[0-9a-f]{8}", r"<anonymous \1.cu>", name)
        if normalize:
            # FwdConfig's last argument (the narrow tail's keys) equal to its keys per step: the default.
            name = re.sub(r"(FwdConfigILi\d+ELi(\d+)(?:ELi\d+){3}(?:ELb\d)+)ELi\2EEE", r"\1EEE", name)
            # BwdConfig's queries per step at its default (64).
            name = re.sub(r"BwdConfigILi(\d+)ELi64EEE", r"BwdConfigILi\1EEE", name)
        lines = []
        for line in body.split("\n"):
            line = re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()
            if line:
                lines.append(re.sub(r"\s+", " ", line))
        out[name] = lines
    return out


def without_param_offsets(lines):
    """Lines with the kernel-parameter bank's offsets (c[0x0][0x...]) and the instruction encodings that
    carry them removed: for a change that only moves fields of the parameter structs."""
    return [re.sub(r"/\* 0x[0-9a-f]+ \*/", "", re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][*]", line)).strip()
            for line in lines]


def summary(lines):
    text = "\n".join(lines)
    regs = [int(r) for r in re.findall(r"\bR(\d+)\b", text)]
    waits = len(re.findall(r"WARPGROUP\.DEPBAR", text))
    loads, stores = len(re.findall(r"\bLDL\b", text)), len(re.findall(r"\bSTL\b", text))
    return (f"HGMMA {text.count('HGMMA')}, waits {waits}, max R{max(regs) if regs else 0}, "
            f"LDL {loads}, STL {stores}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("units", nargs="+",
                        help="csrc/instantiations/<unit>.cu names, e.g. fwd_bf16_hdim64_sm90, or paths under csrc/ "
                             "without .cu (sm80/dispatch); BASE:HEAD for a unit that moved (sm80/mask_tiles:cuda/mask_tiles)")
    parser.add_argument("--base", required=True, help="git revision of the old tree")
    parser.add_argument("--head", help="git revision of the new tree (default: the working tree)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=True,
                        help="match FwdConfig and BwdConfig names with and without a defaulted argument (default on)")
    parser.add_argument("--sub", action="append", default=[], metavar="REGEX=REPLACEMENT",
                        help="rewrite kernel names of both trees before matching (re.sub; repeatable), e.g. a "
                             "namespace that moved: --sub 9flashattn4sm80=9flashattn")
    parser.add_argument("--base-sub", action="append", default=[], metavar="REGEX=REPLACEMENT",
                        help="the same for the base tree only, e.g. a template argument the head tree dropped")
    parser.add_argument("--param-offsets", action=argparse.BooleanOptionalAction, default=True,
                        help="compare the offsets of kernel-parameter loads (--no-param-offsets: ignore them, "
                             "for a change that adds or moves fields of FwdParams or BwdParams)")
    args = parser.parse_args()
    split = lambda items: [tuple(item.split("=", 1)) for item in items]  # noqa: E731
    subs, base_subs = split(args.sub), split(args.sub) + split(args.base_sub)
    with tempfile.TemporaryDirectory() as workdir:
        base_root, head_root = tree_of(args.base, workdir), tree_of(args.head, workdir)
        for unit in args.units:
            base_unit, _, head_unit = unit.partition(":")
            base_sass, _ = compile_unit(base_root, base_unit, workdir, "base")
            head_sass, ptxas_log = compile_unit(head_root, head_unit or base_unit, workdir, "head")
            base, head = kernels(base_sass, args.normalize, base_subs), kernels(head_sass, args.normalize, subs)
            print(f"== {unit}")
            for name, lines in head.items():
                short = name[:150]
                if name not in base:
                    print(f"  new       {summary(lines)}  {short}")
                    continue
                old = base[name]
                if not args.param_offsets:
                    old, lines = without_param_offsets(old), without_param_offsets(lines)
                diff = sum(1 for a, b in zip(old, lines) if a != b) + abs(len(old) - len(lines))
                state = "identical" if diff == 0 else f"{diff} lines differ"
                print(f"  {state:<9} {summary(lines)}  {short}")
            for name in base:
                if name not in head:
                    print(f"  removed   {name[:150]}")
            notes = collections.Counter(l.strip() for l in ptxas_log.split("\n")
                                        if "C75" in l or ("spill" in l and " 0 bytes spill stores" not in l))
            for line, count in notes.items():
                print(f"  ptxas ({count}x): {line[:200]}")


if __name__ == "__main__":
    main()
