#!/usr/bin/env bash
# Compiles every kernel translation unit for sm_90a (no link) and prints registers and spills of the
# attention kernels: a fast check on a machine without a GPU. Usage: scripts/compile_check.sh [pattern]
set -uo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
out=$(mktemp -d)
ls csrc/instantiations/*${1:-}*.cu csrc/*.cu csrc/cuda/*.cu csrc/sm80/*.cu csrc/sm90/*.cu | xargs -P "$(nproc)" -I{} sh -c \
  'nvcc -O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_SM90 -Icsrc \
     -Xptxas -v -c {} -o '"$out"'/$(basename {}).o > '"$out"'/$(basename {}).log 2>&1 || echo "FAILED {}"'
for log in "$out"/*.log; do
  grep -q "error" "$log" && { echo "== $(basename "$log")"; grep error "$log" | head -5; }
  grep -A3 -E "Compiling entry function '.*(fwd|bwd)_kernel" "$log" | grep -E "spill|registers" | paste - - |
    sed "s|^|$(basename "$log" .cu.log): |; s/ptxas info    ://g; s/  */ /g"
done
rm -rf "$out"
