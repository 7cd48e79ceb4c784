#!/usr/bin/env bash
# Install what is missing, build everything, run the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$root/scripts/build.sh"
cd "$root/build"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2
ctest --output-on-failure -j"$(nproc)" --timeout 600
