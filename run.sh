#!/usr/bin/env bash
# The main job, end to end. Installs what is missing and builds only what the
# job needs (the libraries, the flexmodel tool and one example: about 4
# minutes the first time on 2 cores, with progress; nothing on later runs).
# Then:
#   bash run.sh             trains a 2-layer GPT-2 on the spot (about 5 s,
#                           one thread) to continue repeated random sequences,
#   bash run.sh MODEL_DIR   or takes a Hugging Face model folder,
# runs `flexmodel capture` of every module and the attention probabilities on
# held-out repeated sequences, and `flexmodel report`: which heads attend to
# the previous token, to the first token, or from a repeated token to the one
# after its earlier copy (induction), measured, printed, and drawn in one HTML
# page with the logit lens and activation norms.
# Environment: FLEXMODEL_BUILD (build folder, default ./build),
# FLEXMODEL_SKIP_BUILD=1 (use that build as is), FLEXMODEL_DEMO_DIR (outputs,
# default <build>/demo), FLEXMODEL_TRAIN_SECONDS (training time limit, 300;
# the training normally stops on its own after about 200 steps, ~5 s).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${FLEXMODEL_BUILD:-$root/build}
export FLEXMODEL_BUILD=$build
if [ -z "${FLEXMODEL_SKIP_BUILD:-}" ]; then
  bash "$root/scripts/build.sh" flexmodel train_induction_gpt2
fi
export OMP_WAIT_POLICY=PASSIVE
work=${FLEXMODEL_DEMO_DIR:-$build/demo}
mkdir -p "$work"

if [ "$#" -eq 0 ]; then
  model=$work/induction-gpt2
  echo "== training a 2-layer GPT-2 on random token sequences repeated once (stops when it has learnt the copy)"
  # Exit 3: the time limit came before the model learnt the copy. Reporting on
  # that model would describe an untrained network, so the job stops here.
  "$build/examples/train_induction_gpt2" --work "$work" --seconds "${FLEXMODEL_TRAIN_SECONDS:-300}" || {
    echo "run.sh: stopped: the model was not trained to the point where it predicts the copy (see above)" >&2
    exit 1
  }
else
  model=$1
  echo "== held-out repeated random sequences for $model"
  "$build/examples/train_induction_gpt2" "$model" --work "$work" --batch 2
fi

echo "== flexmodel capture: every module and the attention probabilities"
"$build/tools/flexmodel" capture "$model" --input-ids "$work/repeated_ids.safetensors" \
  --hook all --hook '*.hook_attn_probs' --out "$work/capture.safetensors"

echo "== flexmodel report: what the heads do"
"$build/tools/flexmodel" report "$work/capture.safetensors" --out "$work/report.html"
echo "== done: open $work/report.html (activations: $work/capture.safetensors)"
