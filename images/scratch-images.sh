#!/usr/bin/env bash
# Builds the Kubernetes images as OCI layouts under images/out/, without Docker. Both are
# FROM scratch: static binaries and nothing else (no shell, no libc), tagged with the
# crate version, the names the defaults and deploy/ use:
#   injector      ghcr.io/orchard-env/orchard-injector:VERSION, the init container:
#                   /orchard-injector  its program (the entrypoint)
#                   /orchard-agent     the agent it copies into each sandbox's /.orchard
#                   /harness/...       the harness bundle, only with --harness DIR
#   orchestrator  ghcr.io/orchard-env/orchard:VERSION: /orchard (the entrypoint), run as
#                 65532:65532
# `tests/k8s/backend.sh` imports them into the test cluster. Rebuilt every time (seconds):
# they must carry the binaries just built.
#
# Usage: images/scratch-images.sh [--harness DIR] injector|orchestrator...
# Environment: ORCHARD_IMAGES_OUT (default images/out), MUSL_RELEASE (the directory of
# the musl release binaries, default target/x86_64-unknown-linux-musl/release).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd -P)
root=$(dirname "$here")
OUT=${ORCHARD_IMAGES_OUT:-$here/out}
BIN=${MUSL_RELEASE:-$root/target/x86_64-unknown-linux-musl/release}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
CREATED=2024-01-01T00:00:00Z
harness=
if [ "${1:-}" = --harness ]; then
  harness=${2:?--harness needs a directory}
  shift 2
fi
die() { echo "scratch images: $*" >&2; exit 1; }
command -v umoci >/dev/null || die "umoci is missing: run make deps"

# scratch NAME REPOSITORY USER ENTRYPOINT BINARY...: one layer holding the binaries at /.
scratch() {
  local name=$1 repo=$2 user=$3 entry=$4
  shift 4
  local tmp="$OUT/.tmp-$name" stage="$OUT/.stage-$name" b
  rm -rf "$tmp" "$stage"
  mkdir -p "$stage"
  for b in "$@"; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run make k8s-images (it builds it with the musl target)"
    file -L "$BIN/$b" | grep -q 'statically linked' || die "$BIN/$b is not statically linked"
    install -m 0755 "$BIN/$b" "$stage/$b"
  done
  if [ "$name" = injector ] && [ -n "$harness" ]; then
    [ -d "$harness" ] || die "harness bundle $harness is not a directory"
    cp -a "$harness" "$stage/harness"
  fi
  umoci init --layout "$tmp" >/dev/null
  umoci new --image "$tmp:$VERSION" >/dev/null
  tar -C "$stage" --sort=name --mtime=$CREATED --numeric-owner --owner=0 --group=0 -cf "$tmp.layer.tar" .
  umoci raw add-layer --image "$tmp:$VERSION" --history.created "$CREATED" \
    --history.created_by "images/scratch-images.sh $name" "$tmp.layer.tar"
  umoci config --image "$tmp:$VERSION" --created "$CREATED" \
    --config.entrypoint "$entry" --config.user "$user" --author "Orchard Env" >/dev/null
  umoci gc --layout "$tmp"
  rm -rf "$OUT/$name" "$stage" "$tmp.layer.tar"
  mv "$tmp" "$OUT/$name"
  echo "scratch images: $OUT/$name ($repo:$VERSION, $(du -sh "$OUT/$name" | cut -f1))"
}

mkdir -p "$OUT"
[ $# -gt 0 ] || die "usage: images/scratch-images.sh [--harness DIR] injector|orchestrator..."
for image in "$@"; do
  case $image in
    injector) scratch injector ghcr.io/orchard-env/orchard-injector 0:0 /orchard-injector orchard-injector orchard-agent ;;
    orchestrator) scratch orchestrator ghcr.io/orchard-env/orchard 65532:65532 /orchard orchard ;;
    *) die "unknown image $image (injector, orchestrator)" ;;
  esac
done
