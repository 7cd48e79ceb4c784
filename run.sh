#!/usr/bin/env bash
# The main job, end to end: install what is missing, build, then on MODEL_DIR
# (or, when none is given, on a tiny random GPT-2 written as a Hugging Face
# folder with a byte-level BPE tokenizer) draw a logit-lens heatmap (SVG) and
# run a real `flexmodel capture` of every module, listing what it captured.
#   bash run.sh [MODEL_DIR]
# Environment: FLEXMODEL_BUILD (build folder, default ./build),
# FLEXMODEL_SKIP_BUILD=1 (use that build as is), FLEXMODEL_DEMO_DIR (outputs,
# default <build>/demo).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${FLEXMODEL_BUILD:-$root/build}
if [ -z "${FLEXMODEL_SKIP_BUILD:-}" ]; then
  bash "$root/scripts/build.sh" >/dev/null
fi
export OMP_WAIT_POLICY=PASSIVE
work=${FLEXMODEL_DEMO_DIR:-$build/demo}
mkdir -p "$work"
model=${1:-$work/tiny-gpt2}
prompt="the cat sat on the mat and the cat sat on"

echo "== logit lens on $model"
"$build/examples/logit_lens" ${1:+"$1"} --work "$work" --prompt "$prompt" --svg "$work/logit_lens.svg"

echo "== flexmodel capture --hook all"
"$build/tools/flexmodel" capture "$model" --prompt "$prompt" --hook all \
  --out "$work/capture.safetensors" --log-level info

echo "== done: $work/capture.safetensors (activations), $work/logit_lens.svg (heatmap)"
