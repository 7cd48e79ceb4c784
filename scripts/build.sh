#!/usr/bin/env bash
# Configures and builds flexmodel into ./build (Release, Ninja, ccache).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$root/build" -j"$(nproc)"
