#!/usr/bin/env bash
# Install what is missing, build everything, run the whole test suite; then
# (unless FLEX_SKIP_SANITIZERS=1) the sanitizer builds and a short fuzz smoke
# (scripts/ci-sanitizers.sh, scripts/fuzz-smoke.sh: 60 s per fuzz target, two at a time). The main suite runs last
# so its ctest summary ends the output; any failure fails the script.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$root/scripts/install-deps.sh" --tests
bash "$root/scripts/build.sh"
cd "$root/build"
# CI shows only the tail of the output, which the ctest run fills; a stage
# that failed before it is written to stages.txt and repeated at the end, so
# the tail says which one failed and how.
: > stages.txt
extra=0
stage() {  # name command... : runs it, output to the terminal and build/<name>.log
  local name=$1; shift
  if "$@" 2>&1 | tee "$root/build/$name.log"; then
    echo "$name: passed" >> stages.txt
  else
    extra=1
    { echo "$name: FAILED (whole log: build/$name.log)"
      grep -E -A25 'FAILED|ERROR: |WARNING: ThreadSanitizer|runtime error|SUMMARY: ' "$root/build/$name.log" | head -40
    } >> stages.txt
  fi
}
if [ "${FLEX_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage asan bash "$root/scripts/ci-sanitizers.sh" asan
  stage fuzz bash "$root/scripts/fuzz-smoke.sh" "${FLEX_FUZZ_SECONDS:-60}"
  stage tsan bash "$root/scripts/ci-sanitizers.sh" tsan
fi
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2
set +e
ctest --output-on-failure -j"$(nproc)" --timeout 600 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
if [ "$extra" != 0 ]; then
  echo "---- a stage before ctest failed:"
  cat stages.txt
  echo "---- ctest's summary again:"
  sed -n '/tests passed, /,$p' ctest.log
  rc=1
fi
exit "$rc"
