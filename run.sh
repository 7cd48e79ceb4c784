#!/usr/bin/env bash
# The main job: install what is missing, build, and run a real capture.
#   bash run.sh [MODEL_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$root/scripts/build.sh" >/dev/null
export OMP_WAIT_POLICY=PASSIVE
"$root/build/examples/quickstart" "$@"
