#!/usr/bin/env bash
# Runs one test binary of the root package N times in a row under CI=true and counts the
# passes: how a suspected flake is measured (docs/src/development/tests.md records the runs).
#
#   bash scripts/repeat.sh TEST_BINARY [N] [-- TEST_FILTER...]
#
# e.g. `bash scripts/repeat.sh e2e_owners 50`. The binary is built once; each failed run's
# output is kept in $TURNSTILE_REPEAT_OUT (default /tmp/turnstile-repeat).
set -euo pipefail

name=${1:?usage: $0 TEST_BINARY [N] [-- TEST_FILTER...]}
runs=${2:-50}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
out=${TURNSTILE_REPEAT_OUT:-/tmp/turnstile-repeat}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export CI=true
cargo test -p turnstile --test "$name" --no-run
passed=0
for run in $(seq 1 "$runs"); do
  if cargo test -q -p turnstile --test "$name" -- "$@" > "$out/$name-last.log" 2>&1; then
    passed=$((passed + 1))
  else
    cp "$out/$name-last.log" "$out/$name-failed-$run.log"
  fi
  echo "$name: run $run, $passed passed"
done
echo "$name: $passed/$runs passed"
[ "$passed" -eq "$runs" ]
