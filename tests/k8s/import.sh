#!/usr/bin/env bash
# Imports OCI image layouts into the running test cluster's containerd, so pods can run
# them with imagePullPolicy IfNotPresent (nothing is pulled here).
# Usage: tests/k8s/import.sh LAYOUT=NAME:TAG...
#   e.g. tests/k8s/import.sh images/out/injector=ghcr.io/orchard-env/orchard-injector:0.1.0
# Re-importing a name moves it to the new image (a rebuilt injector carries the new agent).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
[ -S "$CONTAINERD_SOCK" ] || die "the test cluster is not up ($CONTAINERD_SOCK is missing): run make cluster"
ctr() { command ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
for pair in "$@"; do
  layout=${pair%%=*} name=${pair#*=}
  [ -f "$layout/index.json" ] || die "$layout is not an OCI layout"
  tarball=$(mktemp "${TMPDIR:-/tmp}/orchard-import.XXXXXX")
  tar -C "$layout" -cf "$tarball" .
  # The layout's tag names the image; --base-name gives it the repository.
  if ! ctr images import --base-name "${name%:*}" "$tarball" >/dev/null; then
    rm -f "$tarball"
    die "importing $layout as $name failed"
  fi
  rm -f "$tarball"
  ctr images ls -q | grep -Fx "$name" >/dev/null || die "importing $layout did not make $name (is its tag ${name##*:}?)"
  log "imported $name"
done
