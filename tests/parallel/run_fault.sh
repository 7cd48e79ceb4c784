#!/bin/sh
# usage: run_fault.sh MAX_SECONDS PATTERN COMMAND...
# Passes when COMMAND (an mpirun line) exits non-zero within MAX_SECONDS and
# its output matches the extended regex PATTERN (the failing rank's message).
max=$1
pattern=$2
shift 2
start=$(date +%s%N)
out=$(timeout 120 "$@" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "--- exit status $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited with status 0"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung (killed after 120 s)"; exit 1; fi
if [ "$elapsed_ms" -gt $((max * 1000)) ]; then echo "FAIL: took longer than ${max} s"; exit 1; fi
if ! echo "$out" | grep -Eq "$pattern"; then echo "FAIL: no output matches '$pattern'"; exit 1; fi
if echo "$out" | grep -q "finished normally"; then echo "FAIL: a rank finished as if nothing happened"; exit 1; fi
echo "PASS"
