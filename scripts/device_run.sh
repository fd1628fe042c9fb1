#!/usr/bin/env bash
# One call on the GPU machine: build in place, then the requested steps, logs under $OUT.
#   scripts/device_run.sh guard        build + one small forward/backward per sm90 width (stops the call if it hangs)
#   scripts/device_run.sh smoke        build + scripts/gpu_smoke.py (kernel oracle + quick timings)
#   scripts/device_run.sh test         build + the GPU tests (test_gpu_*, CLI, transformers, packing, varlen, KV cache and decode op, variants, error table, torch hook), `large` ones apart,
#                                      in TEST_GROUPS pytest processes side by side (default 3; tests_<i>.log, their tails in tests.log)
#   scripts/device_run.sh large        build + the `large` tests (tens of GiB, inputs past 2^31 elements)
#   scripts/device_run.sh sanitize     build + scripts/sanitize.py (compute-sanitizer, about 4 minutes)
#   scripts/device_run.sh fuzz         build + the fuzz tests' GPU profile (FUZZ_EXAMPLES per test, default 300)
#   scripts/device_run.sh bench        build + benchmarks/bench.py (the full grid, about 4 minutes)
#   scripts/device_run.sh masks        build + benchmarks/bench_masks.py (the attention-mask and dropout figures;
#                                      MASKS_ARGS="--figures dropout_anchors --seqlens 1024,4096,16384" picks some)
#   scripts/device_run.sh tune         build + benchmarks/tuning/tune.py ${TUNE_WHICH:-sm90}
#   scripts/device_run.sh ncu          build + Nsight Compute stall profiles of the sm90 forward, no mask
#                                      and padding mask (D=${NCU_HEADDIM:-64}, N=${NCU_SEQLEN:-4096}), when ncu is installed there, and
#                                      per-SASS-instruction counts of both (ncu_source_*.csv); NCU_CASES="is_causal;no mask"
#                                      picks other cases of scripts/dev/mask_profile.py
#   scripts/device_run.sh ncubwd       build + Nsight Compute profiles of the sm90 backward's main kernel
#                                      (scripts/dev/bwd_profile.py; NCU_BWD_CASES="64 4096 0;128 4096 1")
#   scripts/device_run.sh stress       build + scripts/dev/schedule_stress.py (one causal launch ${STRESS_RUNS:-1000} times
#                                      per setting of the script's switches: the runs that are not bit-for-bit the first)
#   scripts/device_run.sh all          build + test + bench
# PREBUILT=1 (any step) uses the module of scripts/dev/prebuild_for_device.sh instead of building.
# Steps combine with "+", e.g. guard+test+large+fuzz. Each step runs under its own timeout so one hang cannot
# eat the call. The copy on the GPU machine has no .git: pass FLASHATTN_GIT_COMMIT=<hash> so results
# record the commit.
set -uo pipefail
OUT=${OUT:-/tmp/flashattn_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
steps=${1:-all}
[[ $steps == all ]] && steps=test+bench
has() { [[ "+$steps+" == *"+$1+"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
# A warm machine keeps ignored build outputs between calls, with timestamps that can make ninja reuse
# objects compiled against older headers: always build from scratch.
# SKIP_BUILD=1 keeps the build of an earlier command in this same call (e.g. scripts/dev/ab_fwd.sh's).
# PREBUILT=1 unpacks the module scripts/dev/prebuild_for_device.sh made (carry .prebuilt) instead.
if [[ ${PREBUILT:-0} == 1 ]]; then
  rm -rf build flashattn/_C*.so
  python3 - <<'UNPACK' || exit 1
import glob, lzma, os, shutil
packed = glob.glob(".prebuilt/_C*.so.xz")
if not packed:
    raise SystemExit("PREBUILT=1: no .prebuilt/_C*.so.xz (carry .prebuilt)")
for path in packed:  # _C, and _C_stable where the build has it
    with lzma.open(path) as src, open(os.path.join("flashattn", os.path.basename(path)[:-3]), "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.copy(".prebuilt/build_record.py", "flashattn/build_record.py")
print("prebuilt module of", open(".prebuilt/COMMIT").read().strip())
UNPACK
elif [[ ${SKIP_BUILD:-0} != 1 ]]; then
  rm -rf build flashattn/_C*.so
  FLASHATTN_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
    || { tail -50 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
status=0
run() {  # run NAME TIMEOUT COMMAND...: logs to $OUT/NAME.log, prints the tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || status=1
  tail -${TAIL:-15} "$OUT/$name.log"
}
# guard: one small forward + backward per sm90 tile width, masked and not, and one long-row forward,
# under a short timeout, so a kernel that hangs (or fails) ends the call in seconds instead of eating
# every later step's timeout.
GUARD='import torch, flashattn
for d in (64, 96, 128, 192, 256):
    q, k, v = (torch.randn(2, 4, 300, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for mask in (None, torch.rand(300, 300, device="cuda") > 0.3):
        flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
# Long rows at tile width 64 (three consumer warpgroups), with a last tile whose second and third
# warpgroups have no rows.
q = torch.randn(1, 4, 4096, 64, device="cuda", dtype=torch.bfloat16)
flashattn.scaled_dot_product_attention(q, q, q)
# Causal with more query tiles than SMs: pairs, then the dynamic tail (every tile of it in the second).
for b, h, n in ((8, 16, 1024), (1, 8, 4096)):
    q = torch.randn(b, h, n, 64, device="cuda", dtype=torch.bfloat16)
    flashattn.scaled_dot_product_attention(q, q, q, is_causal=True)
torch.cuda.synchronize()
print("guard: forward and backward ran")'
if has guard; then
  timeout 120 python3 -c "$GUARD" > "$OUT/guard.log" 2>&1 || { echo "guard failed (hang or error):"; tail -5 "$OUT/guard.log"; exit 1; }
  cat "$OUT/guard.log"
fi
GPU_TESTS="tests/test_plan.py tests/test_package_layout.py tests/test_gpu_attention.py tests/test_gpu_integration.py tests/test_gpu_paths.py tests/test_gpu_sm80_tiles.py tests/test_gpu_masks.py tests/test_gpu_dropout.py tests/test_gpu_reliability.py tests/test_cli.py tests/test_transformers.py tests/test_varlen.py tests/test_kvcache.py tests/test_error_table.py tests/test_torch_flash_impl.py tests/test_packing.py tests/test_sinks.py tests/test_softcap.py tests/test_window.py tests/test_alibi.py tests/test_value_head_dim.py tests/test_kvcache_decode.py tests/test_fa2_standin.py tests/test_bench_decode.py tests/test_bench_varlen.py tests/test_stable_abi.py"
has smoke && run smoke 300 python3 scripts/gpu_smoke.py ${SMOKE_ARGS---bench}
# The GPU suite in TEST_GROUPS processes at once: much of its time is the float64 references on the
# CPU, not the GPU, so the groups overlap. Files are spread by size (a stand-in for their run time);
# each process gets its share of the cores for the references' threads.
test_groups() {
  local groups=${TEST_GROUPS:-3} i
  local -a parts pids
  mapfile -t parts < <(python3 - "$groups" $GPU_TESTS <<'EOF'
import os
import sys
groups = [[0, []] for _ in range(max(int(sys.argv[1]), 1))]
for f in sorted(sys.argv[2:], key=os.path.getsize, reverse=True):
    lightest = min(groups, key=lambda g: g[0])
    lightest[0] += os.path.getsize(f)
    lightest[1].append(f)
for _, files in groups:
    if files:
        print(" ".join(files))
EOF
)
  local threads=$(( $(nproc) / ${#parts[@]} ))
  for i in "${!parts[@]}"; do
    OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 )) timeout 540 python3 -m pytest ${parts[$i]} -m "not large" -q \
      -rfEs --timeout=120 -p no:cacheprovider > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || status=1; done
  for i in "${!parts[@]}"; do
    echo "== group $i: ${parts[$i]}"
    tail -${TAIL:-15} "$OUT/tests_$i.log"
  done > "$OUT/tests.log"
  for i in "${!parts[@]}"; do
    echo "tests group $i: $(grep -E "[0-9]+ (passed|failed|errors?|skipped)" "$OUT/tests_$i.log" | tail -1)"
  done
  grep -hE "^(FAILED|ERROR)" "$OUT"/tests_*.log | head -40
}
has test && test_groups
has large && run tests_large 300 python3 -m pytest tests/test_gpu_reliability.py -m large -q -rfEs --timeout=120
has sanitize && run sanitize 300 python3 scripts/sanitize.py --out "$OUT/sanitize"
has fuzz && run fuzz_gpu 300 env FLASHATTN_FUZZ_PROFILE=gpu FLASHATTN_FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-300} \
  python3 -m pytest tests/test_fuzz.py -q -rfE
has masks && run masks 300 python3 benchmarks/bench_masks.py --out "$OUT/masks" ${MASKS_ARGS:-}
has stress && run stress 300 python3 scripts/dev/schedule_stress.py --runs ${STRESS_RUNS:-1000} ${STRESS_ARGS:-}
has tune && run tune 400 python3 benchmarks/tuning/tune.py ${TUNE_WHICH:-sm90}
# ncu_profile LOG CSV KERNEL "SECTIONS" COMMAND...: Nsight Compute's SECTIONS of the second launch of
# KERNEL (a regex) in COMMAND, into LOG.log, then its per-SASS-instruction execution counts and stall
# samples into CSV.csv, to place a difference.
ncu_profile() {
  local log=$1 csv=$2 kernel=$3 section sections=()
  for section in $4; do sections+=(--section "$section"); done
  shift 4
  run "$log" 240 "$NCU" --clock-control none "${sections[@]}" -k "regex:$kernel" --launch-skip 1 --launch-count 1 "$@"
  timeout 240 "$NCU" --clock-control none --section SourceCounters -k "regex:$kernel" --launch-skip 1 \
    --launch-count 1 --page source --print-source sass --csv "$@" > "$OUT/$csv.csv" 2> "$OUT/$csv.err" || status=1
}
if has ncu || has ncubwd; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  [[ -z $NCU ]] && echo "ncu: not installed on this machine"
fi
if has ncu && [[ -n $NCU ]]; then
  IFS=';' read -ra ncu_cases <<< "${NCU_CASES:-no mask;padding mask}"
  for c in "${ncu_cases[@]}"; do
    ncu_profile "ncu_${c// /_}" "ncu_source_${c// /_}" fwd_kernel \
      "SpeedOfLight WarpStateStats SchedulerStats InstructionStats SourceCounters" \
      python3 scripts/dev/mask_profile.py ${NCU_HEADDIM:-64} ${NCU_SEQLEN:-4096} "$c"
  done
fi
# ncubwd: the sm90 backward's main kernel (scripts/dev/bwd_profile.py; NCU_BWD_CASES "D N causal;...",
# default "64 4096 0;128 4096 0"): where its cycles and stalls go, shared-memory bank conflicts, pipe
# use, and the per-SASS-instruction stall samples (ncubwd_source_*.csv).
if has ncubwd && [[ -n $NCU ]]; then
  IFS=';' read -ra bwd_cases <<< "${NCU_BWD_CASES:-64 4096 0;128 4096 0}"
  for c in "${bwd_cases[@]}"; do
    ncu_profile "ncubwd_${c// /_}" "ncubwd_source_${c// /_}" "bwd_(wide_)?kernel" \
      "SpeedOfLight WarpStateStats SchedulerStats InstructionStats ComputeWorkloadAnalysis MemoryWorkloadAnalysis_Tables Occupancy" \
      python3 scripts/dev/bwd_profile.py $c
  done
fi
has bench && run bench 540 python3 benchmarks/bench.py --out "$OUT/bench" --no-progress ${BENCH_ARGS:-}
echo "total: $(( $(date +%s) - start )) s"
exit $status
