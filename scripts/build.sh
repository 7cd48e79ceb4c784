#!/usr/bin/env bash
# Configures and builds flexmodel into ./build (Release, Ninja, ccache), one
# line per stage and ninja's [done/total] progress as it goes.
#   scripts/build.sh [TARGET...]     no target: everything (libraries, tool,
#                                    examples, tests, benchmarks)
# FLEXMODEL_CMAKE_ARGS: extra configure arguments.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLEXMODEL_BUILD:-$root/build}
start=$SECONDS
echo "flexmodel build: [1/3] Debian packages (installs only what is missing)"
bash "$root/scripts/install-deps.sh"
echo "flexmodel build: [2/3] configure $build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FLEXMODEL_CMAKE_ARGS:-} >/dev/null
# A first build on 2 cores takes about 4 minutes for run.sh's targets and 15
# for everything (tests and benchmarks included); ccache makes rebuilds short.
if [ "$#" -gt 0 ]; then what="$*"; else what="everything"; fi
echo "flexmodel build: [3/3] compile $what on $(nproc) core(s); ninja prints [done/total] per step"
ninja -C "$build" -j"$(nproc)" "$@"
# The Python package, when it was built: importable from the build tree.
if [ "$#" -eq 0 ] || [[ " $* " == *" flexmodel_python "* ]]; then
  if ls "$build"/python/flexmodel/_C*.so >/dev/null 2>&1; then bash "$root/scripts/python-dev.sh"; fi
fi
echo "flexmodel build: done in $((SECONDS - start)) s"
