#!/usr/bin/env bash
# Install what is missing, build everything, run the whole test suite; then
# (unless FLEX_SKIP_SANITIZERS=1) the sanitizer builds and a short fuzz smoke
# (scripts/ci-sanitizers.sh, scripts/fuzz-smoke.sh: 60 s per fuzz target, two at a time). The main suite runs last
# so its ctest summary is the final line; any failure fails the script.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$root/scripts/install-deps.sh" --tests
bash "$root/scripts/build.sh"
extra=0
if [ "${FLEX_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash "$root/scripts/ci-sanitizers.sh" asan || extra=1
  bash "$root/scripts/fuzz-smoke.sh" "${FLEX_FUZZ_SECONDS:-60}" || extra=1
  bash "$root/scripts/ci-sanitizers.sh" tsan || extra=1
fi
cd "$root/build"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2
ctest --output-on-failure -j"$(nproc)" --timeout 600
exit $extra
