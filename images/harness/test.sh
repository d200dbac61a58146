#!/usr/bin/env bash
# Tests the harness bundle (images/out/harness, made by build.sh) the way a sandbox sees it:
# mounted read-only at /.orchard/harness inside three root file systems, each entered with
# chroot in a private mount namespace (unshare -m), so nothing is left mounted afterwards:
#
#   glibc    the Debian bookworm root of images/build.sh (out/cache/python-rootfs), through an
#            overlay so it is not modified; this machine's own / when that root is not built
#   busybox  busybox-static and its applet links only: no C library at all
#   musl     the same plus musl's loader /lib/ld-musl-x86_64.so.1 (Debian's musl package),
#            which is what an Alpine image offers a program
#
# Checks: every tool answers --version where it can run and fails with exit 127 and a clear
# message where it cannot; the bundle cannot be written from inside; a wrapper found through
# PATH or a symlink works; the bundled Python can start itself again (sys.executable).
# Needs root. Ends with the line "harness: N passed, N failed".
#
# Environment: ORCHARD_IMAGES_OUT (default images/out), HARNESS_TEST_GLIBC_ROOT (a glibc root
# file system to use instead of out/cache/python-rootfs).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
OUT=${ORCHARD_IMAGES_OUT:-$here/../out}
OUT=$(cd "$OUT" && pwd)
BUNDLE=$OUT/harness

[ "$(id -u)" = 0 ] || { echo "harness test: needs root (chroot, mount namespaces)" >&2; exit 1; }
[ -x "$BUNDLE/bin/codex" ] || { echo "harness test: no bundle at $BUNDLE: run make harness" >&2; exit 1; }
for t in unshare chroot mount; do
  command -v "$t" >/dev/null || { echo "harness test: $t is missing" >&2; exit 1; }
done
BUSYBOX=/bin/busybox
file -L "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' \
  || { echo "harness test: $BUSYBOX is not busybox-static: run make deps" >&2; exit 1; }

if [ -z "${HARNESS_TEST_INSIDE:-}" ]; then
  exec unshare -m --propagation private env HARNESS_TEST_INSIDE=1 "$0" "$@"
fi

# --- inside a private mount namespace from here on ---------------------------------------

WORK=$(mktemp -d /tmp/orchard-harness-test.XXXXXX)
trap 'umount -R "$WORK" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mount -t tmpfs -o size=64m tmpfs "$WORK"

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }

version() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tools"][sys.argv[2]]["version"])' "$BUNDLE/manifest.json" "$1"; }

# finish_root ROOT: /dev, /proc, a writable /tmp and the bundle, read-only, at /.orchard/harness.
finish_root() {
  local root=$1
  mkdir -p "$root/dev" "$root/proc" "$root/tmp" "$root/.orchard/harness"
  mount --bind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount -t tmpfs tmpfs "$root/tmp"
  mount --bind "$BUNDLE" "$root/.orchard/harness"
  mount -o remount,bind,ro "$root/.orchard/harness"
}

busybox_root() {
  local root=$1 applet
  mkdir -p "$root/bin" "$root/etc" "$root/root" "$root/usr/bin"
  cp "$BUSYBOX" "$root/bin/busybox"
  for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
}

ROOTS=()
glibc_src=${HARNESS_TEST_GLIBC_ROOT:-$OUT/cache/python-rootfs}
if [ -x "$glibc_src/bin/sh" ] && [ -e "$glibc_src/lib64/ld-linux-x86-64.so.2" ]; then
  glibc_what="Debian root $glibc_src"
else
  glibc_src=/
  glibc_what="this machine's own root (no Debian root built yet)"
fi
mkdir -p "$WORK/glibc" "$WORK/ovl-upper" "$WORK/ovl-work"
mount -t overlay overlay -o "lowerdir=$glibc_src,upperdir=$WORK/ovl-upper,workdir=$WORK/ovl-work" "$WORK/glibc"
finish_root "$WORK/glibc"
ROOTS+=(glibc)

busybox_root "$WORK/busybox"
finish_root "$WORK/busybox"
ROOTS+=(busybox)

musl_ld=
for f in /usr/lib/x86_64-linux-musl/libc.so /lib/ld-musl-x86_64.so.1; do
  [ -f "$f" ] && musl_ld=$f && break
done
# oldglibc: what a glibc 2.31 image (Ubuntu 20.04, Debian 11) looks like to the probe. Its
# loader is a stand-in that only answers --version, so only the tools that then use the
# bundle's own glibc (pi: node needs 2.28+, hermes: Debian's Python needs 2.36) are run there.
busybox_root "$WORK/oldglibc"
mkdir -p "$WORK/oldglibc/lib64"
printf '#!/bin/sh\necho "ld.so (Ubuntu GLIBC 2.31-0ubuntu9.16) stable release version 2.31."\n' \
  >"$WORK/oldglibc/lib64/ld-linux-x86-64.so.2"
chmod 755 "$WORK/oldglibc/lib64/ld-linux-x86-64.so.2"
finish_root "$WORK/oldglibc"

if [ -n "$musl_ld" ]; then
  busybox_root "$WORK/musl"
  mkdir -p "$WORK/musl/lib"
  cp "$musl_ld" "$WORK/musl/lib/ld-musl-x86_64.so.1"
  ln -s ld-musl-x86_64.so.1 "$WORK/musl/lib/libc.musl-x86_64.so.1"
  finish_root "$WORK/musl"
  ROOTS+=(musl)
fi


# run ROOT COMMAND: runs a shell command in ROOT with a sandbox-like environment (the image's
# PATH first, the bundle's bin after it); sets rc and output.
run() {
  local root=$1
  shift
  set +e
  output=$(chroot "$WORK/$root" /bin/sh -c 'exec env -i HOME=/root TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.orchard/harness/bin \
    /bin/sh -c "$1"' sh "$*" 2>&1 </dev/null)
  rc=$?
  set -e
}

# expect_version ROOT TOOL: TOOL --version exits 0 and prints the pinned version.
expect_version() {
  local root=$1 tool=$2 want
  want=$(version "$tool")
  run "$root" "$tool --version"
  if [ "$rc" = 0 ] && [[ $output == *"$want"* ]]; then
    ok "$root: $tool --version: ${output%%$'\n'*}"
  else
    bad "$root: $tool --version: exit $rc, want $want: $output"
  fi
}

# expect_refusal ROOT TOOL TEXT: TOOL exits 127 with a message that names the tool and TEXT.
expect_refusal() {
  local root=$1 tool=$2 text=$3
  run "$root" "$tool --version"
  if [ "$rc" = 127 ] && [[ $output == "$tool: "*"$text"* ]]; then
    ok "$root: $tool refuses (127): $output"
  else
    bad "$root: $tool should fail with exit 127 and \"$text\": exit $rc: $output"
  fi
}

expect_ok() {
  local root=$1 what=$2 cmd=$3 want=$4
  run "$root" "$cmd"
  if [ "$rc" = 0 ] && [[ $output == *"$want"* ]]; then
    ok "$root: $what"
  else
    bad "$root: $what: exit $rc: $output"
  fi
}

# expect_read_only ROOT WHAT COMMAND: COMMAND fails because the file system is read-only.
expect_read_only() {
  local root=$1 what=$2 cmd=$3
  run "$root" "$cmd"
  if [ "$rc" != 0 ] && [[ $output == *"Read-only file system"* ]]; then
    ok "$root: $what (exit $rc, read-only file system)"
  else
    bad "$root: $what: succeeded: $output"
  fi
}

echo "harness test: bundle $BUNDLE"

# The wrappers' libc probe against what loaders of other distributions print (busybox sh).
echo "libc probe (lib/orchard-harness.sh under busybox sh)"
fake_loader() { # NAME EXIT TEXT: a stand-in for ld.so --version
  printf '#!/bin/sh\nprintf %%s "%s"\nexit %s\n' "$3" "$2" >"$WORK/$1"
  chmod 755 "$WORK/$1"
}
fake_loader ld-debian 0 'ld.so (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.
Copyright (C) 2022 Free Software Foundation, Inc.'
fake_loader ld-ubuntu 0 'ld.so (Ubuntu GLIBC 2.35-0ubuntu3.8) stable release version 2.35.'
fake_loader ld-centos7 0 'ld.so (GNU libc) stable release version 2.17, by Roland McGrath et al.'
fake_loader ld-gcompat 1 'musl libc (x86_64)
Version 1.2.4'
for case in ld-debian:2.36 ld-ubuntu:2.35 ld-centos7:2.17 ld-gcompat: ld-missing:; do
  got=$("$BUSYBOX" sh -c '. "$1/lib/orchard-harness.sh"; ORCHARD_GLIBC_LD=$2; orchard_probe_glibc; echo "$ORCHARD_GLIBC"' \
    sh "$BUNDLE" "$WORK/${case%%:*}")
  if [ "$got" = "${case#*:}" ]; then ok "${case%%:*} reads as glibc '${case#*:}'"; else bad "${case%%:*}: read '$got', want '${case#*:}'"; fi
done
for case in 2.36:2.36:0 2.35:2.36:1 2.40:2.36:0 3.0:2.36:0 2.9:2.17:1 2.17:2.9:0 2.28:2.28:0; do
  IFS=: read -r a b want <<<"$case"
  set +e
  "$BUSYBOX" sh -c '. "$1/lib/orchard-harness.sh"; orchard_version_ge "$2" "$3"' sh "$BUNDLE" "$a" "$b"
  got=$?
  set -e
  if [ "$got" = "$want" ]; then ok "$a >= $b is $([ "$want" = 0 ] && echo true || echo false)"; else bad "$a >= $b: exit $got, want $want"; fi
done

echo "glibc: $glibc_what"
for tool in codex claude opencode pi hermes; do expect_version glibc "$tool"; done

echo "busybox: no C library"
expect_version busybox codex
expect_refusal busybox claude "no C library loader"
expect_refusal busybox opencode "no C library loader"
expect_version busybox pi
expect_version busybox hermes

if [ -d "$WORK/musl/lib" ]; then
  echo "musl: busybox + musl's loader ($musl_ld)"
  expect_version musl codex
  expect_version musl claude
  expect_refusal musl opencode "libstdc++"
  expect_version musl pi
  expect_version musl hermes
fi

echo "oldglibc: a loader that says glibc 2.31"
expect_version oldglibc pi
expect_version oldglibc hermes
expect_ok oldglibc "the bundled Python runs on the bundle's glibc 2.36 there, as sys.executable says" \
  "/.orchard/harness/lib/hermes/python/bin/python3 -I -c 'import ctypes, sys; f = ctypes.CDLL(None).gnu_get_libc_version; f.restype = ctypes.c_char_p; print(f().decode(), sys.executable)'" \
  "2.36 /.orchard/harness/lib/hermes/python/bin/python3"

echo "read-only, PATH, symlinks, sys.executable"
for root in "${ROOTS[@]}"; do
  expect_read_only "$root" "creating a file in the bundle fails" "echo x > /.orchard/harness/new-file"
  expect_read_only "$root" "overwriting a wrapper fails" "echo x > /.orchard/harness/bin/codex"
  expect_read_only "$root" "removing a file of the bundle fails" "rm -f /.orchard/harness/lib/codex/bin/codex"
done
expect_ok busybox "a wrapper found through PATH from another directory" "cd /tmp && codex --version" "codex"
expect_ok busybox "a wrapper called through a symlink" \
  "ln -s /.orchard/harness/bin/pi /tmp/pi && /tmp/pi --version" "$(version pi)"
for root in glibc busybox; do
  expect_ok "$root" "the bundled Python starts itself again through sys.executable" \
    "/.orchard/harness/lib/hermes/python/bin/python3 -I -c 'import subprocess, sys; print(subprocess.check_output([sys.executable, \"-c\", \"import ssl, sqlite3; print(6 * 7)\"]).decode().strip())'" "42"
done
expect_ok glibc "hermes imports its packages with the image's PYTHONPATH set" \
  "PYTHONPATH=/nonexistent hermes --version" "$(version hermes)"

echo "harness: $passed passed, $failed failed"
[ "$failed" = 0 ]
