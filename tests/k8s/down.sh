#!/usr/bin/env bash
# `make cluster-down`: stops the test cluster and removes what it made on the host, even
# after every component was killed with SIGKILL: processes (the components, containerd's
# shims, every container process), mounts under $RUN, network namespaces, the bridge and
# its veths, iptables chains and ipsets the kubelet and kube-router made (KUBE-*), and the cgroup $CGROUP_ROOT in
# every hierarchy. Keeps $RUN/pki (certificates) for the next start. `--quiet`: no
# summary. Exits non-zero if anything is left.
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
quiet=
[ "${1:-}" = --quiet ] && quiet=1
[ -d "$RUN" ] || exit 0

# Processes: the cluster's own, matched on their executable (own_pids in lib.sh: the
# build cache's binaries, containerd and its shims for $RUN; pid files could name a reused
# pid), then every process in the cluster's cgroups (container processes that outlived
# their shims).
# With no cgroup the globs expand to nothing, and `cat` with no file would read stdin.
cgroup_pids() {
  local files=(/sys/fs/cgroup/*/"$CGROUP_ROOT"/cgroup.procs /sys/fs/cgroup/*/"$CGROUP_ROOT"/**/cgroup.procs)
  [ ${#files[@]} -gt 0 ] || return 0
  cat "${files[@]}" 2>/dev/null
}
shopt -s globstar nullglob
for _ in 1 2 3 4 5 6 7 8 9 10; do
  pids=$( { own_pids; cgroup_pids; } | sort -u)
  [ -z "$pids" ] && break
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null
  sleep 0.2
done
# runc's record of the containers (their processes are dead by now).
for root in "$RUNC_ROOT"/*/; do
  for id in $(runc --root "$root" list -q 2>/dev/null); do
    runc --root "$root" delete -f "$id" >/dev/null 2>&1
  done
done

# Mounts under $RUN, deepest first (overlay roots, network namespace files, secrets).
for _ in 1 2 3; do
  mounts=$(awk -v r="$RUN/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r)
  [ -z "$mounts" ] && break
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done

# The bridge (its veths went with their namespaces).
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"

# iptables: the kubelet's KUBE-* chains and the rules that jump to them, both families.
for save in iptables-save ip6tables-save; do
  command -v "$save" >/dev/null || continue
  restore=${save/-save/-restore}
  for table in filter nat mangle; do
    rules=$("$save" -t "$table" 2>/dev/null) || continue
    grep -q 'KUBE-' <<<"$rules" || continue
    grep -v 'KUBE-' <<<"$rules" | "$restore" -T "$table" 2>/dev/null ||
      log "could not remove the KUBE-* rules from $save -t $table"
  done
done

# kube-router's ipsets (named KUBE-*; free once no rule refers to them).
if command -v ipset >/dev/null; then
  for set in $(ipset list -n 2>/dev/null | grep '^KUBE-'); do
    ipset destroy "$set" 2>/dev/null
  done
fi

# Cgroups, deepest first.
for hier in /sys/fs/cgroup/*/; do
  [ -d "$hier$CGROUP_ROOT" ] || continue
  find "$hier$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
done

# Files outside $RUN: the kubelet's links in /var/log/containers (a fixed path) and the
# CNI result cache of libcni (/var/lib/cni/results, named after our network).
for l in /var/log/containers/*.log; do
  case $(readlink "$l") in "$RUN"/*) rm -f "$l" ;; esac
done
rmdir /var/log/containers 2>/dev/null
# libcni caches each attachment as <network>-<sandbox id>-<interface>: ours are named
# after our network, or after a sandbox id of our containerd.
rm -f /var/lib/cni/results/orchard-test-*
for task in "$RUN"/containerd/state/io.containerd.runtime.v2.task/*/*/; do
  id=$(basename "$task")
  rm -f /var/lib/cni/results/*-"$id"-*
done

# Files: everything but the certificates.
find "$RUN" -mindepth 1 -maxdepth 1 ! -name pki -exec rm -rf {} + 2>/dev/null

# What is left, if anything.
left=()
[ -n "$(own_pids)" ] && left+=("processes: $(own_pids | tr '\n' ' ')")
awk -v r="$RUN/" 'index($2, r) == 1 { f = 1 } END { exit !f }' /proc/self/mounts && left+=("mounts under $RUN")
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("interface $BRIDGE")
compgen -G "/sys/fs/cgroup/*/$CGROUP_ROOT" >/dev/null && left+=("cgroups $CGROUP_ROOT")
iptables-save 2>/dev/null | grep -q 'KUBE-' && left+=("iptables KUBE-* rules")
ipset list -n 2>/dev/null | grep -q '^KUBE-' && left+=("ipsets KUBE-*")
if [ ${#left[@]} -gt 0 ]; then
  log "left behind: ${left[*]}"
  exit 1
fi
[ -n "$quiet" ] || log "stopped; nothing left behind"
