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
if [ "$#" -gt 0 ]; then what="$*"; else what="everything"; fi
todo=$(ninja -C "$build" -n "$@" 2>/dev/null | grep -c '^\[' || true)
echo "flexmodel build: [3/3] compile $what: $todo step(s) to do on $(nproc) core(s)"
ninja -C "$build" -j"$(nproc)" "$@"
echo "flexmodel build: done in $((SECONDS - start)) s"
