#!/usr/bin/env bash
# The main job, end to end. Installs what is missing and builds only what the
# job needs (the libraries, the flexmodel tool and one example: about 4
# minutes the first time on 2 cores, with progress; nothing on later runs).
# Then:
#   bash run.sh             trains a 2-layer Llama on the spot (about 900
#                           steps, 20 s, one thread) to continue segments that
#                           occur twice at random places in random rows,
#   bash run.sh MODEL_DIR   or takes a Hugging Face model folder,
# runs `flexmodel capture` of every module and the attention probabilities on
# held-out rows, and `flexmodel report`: which heads attend to the previous
# token, to the first token, or from a repeated token to the one after its
# earlier copy (induction), and the circuit they form, measured, printed, and
# drawn in one HTML page with the logit lens and activation norms.
# Environment: FLEXMODEL_BUILD (build folder, default ./build),
# FLEXMODEL_SKIP_BUILD=1 (use that build as is), FLEXMODEL_DEMO_DIR (outputs,
# default <build>/demo), FLEXMODEL_TRAIN_SECONDS (training time limit, 300;
# the training normally stops on its own after 750-1000 steps, 15-20 s).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${FLEXMODEL_BUILD:-$root/build}
export FLEXMODEL_BUILD=$build
if [ -z "${FLEXMODEL_SKIP_BUILD:-}" ]; then
  bash "$root/scripts/build.sh" flexmodel train_induction flexmodel_python
fi
export OMP_WAIT_POLICY=PASSIVE
work=${FLEXMODEL_DEMO_DIR:-$build/demo}
mkdir -p "$work"

if [ "$#" -eq 0 ]; then
  model=$work/induction-llama
  echo "== training a 2-layer Llama on random rows in which two segments occur twice at random places (stops when it predicts the copies)"
  # Exit 3: the time limit came before the model learnt the copy. Reporting on
  # that model would describe an untrained network, so the job stops here.
  "$build/examples/train_induction" --work "$work" --seconds "${FLEXMODEL_TRAIN_SECONDS:-300}" || {
    echo "run.sh: stopped: the model was not trained to the point where it predicts the copy (see above)" >&2
    exit 1
  }
else
  model=$1
  echo "== held-out rows with repeated segments for $model"
  "$build/examples/train_induction" "$model" --work "$work" --batch 2
fi

echo "== flexmodel capture: every module and the attention probabilities"
"$build/tools/flexmodel" capture "$model" --input-ids "$work/repeated_ids.safetensors" \
  --hook all --hook '*.hook_attn_probs' --out "$work/capture.safetensors"

echo "== flexmodel report: what the heads do"
"$build/tools/flexmodel" report "$work/capture.safetensors" --out "$work/report.html"
echo "== done: open $work/report.html (activations: $work/capture.safetensors)"
