#!/usr/bin/env bash
# On the device machine: several device scripts in one command, one after the other (one benchmark on the GPU at a
# time), each with its own $OUT/<name>; everything under $OUT packed once at the end (scripts/gpu-lib.sh), and each
# step's last lines (its table) printed again together last.
#
#   scripts/gpu-steps.sh NAME=COMMAND [NAME=COMMAND ...]
#     e.g. scripts/gpu-steps.sh "ep=scripts/gpu-epilogue-path.sh build-ep/comfuse_epilogue_path" \
#                               "dp=scripts/gpu-data-path.sh --rounds 3 --programs res"
#     COMMAND runs under bash from the repository root (so `VAR=value script ...` sets a step's environment);
#     STEPS_TAIL lines of each step's output are printed in the summary (default 30).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
[ $# -ge 1 ] || { echo "usage: scripts/gpu-steps.sh NAME=COMMAND [NAME=COMMAND ...]" >&2; exit 2; }
top="${OUT:-$root/build/gpu-steps}"
mkdir -p "$top"
declare -A status
names=()
t0=$(date +%s)
for step in "$@"; do
  name="${step%%=*}" cmd="${step#*=}"
  [ -n "$name" ] && [ "$name" != "$step" ] || { echo "gpu-steps: '$step' is not NAME=COMMAND" >&2; exit 2; }
  names+=("$name")
  mkdir -p "$top/$name"
  echo "==== $name: $cmd ($(( $(date +%s) - t0 )) s in)"
  OUT="$top/$name" bash -c "$cmd" > "$top/$name.log" 2>&1
  status[$name]=$?
  tail -n "${STEPS_TAIL:-30}" "$top/$name.log"
done
echo
echo "gpu-steps summary ($(( $(date +%s) - t0 )) s; logs in $top)"
gpu_status_table
