#!/usr/bin/env bash
# A/B timing of the forward in one device call: builds this tree and a second one under baseline/
# (made beforehand, e.g. `mkdir baseline && git archive main | tar -x -C baseline`; git ignores it,
# so name it in the device call's carry list), then runs
# scripts/dev/fwd_timing.py on each in turn, ROUNDS times, so both see the same GPU and clocks.
# Lines are prefixed with "trial" or "baseline". Logs under $OUT.
#   scripts/dev/ab_fwd.sh [DIMS] [SEQLENS] [ROUNDS]     e.g. scripts/dev/ab_fwd.sh 64,128 512,1024,4096 2
# ROUNDS=0 only builds; SKIP_BUILD=1 times the trees built by an earlier call; PREBUILT=1 unpacks each
# tree's module from scripts/dev/prebuild_for_device.sh instead of building (carry .prebuilt and baseline/,
# made with PREBUILT_DEST=baseline/.prebuilt; run `PREBUILT=1 scripts/device_run.sh guard` first for a
# change that could hang). AB_EXTRA names more
# trees (folders made like baseline/, carried too), built and timed beside the two, under their names.
# AB_CMD replaces the
# timing command (run in each tree with $name set), e.g.
#   AB_CMD='python3 benchmarks/bench_masks.py --head-dims 64 --out $OUT/masks_$name' scripts/dev/ab_fwd.sh
set -uo pipefail
dims=${1:-64,128}
seqlens=${2:-512,1024,2048,4096}
rounds=${3:-2}
OUT=${OUT:-/tmp/flashattn_out}
mkdir -p "$OUT"
[[ -f baseline/setup.py ]] || { echo "no baseline/ tree"; exit 2; }
tree_of() { [[ $1 == trial ]] && echo . || echo "$1"; }  # the folder of tree NAME
build() {  # build TREE NAME: in place, from scratch, half the cores each (both build at once)
  (cd "$1" && rm -rf build flashattn/_C*.so &&
    FLASHATTN_BUILD_CUDA=1 MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/build_$2.log" 2>&1) ||
    { echo "build of $2 failed:"; tail -20 "$OUT/build_$2.log"; return 1; }
}
if [[ ${PREBUILT:-0} == 1 ]]; then
  # Each tree's module from scripts/dev/prebuild_for_device.sh (.prebuilt, baseline/.prebuilt, ...).
  for name in trial baseline ${AB_EXTRA:-}; do
    tree=$(tree_of "$name")
    (cd "$tree" && PREBUILT=1 OUT="$OUT/unpack_$name" scripts/device_run.sh none > "$OUT/unpack_$name.log" 2>&1) ||
      { echo "unpack of $name failed:"; tail -5 "$OUT/unpack_$name.log"; exit 1; }
  done
elif [[ ${SKIP_BUILD:-0} != 1 ]]; then
  start=$(date +%s)
  pids=()
  for name in trial baseline ${AB_EXTRA:-}; do
    tree=$(tree_of "$name")
    build "$tree" "$name" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
  echo "builds: $(( $(date +%s) - start )) s"
fi
for ((r = 1; r <= rounds; ++r)); do
  for name in trial baseline ${AB_EXTRA:-}; do
    tree=$(tree_of "$name")
    (cd "$tree" && export PYTHONPATH=$PWD name OUT &&
      if [[ -n ${AB_CMD:-} ]]; then eval "$AB_CMD"; else python3 scripts/dev/fwd_timing.py "$dims" "$seqlens"; fi) 2>&1 |
      sed -u "s/^/$name /" | tee -a "$OUT/ab_fwd.txt"
  done
done
