#!/usr/bin/env bash
# mdbook, built from crates.io (pinned) for the docs site's tests (tests/e2e/docs.rs).
#
#   bash scripts/mdbook.sh build    build once (cached by version)
#   bash scripts/mdbook.sh bin      print the path of the built binary
#   bash scripts/mdbook.sh built    exit 0 when it is built
#
# Cached outside the work tree under $TURNSTILE_TOOLS_CACHE (default /opt/turnstile-tools),
# one folder per version. Built with search and without `serve`/`watch` (a web server and a
# file watcher the tests do not use): about a minute on 2 cores.
set -euo pipefail

cache=${TURNSTILE_TOOLS_CACHE:-/opt/turnstile-tools}
MDBOOK_VERSION=0.5.4

bin() { echo "$cache/mdbook-$MDBOOK_VERSION/bin/mdbook"; }

build() {
  if [ -x "$(bin)" ]; then
    return 0
  fi
  echo "mdbook: building $MDBOOK_VERSION from crates.io" >&2
  # A target folder of its own, removed afterwards: the binary is what is kept.
  CARGO_TARGET_DIR=$(mktemp -d "${TMPDIR:-/tmp}/turnstile-mdbook-build.XXXXXX")
  export CARGO_TARGET_DIR
  trap 'rm -rf "$CARGO_TARGET_DIR"' EXIT
  cargo install mdbook --version "=$MDBOOK_VERSION" --locked --no-default-features \
    --features search --root "$cache/mdbook-$MDBOOK_VERSION" --quiet
}

case "${1:-}" in
  build) build ;;
  bin) bin ;;
  built) [ -x "$(bin)" ] ;;
  *) echo "usage: $0 build|bin|built" >&2; exit 2 ;;
esac
