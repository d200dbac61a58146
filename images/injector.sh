#!/usr/bin/env bash
# Builds the injector image as an OCI layout in images/out/injector, without Docker:
# FROM scratch, two static binaries and nothing else (no shell, no libc):
#   /orchard-injector   the init container's program (its entrypoint)
#   /orchard-agent      the agent it copies into each sandbox's /.orchard volume
#   /harness/...        the harness bundle, only with --harness DIR
# Tagged with the crate version, the name the Kubernetes backend uses by default
# (ghcr.io/orchard-env/orchard-injector:VERSION); `tests/k8s/up.sh` imports it into
# the test cluster. Rebuilt every time (seconds): it must carry the agent just built.
#
# Usage: images/injector.sh [--harness DIR]
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
if [ "${1:-}" = --harness ]; then harness=${2:?--harness needs a directory}; fi

die() { echo "injector image: $*" >&2; exit 1; }
for b in orchard-injector orchard-agent; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run make injector-image (it builds both with the musl target)"
  file -L "$BIN/$b" | grep -q 'statically linked' || die "$BIN/$b is not statically linked"
done
command -v umoci >/dev/null || die "umoci is missing: run make deps"

mkdir -p "$OUT"
tmp="$OUT/.tmp-injector"
stage="$OUT/.stage-injector"
rm -rf "$tmp" "$stage"
trap 'rm -rf "$tmp" "$stage" "$tmp.layer.tar"' EXIT
mkdir -p "$stage"
install -m 0755 "$BIN/orchard-injector" "$stage/orchard-injector"
install -m 0755 "$BIN/orchard-agent" "$stage/orchard-agent"
if [ -n "$harness" ]; then
  [ -d "$harness" ] || die "harness bundle $harness is not a directory"
  cp -a "$harness" "$stage/harness"
fi
umoci init --layout "$tmp" >/dev/null
umoci new --image "$tmp:$VERSION" >/dev/null
tar -C "$stage" --sort=name --mtime=$CREATED --numeric-owner --owner=0 --group=0 -cf "$tmp.layer.tar" .
umoci raw add-layer --image "$tmp:$VERSION" --history.created "$CREATED" \
  --history.created_by "images/injector.sh" "$tmp.layer.tar"
umoci config --image "$tmp:$VERSION" --created "$CREATED" \
  --config.entrypoint /orchard-injector --config.user 0:0 \
  --author "Orchard Env" >/dev/null
umoci gc --layout "$tmp"
rm -rf "$OUT/injector"
mv "$tmp" "$OUT/injector"
echo "injector image: $OUT/injector (ghcr.io/orchard-env/orchard-injector:$VERSION, $(du -sh "$OUT/injector" | cut -f1))"
