#!/usr/bin/env bash
# Quick start: a local kind cluster running Turnstile (memory backend) with the example lock
# and claims applied, ending on `kubectl get locks`. Safe to re-run: it reuses the cluster and
# rolls the controller onto the freshly built image.
#
# Needs: docker, kind, kubectl. Environment: CLUSTER (default turnstile), IMAGE (default
# turnstile:dev), TURNSTILE_QUICKSTART_DIR (state, default .quickstart/: the kustomize
# overlay that points deploy/ at IMAGE).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"

CLUSTER="${CLUSTER:-turnstile}"
IMAGE="${IMAGE:-turnstile:dev}"
STATE_DIR="${TURNSTILE_QUICKSTART_DIR:-$REPO/.quickstart}"
NAMESPACE=turnstile-system

say() { echo "==> $*"; }
die() { echo "quickstart: $*" >&2; exit 1; }

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
  base="$(realpath --relative-to="$overlay" "$REPO/deploy")"
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

already_deployed=false
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
for _ in $(seq 1 30); do
  tokens="$(k get distributedlocks --all-namespaces -o jsonpath='{.items[*].status.fencingToken}')"
  [ -n "$tokens" ] && break
  sleep 2
done

say "kubectl get locks"
k get locks
