#!/usr/bin/env bash
# Side-by-side GPU offload benchmark: Hugging Face Transformers + Accelerate
# against flexmodel (build-gpu/bench/bench_gpu_offload) on one Llama-shaped
# bf16 model with random weights, the same device maps, the same prompt.
#
#   bash scripts/gpu/bench.sh OUTDIR
#
# Configs: gpu-only (no offload), A-cpu (about half the blocks on the CPU),
# B-cpu-disk (about a third each on GPU, CPU and disk). For each: Accelerate
# (plain and with 12 forward hooks copying MLP outputs to the CPU; it writes
# model.hf_device_map), then ours with exactly that map: prefetch on with and
# without capturing the same 12 modules (interleaved in one process), prefetch
# off; prefetch depth 2 at the end if time remains. On gpu-only also our
# decode modes (eager / cuda-graph, with and without 12 taps; --graph-modes). Every step is a separate
# process under `timeout`, and the whole run stops starting steps at a
# deadline, so a hang cannot eat the GPU lease. Writes OUTDIR/bench.jsonl (one
# JSON line per run), OUTDIR/bench.md (the table, printed at the end),
# OUTDIR/steps.txt and OUTDIR/logs/.
#
# Environment (defaults): FLEX_BENCH_BIN (build-gpu/bench/bench_gpu_offload),
# FLEX_BENCH_ENV (build-gpu/env.sh, sourced for our runs when present), PYTHON (python3), BENCH_MODEL_DIR (/tmp/bench-llama), BENCH_OFFLOAD_DIR
# (/tmp/bench-offload), BENCH_BUDGET_S (450: no step starts after it and none
# runs past it), BENCH_PROMPT_LEN (512), BENCH_NEW_TOKENS (64),
# BENCH_NEW_TOKENS_DISK (32: config B, where Accelerate reads ~1 GB from disk
# per token), BENCH_REPEATS (2), BENCH_CAPTURE (12), BENCH_HOOK_REPEATS_OFFLOAD
# (1: Accelerate's hooked runs in the offloaded configs), BENCH_MODEL_ARGS
# (make_llama.py's shape options; default hidden 2048, 24 layers, 8192 MLP,
# 16 heads / 8 KV heads, vocab 32000: 3.3 GB in bf16).
set -uo pipefail
out=${1:?usage: bash scripts/gpu/bench.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/scripts/gpu"
bin=${FLEX_BENCH_BIN:-$root/build-gpu/bench/bench_gpu_offload}
py=${PYTHON:-python3}
# build-gpu/env.sh (scripts/build-gpu.sh): the library path our binary needs; sourced for our runs only.
bench_env=${FLEX_BENCH_ENV:-$(dirname "$bin")/../env.sh}
# shellcheck disable=SC2016
ours=(bash -c 'if [ -f "$0" ]; then . "$0"; fi; exec "$@"' "$bench_env" "$bin")
model=${BENCH_MODEL_DIR:-/tmp/bench-llama}
offload=${BENCH_OFFLOAD_DIR:-/tmp/bench-offload}
budget=${BENCH_BUDGET_S:-450}
prompt_len=${BENCH_PROMPT_LEN:-512}
new_tokens=${BENCH_NEW_TOKENS:-64}
new_tokens_disk=${BENCH_NEW_TOKENS_DISK:-32}
repeats=${BENCH_REPEATS:-2}
capture=${BENCH_CAPTURE:-12}
hook_repeats_offload=${BENCH_HOOK_REPEATS_OFFLOAD:-1}
# shellcheck disable=SC2206
model_args=(${BENCH_MODEL_ARGS:-})

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

mkdir -p "$out/logs" "$out/maps" "$offload"
out=$(cd "$out" && pwd)
: > "$out/bench.jsonl"
: > "$out/steps.txt"
deadline=$((SECONDS + budget))

gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu_name" ] || gpu_name="no GPU found by nvidia-smi"
echo "bench: $gpu_name; budget ${budget}s; binary $bin"
timeout 20 nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>/dev/null | sed 's/^/bench: /'
if [ ! -x "$bin" ]; then
  echo "bench: $bin is missing: build it first (FLEXMODEL_BUILD=$root/build-gpu bash scripts/build.sh bench_gpu_offload)"
fi

# step NAME CAP_SECONDS CMD...: runs CMD under timeout min(CAP, time left),
# stdout/stderr to logs/NAME.{out,err}; its JSON lines go to bench.jsonl and
# are echoed briefly. Returns CMD's status (124/137: timed out; 200: skipped).
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 20)); then
    echo "bench: skip $name (deadline)" | tee -a "$out/steps.txt"
    return 200
  fi
  local t=$((cap < left ? cap : left)) start=$SECONDS rc
  echo "bench: == $name (limit ${t}s, $((left))s left)"
  timeout -k 10 "$t" "$@" >"$out/logs/$name.out" 2>"$out/logs/$name.err"
  rc=$?
  grep -E '^\{.*"impl"' "$out/logs/$name.out" >>"$out/bench.jsonl"
  grep -E '^\{.*"impl"' "$out/logs/$name.out" | "$py" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    f = lambda x, s: "-" if x is None else format(x, s)
    print("bench:   %-10s %-11s prefetch=%-7s capture=%-2s run=%s blocks=%s prompt=%s ms decode=%s tok/s%s" % (
        r.get("impl"), r.get("config"), r.get("prefetch"), r.get("capture"), r.get("run"),
        "/".join(str(r.get("device_map_counts", {}).get(k, "?")) for k in ("gpu", "cpu", "disk")),
        f(r.get("prompt_ms"), ".1f"), f(r.get("decode_tok_s"), ".2f"),
        "" if r.get("captures_on_cpu_ok", True) else "  CAPTURE CHECK FAILED"))
'
  echo "$name rc=$rc $((SECONDS - start))s" >>"$out/steps.txt"
  if ((rc != 0)); then
    echo "bench: $name failed (rc=$rc$( ((rc == 124 || rc == 137)) && echo ', timed out')); last lines of its stderr:"
    tail -n 15 "$out/logs/$name.err" | sed 's/^/bench:   | /'
  fi
  return $rc
}

# 1. The model (skipped when the folder already holds it).
step make_model 240 "$py" "$here/make_llama.py" "$model" ${model_args[@]+"${model_args[@]}"}
sed 's/^/bench: /' "$out/logs/make_model.out" 2>/dev/null
layers=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$model/config.json" 2>/dev/null)
if [ -z "$layers" ]; then
  echo "bench: no model at $model; stopping"
  exit 1
fi

# run_config NAME GPU_BLOCKS CPU_BLOCKS NEW_TOKENS HOOK_REPEATS OURS_VARIANTS...
# (a variant is a prefetch depth, or "default" for the library's default)
run_config() {
  local name=$1 gpu=$2 cpu=$3 n=$4 hooks=$5
  shift 5
  local map="$out/maps/$name.json"
  rm -f "$map"
  rm -rf "$offload/hf-$name" "$offload/ours-$name"
  step "accelerate_$name" 200 "$py" "$here/bench_accelerate.py" --model "$model" --config "$name" \
    --map-out "$map" --gpu-blocks "$gpu" --cpu-blocks "$cpu" --offload-folder "$offload/hf-$name" \
    --prompt-len "$prompt_len" --new-tokens "$n" --repeats "$repeats" --hook-repeats "$hooks" \
    --capture "$capture"
  if [ ! -s "$map" ]; then
    echo "bench: no device map from Accelerate for $name; skipping our runs"
    return
  fi
  local v first=1
  for v in "$@"; do
    local pf=() cap=0
    [ "$v" = default ] || pf=(--prefetch-depth "$v")
    if ((first)); then cap=$capture; fi  # the first variant also measures capture, interleaved
    first=0
    step "flexmodel_${name}_prefetch${v}" 150 "${ours[@]}" --model "$model" --device-map "$map" --config "$name" \
      --offload-folder "$offload/ours-$name" --prompt-len "$prompt_len" --new-tokens "$n" \
      --repeats "$repeats" --capture "$cap" ${pf[@]+"${pf[@]}"}
  done
}

third=$((layers / 3))
half=$((layers / 2))
run_config gpu-only all rest "$new_tokens" "$repeats" default
# flexmodel's decode modes on the gpu-only map (design decision 51): eager,
# eager + the capture modules as taps, cuda-graph, cuda-graph + taps.
if [ -s "$out/maps/gpu-only.json" ]; then
  step flexmodel_gpu-only_graph_modes 150 "${ours[@]}" --model "$model" --device-map "$out/maps/gpu-only.json" \
    --config gpu-only --prompt-len "$prompt_len" --new-tokens "$new_tokens" --repeats "$repeats" \
    --capture "$capture" --graph-modes 1
fi
run_config A-cpu "$half" rest "$new_tokens" "$hook_repeats_offload" 1 0
run_config B-cpu-disk "$third" "$third" "$new_tokens_disk" "$hook_repeats_offload" 1 0
# Extras while time remains: prefetch depth 2.
for name in A-cpu B-cpu-disk; do
  n=$new_tokens
  [ "$name" = B-cpu-disk ] && n=$new_tokens_disk
  [ -s "$out/maps/$name.json" ] || continue
  step "flexmodel_${name}_prefetch2" 120 "${ours[@]}" --model "$model" --device-map "$out/maps/$name.json" \
    --config "$name" --offload-folder "$offload/ours-$name" --prompt-len "$prompt_len" --new-tokens "$n" \
    --repeats "$repeats" --capture 0 --prefetch-depth 2
done

"$py" "$here/table.py" "$out/bench.jsonl" --gpu "$gpu_name" >"$out/bench.md"
echo
echo "bench: steps (name, status, seconds):"
sed 's/^/bench:   /' "$out/steps.txt"
echo
cat "$out/bench.md"
