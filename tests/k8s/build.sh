#!/usr/bin/env bash
# Builds the test cluster's components from their pinned Go modules into a cache keyed by
# the pins, and prints the cache's bin directory. A cached build is reused as it is.
#
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl  k8s.io/kubernetes
#   etcd                                                                     go.etcd.io/etcd/server/v3
#   kube-router (firewall only: NetworkPolicy)                              github.com/cloudnativelabs/kube-router/v2
#   pause (static C, from k8s.io/kubernetes/build/pause) and its OCI layout (umoci)
#
# containerd, runc and the CNI plugins come from Debian (scripts/deps.sh).
# Environment: ORCHARD_K8S_CACHE (default ~/.cache/orchard/k8s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd -P)
# shellcheck source=versions.env
. "$here/versions.env"

log() { echo "k8s build: $*" >&2; }
die() { echo "k8s build: error: $*" >&2; exit 1; }

# The cache key: the pins, and RECIPE, bumped when what this script builds changes.
RECIPE=2
key=$( (echo "$RECIPE"; cat "$here/versions.env" "$here"/gomod/*/go.mod "$here"/gomod/*/go.sum) |
  sha256sum | cut -c1-16)
cache=${ORCHARD_K8S_CACHE:-$HOME/.cache/orchard/k8s}
dest="$cache/$K8S_VERSION-$key"
if [ -f "$dest/.complete" ]; then
  [ "${1:-}" = --background ] || echo "$dest/bin"
  exit 0
fi

# A build needs Go (the version the gomod/*/go.mod files name, from go.dev: Debian 12's
# is too old, so scripts/deps.sh cannot install it) and gcc (the static pause binary).
export PATH=$PATH:/usr/local/go/bin
go_min=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$here/gomod/k8s/go.mod")
go_min=${go_min%.0}
missing=()
if ! command -v go >/dev/null; then
  missing+=("Go $go_min or newer (not on PATH nor /usr/local/go/bin/go; Debian 12 does not package it: install it from https://go.dev/dl into /usr/local/go)")
else
  go_have=$(go env GOVERSION 2>/dev/null) || go_have=unknown
  go_have=${go_have#go}
  if [ "$(printf '%s\n%s\n' "$go_min" "$go_have" | sort -V | head -1)" != "$go_min" ]; then
    missing+=("Go $go_min or newer (found $go_have at $(command -v go); Debian 12 does not package it: install it from https://go.dev/dl into /usr/local/go)")
  fi
fi
command -v gcc >/dev/null || missing+=("gcc (scripts/deps.sh installs it from Debian)")
if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do echo "k8s build: missing: $m" >&2; done
  die "cannot build the test cluster's binaries without the above"
fi

# --background: start the build niced and detached (make test overlaps it with the rest
# of the run); a later foreground call waits for it on the lock and then reuses it.
if [ "${1:-}" = --background ]; then
  mkdir -p "$cache"
  bglog=$cache/background-build.log
  setsid nice -n 19 "$0" > "$bglog" 2>&1 < /dev/null &
  log "started in the background (log: $bglog)"
  exit 0
fi

# One build at a time: a second caller waits here (an hour at most: a cold build takes
# about 25 min), then finds the first one's result.
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  log "waiting for the build already running (lock: $cache/.lock)"
  flock -w 3600 9 || die "gave up after 3600 s waiting for another build to release $cache/.lock (see $cache/background-build.log, or fuser $cache/.lock for its process)"
fi
if [ -f "$dest/.complete" ]; then
  echo "$dest/bin"
  exit 0
fi

start=$(date +%s)
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/bin"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN=local
# Go's build and module caches live in the build's own directory and go as soon as
# nothing needs them (the build cache after Kubernetes, the largest part; the rest at
# the end, or when the build fails): a cold build fills them with about 6.5 GB (5 GB of
# compiled packages, 1.4 GB of module sources) that nothing reads once the binaries
# exist, and CI's disk is shared and small (a run failed on "No space left on device"
# while they sat next to cargo's targets). Every build therefore starts cold.
# -modcacherw keeps the module sources writable so `rm -rf` removes them as any user.
export GOCACHE="$dest.tmp/go-build" GOMODCACHE="$dest.tmp/go-mod"
trap 'rm -rf "$GOCACHE" "$GOMODCACHE"' EXIT

minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
log "building Kubernetes $K8S_VERSION (cold: about 20 min on 2 cores)"
(cd "$here/gomod/k8s" && go build -trimpath -ldflags "$ldflags" -o "$dest.tmp/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)
rm -rf "$GOCACHE"
log "building etcd $ETCD_VERSION"
(cd "$here/gomod/etcd" && go build -trimpath -ldflags "-s -w" -o "$dest.tmp/bin/etcd" \
  go.etcd.io/etcd/server/v3)

log "building kube-router (the NetworkPolicy enforcer)"
(cd "$here/gomod/kube-router" && go build -trimpath -ldflags "-s -w" -o "$dest.tmp/bin/kube-router" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)

log "building the pause image"
kdir=$(cd "$here/gomod/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
root="$dest.tmp/pause-root"
mkdir -p "$root"
gcc -Os -static -DVERSION="$K8S_VERSION" -o "$root/pause" "$kdir/build/pause/linux/pause.c"
layout="$dest.tmp/pause"
tag=${PAUSE_IMAGE##*:}
umoci init --layout "$layout" >/dev/null
umoci new --image "$layout:$tag" >/dev/null
tar -C "$root" --sort=name --mtime=2024-01-01T00:00:00Z --numeric-owner --owner=65535 \
  --group=65535 -cf "$dest.tmp/pause.tar" ./pause
umoci raw add-layer --image "$layout:$tag" "$dest.tmp/pause.tar" >/dev/null
umoci config --image "$layout:$tag" --config.entrypoint /pause --config.user 65535:65535 \
  --architecture amd64 --os linux >/dev/null
umoci gc --layout "$layout"
rm -rf "$root" "$dest.tmp/pause.tar"

rm -rf "$GOCACHE" "$GOMODCACHE"
echo "$(( $(date +%s) - start ))" > "$dest.tmp/build-seconds"
touch "$dest.tmp/.complete"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
# Builds for other pins are dead weight (about 600 MB each): keep this one and the newest
# other (a checkout on an older pin, or a switch back), remove the rest and the leftovers
# of interrupted builds. Only here, under the lock, so never while another build runs; and
# never a build whose binaries are running.
# find exits 1 when it meets a process that ended or an exe it may not read: not an error.
running=$(find /proc -mindepth 2 -maxdepth 2 -name exe -printf '%l\n' 2>/dev/null || true)
kept=0
# shellcheck disable=SC2045 # the names are v<version>-<hex key>, no blanks
for old in $(ls -1dt "$cache"/v*-*/ 2>/dev/null); do
  old=${old%/}
  [ "$old" = "$dest" ] && continue
  if [ -f "$old/.complete" ] && [ "$kept" -lt 1 ]; then
    kept=$((kept + 1))
    continue
  fi
  if grep -F "$old/" <<<"$running" >/dev/null; then
    log "keeping $old: its binaries are running"
    continue
  fi
  rm -rf "$old"
done
log "built in $(cat "$dest/build-seconds") s: $dest"
echo "$dest/bin"
