#!/usr/bin/env bash
# `make cluster-down`: stops the test cluster and removes what it made on the host, even
# after every component was killed with SIGKILL: processes (the components, containerd's
# shims, every container process), mounts under $RUN, network namespaces, the bridge and
# its veths, the iptables chains (both families) and ipsets the kubelet, kube-router and
# the CNI bridge made for this cluster, containerd's shim sockets, the cgroup $CGROUP_ROOT
# in every hierarchy, the sysctls up.sh saved (restored), and the host's owner file. Works
# without $RUN too (from what is on the host). Keeps $RUN/pki (certificates) for the next
# start. `--quiet`: no summary. Exits non-zero if anything is left.
#
# If another checkout's cluster is running (the owner file names it, see lib.sh), only this
# checkout's own files are removed: the host's bridge, chains and cgroups are that one's.
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
quiet=
[ "${1:-}" = --quiet ] && quiet=1
shopt -s globstar nullglob

# unmount_run: mounts under $RUN, deepest first (overlay roots, network namespace files,
# secrets). remove_run_files: those, then every file but the certificates.
unmount_run() {
  local mounts m
  for _ in 1 2 3; do
    mounts=$(awk -v r="$RUN/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r)
    [ -z "$mounts" ] && break
    for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  done
}
remove_run_files() {
  unmount_run
  [ -d "$RUN" ] && find "$RUN" -mindepth 1 -maxdepth 1 ! -name pki -exec rm -rf {} + 2>/dev/null
  return 0
}

owner_run=$(owner_get run)
if [ -n "$owner_run" ] && [ "$owner_run" != "$RUN" ] && owner_live "$owner_run" "$(owner_get pid)"; then
  remove_run_files
  [ -n "$quiet" ] || log "the running cluster is $(owner_get checkout)'s ($OWNER_FILE): left it alone; removed only $RUN's files"
  exit 0
fi

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

# containerd's shim sockets (/run/containerd/s, outside $RUN): a shim killed with SIGKILL
# leaves its socket; each task directory of our containerd names its shim's in `address`.
for a in "$RUN"/containerd/state/io.containerd.runtime.v2.task/*/*/address; do
  sock=$(cat "$a" 2>/dev/null)
  sock=${sock#unix://}
  case $sock in /run/containerd/s/*) [ -S "$sock" ] && rm -f "$sock" ;; esac
done

# The sysctls up.sh saved before anything started (the kubelet and the CNI bridge change
# them); nothing is left to set them again.
# Without ours, a stale owner's (another checkout whose cluster died) are the host's.
saved=$SYSCTL_SAVED
[ -f "$saved" ] || [ -z "$owner_run" ] || saved=$owner_run/sysctl.saved
sysctls_differ=()
if [ -f "$saved" ]; then
  while read -r key value; do
    [ -n "$key" ] || continue
    [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] && continue
    sysctl -qw "$key=$value" >/dev/null 2>&1
    [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctls_differ+=("$key (saved $value)")
  done < "$saved"
fi

unmount_run

# The bridge (its veths went with their namespaces).
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"

# iptables, both families: this cluster's chains, never a built-in chain or a whole table.
# our_chains IPT TABLE RULES: the chains in RULES (`IPT -t TABLE -S`) that are ours: the
# kubelet's (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT), kube-router's
# (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*), and the CNI bridge's CNI-* chains whose rules,
# or the rules jumping to them, name our network (orchard-test) or pod range.
our_chains() {
  local rules=$1 c
  for c in $(sed -n 's/^-N //p' <<<"$rules"); do
    case $c in
      KUBE-ROUTER-* | KUBE-POD-FW-* | KUBE-NWPLCY-* | KUBE-FIREWALL | KUBE-KUBELET-CANARY | KUBE-IPTABLES-HINT)
        echo "$c" ;;
      CNI-*)
        grep -E -e "^-A $c " -e " -[jg] $c( |\$)" <<<"$rules" |
          grep -F -e 'orchard-test' -e "${POD_CIDR%.*}." >/dev/null && echo "$c" ;;
    esac
  done
  return 0
}
# clean_chains IPT: first the rules of other chains (the built-in ones) that jump to ours,
# one by one (`-A` turned into `-D`, through IPT-restore --noflush, which reads -S's quoting),
# then our chains are flushed and deleted.
clean_chains() {
  local ipt=$1 restore=${1}-restore table rules line chain target c
  command -v "$ipt" >/dev/null || return 0
  for table in filter nat mangle raw; do
    rules=$("$ipt" -w 5 -t "$table" -S 2>/dev/null) || continue
    local -A ours=()
    for c in $(our_chains "$rules"); do ours[$c]=1; done
    [ ${#ours[@]} -gt 0 ] || continue
    while IFS= read -r line; do
      chain=${line#-A }
      chain=${chain%% *}
      [ -n "${ours[$chain]:-}" ] && continue
      for target in "${line##* -j }" "${line##* -g }"; do
        target=${target%% *}
        if [ "$target" != "$line" ] && [ -n "${ours[$target]:-}" ]; then
          printf '*%s\n%s\nCOMMIT\n' "$table" "-D ${line#-A }" | "$restore" -w 5 --noflush 2>/dev/null ||
            log "could not delete from $ipt -t $table: $line"
          break
        fi
      done
    done < <(grep '^-A ' <<<"$rules")
    for c in "${!ours[@]}"; do "$ipt" -w 5 -t "$table" -F "$c" 2>/dev/null; done
    for c in "${!ours[@]}"; do
      "$ipt" -w 5 -t "$table" -X "$c" 2>/dev/null || log "could not delete the chain $c from $ipt -t $table"
    done
    unset ours
  done
}
clean_chains iptables
clean_chains ip6tables
# left_chains: what clean_chains would remove, if anything is left (both families).
left_chains() {
  local ipt table rules
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle raw; do
      rules=$("$ipt" -w 5 -t "$table" -S 2>/dev/null) || continue
      our_chains "$rules" | sed "s/^/$ipt -t $table /"
    done
  done
}

# kube-router's ipsets (KUBE-SRC-*, KUBE-DST-*, kube-router-*, inet6: for IPv6; free once
# no rule refers to them). Nothing else.
our_ipsets() {
  command -v ipset >/dev/null || return 0
  local sets
  sets=$(ipset list -n 2>/dev/null)
  grep -E '^(inet6:)?(KUBE-SRC-|KUBE-DST-|kube-router-)' <<<"$sets"
  return 0
}
for _ in 1 2; do
  for set in $(our_ipsets); do ipset destroy "$set" 2>/dev/null; done
done

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
remove_run_files

# The host's owner file, under the lock (it is ours, or its owner's cluster is gone).
exec 8>>"$LOCK_FILE"
if flock -w 30 8; then
  owner_run=$(owner_get run)
  if [ -z "$owner_run" ] || [ "$owner_run" = "$RUN" ] || ! owner_live "$owner_run" "$(owner_get pid)"; then
    rm -f "$OWNER_FILE"
  fi
fi
exec 8>&-

# What is left, if anything.
left=()
[ -n "$(own_pids)" ] && left+=("processes: $(own_pids | tr '\n' ' ')")
awk -v r="$RUN/" 'index($2, r) == 1 { f = 1 } END { exit !f }' /proc/self/mounts && left+=("mounts under $RUN")
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("interface $BRIDGE")
compgen -G "/sys/fs/cgroup/*/$CGROUP_ROOT" >/dev/null && left+=("cgroups $CGROUP_ROOT")
chains=$(left_chains)
[ -n "$chains" ] && left+=("iptables chains: $(tr '\n' ' ' <<<"$chains")")
sets=$(our_ipsets)
[ -n "$sets" ] && left+=("ipsets: $(tr '\n' ' ' <<<"$sets")")
[ ${#sysctls_differ[@]} -gt 0 ] && left+=("sysctls not restored: ${sysctls_differ[*]}")
if [ ${#left[@]} -gt 0 ]; then
  log "left behind: ${left[*]}"
  exit 1
fi
[ -n "$quiet" ] || log "stopped; nothing left behind"
