#!/usr/bin/env bash
# Quick start: Turnstile (memory backend) with the example lock and claims applied, ending on
# `kubectl get locks`. Three ways, chosen by what is installed:
#
#   kind        `kind` is on PATH and `docker info` answers: a local kind cluster running the
#               controller image built from this checkout. Safe to re-run: it reuses the
#               cluster and rolls the controller onto the freshly built image.
#   control-plane  otherwise, where `bash scripts/control-plane.sh build` has built a real
#               control plane (about 10 minutes, once): etcd, kube-apiserver,
#               kube-controller-manager, kube-scheduler and KWOK on 127.0.0.1, and
#               `turnstile run`, left running; `bash scripts/quickstart.sh stop` ends them.
#   playground  otherwise, the instant fallback: the repository's fake API server (an
#               in-memory stand-in for the Kubernetes API, not Kubernetes) and `turnstile run`,
#               both on 127.0.0.1, left running; `bash scripts/quickstart.sh stop` ends them.
#
# Usage: bash scripts/quickstart.sh [stop]
#
# Environment:
#   TURNSTILE_QUICKSTART      kind | control-plane | playground (default: chosen as above)
#   TURNSTILE_QUICKSTART_DIR  state: kustomize overlay, kubeconfig, logs, PIDs (default .quickstart/)
#   CLUSTER, IMAGE            kind: the cluster (default turnstile) and the image built, loaded
#                             and rolled out (default turnstile:dev)
#   TURNSTILE_BIN, FAKE_APISERVER_BIN
#                             playground: binaries to run; each one not given is built with cargo
#   PLAYGROUND_PORT           playground: the fake API server's port (default: a free one)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"

CLUSTER="${CLUSTER:-turnstile}"
IMAGE="${IMAGE:-turnstile:dev}"
STATE_DIR="${TURNSTILE_QUICKSTART_DIR:-$REPO/.quickstart}"
# One `name pid` line per process the playground started.
PIDS="$STATE_DIR/pids"
NAMESPACE=turnstile-system

say() { echo "==> $*"; }
die() { echo "quickstart: $*" >&2; exit 1; }

# --- playground -------------------------------------------------------------------------------

# Whether `pid` is still the process named `name` we started (and not a reused PID).
is_ours() {
  local name="$1" pid="$2" command state
  kill -0 "$pid" 2>/dev/null || return 1
  command -v ps >/dev/null 2>&1 || return 0
  command="$(ps -o comm= -p "$pid" 2>/dev/null || true)"
  state="$(ps -o stat= -p "$pid" 2>/dev/null || true)"
  # A zombie has ended (its new parent has not reaped it yet, or never will in a container).
  [[ "$state" != Z* ]] || return 1
  # Linux shows at most 15 characters of the name.
  [ "${command}" = "${name:0:15}" ]
}

# Ends the processes listed in $PIDS, by PID: SIGTERM, then SIGKILL after 10 s.
stop_playground() {
  local name pid lines=() i
  if [ ! -f "$PIDS" ]; then
    say "no playground running (no ${PIDS})"
    return 0
  fi
  while read -r name pid; do
    if [ -n "${pid:-}" ]; then lines+=("$name $pid"); fi
  done <"$PIDS"
  # Reverse order: the controller first, then the API server it talks to.
  for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
    read -r name pid <<<"${lines[$i]}"
    if ! is_ours "$name" "$pid"; then
      say "${name} (PID ${pid}) is not running"
      continue
    fi
    say "stopping ${name} (PID ${pid})"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      is_ours "$name" "$pid" || break
      sleep 0.1
    done
    if is_ours "$name" "$pid"; then
      echo "quickstart: ${name} (PID ${pid}) ignored SIGTERM for 10 s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -f "$PIDS"
}

# Starts the real control plane (scripts/control-plane.sh up, building it first if need be) in
# $STATE_DIR/control-plane, copies its admin kubeconfig to $1 and adds its processes to $PIDS,
# so `stop` ends them (after the controller) like the playground's.
start_control_plane() {
  local dir="$STATE_DIR/control-plane" pid
  say "starting a real control plane on 127.0.0.1 (bash scripts/control-plane.sh up)"
  rm -rf "$dir"
  TURNSTILE_CONTROL_PLANE_DIR="$dir" bash scripts/control-plane.sh up >/dev/null
  cp "$dir/admin.kubeconfig" "$1"
  while read -r pid; do
    echo "$(ps -o comm= -p "$pid") ${pid}" >>"$PIDS"
  done <"$dir/pids"
  rm -f "$dir/pids"
}

# Sets TURNSTILE_BIN and FAKE_APISERVER_BIN, building with cargo the ones not given.
playground_binaries() {
  local packages=() executables path
  [ -n "${TURNSTILE_BIN:-}" ] || packages+=(-p turnstile)
  [ -n "${FAKE_APISERVER_BIN:-}" ] || packages+=(-p fake-apiserver)
  if [ "${#packages[@]}" -gt 0 ]; then
    command -v cargo >/dev/null 2>&1 ||
      die "cargo is not on PATH (or set TURNSTILE_BIN and FAKE_APISERVER_BIN to built binaries)"
    # Debug, not --release: it compiles in about half the time, and runs fast enough here.
    say "building ${packages[*]} with cargo (debug profile: quicker to build than --release)"
    # The JSON messages name each built executable; diagnostics still go to stderr.
    executables="$(cargo build "${packages[@]}" --bins --message-format=json-render-diagnostics |
      sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
    while read -r path; do
      case "$(basename "$path")" in
        turnstile) TURNSTILE_BIN="${TURNSTILE_BIN:-$path}" ;;
        fake-apiserver) FAKE_APISERVER_BIN="${FAKE_APISERVER_BIN:-$path}" ;;
      esac
    done <<<"$executables"
  fi
  [ -x "${TURNSTILE_BIN:-}" ] || die "turnstile binary not found: ${TURNSTILE_BIN:-}"
  [ -x "${FAKE_APISERVER_BIN:-}" ] || die "fake-apiserver binary not found: ${FAKE_APISERVER_BIN:-}"
}

# The last lines of a log, to say why something did not start.
show_log() {
  echo "--- last lines of $1:" >&2
  tail -n 20 "$1" >&2 || true
}

playground() {
  command -v kubectl >/dev/null 2>&1 || die "kubectl is not on PATH"
  if [ "${1:-}" = control-plane ]; then
    say "a real Kubernetes control plane on 127.0.0.1 and the controller"
  else
    say "playground: the fake API server (an in-memory stand-in for the Kubernetes API, not"
    say "Kubernetes: nothing is stored on disk, no Pods or Jobs ever run) and the controller"
  fi
  mkdir -p "$STATE_DIR"
  if [ -f "$PIDS" ]; then
    say "stopping the previous playground first"
    stop_playground
  fi
  playground_binaries

  local kubeconfig="$STATE_DIR/kubeconfig" out="$STATE_DIR/fake-apiserver.out"
  local url="" fake_pid controller_pid stop_command="bash scripts/quickstart.sh stop"
  if [ -n "${TURNSTILE_QUICKSTART_DIR:-}" ]; then
    stop_command="TURNSTILE_QUICKSTART_DIR=${STATE_DIR} ${stop_command}"
  fi
  rm -f "$kubeconfig" "$out"
  # From here on a failure stops what was started.
  trap 'status=$?; if [ "$status" -ne 0 ]; then echo "quickstart: failed; stopping the playground" >&2; stop_playground >&2; fi' EXIT

  if [ "${1:-}" = control-plane ]; then
    start_control_plane "$kubeconfig"
  else
  say "starting the fake API server on 127.0.0.1 (${FAKE_APISERVER_BIN})"
  # Own stdio, so that it outlives this script and holds none of its pipes open.
  "$FAKE_APISERVER_BIN" --port "${PLAYGROUND_PORT:-0}" --kubeconfig "$kubeconfig" \
    </dev/null >"$out" 2>"$STATE_DIR/fake-apiserver.log" &
  fake_pid=$!
  echo "fake-apiserver ${fake_pid}" >"$PIDS"
  # Its first line on stdout is its URL, printed once the kubeconfig is written (bounded: 300 x 0.1 s).
  for _ in $(seq 1 300); do
    url="$(head -n 1 "$out" 2>/dev/null || true)"
    [ -n "$url" ] && break
    kill -0 "$fake_pid" 2>/dev/null || { show_log "$STATE_DIR/fake-apiserver.log"; die "the fake API server exited"; }
    sleep 0.1
  done
  [ -n "$url" ] || { show_log "$STATE_DIR/fake-apiserver.log"; die "the fake API server did not start within 30 s"; }
  say "the fake API server serves ${url}"
  fi

  # kubectl caches discovery per host:port; ports get reused by later playgrounds.
  kc() { kubectl --kubeconfig "$kubeconfig" --cache-dir "$STATE_DIR/kube-cache" "$@"; }

  say "posting the CRDs (turnstile crds | kubectl apply -f -)"
  "$TURNSTILE_BIN" crds | kc apply -f -
  kc wait --for condition=established --timeout=60s \
    crd/distributedlocks.turnstile.dev crd/lockclaims.turnstile.dev

  say "starting the controller: turnstile run (memory backend, all namespaces)"
  # NO_COLOR: plain log lines in the file.
  NO_COLOR=1 KUBECONFIG="$kubeconfig" "$TURNSTILE_BIN" run </dev/null >"$STATE_DIR/turnstile.log" 2>&1 &
  controller_pid=$!
  echo "turnstile ${controller_pid}" >>"$PIDS"

  say "applying the example lock and claims"
  kc apply -f examples/lock.yaml
  kc apply -f examples/claims.yaml

  say "waiting until job-a, the first claim, holds the lock"
  if ! kc wait --for=condition=Held lockclaim/job-a --timeout=60s; then
    show_log "$STATE_DIR/turnstile.log"
    die "job-a was not granted within 60 s"
  fi

  say "kubectl get locks"
  kc get locks
  trap - EXIT

  if [ "${1:-}" = control-plane ]; then
    cat <<EOF

Turnstile is running on a real Kubernetes control plane on 127.0.0.1: etcd,
kube-apiserver ($(kc version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1)), kube-controller-manager, kube-scheduler and KWOK (which runs
the Pods of its Node without containers), and the controller (PID ${controller_pid}).
Logs and PIDs: ${STATE_DIR}/.

Use it from this shell:

    export KUBECONFIG=${kubeconfig}
    kubectl get locks
    kubectl delete lockclaim job-a     # the lock goes to job-b
    kubectl apply -f examples/gated-job.yaml   # a gated Job, run by the real Job controller

Stop it (every process, by PID):

    ${stop_command}
EOF
    return 0
  fi
  cat <<EOF

The playground is running: the fake API server (PID ${fake_pid}) at ${url} and the
controller (PID ${controller_pid}). That API server is an in-memory stand-in for the
Kubernetes API, not Kubernetes: it serves what kubectl and the controller use, forgets
everything when it stops, and never runs Pods or Jobs. Logs and PIDs: ${STATE_DIR}/.

Use it from this shell:

    export KUBECONFIG=${kubeconfig}
    kubectl get locks
    kubectl delete lockclaim job-a     # the lock goes to job-b

Stop it (both processes, by PID):

    ${stop_command}
EOF
}

# --- kind ---------------------------------------------------------------------------------------

# Whether the kind path can run here: kind installed and a Docker daemon answering.
kind_available() {
  command -v kind >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 &&
    docker info >/dev/null 2>&1
}

# The path from directory $1 to directory $2 (both existing), as `realpath --relative-to`
# prints it where GNU coreutils are installed (macOS has no such flag).
relative_path() {
  local from to common up=""
  from="$(cd "$1" && pwd -P)"
  to="$(cd "$2" && pwd -P)"
  common="$from"
  while [ "$common" != / ] && [ "$common" != "$to" ] && [ "${to#"$common"/}" = "$to" ]; do
    common="$(dirname "$common")"
    up="../$up"
  done
  if [ "$common" = "$to" ]; then
    echo "${up:-.}"
  elif [ "$common" = / ]; then
    echo "${up}${to#/}"
  else
    echo "${up}${to#"$common"/}"
  fi
}

# Writes $STATE_DIR/overlay: deploy/ with its image `turnstile` (deploy/ runs turnstile:dev)
# replaced by $IMAGE, so the rollout runs the image that was built and loaded.
write_overlay() {
  local overlay="$STATE_DIR/overlay" name="$IMAGE" tag="" digest="" base
  mkdir -p "$overlay"
  # kustomize takes name, tag and digest apart: registry:5000/team/turnstile:v1@sha256:...
  if [[ "$name" == *@* ]]; then
    digest="${name#*@}"
    name="${name%%@*}"
  fi
  if [[ "${name##*/}" == *:* ]]; then
    tag="${name##*:}"
    name="${name%:*}"
  fi
  # As docker does: no tag and no digest means latest.
  if [ -z "$tag" ] && [ -z "$digest" ]; then
    tag=latest
  fi
  # kustomize accepts only relative paths to a base.
  base="$(relative_path "$overlay" "$REPO/deploy")"
  {
    echo "# Written by scripts/quickstart.sh: deploy/ running ${IMAGE}."
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "  - ${base}"
    echo "images:"
    echo "  - name: turnstile"
    echo "    newName: ${name}"
    [ -n "$tag" ] && echo "    newTag: \"${tag}\""
    [ -n "$digest" ] && echo "    digest: ${digest}"
    true
  } >"$overlay/kustomization.yaml"
}

kind_quickstart() {
  for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not on PATH"
  done

  k() { kubectl --context "kind-${CLUSTER}" "$@"; }

  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "reusing kind cluster ${CLUSTER}"
  else
    say "creating kind cluster ${CLUSTER}"
    kind create cluster --name "$CLUSTER" --config kind-config.yaml --wait 120s
  fi

  say "building ${IMAGE}"
  docker build -t "$IMAGE" .

  say "loading ${IMAGE} into the cluster's nodes"
  kind load docker-image "$IMAGE" --name "$CLUSTER"

  local already_deployed=false
  if k -n "$NAMESPACE" get deployment/turnstile-controller >/dev/null 2>&1; then
    already_deployed=true
  fi

  write_overlay
  say "installing Turnstile running ${IMAGE} (kubectl apply -k ${STATE_DIR}/overlay: deploy/ with its image set)"
  k apply -k "$STATE_DIR/overlay"
  k wait --for condition=established --timeout=60s \
    crd/distributedlocks.turnstile.dev crd/lockclaims.turnstile.dev
  if [ "$already_deployed" = true ]; then
    # Same tag, new image: restart so the pods pick it up.
    k -n "$NAMESPACE" rollout restart deployment/turnstile-controller
  fi
  k -n "$NAMESPACE" rollout status deployment/turnstile-controller --timeout=180s

  say "applying the example lock and claims"
  k apply -f examples/lock.yaml
  k apply -f examples/claims.yaml

  # Give the controller a moment to grant the first claim (bounded: 30 x 2 s).
  local tokens
  for _ in $(seq 1 30); do
    tokens="$(k get distributedlocks --all-namespaces -o jsonpath='{.items[*].status.fencingToken}')"
    [ -n "$tokens" ] && break
    sleep 2
  done

  say "kubectl get locks"
  k get locks
}

# --- main ---------------------------------------------------------------------------------------

case "${1:-}" in
  stop)
    stop_playground
    exit 0
    ;;
  "") ;;
  *) die "usage: bash scripts/quickstart.sh [stop]" ;;
esac

case "${TURNSTILE_QUICKSTART:-}" in
  kind) kind_quickstart ;;
  control-plane) playground control-plane ;;
  playground) playground ;;
  "")
    if kind_available; then
      kind_quickstart
    else
      if bash scripts/control-plane.sh built; then
        say "kind or a Docker daemon is missing: starting a real control plane on 127.0.0.1 instead"
        playground control-plane
      else
        say "kind or a Docker daemon is missing, and no real control plane is built"
        say "(bash scripts/control-plane.sh build: about 10 minutes, once): starting the local playground instead"
        playground
      fi
    fi
    ;;
  *) die "TURNSTILE_QUICKSTART must be kind, control-plane or playground, not ${TURNSTILE_QUICKSTART}" ;;
esac
