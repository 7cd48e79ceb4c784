#!/usr/bin/env bash
# reliability_valgrind_cli_capture: `flexmodel capture` under valgrind, no
# invalid access, no leak. Usage: valgrind_capture.sh VALGRIND SUPP FLEXMODEL ARGS...
# Skipped (exit 77) only when valgrind cannot run the binary at all on this
# CPU: a shared library that libtorch loads (e.g. libhwy's RDTSCP timer, via
# OpenCV) executes an instruction valgrind's VEX does not emulate, before main.
set -u
valgrind=$1 supp=$2 exe=$3
shift 3
probe=$("$valgrind" --error-exitcode=3 "$exe" --help 2>&1 >/dev/null)
if [ $? -ne 0 ] && grep -q "Unrecognised instruction" <<<"$probe"; then
  grep -m1 -A1 "Unrecognised instruction" <<<"$probe"
  echo "valgrind cannot emulate an instruction a system library runs at load time on this CPU: skipped"
  exit 77
fi
exec "$valgrind" --leak-check=full --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=3 \
  --suppressions="$supp" "$exe" "$@"
