#!/usr/bin/env bash
# One call on the GPU machine: build in place, then the requested steps, logs under $OUT.
#   scripts/device_run.sh smoke      build + scripts/gpu_smoke.py (kernel oracle + quick timings)
#   scripts/device_run.sh test       build + the full pytest suite
#   scripts/device_run.sh bench      build + benchmarks/bench.py
#   scripts/device_run.sh all        build + smoke + test + bench
#   scripts/device_run.sh smoke+tune build + smoke + benchmarks/tuning/tune.py (kernel configurations)
# The copy on the GPU machine has no .git: pass the commit as FLASHATTN_GIT_COMMIT=<hash> so the
# benchmark records it.
set -uo pipefail
OUT=${OUT:-/tmp/flashattn_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
steps=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
# A warm machine keeps ignored build outputs between calls, with timestamps that can make ninja reuse
# objects compiled against older headers: always build from scratch.
rm -rf build flashattn/_C*.so
FLASHATTN_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
status=0
if [[ $steps == *smoke* || $steps == all ]]; then
  python3 scripts/gpu_smoke.py ${SMOKE_ARGS---bench} 2>&1 | tee "$OUT/smoke.log" | grep -v "^ok " || status=1
fi
if [[ $steps == *tune* ]]; then
  python3 benchmarks/tuning/tune.py ${TUNE_WHICH:-both} 2>&1 | tee "$OUT/tune.log" || status=1
fi
if [[ $steps == test || $steps == all ]]; then
  python3 -m pytest tests -q --timeout=900 2>&1 | tee "$OUT/tests.log" | tail -30 || status=1
fi
if [[ $steps == bench || $steps == all ]]; then
  python3 benchmarks/bench.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60 || status=1
fi
exit $status
