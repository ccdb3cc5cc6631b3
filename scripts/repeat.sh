#!/usr/bin/env bash
# Runs one topic of the root package's tests (a module of the `e2e` or `checks` test binary)
# N times in a row under CI=true and counts the passes: how a suspected flake is measured
# (docs/src/development/tests.md records the runs).
#
#   bash scripts/repeat.sh [BINARY] TOPIC [N]
#
# e.g. `bash scripts/repeat.sh owners 50` (BINARY defaults to e2e; TOPIC may name one test,
# `owners::the_test`). The binary is built once; each failed run's output is kept in
# $TURNSTILE_REPEAT_OUT (default /tmp/turnstile-repeat).
set -euo pipefail

binary=e2e
if [ "${1:-}" = e2e ] || [ "${1:-}" = checks ]; then
  binary=$1
  shift
fi
topic=${1:?usage: $0 [BINARY] TOPIC [N]}
runs=${2:-50}
name=${topic//::/-}
out=${TURNSTILE_REPEAT_OUT:-/tmp/turnstile-repeat}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export CI=true
cargo test -p turnstile --test "$binary" --no-run
filter=$topic
[[ $topic == *::* ]] || filter="$topic::"
passed=0
for run in $(seq 1 "$runs"); do
  if cargo test -q -p turnstile --test "$binary" -- "$filter" > "$out/$name-last.log" 2>&1; then
    passed=$((passed + 1))
  else
    cp "$out/$name-last.log" "$out/$name-failed-$run.log"
  fi
  echo "$name: run $run, $passed passed"
done
echo "$name: $passed/$runs passed"
[ "$passed" -eq "$runs" ]
