#!/usr/bin/env bash
# Quick start: a local kind cluster running Turnstile (memory backend) with the example lock
# and claims applied, ending on `kubectl get locks`. Safe to re-run: it reuses the cluster and
# rolls the controller onto the freshly built image.
#
# Needs: docker, kind, kubectl. Environment: CLUSTER (default turnstile), IMAGE (default
# turnstile:dev, the image deploy/ runs).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-turnstile}"
IMAGE="${IMAGE:-turnstile:dev}"
NAMESPACE=turnstile-system

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "quickstart: $tool is not on PATH" >&2; exit 1; }
done

k() { kubectl --context "kind-${CLUSTER}" "$@"; }

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "==> reusing kind cluster ${CLUSTER}"
else
  echo "==> creating kind cluster ${CLUSTER}"
  kind create cluster --name "$CLUSTER" --config kind-config.yaml --wait 120s
fi

echo "==> building ${IMAGE}"
docker build -t "$IMAGE" .

echo "==> loading ${IMAGE} into the cluster's nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER"

already_deployed=false
if k -n "$NAMESPACE" get deployment/turnstile-controller >/dev/null 2>&1; then
  already_deployed=true
fi

echo "==> installing Turnstile (kubectl apply -k deploy/)"
k apply -k deploy/
k wait --for condition=established --timeout=60s \
  crd/distributedlocks.turnstile.dev crd/lockclaims.turnstile.dev
if [ "$already_deployed" = true ]; then
  # Same tag, new image: restart so the pods pick it up.
  k -n "$NAMESPACE" rollout restart deployment/turnstile-controller
fi
k -n "$NAMESPACE" rollout status deployment/turnstile-controller --timeout=180s

echo "==> applying the example lock and claims"
k apply -f examples/lock.yaml
k apply -f examples/claims.yaml

# Give the controller a moment to grant the first claim (bounded: 30 x 2 s).
for _ in $(seq 1 30); do
  tokens="$(k get distributedlocks --all-namespaces -o jsonpath='{.items[*].status.fencingToken}')"
  [ -n "$tokens" ] && break
  sleep 2
done

echo "==> kubectl get locks"
k get locks
