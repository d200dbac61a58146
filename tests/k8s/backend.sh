#!/usr/bin/env bash
# The Kubernetes backend's tests on the test cluster (in `make test`): brings the cluster
# up (unless one is up already, which it then leaves running), imports the injector image
# and the no-shell test image, and runs
#   - the Rust tests of orchestrator/tests/kubernetes (the backend, and the real
#     `orchard serve --backend kubernetes` on this host);
#   - the Python SDK's quick start against `orchard serve --backend kubernetes`, and its
#     `direct=True` sandboxes (exec, streams, files, terminals) on the agent's pod IP;
#   - the same quick start against the orchestrator deployed inside the cluster from
#     deploy/ (`kubectl apply -k deploy/test-cluster`), reached on its pod IP.
# Prints `k8s backend: N passed, M failed` for its own checks (the CI total counts it, and
# the Rust tests' `test result:` line).
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$K8S_DIR/../.." && pwd -P)
IMAGES=$ROOT/images/out
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
passed=0
failed=0
cargo_failed=
started=
finish() {
  [ -n "$started" ] && "$K8S_DIR/down.sh" --quiet >/dev/null 2>&1
  echo "k8s backend: $passed passed, $failed failed"
  [ "$failed" = 0 ] && [ -z "$cargo_failed" ]
}
trap 'finish; exit $?' EXIT

if ! [ -S "$CONTAINERD_SOCK" ] || ! kubectl --kubeconfig "$KUBECONFIG_FILE" get --raw /readyz >/dev/null 2>&1; then
  "$K8S_DIR/build.sh" >/dev/null || { failed=$((failed + 1)); exit 1; }
  started=1
  if ! "$K8S_DIR/up.sh" > "$RUN.up.log" 2>&1; then
    cat "$RUN.up.log"
    failed=$((failed + 1))
    exit 1
  fi
fi
"$K8S_DIR/import.sh" "$IMAGES/injector=ghcr.io/orchard-env/orchard-injector:$VERSION" \
  "$IMAGES/orchestrator=ghcr.io/orchard-env/orchard:$VERSION" \
  "$IMAGES/empty=docker.io/library/empty:latest" || { failed=$((failed + 1)); exit 1; }
k() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

export ORCHARD_TEST_KUBECONFIG=$KUBECONFIG_FILE ORCHARD_REQUIRE_K8S=1
export ORCHARD_TEST_KUBE_HOST_CIDR=$NODE_IP/32
out=$(mktemp)
# --workspace, as `make test` builds it: with `-p orchard` cargo unifies features over
# that package alone and builds the orchard crate and its test binaries a second time
# (minutes, and 1.3 GB of disk). The agent's integration binary runs too, with nothing
# matching the filter.
(cd "$ROOT" && cargo test -q --workspace --test integration kubernetes:: 2>&1) | tee "$out"
cargo_status=${PIPESTATUS[0]}
n=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$out" |
  awk 'NF == 2 { p += $1; f += $2; n++ } END { if (n) print p, f }')
rm -f "$out"
# CI's total counts the cargo tests from their own `test result:` line; this script's
# summary counts its other checks (and a test binary that did not build).
if [ -z "$n" ]; then
  failed=$((failed + 1)); echo "k8s backend: FAILED: the Rust tests did not run"
elif [ "${n#* }" != 0 ] || [ "$cargo_status" != 0 ]; then
  # A test binary that crashed prints no `test result:` line of its own.
  cargo_failed=1
fi

# The SDK's quick start, verbatim, against a server on the Kubernetes backend; then its
# direct mode, sync and async, on the pod IP.
ns=t-sdk-$$
export ORCHARD_TEST_SERVE_ARGS="--backend kubernetes --kubeconfig $KUBECONFIG_FILE --namespace $ns --kube-ingress-cidr $NODE_IP/32 --kube-grace-period-s 0 --default-cpu 250m --default-memory 256Mi"
if (cd "$ROOT" && ORCHARD_BIN=$ROOT/target/debug/orchard python3 -m pytest -q -p no:cacheprovider \
      sdk/python/tests/test_quickstart.py "sdk/python/tests/test_methods.py::test_direct" 2>&1); then
  passed=$((passed + 1)); echo "k8s backend: ok: SDK quick start, and direct=True on the pod IP"
else
  failed=$((failed + 1)); echo "k8s backend: FAILED: SDK quick start, and direct=True on the pod IP"
fi
k delete namespace "$ns" --wait=false --ignore-not-found >/dev/null 2>&1

# The orchestrator deployed in the cluster from deploy/: the quick start through it.
quickstart='
from orchard_env import SandboxClient
with SandboxClient() as client:
    with client.create_sandbox("python:3.11-slim") as sandbox:
        print(sandbox.exec("echo Hello, Orchard!").stdout, end="")
'
deployed() {
  k apply -k "$ROOT/deploy/test-cluster" >/dev/null || return 1
  k -n orchard-system rollout status deploy/orchard --timeout=180s || {
    k -n orchard-system describe pods; k -n orchard-system logs deploy/orchard; return 1; }
  local ip
  ip=$(k -n orchard-system get pods -l app.kubernetes.io/name=orchard \
    -o jsonpath='{.items[0].status.podIP}') || return 1
  local said
  said=$(SANDBOX_BASE_URL=http://$ip:8000 SANDBOX_API_KEY=test-key-in-cluster \
    timeout 300 python3 -c "$quickstart") || { k -n orchard-system logs deploy/orchard | tail -20; return 1; }
  [ "$said" = "Hello, Orchard!" ] || { echo "the quick start printed: $said"; return 1; }
  # The deployed RBAC lets it watch the nodes: /resources has their capacity, and no
  # message saying it lacks them.
  python3 - "http://$ip:8000/resources" <<'PY' || return 1
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"X-API-Key": "test-key-in-cluster"})
res = json.load(urllib.request.urlopen(req, timeout=30))
ok = "message" not in res and res["nodes"] and all(
    n["allocatable"]["cpu"] > 0 and n["allocatable"]["memory_bytes"] > 0 for n in res["nodes"])
if not ok:
    sys.exit(f"/resources of the deployed orchestrator: {res}")
PY
  # Nothing is left in the sandbox namespace once the sandbox is deleted.
  [ -z "$(k -n orchard-sandboxes get pods,secrets -l orchard.dev/sandbox -o name)" ]
}
if deployed; then
  passed=$((passed + 1)); echo "k8s backend: ok: quick start through the orchestrator deployed from deploy/"
else
  failed=$((failed + 1)); echo "k8s backend: FAILED: quick start through the orchestrator deployed from deploy/"
fi
k delete -k "$ROOT/deploy/test-cluster" --wait=false --ignore-not-found >/dev/null 2>&1
