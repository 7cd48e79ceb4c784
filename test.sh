#!/usr/bin/env bash
# Install what is missing, build everything, run the whole test suite; then
# (unless FLEX_SKIP_SANITIZERS=1) the sanitizer builds and a short fuzz smoke
# (scripts/ci-sanitizers.sh, scripts/fuzz-smoke.sh: FLEX_FUZZ_SECONDS, default 30 s per fuzz
# target, two at a time); with FLEX_CUDA_STAGE=1 (CI sets it) the CUDA build
# and its suite on the CPU (scripts/ci-cuda.sh: a CUDA PyTorch of ~5.5 GB in
# its own venv, hence opt-in). The main suite runs last; any failure fails the script.
#
# CI shows only the tail of the output, which the ctest run fills. So each
# stage's result and time go to build/stages.txt (with the report of a stage
# that failed), which is printed after ctest, followed by ctest's summary
# again: the output still ends with ctest's summary line.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$root/build"
stages=$root/build/stages.txt
: > "$stages"
extra=0
stage() {  # name command... : runs it, output to the terminal and build/<name>.log
  local name=$1; shift
  local start=$SECONDS
  local ok=0 summary
  "$@" 2>&1 | tee "$root/build/$name.log" || ok=$?
  # A stage that runs ctest: its summary line goes on the stage's line.
  summary=$(grep -E '^[0-9]+% tests passed, ' "$root/build/$name.log" | tail -1 || true)
  if [ "$ok" = 0 ]; then
    echo "$name: passed ($((SECONDS - start)) s${summary:+; $summary})" >> "$stages"
  else
    extra=1
    { echo "$name: FAILED ($((SECONDS - start)) s${summary:+; $summary}; whole log: build/$name.log)"
      grep -E -A25 'FAILED|ERROR: |WARNING: ThreadSanitizer|runtime error|SUMMARY: ' "$root/build/$name.log" | head -40
    } >> "$stages"
  fi
}
stage install bash "$root/scripts/install-deps.sh" --tests
[ "$extra" = 0 ] || { cat "$stages"; exit 1; }
stage build bash "$root/scripts/build.sh"
[ "$extra" = 0 ] || { cat "$stages"; exit 1; }
if [ "${FLEX_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage asan bash "$root/scripts/ci-sanitizers.sh" asan
  stage fuzz bash "$root/scripts/fuzz-smoke.sh" "${FLEX_FUZZ_SECONDS:-30}"
  stage tsan bash "$root/scripts/ci-sanitizers.sh" tsan
fi
if [ "${FLEX_CUDA_STAGE:-0}" = 1 ]; then
  stage cuda bash "$root/scripts/ci-cuda.sh"
fi
cd "$root/build"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2
start=$SECONDS
set +e
ctest --output-on-failure -j"$(nproc)" --timeout 600 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
echo "ctest: $([ "$rc" = 0 ] && echo passed || echo FAILED) ($((SECONDS - start)) s)" >> "$stages"
echo "---- stages (whole run: $SECONDS s):"
cat "$stages"
echo "---- ctest's summary again (failed and skipped tests, then the summary line):"
sed -n '/tests passed, /,$p' ctest.log | sed -n '/^The following tests/,$p'
grep -E '^[0-9]+% tests passed, ' ctest.log | tail -1
[ "$extra" = 0 ] || rc=1
exit "$rc"
