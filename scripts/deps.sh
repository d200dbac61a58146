#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test Orchard Env.
# Idempotent and quiet when everything is present.
set -euo pipefail

need=()
command -v runc >/dev/null || need+=(runc)
# Egress of sandboxes that ask for it (user-mode networking, no bridge or iptables).
command -v slirp4netns >/dev/null || need+=(slirp4netns)
# The egress filter of sandboxes with egress (an nftables table in their namespace).
command -v nft >/dev/null || [ -x /usr/sbin/nft ] || need+=(nftables)
# (Output captured before grep: `grep -q` exits at its first match and, under pipefail,
# the writer's SIGPIPE would fail the pipeline.)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 &&
  [[ $(file -L /bin/busybox 2>/dev/null) == *static* ]] || need+=(busybox-static)
command -v x86_64-linux-musl-gcc >/dev/null || need+=(musl-tools)
command -v file >/dev/null || need+=(file)
command -v curl >/dev/null || need+=(curl)
# The image store's tests and `make images`: a registry, image copying, OCI layouts,
# and a Debian root file system for the python image.
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v skopeo >/dev/null || need+=(skopeo)
# htpasswd: the registry-auth tests protect a registry with a bcrypt htpasswd file.
command -v htpasswd >/dev/null || need+=(apache2-utils)
command -v umoci >/dev/null || need+=(umoci)
[ -x /usr/sbin/debootstrap ] || command -v debootstrap >/dev/null || need+=(debootstrap)
# The test cluster (tests/k8s): containerd as its CRI runtime, the CNI plugins (bridge,
# host-local, loopback in /usr/lib/cni), iptables for the cleanup check, openssl for its
# certificates.
command -v containerd >/dev/null || need+=(containerd)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables-save >/dev/null || need+=(iptables)
command -v openssl >/dev/null || need+=(openssl)
# kube-router, the test cluster's NetworkPolicy enforcer, drives ipsets with this tool.
command -v ipset >/dev/null || need+=(ipset)
# The Redis state store's tests (many replicas over one Redis): a real redis-server,
# started and stopped by the tests themselves (policy-rc.d keeps Debian's service off).
command -v redis-server >/dev/null || need+=(redis-server)
# The load generator's plot (bench/src/plot.rs) draws its text with a TrueType font.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
# Its build (tests/k8s/build.sh): gcc for the static pause binary, and Go (below).
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # No init system here may start Debian's own containerd service: the test cluster runs
  # its own. policy-rc.d refuses every service start during the install.
  # The guard goes whether the install succeeds or fails (the trap), if it is ours.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  if [ -n "$(trap -p EXIT)" ]; then
    $SUDO rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
fi
# Go builds the test cluster (tests/k8s/build.sh) and is not installed from here: Debian 12's
# golang is 1.19, older than the go.mod files ask for; it comes from https://go.dev/dl.
go_min=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$(dirname "$0")/../tests/k8s/gomod/k8s/go.mod")
go_min=${go_min%.0}
go_bin=$(PATH=$PATH:/usr/local/go/bin command -v go) || go_bin=
go_have=
[ -z "$go_bin" ] || go_have=$("$go_bin" env GOVERSION 2>/dev/null) || go_have=
go_have=${go_have#go}
if [ -z "$go_have" ] || [ "$(printf '%s\n%s\n' "$go_min" "$go_have" | sort -V | head -1)" != "$go_min" ]; then
  echo "deps: error: Go $go_min or newer is needed (for tests/k8s/build.sh) at /usr/local/go/bin/go or on PATH; found: ${go_bin:-none}${go_have:+ (go$go_have)}." >&2
  echo "deps: Debian 12 does not package it and this script does not install it: install it from https://go.dev/dl into /usr/local/go." >&2
  exit 1
fi
if [[ $(rustup target list --installed 2>/dev/null) != *x86_64-unknown-linux-musl* ]]; then
  echo "deps: adding the x86_64-unknown-linux-musl target"
  rustup target add x86_64-unknown-linux-musl
fi
