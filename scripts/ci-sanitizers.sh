#!/usr/bin/env bash
# Sanitizer builds and runs (clang 14, against the same libtorch 2.x as the main build).
#
#   scripts/ci-sanitizers.sh [asan|tsan|all]      (default: all)
#
# asan: build-asan with -fsanitize=address,undefined (plus libFuzzer coverage
#       instrumentation, so the same build also holds the fuzz targets, see
#       scripts/fuzz-smoke.sh) and runs the parser, file-writer, hooks,
#       flexcore and reliability tests in it. Leak checking is on.
# tsan: build-tsan with -fsanitize=thread and runs the tests that use threads
#       (tests/reliability/test_threads.cpp, the local communicator, the
#       streaming sink) with OMP_NUM_THREADS=1 (libgomp is not instrumented).
#
# The ASan build also builds the flexmodel tool: the bad-input catalogue's CLI
# rows run it, and two CLI captures (in memory, and with blocks offloaded to
# disk) run under LeakSanitizer. Only a subset of the suite is sanitized: the
# whole suite under ASan does not fit the 45-minute CI budget on 2 cores. FLEX_ASAN_TESTS / FLEX_TSAN_TESTS
# (space-separated test executable names) override the subsets; FLEX_ASAN_DIR /
# FLEX_TSAN_DIR the build directories.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-all}
jobs=${FLEX_JOBS:-$(nproc)}

# clang, its sanitizer/fuzzer runtimes and lld: install-deps.sh --tests
# installs them when missing (a few dpkg queries otherwise).
bash "$root/scripts/install-deps.sh" --tests

asan_tests=${FLEX_ASAN_TESTS:-"hooks_hooks hooks_module hooks_value
  dispatch_safetensors dispatch_checkpoint dispatch_offload_folder dispatch_sharded_writer dispatch_device_map
  flexcore_flex_model flexcore_streaming_sink tokenizers_errors tokenizers_gpt2 models_loading
  reliability_bad_inputs reliability_crash_safe_writes reliability_threads reliability_fuzz_regressions
  datasets_capture_dataset flexcore_capture_by_reference"}
tsan_tests=${FLEX_TSAN_TESTS:-"reliability_threads parallel_local_comm flexcore_streaming_sink datasets_capture_dataset"}

common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DFLEX_BUILD_BENCH=OFF
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
# vptr and function checks need RTTI/type info of every library the objects
# come from; libtorch is not built for them, so they only give false reports.
asan_flags="-fsanitize=address,undefined -fno-sanitize=vptr,function -fno-sanitize-recover=undefined -fno-omit-frame-pointer -gline-tables-only -fsanitize=fuzzer-no-link"
asan_dir=${FLEX_ASAN_DIR:-$root/build-asan}
tsan_dir=${FLEX_TSAN_DIR:-$root/build-tsan}

run_tests() {  # build_dir tests...
  local dir=$1; shift
  local failed=0
  for t in "$@"; do
    local exe
    exe=$(find "$dir/tests" -maxdepth 2 -type f -name "$t" | head -1)
    if [ -z "$exe" ]; then echo "sanitizers: $t not built"; failed=1; continue; fi
    local start=$(date +%s)
    if "$exe" --gtest_brief=1 > "$dir/$t.log" 2>&1; then
      echo "sanitizers: $t passed ($(( $(date +%s) - start )) s)"
    else
      echo "sanitizers: $t FAILED ($(( $(date +%s) - start )) s); log:"; tail -50 "$dir/$t.log"; failed=1
    fi
  done
  return $failed
}

status=0
if [ "$mode" = asan ] || [ "$mode" = all ]; then
  start=$(date +%s)
  cmake -S "$root" -B "$asan_dir" "${common[@]}" -DFLEX_FUZZ=ON "-DCMAKE_CXX_FLAGS=$asan_flags" >/dev/null
  # shellcheck disable=SC2086
  ninja -C "$asan_dir" -j"$jobs" $asan_tests flexmodel
  echo "sanitizers: ASan+UBSan build took $(( $(date +%s) - start )) s"
  start=$(date +%s)
  # libtorch keeps some allocations for the life of the process (registries,
  # thread pools); LSan reports only unreachable blocks, which it has none of.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_odr_violation=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # MKL single-threaded: the bitwise checks here (dataset capture) see its
  # two-thread first-call differences otherwise (tests/CMakeLists.txt).
  # shellcheck disable=SC2086
  MKL_NUM_THREADS=1 OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE run_tests "$asan_dir" $asan_tests || status=1
  # The CLI capture path under LeakSanitizer: a leak, invalid access or UB fails it.
  cli_tmp=$(mktemp -d)
  fx=$root/tests/data/fixtures
  for variant in memory disk; do
    extra=()
    [ "$variant" = disk ] && extra=(--device-map auto --max-memory cpu=240KB --offload-folder "$cli_tmp/offload")
    if OMP_NUM_THREADS=2 "$asan_dir/tools/flexmodel" capture "$fx/models/gpt2" --input-ids "$fx/golden/inputs.safetensors" \
         --hook all --out "$cli_tmp/cap-$variant.safetensors" "${extra[@]}" > "$asan_dir/cli-$variant.log" 2>&1; then
      echo "sanitizers: flexmodel capture ($variant) clean under ASan+LSan"
    else
      echo "sanitizers: flexmodel capture ($variant) FAILED; log:"; tail -40 "$asan_dir/cli-$variant.log"; status=1
    fi
  done
  rm -rf "$cli_tmp"
  echo "sanitizers: ASan+UBSan tests took $(( $(date +%s) - start )) s"
fi
if [ "$mode" = tsan ] || [ "$mode" = all ]; then
  start=$(date +%s)
  cmake -S "$root" -B "$tsan_dir" "${common[@]}" \
    "-DCMAKE_CXX_FLAGS=-fsanitize=thread -fno-omit-frame-pointer -gline-tables-only" >/dev/null
  # shellcheck disable=SC2086
  ninja -C "$tsan_dir" -j"$jobs" $tsan_tests
  echo "sanitizers: TSan build took $(( $(date +%s) - start )) s"
  start=$(date +%s)
  # Suppressions cover races reported inside uninstrumented libtorch only.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/reliability/tsan.supp}
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE run_tests "$tsan_dir" $tsan_tests || status=1
  echo "sanitizers: TSan tests took $(( $(date +%s) - start )) s"
fi
exit $status
