#!/usr/bin/env bash
# Runs every libFuzzer target for a short while from its seed corpus.
#
#   scripts/fuzz-smoke.sh [SECONDS_PER_TARGET] [BUILD_DIR]    (defaults: 60, build-asan)
#
# The build dir must be configured with clang, -DFLEX_FUZZ=ON and
# -fsanitize=fuzzer-no-link,address,undefined (scripts/ci-sanitizers.sh asan
# does this); this script builds the targets in it. New corpus entries go to
# a scratch directory, not to fuzz/corpus. Any crash, leak, UB report or
# property violation fails the run and leaves the input in BUILD_DIR/fuzz-artifacts.
# Longer runs: FLEX_FUZZ_ARGS="-jobs=1 -workers=1" scripts/fuzz-smoke.sh 600.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=${1:-60}
build=${2:-$root/build-asan}
targets="safetensors checkpoint_index offload_index config tokenizer tokenizer_text device_map torch_bin gguf"
if [ ! -f "$build/build.ninja" ]; then
  echo "fuzz-smoke: $build is not configured; run scripts/ci-sanitizers.sh asan first" >&2
  exit 2
fi
ninja -C "$build" -j"${FLEX_JOBS:-$(nproc)}" $(for t in $targets; do echo "fuzz_$t"; done)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$build/fuzz-artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_odr_violation=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp}
# Targets run side by side, one per core (each fuzzer is single-threaded).
fuzz_one() {  # target -> 0 when clean
  local t=$1
  mkdir -p "$scratch/$t"
  if OMP_NUM_THREADS=1 "$build/fuzz/fuzz_$t" "$scratch/$t" "$root/fuzz/corpus/$t" -max_total_time="$secs" \
       -rss_limit_mb=4096 -timeout=25 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
       ${FLEX_FUZZ_ARGS:-} > "$scratch/$t.log" 2>&1; then
    echo "fuzz-smoke: $t ok: $(grep -E '^stat::number_of_executed_units' "$scratch/$t.log" | awk '{print $2}') executions in ${secs} s"
  else
    echo "fuzz-smoke: $t FAILED"; tail -40 "$scratch/$t.log"; return 1
  fi
}
status=0
parallel=${FLEX_FUZZ_PARALLEL:-$(nproc)}
set -- $targets
while [ $# -gt 0 ]; do
  pids=()
  for _ in $(seq "$parallel"); do
    [ $# -gt 0 ] || break
    fuzz_one "$1" > "$scratch/$1.result" 2>&1 &
    pids+=("$!:$1")
    shift
  done
  for p in "${pids[@]}"; do
    wait "${p%%:*}" || status=1
    cat "$scratch/${p#*:}.result"
  done
done
exit $status
