#!/usr/bin/env bash
# helm, built from its Go module (pinned by tools/helm/go.mod) for the chart's tests.
#
#   bash scripts/helm.sh build    build once (cached by version)
#   bash scripts/helm.sh bin      print the path of the built binary
#   bash scripts/helm.sh built    exit 0 when it is built
#
# Cached outside the work tree under $TURNSTILE_TOOLS_CACHE (default /opt/turnstile-tools),
# one folder per version. The first build takes a few minutes on 2 cores.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${TURNSTILE_TOOLS_CACHE:-/opt/turnstile-tools}
# Must match the version tools/helm/go.mod requires.
HELM_VERSION=v4.3.2

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"

bin() { echo "$cache/helm-$HELM_VERSION/bin/helm"; }

build() {
  if [ -x "$(bin)" ]; then
    return 0
  fi
  echo "helm: building $HELM_VERSION from its Go module" >&2
  local out
  out=$(dirname "$(bin)")
  mkdir -p "$out"
  # A build cache of its own, removed afterwards: the binary is what is kept.
  GOCACHE=$(mktemp -d "${TMPDIR:-/tmp}/turnstile-go-build.XXXXXX")
  export GOCACHE
  trap 'rm -rf "$GOCACHE"' EXIT
  # The version helm reports (`helm version`), as its release builds set it.
  (cd "$repo/tools/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    -o "$out/helm.partial" helm.sh/helm/v4/cmd/helm)
  mv "$out/helm.partial" "$(bin)"
}

case "${1:-}" in
  build) build ;;
  bin) bin ;;
  built) [ -x "$(bin)" ] ;;
  *) echo "usage: $0 build|bin|built" >&2; exit 2 ;;
esac
