#!/usr/bin/env bash
# On the device machine: compute-sanitizer memcheck and racecheck of whole .cf programs as `comfuse run` compiles
# them (the CLI built here and carried: build/bin/comfuse; CUTLASS at .carry/cutlass/include). Each program is
# compiled and checked first (`run --check`, in parallel), then launched once under each tool. racecheck's hazards in
# cuBLASLt's own kernels (nvjet_*) are about their barriers, not ComFuse's code: they are counted apart, and a program
# passes racecheck when its run completes and every report lies inside those kernels. (Leaving them out with
# --kernel-name-exclude instead made racecheck fail to handle a hardware exception in every program that runs one.)
# Logs under $OUT/sanitize; one line per program and tool last.
#
#   scripts/gpu-sanitize-programs.sh [--defer-norms on|off] [FILE.cf[:EXTRA-ARGS] ...]
# Default programs: the deferred norms at odd sizes (tests/data/row_parts_odd*.cf), the value regions
# (tests/forms/cf/value_*.cf) and a per-row vector at rows past a 16-byte chunk (tests/forms/cf/col_odd.cf, in both
# forms), with --defer-norms on.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
defer=on
programs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --defer-norms) defer="$2"; shift ;;
    *) programs+=("$1") ;;
  esac
  shift
done
[ ${#programs[@]} -eq 0 ] && programs=(tests/data/row_parts_odd.cf tests/data/row_parts_odd_ln.cf
  tests/forms/cf/value_*.cf tests/forms/cf/col_odd.cf "tests/forms/cf/col_odd.cf:--form library")
gpu_cli_env sanitize || exit 1
OUT="${OUT:-$root/build/gpu-sanitize}"
mkdir -p "$OUT/sanitize"
t0=$(date +%s)
# FILE.cf[:EXTRA-ARGS] -> a log name (FILE, then the extra arguments' letters), and the extra arguments
name_of() {
  local f="${1%%:*}" x=""
  [ "$1" != "$f" ] && x="_$(echo "${1#*:}" | tr -c 'a-z0-9' '_')"
  echo "$(basename "$f" .cf)$x"
}
args_of() { [ "$1" != "${1%%:*}" ] && echo "${1#*:}"; }
for p in "${programs[@]}"; do
  ( n=$(name_of "$p"); timeout 200 "$cli" run "${p%%:*}" $(args_of "$p") --defer-norms "$defer" --check --launches 2 \
      > "$OUT/sanitize/check_$n.log" 2>&1
    echo "check $n rc=$?" ) &
done
wait
echo "== compiled and checked at $(( $(date +%s) - t0 )) s"
# racecheck's reports (a report's line and the next two name its accesses' kernels): n counts them, t those in
# cuBLASLt's kernels (nvjet_*, and no kernel of ComFuse's, all in namespace comfuse); the others are printed.
race_awk='/^=+ +(Error|Warning): /{ n++; getline a; getline b; r = $0 " " a " " b;
  if (r ~ /nvjet/ && r !~ /comfuse/) t++; else { print $0; print a; print b } }'
fails=0
for tool in memcheck racecheck; do
  for p in "${programs[@]}"; do
    n=$(name_of "$p")
    log="$OUT/sanitize/${tool}_$n.log"
    # racecheck prints every report (cuBLASLt's kernels can have tens of thousands), without backtraces
    extra=(); [ $tool = racecheck ] && extra=(--racecheck-report all --print-limit 0 --show-backtrace no)
    timeout 150 compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 9 "$cli" run "${p%%:*}" $(args_of "$p") \
      --defer-norms "$defer" --launches 1 > "$log" 2>&1
    rc=$?
    verdict=$rc
    if [ $tool = racecheck ] && [ $rc -eq 9 ]; then   # hazards: only cuBLASLt's own kernels' are tolerated
      read -r reports theirs < <(awk "$race_awk"' END {print n + 0, t + 0}' "$log")
      ours=$((reports - theirs))
      [ "$reports" -eq 0 ] && ours=1   # hazards, but no report read: a format this script does not know
      grep -q -E "Internal Sanitizer Error|Target application returned an error" "$log" && ours=$((ours + 1))
      [ "$ours" -eq 0 ] && verdict=0
      echo "  $n: $reports race reports, $theirs inside cuBLASLt's kernels, $ours elsewhere"
      awk "$race_awk"' /SUMMARY/' "$log" > "$log.ours" && mv "$log.ours" "$log"   # it keeps the reports that count
    fi
    [ $verdict -ne 0 ] && fails=$((fails + 1))
    echo "$tool $n rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  done
done
echo "== sanitizers done at $(( $(date +%s) - t0 )) s; failed: $fails"
[ $fails -eq 0 ]
