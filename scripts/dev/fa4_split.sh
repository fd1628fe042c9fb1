#!/usr/bin/env bash
# Splits ../shared/tools/fa4_pack.sh's .fa4/big archive (~61 MiB) in two halves, .fa4/big1 and .fa4/big2
# (git-ignored with .fa4/), because a device call carries the tracked tree too (about 6 MiB) and the
# whole archive beside it passes the call's 64 MiB. FlashAttention-4 then reaches a warm device machine
# in three calls made one right after the other (a machine goes back 30 s after a call):
#   1. carry [".fa4/big1"]:  mkdir -p $HOME/fa4 && cp .fa4/big1/cdsl_part.aa $HOME/fa4/ && <build, tests, ...>
#   2. carry [".fa4/big2"]:  cp .fa4/big2/cdsl_part.ab $HOME/fa4/ &&
#                            cat $HOME/fa4/cdsl_part.a? > $HOME/fa4/cdsl13.tar.xz && <more work>
#   3. carry [".fa4/small"]: bash .fa4/small/install.sh &&
#                            export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages && <bench>
# Run from the repository root after fa4_pack.sh.
set -euo pipefail
[[ -f .fa4/big/cdsl13.tar.xz ]] || { echo "no .fa4/big/cdsl13.tar.xz: run ../shared/tools/fa4_pack.sh first"; exit 1; }
rm -rf .fa4/big1 .fa4/big2
mkdir -p .fa4/big1 .fa4/big2
half=$(( ($(stat -c %s .fa4/big/cdsl13.tar.xz) + 1) / 2 ))
split -b "$half" .fa4/big/cdsl13.tar.xz .fa4/big1/cdsl_part.
mv .fa4/big1/cdsl_part.ab .fa4/big2/
du -sh .fa4/big1 .fa4/big2
