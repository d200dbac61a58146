#!/usr/bin/env bash
# Builds the test base images without Docker, as OCI image layouts under images/out/:
#
#   out/busybox   busybox:latest     busybox-static, its applet links, /etc/passwd, /tmp, /workspace
#   out/empty     empty:latest       one layer holding no files
#   out/whiteout  whiteout:latest    two layers; the second deletes a file and makes a dir opaque
#   out/python    python:3.11-slim   Debian bookworm (debootstrap minbase) + python3, pip, git
#   out/swe       swe:latest         python + a conda-style env activated only by ~/.bashrc
#
# Each layout is built in a temporary directory and renamed into place when complete, and a
# layout that already exists is kept: delete it (or all of out/) to rebuild. The debootstrap
# root file system, the slow part, is cached on its own in out/cache/. Nothing is pushed:
# the tests start their own registry and push what they need with skopeo.
#
# Environment: ORCHARD_IMAGES_OUT (output directory, default images/out),
# DEBIAN_MIRROR (default: the bookworm mirror of this machine's apt sources).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
OUT=${ORCHARD_IMAGES_OUT:-$here/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in umoci tar; do
  command -v "$tool" >/dev/null || { echo "images: $tool is missing: run make deps" >&2; exit 1; }
done

PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Fixed times (file mtimes in the small images, creation and history dates in all) and
# sorted entries, so an image rebuilt from the same files has the same digests.
CREATED=2024-01-01T00:00:00Z
TAR_REPRO=(--sort=name --mtime=$CREATED --numeric-owner)

log() { echo "images: $*"; }

# new_layout NAME TAG: an empty image in a fresh temporary layout; prints the layout path.
new_layout() {
  local tmp="$OUT/.tmp-$1"
  rm -rf "$tmp"
  umoci init --layout "$tmp" >/dev/null
  umoci new --image "$tmp:$2" >/dev/null
  echo "$tmp"
}

# add_layer LAYOUT TAG DIR [TAR OPTIONS...]: appends the contents of DIR as one layer.
add_layer() {
  local layout=$1 tag=$2 dir=$3
  shift 3
  local tarball="$layout.layer.tar"
  tar -C "$dir" "$@" -cf "$tarball" .
  umoci raw add-layer --image "$layout:$tag" --history.created "$CREATED" \
    --history.created_by "images/build.sh: $(basename "$dir")" "$tarball"
  rm -f "$tarball"
}

# finish LAYOUT NAME: drops unreferenced blobs and moves the layout into place.
finish() {
  umoci gc --layout "$1"
  rm -rf "$OUT/$2"
  mv "$1" "$OUT/$2"
  log "$2 done ($(du -sh "$OUT/$2" | cut -f1))"
}

build_busybox() {
  [ -f "$OUT/busybox/index.json" ] && return
  log "building busybox"
  local busybox=/bin/busybox
  file -L "$busybox" 2>/dev/null | grep -q 'statically linked' \
    || { echo "images: $busybox is not busybox-static: run make deps" >&2; exit 1; }
  local stage="$OUT/.stage-busybox"
  rm -rf "$stage"
  mkdir -p "$stage"/{bin,etc,root,tmp,workspace,dev,proc,sys,usr/bin,usr/sbin,sbin}
  cp "$busybox" "$stage/bin/busybox"
  local applet
  for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$stage/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$stage/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$stage/etc/group"
  chmod 1777 "$stage/tmp"
  chmod 700 "$stage/root"
  local layout
  layout=$(new_layout busybox latest)
  add_layer "$layout" latest "$stage" "${TAR_REPRO[@]}" --owner=0 --group=0
  umoci config --no-history --image "$layout:latest" --created "$CREATED" --config.env "$PATH_ENV" --config.cmd sh
  rm -rf "$stage"
  finish "$layout" busybox
}

build_empty() {
  [ -f "$OUT/empty/index.json" ] && return
  log "building empty"
  local stage="$OUT/.stage-empty"
  rm -rf "$stage"
  mkdir -p "$stage"
  local layout
  layout=$(new_layout empty latest)
  # An archive with no entries at all, not even "./".
  tar -cf "$layout.layer.tar" -T /dev/null
  umoci raw add-layer --image "$layout:latest" --history.created "$CREATED" \
    --history.created_by "images/build.sh: no files" "$layout.layer.tar"
  rm -f "$layout.layer.tar"
  umoci config --no-history --image "$layout:latest" --created "$CREATED"
  rm -rf "$stage"
  finish "$layout" empty
}

build_whiteout() {
  [ -f "$OUT/whiteout/index.json" ] && return
  log "building whiteout"
  local stage="$OUT/.stage-whiteout"
  rm -rf "$stage"
  # Layer 1: files of several kinds, so the tests can check what an unpack keeps.
  mkdir -p "$stage/1/data" "$stage/1/opaque/sub" "$stage/1/owned"
  echo keep >"$stage/1/data/keep.txt"
  echo gone >"$stage/1/data/gone.txt"
  echo old >"$stage/1/opaque/old.txt"
  echo older >"$stage/1/opaque/sub/older.txt"
  ln "$stage/1/data/keep.txt" "$stage/1/data/hard.txt"
  ln -s ../data/keep.txt "$stage/1/owned/link"
  echo secret >"$stage/1/owned/private.txt"
  chown 1000:1000 "$stage/1/owned/private.txt"
  chmod 640 "$stage/1/owned/private.txt"
  echo tool >"$stage/1/owned/setuid"
  chmod 4755 "$stage/1/owned/setuid"
  # Layer 2: deletes data/gone.txt and makes opaque/ opaque, with one new file in it.
  # GNU tar stores these marker files as they are: that is the OCI whiteout format.
  mkdir -p "$stage/2/data" "$stage/2/opaque"
  : >"$stage/2/data/.wh.gone.txt"
  : >"$stage/2/opaque/.wh..wh..opq"
  echo new >"$stage/2/opaque/new.txt"
  local layout
  layout=$(new_layout whiteout latest)
  add_layer "$layout" latest "$stage/1" "${TAR_REPRO[@]}"
  add_layer "$layout" latest "$stage/2" "${TAR_REPRO[@]}"
  umoci config --no-history --image "$layout:latest" --created "$CREATED" --config.env "$PATH_ENV" \
    --config.workingdir /data --config.user 1000:1000 --config.entrypoint /bin/true
  rm -rf "$stage"
  finish "$layout" whiteout
}

# The bookworm mirror of this machine's apt sources (one-line or deb822 format).
debian_mirror() {
  local mirror
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == "bookworm") { print $i; exit }
    }') || true
  if [ -z "$mirror" ]; then
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
      function flush() { if (!done && deb && suite && uri != "") { print uri; done = 1 } uri = ""; deb = 0; suite = 0 }
      /^[ \t]*$/ { flush(); next }
      $1 == "Types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      $1 == "URIs:" { uri = $2 }
      $1 == "Suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
      END { flush() }') || true
  fi
  echo "${mirror:-http://deb.debian.org/debian}"
}

# Removes an unfinished debootstrap target. debootstrap mounts /proc, /sys and (in a
# container) a bind of the host's /dev inside it, and a killed run leaves them mounted:
# unmount what is below it first, and never let rm cross into another file system.
remove_rootfs() {
  local dir=$1 mounts
  [ -e "$dir" ] || return 0
  mounts=$(awk -v dir="$dir/" 'index($2 "/", dir) == 1 { print $2 }' /proc/mounts | sort -r)
  local mount
  for mount in $mounts; do
    umount -l "$mount" 2>/dev/null || true
  done
  rm -rf --one-file-system "$dir"
}

# The debootstrap root file system, cached on its own: it is what takes time.
python_rootfs() {
  local rootfs="$OUT/cache/python-rootfs"
  [ -f "$rootfs/.orchard-complete" ] && { echo "$rootfs"; return; }
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] \
    || { echo "images: debootstrap is missing: run make deps" >&2; exit 1; }
  local mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  local tmp="$OUT/cache/.tmp-python-rootfs"
  log "debootstrap bookworm from $mirror (about a minute)" >&2
  remove_rootfs "$tmp"
  mkdir -p "$OUT/cache"
  PATH=$PATH:/usr/sbin:/sbin debootstrap --variant=minbase \
    --include=python3,python3-pip,python-is-python3,git,ca-certificates \
    bookworm "$tmp" "$mirror" >"$OUT/cache/debootstrap.log" 2>&1 \
    || {
      echo "images: debootstrap failed, see $OUT/cache/debootstrap.log" >&2
      tail -20 "$OUT/cache/debootstrap.log" >&2
      remove_rootfs "$tmp"
      exit 1
    }
  # What an image does not carry: package caches, the build machine's name and resolver.
  rm -rf "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  rm -f "$tmp/etc/resolv.conf" "$tmp/etc/hostname" "$tmp"/var/cache/debconf/*-old "$tmp"/var/log/*.log
  # Documentation, manual pages and translations, as Debian's slim images leave out
  # (copyright files stay).
  find "$tmp/usr/share/doc" -type f ! -name copyright -delete
  rm -rf "$tmp"/usr/share/man/* "$tmp"/usr/share/info/* "$tmp"/usr/share/locale/*
  # Like the official python image, let `pip install` work without --break-system-packages.
  rm -f "$tmp"/usr/lib/python3*/EXTERNALLY-MANAGED
  mkdir -p "$tmp/workspace"
  touch "$tmp/.orchard-complete"
  mv "$tmp" "$rootfs"
  echo "$rootfs"
}

build_python() {
  [ -f "$OUT/python/index.json" ] && return
  local rootfs
  rootfs=$(python_rootfs)
  log "building python:3.11-slim"
  local version
  version=$(chroot "$rootfs" /usr/bin/python3 -c 'import platform; print(platform.python_version())')
  local layout
  layout=$(new_layout python 3.11-slim)
  add_layer "$layout" 3.11-slim "$rootfs" --numeric-owner --sort=name --exclude=./.orchard-complete
  umoci config --no-history --image "$layout:3.11-slim" --created "$CREATED" --config.env "$PATH_ENV" \
    --config.env LANG=C.UTF-8 --config.env "PYTHON_VERSION=$version" --config.cmd python3
  finish "$layout" python
}

# A SWE-bench-style image: python:3.11-slim plus a conda-style environment that only
# ~/.bashrc activates, after the guard that returns early in non-interactive shells (as
# SWE-bench's images do). `conda` is a small shell function standing in for miniconda's:
# no conda package is reachable here, and what the tests check is the shell's side.
build_swe() {
  [ -f "$OUT/swe/index.json" ] && return
  [ -f "$OUT/python/index.json" ] || { echo "images: swe needs python" >&2; exit 1; }
  log "building swe:latest"
  local stage="$OUT/.stage-swe"
  rm -rf "$stage"
  mkdir -p "$stage/root" "$stage/testbed" "$stage/opt/miniconda3/etc/profile.d" \
    "$stage/opt/miniconda3/envs/testbed/bin"
  ln -s /usr/bin/python3 "$stage/opt/miniconda3/envs/testbed/bin/python"
  ln -s /usr/bin/python3 "$stage/opt/miniconda3/envs/testbed/bin/python3"
  printf '#!/bin/sh\necho testbed-tool "$@"\n' >"$stage/opt/miniconda3/envs/testbed/bin/testbed-tool"
  chmod 755 "$stage/opt/miniconda3/envs/testbed/bin/testbed-tool"
  cat >"$stage/opt/miniconda3/etc/profile.d/conda.sh" <<'CONDA'
# A stand-in for miniconda's conda.sh: `conda activate NAME` as far as a shell sees it.
conda() {
  case $1 in
    activate)
      CONDA_PREFIX=/opt/miniconda3/envs/$2
      [ -d "$CONDA_PREFIX" ] || { echo "EnvironmentNameNotFound: $2" >&2; return 1; }
      CONDA_DEFAULT_ENV=$2
      PATH=$CONDA_PREFIX/bin:$PATH
      export CONDA_PREFIX CONDA_DEFAULT_ENV PATH ;;
    *) echo "conda: only activate is offered here" >&2; return 1 ;;
  esac
}
CONDA
  cat >"$stage/root/.bashrc" <<'BASHRC'
# ~/.bashrc: executed by bash(1) for non-login shells.

# If not running interactively, don't do anything
case $- in
    *i*) ;;
      *) return;;
esac

HISTCONTROL=ignoreboth
PS1='\u@\h:\w\$ '

source /opt/miniconda3/etc/profile.d/conda.sh
conda activate testbed
BASHRC
  cat >"$stage/root/.profile" <<'PROFILE'
# ~/.profile: executed by the command interpreter for login shells.
if [ "$BASH" ]; then
  if [ -f ~/.bashrc ]; then
    . ~/.bashrc
  fi
fi
PROFILE
  chmod 700 "$stage/root"
  local layout="$OUT/.tmp-swe"
  rm -rf "$layout"
  # The python layout's blobs are shared (hard links: blobs are never changed).
  cp -al "$OUT/python" "$layout"
  rm "$layout/index.json"
  cp "$OUT/python/index.json" "$layout/index.json"
  add_layer "$layout" 3.11-slim "$stage" "${TAR_REPRO[@]}" --owner=0 --group=0
  umoci tag --image "$layout:3.11-slim" latest
  umoci rm --image "$layout:3.11-slim"
  umoci config --no-history --image "$layout:latest" --created "$CREATED" --config.workingdir /testbed
  rm -rf "$stage"
  finish "$layout" swe
}

start=$(date +%s)
build_busybox
build_empty
build_whiteout
build_python
build_swe
log "all images in $OUT ($(($(date +%s) - start)) s)"
