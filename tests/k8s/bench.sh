#!/usr/bin/env bash
# The Kubernetes backend's benchmark (in `make bench`): brings the test cluster up (unless
# one is up already, which it then leaves running), imports the injector image, and runs
# the ignored test `bench_kubernetes` (orchestrator/tests/kubernetes/bench.rs) in a release
# build: create-to-ready of a pod and exec `true` on the pod IP and through
# `orchard serve --backend kubernetes`, next to the local backend's floors measured in the
# same run. Writes bench/results/kubernetes.md (or $ORCHARD_BENCH_OUT).
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$K8S_DIR/../.." && pwd -P)
IMAGES=$ROOT/images/out
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
started=
finish() {
  local rc=$?
  [ -n "$started" ] && "$K8S_DIR/down.sh" --quiet >/dev/null 2>&1
  return $rc
}
trap 'finish' EXIT

if ! [ -S "$CONTAINERD_SOCK" ] || ! kubectl --kubeconfig "$KUBECONFIG_FILE" get --raw /readyz >/dev/null 2>&1; then
  "$K8S_DIR/build.sh" >/dev/null || die "building the test cluster failed"
  started=1
  if ! "$K8S_DIR/up.sh" > "$RUN.up.log" 2>&1; then
    cat "$RUN.up.log"
    die "the test cluster did not come up"
  fi
fi
# `make bench` does not build the Kubernetes images; the injector is built when missing.
if ! [ -f "$IMAGES/injector/index.json" ]; then
  make -C "$ROOT" k8s-images || die "building the injector image failed"
fi
"$K8S_DIR/import.sh" "$IMAGES/injector=ghcr.io/orchard-env/orchard-injector:$VERSION" ||
  die "importing the injector image failed"

export ORCHARD_TEST_KUBECONFIG=$KUBECONFIG_FILE ORCHARD_REQUIRE_K8S=1
export ORCHARD_TEST_KUBE_HOST_CIDR=$NODE_IP/32
export ORCHARD_BENCH_OUT=${ORCHARD_BENCH_OUT:-$ROOT/bench/results/kubernetes.md}
cd "$ROOT" && cargo test --release -p orchard --test integration bench_kubernetes -- --ignored --nocapture
