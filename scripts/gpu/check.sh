#!/usr/bin/env bash
# Everything a GPU machine should check, in one command (issue 48), under 9
# minutes on one H100/H200 with 16 cores:
#
#   bash scripts/gpu/check.sh OUTDIR
#
#  1. build       scripts/build-gpu.sh, everything, all cores, ninja -k0   -> build.log
#  2. gpu label   ctest -L gpu (tests/gpu, python_gpu; among them the     -> ctest-gpu.log
#                 CUDA-graph decode: gpu_cuda_graph, test_cuda_graph.py)
#  3. cli smoke   for every fixture model under tests/data the CLI loads
#                 (fixtures/models/*, golden5/*): `flexmodel capture MODEL
#                 --input-ids IDS --hook all` on the CPU, on cuda (--device-map
#                 auto --max-memory 0=20GB,cpu=4GB) and over a map with GPU 0,
#                 cpu and disk entries (check_util.py map); each compared with
#                 the CPU capture, the largest difference per model printed  -> cli.log, cli.jsonl, cli/
#  4. suite       the rest of the suite: ctest -LE gpu                     -> ctest.log
#  5. bench       scripts/gpu/bench.sh with the time left (BENCH_BUDGET_S)  -> bench.log, bench/
#                 (with flexmodel's eager / cuda-graph decode rows on gpu-only)
#  6. summary     the machine, each stage's status and time, tests per
#                 label, the CLI comparisons, the bench table               -> summary.md (printed last)
#
# Without a GPU (nvidia-smi finds none, or torch.cuda.is_available() is
# False) it runs 1 and the whole suite (the gpu label reports Skipped) and
# says that it skipped the GPU part. No stage starts after CHECK_LIMIT_S and
# each is capped to the time left, so the run ends in time even when a stage
# hangs; a stage that fails does not stop the next.
#
# A GPU machine without network: run scripts/gpu/offline-deps.sh on one with
# it first and carry build-devdeps/ along (CHECK_OFFLINE_DEPS names another
# folder); the build stage then installs cmake/ninja wheels and unpacks the
# library packages from it.
#
# Env: CHECK_LIMIT_S (530), FLEXMODEL_BUILD (build-gpu), CHECK_SKIP_BUILD=1
# (use the build as it is), CHECK_JOBS (nproc), CHECK_CTEST_ARGS (added to the
# suite's ctest, e.g. "-R hooks_"), CHECK_CLI_MODELS (a regex choosing the
# CLI smoke's models, default all), CHECK_CLI_ON_CPU=1 (without a GPU, the
# CLI smoke with the CPU standing in for it: a dry run of that stage),
# PYTHON (python3); build-gpu.sh's
# FLEX_DEPS_DEBS, FLEXMODEL_CMAKE_ARGS; bench.sh's BENCH_* (defaults here: one
# repeat, 32 new tokens, 16 with disk).
set -uo pipefail
out=${1:?usage: bash scripts/gpu/check.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$root/scripts/gpu
py=${PYTHON:-python3}
limit=${CHECK_LIMIT_S:-530}
build=${FLEXMODEL_BUILD:-$root/build-gpu}
jobs=${CHECK_JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
: > "$out/stages.txt"
t0=$SECONDS
exec > >(tee -a "$out/check.log") 2>&1

left() { echo $((limit - (SECONDS - t0))); }
# cap N: N seconds, or what is left less `reserve` (never below 1).
cap() {
  local want=$1 reserve=${2:-15} l
  l=$(($(left) - reserve))
  ((l < want)) && want=$l
  ((want < 1)) && want=1
  echo "$want"
}
stage() { echo; echo "=== [$((SECONDS - t0))s] $*"; }
# record NAME RC START: one line of stages.txt.
record() {
  local what=ok
  [ "$2" = skipped ] && what=skipped
  [ "$2" != skipped ] && [ "$2" != 0 ] && what="FAILED (rc $2)"
  printf '%s\t%s\t%ss\n' "$1" "$what" "$((SECONDS - $3))" >> "$out/stages.txt"
}
# Runs ctest in the build with a wall-clock cap (ctest's --stop-time ends the
# tests it started; the outer timeout is the backstop).
run_ctest() {
  local secs=$1
  shift
  (cd "$build" && timeout -k 10 $((secs + 20)) ctest --output-on-failure -j"$jobs" --timeout 300 \
    --stop-time "$(date -d "+$secs sec" +%H:%M:%S)" "$@")
}

# --- 0. the machine ------------------------------------------------------------
stage "machine"
gpu=0
gpu_name="no GPU"
if command -v nvidia-smi >/dev/null 2>&1 && timeout 20 nvidia-smi -L >/dev/null 2>&1; then
  gpu_name=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  if timeout 60 "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    gpu=1
  else
    gpu_name="$gpu_name (torch.cuda.is_available() is False: the GPU part is skipped)"
  fi
fi
{
  echo "host: $(hostname), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory"
  echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')"
  echo "gpu: $gpu_name"
  timeout 60 "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"
} | tee "$out/machine.txt"

# --- 1. build --------------------------------------------------------------------
stage "build (cap $(cap 300 200)s)"
start=$SECONDS
# A machine without a package registry: the tools and packages
# scripts/gpu/offline-deps.sh fetched elsewhere, carried in CHECK_OFFLINE_DEPS.
offline=${CHECK_OFFLINE_DEPS:-$root/build-devdeps}
if [ -d "$offline/wheels" ] && ! { command -v cmake && command -v ninja; } >/dev/null 2>&1; then
  echo "offline deps: installing $(ls "$offline/wheels" | tr '\n' ' ')"
  "$py" -m pip install --no-index -q --break-system-packages "$offline"/wheels/*.whl 2>&1 | tail -2 ||
    "$py" -m pip install --no-index -q "$offline"/wheels/*.whl 2>&1 | tail -2
  hash -r
fi
if [ -z "${FLEX_DEPS_DEBS:-}" ] && [ -d "$offline/debs" ] && ls "$offline"/debs/*.deb >/dev/null 2>&1; then
  export FLEX_DEPS_DEBS=$offline/debs
  echo "offline deps: FLEX_DEPS_DEBS=$FLEX_DEPS_DEBS"
fi
if [ -n "${CHECK_SKIP_BUILD:-}" ]; then
  echo "CHECK_SKIP_BUILD: using $build as it is"
  record build skipped "$start"
else
  FLEXMODEL_BUILD=$build FLEX_NINJA_ARGS=${FLEX_NINJA_ARGS:--k0} timeout -k 10 "$(cap 300 200)" \
    bash "$root/scripts/build-gpu.sh" > "$out/build.log" 2>&1
  rc=$?
  grep -E "^FAILED:|error:" "$out/build.log" | head -20
  tail -3 "$out/build.log"
  record build "$rc" "$start"
fi
# shellcheck disable=SC1091
[ -f "$build/env.sh" ] && . "$build/env.sh"
flexmodel=$build/tools/flexmodel
[ -x "$flexmodel" ] && "$flexmodel" --version 2>&1 | tee -a "$out/machine.txt"
(cd "$build" 2>/dev/null && ctest --show-only=json-v1 > "$out/ctest-tests.json" 2>/dev/null)

# --- 2. the gpu label ---------------------------------------------------------------
if ((gpu)); then
  stage "ctest -L gpu (cap $(cap 150 200)s)"
  start=$SECONDS
  run_ctest "$(cap 150 200)" -L gpu > "$out/ctest-gpu.log" 2>&1
  rc=$?
  sed -n '/tests passed, /,$p' "$out/ctest-gpu.log"
  record "ctest -L gpu" "$rc" "$start"
else
  record "ctest -L gpu" skipped "$SECONDS"
fi

# --- 3. CLI smoke on cuda -------------------------------------------------------------
# cli_model DIR LABEL: the three captures of one model and the two comparisons.
cli_model() {
  local dir=$1 label=$2 w=$out/cli/$2
  mkdir -p "$w"
  "$py" "$here/check_util.py" ids "$dir" "$w/ids.safetensors" || return 1
  local run=(capture "$dir" --input-ids "$w/ids.safetensors" --hook all)
  timeout 120 "$flexmodel" "${run[@]}" --out "$w/cpu.safetensors" > "$w/cpu.log" 2>&1 ||
    { echo "$label: the CPU capture failed: $(tail -2 "$w/cpu.log" | tr '\n' ' ')"; return 1; }
  if timeout 120 "$flexmodel" "${run[@]}" --device-map auto --max-memory "$budget" --out "$w/cuda.safetensors" \
    > "$w/cuda.log" 2>&1; then
    "$py" "$here/check_util.py" compare "$w/cpu.safetensors" "$w/cuda.safetensors" --label "$label cuda" --jsonl "$w/rows.jsonl"
  else
    echo "$label cuda: the capture failed: $(tail -2 "$w/cuda.log" | tr '\n' ' ')"
    echo "{\"label\": \"$label cuda\", \"compared\": 0, \"max_abs\": -1, \"at\": \"capture failed\", \"scale\": 0, \"ok\": false}" >> "$w/rows.jsonl"
  fi
  if timeout 60 "$flexmodel" inspect "$dir" --json > "$w/inspect.json" 2> "$w/inspect.log" &&
    "$py" "$here/check_util.py" map "$w/inspect.json" "$w/map.json" --gpu "$gpu_entry" > "$w/map.log" &&
    timeout 120 "$flexmodel" "${run[@]}" --device-map "$w/map.json" --offload-folder "$w/offload" \
      --out "$w/mixed.safetensors" > "$w/mixed.log" 2>&1; then
    "$py" "$here/check_util.py" compare "$w/cpu.safetensors" "$w/mixed.safetensors" --label "$label cuda+cpu+disk" \
      --jsonl "$w/rows.jsonl"
  else
    echo "$label cuda+cpu+disk: failed: $(tail -2 "$w/mixed.log" "$w/inspect.log" 2>/dev/null | tr '\n' ' ')"
    echo "{\"label\": \"$label cuda+cpu+disk\", \"compared\": 0, \"max_abs\": -1, \"at\": \"capture failed\", \"scale\": 0, \"ok\": false}" >> "$w/rows.jsonl"
  fi
  rm -rf "$w/offload"
}
export -f cli_model
# CHECK_CLI_ON_CPU=1: the CLI smoke without a GPU, "cuda" standing for the CPU
# (a dry run of this stage's logic; the comparisons are then exact).
budget=0=20GB,cpu=4GB gpu_entry=0
if [ -n "${CHECK_CLI_ON_CPU:-}" ] && ((!gpu)); then budget=cpu=4GB gpu_entry=cpu; fi
export out here py flexmodel budget gpu_entry

if { ((gpu)) || [ "$gpu_entry" = cpu ]; } && [ -x "$flexmodel" ]; then
  secs=$(cap 100 150)
  stage "CLI smoke on cuda (cap ${secs}s)"
  start=$SECONDS
  rm -rf "$out/cli" && mkdir -p "$out/cli"
  # shellcheck disable=SC2016
  for d in "$root"/tests/data/fixtures/models/*/ "$root"/tests/data/golden5/*/; do
    d=${d%/}
    [ -f "$d/config.json" ] || continue
    label="$(basename "$(dirname "$d")")/$(basename "$d")"
    label=${label#models/}
    [[ "$label" =~ ${CHECK_CLI_MODELS:-.} ]] || continue
    printf '%s\t%s\n' "$d" "${label//\//-}"
  done | timeout -k 5 "$secs" xargs -P "$jobs" -L 1 bash -c 'cli_model "$0" "$1"' > "$out/cli.log" 2>&1
  rc=$?
  cat "$out"/cli/*/rows.jsonl > "$out/cli.jsonl" 2>/dev/null
  sort "$out/cli.log"
  if grep -q '"ok": false' "$out/cli.jsonl" 2>/dev/null; then rc=1; fi
  record "cli smoke" "$rc" "$start"
else
  record "cli smoke" skipped "$SECONDS"
fi

# --- 4. the suite -----------------------------------------------------------------------
if ((gpu)); then
  secs=$(cap 200 110)
  stage "the rest of the suite: ctest -LE gpu (cap ${secs}s)"
  label_args=(-LE gpu)
else
  secs=$(cap 400 10)
  stage "the whole suite on the CPU (cap ${secs}s; the gpu label reports Skipped)"
  label_args=()
fi
start=$SECONDS
# shellcheck disable=SC2086
run_ctest "$secs" "${label_args[@]}" ${CHECK_CTEST_ARGS:-} > "$out/ctest.log" 2>&1
rc=$?
sed -n '/tests passed, /,$p' "$out/ctest.log" | grep -v '^$' | head -40
record "ctest ${label_args[*]:-(all)}" "$rc" "$start"

# parallel_mpi_process crashed rank 0 on the first GPU run (the only MPI
# program that touches CUDA); if it fails again, rerun it once without UCX
# (Open MPI's ob1 layer, shared-memory transport), which tells whether UCX's
# memory hooks over the CUDA context are involved.
if ((gpu)) && grep -qE "parallel_mpi_process_np[0-9]+ .*(Failed|Exception|SEGFAULT)" "$out/ctest.log" && (($(left) >= 60)); then
  stage "diagnosis: parallel_mpi_process_np2 again with OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader"
  OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader run_ctest 40 -R 'parallel_mpi_process_np2$' > "$out/diagnosis-mpi.log" 2>&1
  echo "rc=$? (log: diagnosis-mpi.log)"
  grep -E "flex mpi test|Signal|signal|passed|FAILED" "$out/diagnosis-mpi.log" | head -20
fi

# --- 5. bench -------------------------------------------------------------------------------
if ((gpu)) && (($(left) >= 100)); then
  secs=$(cap 450 15)
  stage "bench.sh (budget $((secs - 20))s)"
  start=$SECONDS
  BENCH_BUDGET_S=$((secs - 20)) BENCH_REPEATS=${BENCH_REPEATS:-1} BENCH_NEW_TOKENS=${BENCH_NEW_TOKENS:-32} \
    BENCH_NEW_TOKENS_DISK=${BENCH_NEW_TOKENS_DISK:-16} FLEX_BENCH_BIN=${FLEX_BENCH_BIN:-$build/bench/bench_gpu_offload} \
    timeout -k 10 "$secs" bash "$here/bench.sh" "$out/bench" > "$out/bench.log" 2>&1
  rc=$?
  tail -5 "$out/bench.log"
  record bench "$rc" "$start"
else
  ((gpu)) && echo "bench: skipped, $(left)s left"
  record bench skipped "$SECONDS"
fi

# --- 6. summary --------------------------------------------------------------------------------
stage "summary"
logs=()
for f in "$out/ctest-gpu.log" "$out/ctest.log"; do [ -f "$f" ] && logs+=("$f"); done
{
  echo "# GPU check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  if ((gpu)); then echo "GPU part: run."; else echo "GPU part: SKIPPED (no usable CUDA device: $gpu_name)."; fi
  echo
  echo '```'
  cat "$out/machine.txt"
  echo '```'
  echo
  echo "## Stages"
  echo
  echo "| stage | result | time |"
  echo "|---|---|---|"
  awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}' "$out/stages.txt"
  echo
  echo "## Tests per label"
  echo
  if ((${#logs[@]})); then
    "$py" "$here/check_util.py" labels "$out/ctest-tests.json" "${logs[@]}" --out "$out/labels.md" > /dev/null
    cat "$out/labels.md"
  else
    echo "(no ctest log)"
  fi
  echo
  echo "## CLI captures, cuda vs CPU (largest |difference| per model and map)"
  echo
  if [ -s "$out/cli.jsonl" ]; then "$py" "$here/check_util.py" table "$out/cli.jsonl"; else echo "(not run)"; fi
  echo
  echo "## Offload bench"
  echo
  if [ -s "$out/bench/bench.md" ]; then cat "$out/bench/bench.md"; else echo "(not run)"; fi
  echo
  echo "Total: $((SECONDS - t0)) s of $limit s."
} > "$out/summary.md"
cat "$out/summary.md"
