#!/usr/bin/env bash
# Installs the Debian packages the test cluster runs on: containerd (the CRI runtime),
# runc, the CNI plugins (bridge, host-local, loopback in /usr/lib/cni), iptables, openssl.
set -euo pipefail
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables-save >/dev/null || need+=(iptables)
command -v openssl >/dev/null || need+=(openssl)
command -v umoci >/dev/null || need+=(umoci)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  echo "k8s deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d: no init system here to start Debian's own containerd service; we run ours.
  ours=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    ours=1
  fi
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -z "$ours" ] || rm -f /usr/sbin/policy-rc.d
fi
