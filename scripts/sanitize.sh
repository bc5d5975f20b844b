#!/usr/bin/env bash
# The fuzz corpus under AddressSanitizer + UndefinedBehaviorSanitizer (scripts/test.sh runs this, so CI does).
#
# build-asan/ (configured here when missing) builds the CLI and the fuzzer once more with
# -fsanitize=address,undefined. Then: the fuzzer runs its seeded cases in-process and writes them out as a
# corpus, and the sanitized CLI runs over a sample of that corpus (plan --explain, print --decomposed, emit on
# .cf cases; interp on .npy cases). Any sanitizer report, crash, internal error (exit 1) or hang (60 s) fails.
#   COMFUSE_FUZZ_CF / COMFUSE_FUZZ_NPY: cases for the in-process run (default 20000 / 4000)
#   COMFUSE_FUZZ_CLI_EVERY: the CLI runs on every Nth case of the corpus (default 40)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="$(nproc)"
if [ ! -f build-asan/build.ninja ]; then
  san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g" \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >/dev/null
fi
cmake --build build-asan -j "$jobs" --target comfuse_cli comfuse_fuzz
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87"
work="$(mktemp -d "${TMPDIR:-/tmp}/comfuse-asan.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "sanitize: fuzzer in-process (ASan+UBSan)"
rc=0
build-asan/bin/comfuse_fuzz --seed 14 --cf "${COMFUSE_FUZZ_CF:-20000}" --npy "${COMFUSE_FUZZ_NPY:-4000}" \
  --corpus "$work/corpus" --case-timeout 30 > "$work/fuzz.txt" 2>&1 || rc=$?
head -n 1 "$work/fuzz.txt"
if [ "$rc" -ne 0 ]; then
  grep -E "FAIL|HANG|ERROR|runtime error" "$work/fuzz.txt" | head -n 40
  echo "sanitize: the fuzzer failed under ASan+UBSan (exit $rc)"
  exit 1
fi

every="${COMFUSE_FUZZ_CLI_EVERY:-40}"
cli=build-asan/bin/comfuse
runs=0; fails=0
check() {  # check CASE CMD...: exit 0 or 2 (a user error), no sanitizer report, no internal error
  local case="$1"; shift
  local rc=0
  timeout 60 "$@" >"$work/out" 2>&1 || rc=$?
  runs=$((runs + 1))
  if { [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ]; } || grep -qE "internal error|AddressSanitizer|runtime error:|LeakSanitizer" "$work/out"; then
    fails=$((fails + 1))
    echo "sanitize: FAIL (exit $rc) on $case: $*"
    head -n 30 "$work/out"
  fi
}
mkdir -p "$work/npy"
printf 'input X : f32[2, 3]\nY = exp(X)\noutput Y\n' >"$work/npy.cf"
i=0
for f in "$work"/corpus/*.cf "$work"/corpus/*.npy; do
  i=$((i + 1))
  [ $((i % every)) -eq 0 ] || continue
  case "$f" in
    *.cf)
      check "$f" "$cli" plan "$f" --explain
      check "$f" "$cli" print "$f" --decomposed
      check "$f" "$cli" emit "$f" -o "$work/emit" ;;
    *.npy)
      cp "$f" "$work/npy/X.npy"
      check "$f" "$cli" interp "$work/npy.cf" --inputs "$work/npy" --outputs "$work/npy-out" ;;
  esac
done
echo "sanitize: CLI (ASan+UBSan) on every ${every}th corpus case: $runs runs, $fails failed"
[ "$fails" -eq 0 ]
