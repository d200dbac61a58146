#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test Orchard Env.
# Idempotent and quiet when everything is present.
set -euo pipefail

need=()
command -v runc >/dev/null || need+=(runc)
# Egress of sandboxes that ask for it (user-mode networking, no bridge or iptables).
command -v slirp4netns >/dev/null || need+=(slirp4netns)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && file -L /bin/busybox 2>/dev/null | grep -q static || need+=(busybox-static)
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
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # No init system here may start Debian's own containerd service: the test cluster runs
  # its own. policy-rc.d refuses every service start during the install.
  ours=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    ours=1
  fi
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  [ -z "$ours" ] || $SUDO rm -f /usr/sbin/policy-rc.d
fi
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  echo "deps: adding the x86_64-unknown-linux-musl target"
  rustup target add x86_64-unknown-linux-musl
fi
