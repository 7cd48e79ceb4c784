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
# drawn in one HTML page with the logit lens and activation norms. Without
# MODEL_DIR it then trains a transcoder per layer (`flexmodel train-sae`,
# about 1 minute) and traces the induction circuit as an attribution graph
# (`flexmodel attribute`: induction_graph.json / .html).
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
if [ "$#" -eq 0 ]; then
  # The circuit again, as an attribution graph (circuit-tracer's): a
  # transcoder for each MLP trained on more rows of the same task, then the
  # direct effects that predict the next token inside a repeated copy.
  echo "== flexmodel train-sae: a transcoder for each layer's MLP, on 2048 other rows"
  "$build/examples/train_induction" "$model" --work "$work/corpus" --batch 2048 --seed 1 >/dev/null
  for layer in 0 1; do
    OMP_NUM_THREADS=1 "$build/tools/flexmodel" train-sae --model "$model" --dataset "$work/corpus/repeated_ids.safetensors" \
      --context-len 64 --hook blocks.$layer.mlp.hook_in --transcoder-out blocks.$layer.mlp.hook_out \
      --architecture batchtopk --k 16 --d-sae 256 --total-tokens 1500000 --batch-tokens 1024 --lr 1e-3 \
      --lr-decay-steps 300 --no-normalize --eval-tokens 4096 --out "$work/transcoders/layer$layer"
  done
  echo "== flexmodel attribute: the graph of the next token inside a repeated copy"
  "$build/tools/flexmodel" attribute "$model" --transcoders "$work/transcoders" \
    --input-ids "$work/induction_prompt.safetensors" --out "$work/induction_graph.json" \
    --html "$work/induction_graph.html" --slug induction
  echo "== done: open $work/report.html and $work/induction_graph.html (activations: $work/capture.safetensors)"
else
  echo "== done: open $work/report.html (activations: $work/capture.safetensors)"
fi
