#!/usr/bin/env bash
# Builds the extension on this machine against the GPU machine's Python and torch, so that a device
# call carries the compiled module instead of building it (a build there takes 150-330 s of the call's
# device time; here about 12 minutes on 2 cores from scratch for sm_90a alone, a minute or two when a
# rebuild touches a few files).
#   scripts/dev/prebuild_for_device.sh [REV]     REV (default HEAD) checked out in a worktree under /tmp
# Writes .prebuilt/<module file>.xz (the stripped module, and the stable-ABI library's beside it where REV has one; xz-compressed: about 11 MB, under a call's
# 64 MiB carry limit) and .prebuilt/build_record.py. On the GPU machine: carry [".prebuilt"] and run
# `PREBUILT=1 scripts/device_run.sh ...`, which unpacks them instead of building. Only a tree whose
# Python files match REV's may use them (the module is REV's).
# Knobs: DEVICE_PYTHON (a CPython of the GPU machine's minor version; default pyenv's 3.12), DEVICE_TORCH
# (default 2.11.0, a cu130 build from the package index), FLASHATTN_CUDA_ARCHS (default 90), PREBUILT_DEST
# (default .prebuilt; e.g. baseline/.prebuilt for the baseline tree of scripts/dev/ab_fwd.sh, made from
# the same REV, whose device_run.sh then runs there with PREBUILT=1 as well).
set -euo pipefail
rev=${1:-HEAD}
repo=$(git rev-parse --show-toplevel)
python=${DEVICE_PYTHON:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1)}
[[ -x $python ]] || { echo "no Python 3.12 found: set DEVICE_PYTHON"; exit 2; }
venv=/tmp/flashattn_device_venv
worktree=/tmp/flashattn_prebuild
build_temp=/tmp/flashattn_prebuild_build
if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "torch==${DEVICE_TORCH:-2.11.0}" ninja setuptools pybind11 numpy
fi
if [[ ! -d $worktree ]]; then
  git -C "$repo" worktree add -q --detach "$worktree" "$rev"
else
  git -C "$worktree" checkout -q --detach "$rev"
fi
commit=$(git -C "$worktree" rev-parse --short HEAD)
start=$(date +%s)
(cd "$worktree" && CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASHATTN_BUILD_CUDA=1 \
  FLASHATTN_CUDA_ARCHS=${FLASHATTN_CUDA_ARCHS:-90} FLASHATTN_CUDA_PTX= MAX_JOBS=${MAX_JOBS:-3} \
  "$venv/bin/python" setup.py build_ext --inplace --build-temp "$build_temp" > /tmp/flashattn_prebuild.log 2>&1) ||
  { tail -30 /tmp/flashattn_prebuild.log; exit 1; }
module=_C$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
dest=$repo/${PREBUILT_DEST:-.prebuilt}
rm -rf "$dest" && mkdir -p "$dest"
strip --strip-debug -o "$dest/$module" "$worktree/flashattn/$module"
xz -T0 -6 "$dest/$module"
# The stable-ABI library (flashattn._C_stable), where REV has one.
for lib in "$worktree"/flashattn/_C_stable*.so; do
  [[ -e $lib ]] && strip --strip-debug -o "$dest/$(basename "$lib")" "$lib" && xz -T0 -6 "$dest/$(basename "$lib")"
done
cp "$worktree/flashattn/build_record.py" "$dest/"
echo "$commit" > "$dest/COMMIT"
echo "prebuilt $commit in $(( $(date +%s) - start )) s: $(du -h "$dest/$module.xz" | cut -f1) $dest/$module.xz"
