#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, built from its published Go modules: etcd,
# kube-apiserver (TLS, RBAC, service-account tokens), kube-controller-manager (garbage
# collector, Job, namespace, service-account controllers), kube-scheduler and KWOK (Nodes and
# Pods without a kubelet). Every process listens on 127.0.0.1 only and is stopped by its PID.
#
#   bash scripts/control-plane.sh build    build the binaries once (cached by version)
#   bash scripts/control-plane.sh up       build if needed, start, print `export KUBECONFIG=…`
#   bash scripts/control-plane.sh down     stop what `up` started
#   bash scripts/control-plane.sh bin-dir  print the folder of the built binaries
#   bash scripts/control-plane.sh built    exit 0 when the binaries are built
#
# The versions are pinned by the Go modules under tools/ (one Kubernetes release for every
# k8s.io module). The binaries are cached outside the work tree under $TURNSTILE_TOOLS_CACHE
# (default /opt/turnstile-tools), one folder per version, and rebuilt only when a version
# changes. The first build takes about 10 minutes on 2 cores (peak memory about 2.6 GB) and
# leaves about 1 GB of Go module cache and 410 MB of binaries (its 4-5 GB build cache is
# removed); later runs start in seconds.
# The tests start their own control plane through crates/test-servers (same binaries).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools="$repo/tools"
cache=${TURNSTILE_TOOLS_CACHE:-/opt/turnstile-tools}
state=${TURNSTILE_CONTROL_PLANE_DIR:-${XDG_RUNTIME_DIR:-/tmp}/turnstile-control-plane}

# The pinned versions: each must match its module under tools/.
KUBERNETES_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# The machine's Go, where a login shell has not put it on PATH.
command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"

bin_dir() { echo "$cache/control-plane-k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION/bin"; }

say() { echo "control-plane: $*" >&2; }

build_kubernetes() {
  local out=$1 v=${KUBERNETES_VERSION#v} ldflags=""
  local major=${v%%.*} minor=${v#*.}
  minor=${minor%%.*}
  # Without these the servers report v0.0.0-master and kubectl's version skew checks misread them.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major"
    ldflags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  (cd "$tools/kubernetes" && go build -trimpath -tags selinux,notest -ldflags "-s -w$ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)
}

build_etcd() {
  local out=$1
  # etcd-mutex-bench: etcd's own concurrency.Mutex, measured beside the etcd lock backend by
  # crates/turnstile-lock/benches/lock.rs.
  (cd "$tools/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 \
    && go build -trimpath -ldflags "-s -w" -o "$out/etcdctl" go.etcd.io/etcd/etcdctl/v3 \
    && go build -trimpath -ldflags "-s -w" -o "$out/etcd-mutex-bench" ./mutexbench)
}

build_kwok() {
  local out=$1
  (cd "$tools/kwok" && go build -trimpath -ldflags "-s -w" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # KWOK's Stages (how a fake Node and its Pods move through their phases) ship in its module.
  local src
  src=$(cd "$tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  {
    for stage in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready \
      pod/fast/pod-complete pod/fast/pod-delete; do
      echo "---"
      cat "$src/kustomize/stage/$stage.yaml"
    done
  } >"$out/kwok-stages.yaml"
}

build() {
  local out
  out=$(bin_dir)
  local missing=()
  for b in kube-apiserver kube-controller-manager kube-scheduler; do [ -x "$out/$b" ] || missing+=(kubernetes); done
  for b in etcd etcdctl etcd-mutex-bench; do [ -x "$out/$b" ] || missing+=(etcd); done
  for b in kwok kwok-stages.yaml; do [ -e "$out/$b" ] || missing+=(kwok); done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v go >/dev/null || { say "go is not on PATH: it builds the control plane"; exit 1; }
  mkdir -p "$out"
  # A build cache of its own, removed afterwards: the binaries are what is kept (the cache
  # would hold 4-5 GB that no later run reads).
  GOCACHE=$(mktemp -d "${TMPDIR:-/tmp}/turnstile-go-build.XXXXXX")
  export GOCACHE
  trap 'rm -rf "$GOCACHE"' EXIT
  local part
  for part in $(printf '%s\n' "${missing[@]}" | sort -u); do
    say "building $part (once for these versions; kubernetes takes about 10 minutes)"
    local started=$SECONDS
    # Build into a scratch folder and move in whole, so an interrupted build never looks done.
    local scratch
    scratch=$(mktemp -d "$out/../build.XXXXXX")
    "build_$part" "$scratch"
    mv "$scratch"/* "$out/"
    rmdir "$scratch"
    say "built $part in $((SECONDS - started)) s"
  done
}

up() {
  build
  if [ -f "$state/pids" ]; then
    say "already up (pids in $state/pids); run '$0 down' first"
  else
    rm -rf "$state"
    mkdir -p "$state"
    local kubeconfig
    kubeconfig=$(cd "$repo" && cargo run -q -p test-servers --bin turnstile-control-plane -- "$state")
    say "up: kube-apiserver $(KUBECONFIG=$kubeconfig kubectl version -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1), logs in $state/logs"
  fi
  echo "export KUBECONFIG=$state/admin.kubeconfig"
}

down() {
  if [ ! -f "$state/pids" ]; then
    say "not up (no $state/pids)"
    return 0
  fi
  # Only the processes `up` started, by PID.
  xargs -r kill <"$state/pids" 2>/dev/null || true
  sleep 1
  xargs -r kill -9 <"$state/pids" 2>/dev/null || true
  rm -f "$state/pids"
  say "down"
}

# Whether the binaries of the pinned versions are built (exit status only).
built() {
  local out
  out=$(bin_dir)
  for b in etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kwok; do
    [ -x "$out/$b" ] || return 1
  done
}

case "${1:-}" in
  build) build ;;
  built) built ;;
  up) up ;;
  down) down ;;
  bin-dir) bin_dir ;;
  *)
    echo "usage: $0 build|built|up|down|bin-dir" >&2
    exit 2
    ;;
esac
