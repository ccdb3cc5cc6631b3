#!/usr/bin/env bash
# Mutation testing with cargo-mutants (crates.io; `cargo install cargo-mutants --locked`): how
# many deliberate bugs in the code that decides grants, tokens and releases the tests catch. A
# measurement job, not part of CI: a file of the core takes 10-30 minutes on 2 cores.
#
#   bash scripts/mutants.sh core FILE...    mutants of these files of the controller's core,
#                                           judged by its unit tests and the simulation's
#                                           (core_semantics, controller_core, multi_lock)
#   bash scripts/mutants.sh engine FILE...  mutants of these files of turnstile-lock, judged by
#                                           its unit tests and the conformance suite
#
# Results go to mutants.out/ under $TURNSTILE_MUTANTS_OUT (default /tmp/turnstile-mutants);
# docs/src/development/mutation-testing.md records each run. $TURNSTILE_MUTANTS_SKIP (words,
# e.g. "redis mongo etcd") leaves out the tests whose names contain them: the engine's files
# that decide for the memory backend are judged by its conformance cases alone, in minutes
# per mutant instead of the whole suite's. $TURNSTILE_MUTANTS_ONLY (one word, e.g. "etcd") keeps
# only the tests whose names contain it: a network backend's files are judged by that
# backend's conformance cases and unit tests against its real server.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${TURNSTILE_MUTANTS_OUT:-/tmp/turnstile-mutants}
scope=${1:-}
shift || true
if [ "$#" -eq 0 ]; then
  echo "usage: $0 core|engine FILE..." >&2
  exit 2
fi
files=()
for file in "$@"; do
  files+=(-f "$file")
done
# $TURNSTILE_MUTANTS_RE (a regex over mutant names, e.g. function names) narrows a run to
# the mutants a fix was for, to check it.
only_mutants=()
if [ -n "${TURNSTILE_MUTANTS_RE:-}" ]; then
  only_mutants+=(--re "$TURNSTILE_MUTANTS_RE")
fi
# A mutant that makes a test hang counts as caught ("timeout") once this many seconds pass.
timeout=${TURNSTILE_MUTANTS_TIMEOUT:-240}
filters=()
for word in ${TURNSTILE_MUTANTS_SKIP:-}; do
  filters+=(--skip "$word")
done
if [ -n "${TURNSTILE_MUTANTS_ONLY:-}" ]; then
  filters+=("$TURNSTILE_MUTANTS_ONLY")
fi
# Incremental builds: every mutant rebuilds one crate.
export CARGO_INCREMENTAL=1 CARGO_PROFILE_DEV_DEBUG=line-tables-only
cd "$repo"
case "$scope" in
  core)
    exec cargo mutants -p turnstile-controller "${files[@]}" "${only_mutants[@]}" --output "$out" --timeout "$timeout" \
      --test-workspace=false -- --lib --test core_semantics --test controller_core --test multi_lock \
      -- "${filters[@]}"
    ;;
  engine)
    exec cargo mutants -p turnstile-lock "${files[@]}" "${only_mutants[@]}" --output "$out" --timeout "$timeout" \
      --test-workspace=false -- --lib --test conformance -- "${filters[@]}"
    ;;
  *)
    echo "usage: $0 core|engine FILE..." >&2
    exit 2
    ;;
esac
