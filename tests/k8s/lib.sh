# Shared by tests/k8s/*.sh: the pinned versions, the run directory and small helpers.
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
K8S_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=versions.env
. "$K8S_DIR/versions.env"
# Everything a running cluster writes lives here (git-ignored); `down.sh` removes it all
# but the certificates.
RUN=${ORCHARD_K8S_RUN:-$K8S_DIR/.run}
KUBECONFIG_FILE=$RUN/kubeconfig
CONTAINERD_SOCK=$RUN/containerd/containerd.sock
RUNC_ROOT=$RUN/runc
# The cgroup every pod and container of the cluster lives under, in every v1 hierarchy.
CGROUP_ROOT=orchard-k8s
# build.sh's cache of the binaries (etcd, kube-*, kubectl) the cluster runs.
CACHE=${ORCHARD_K8S_CACHE:-$HOME/.cache/orchard/k8s}

# own_pids: this cluster's processes, matched on their executable (/proc/PID/exe), not on
# their command line: every binary of the build cache, and Debian's containerd and its
# runc shims when they serve this cluster's socket (containerd --config $RUN/containerd/...,
# the shims' -address $RUN/containerd/containerd.sock). Containers are found by their cgroup.
own_pids() {
  local cache containerd shim pid exe
  cache=$(readlink -f "$CACHE" 2>/dev/null) || cache=$CACHE
  containerd=$(readlink -f "$(command -v containerd 2>/dev/null || echo /usr/bin/containerd)")
  shim=$(readlink -f "$(command -v containerd-shim-runc-v2 2>/dev/null || echo /usr/bin/containerd-shim-runc-v2)")
  find /proc -mindepth 2 -maxdepth 2 -name exe -printf '%h %l\n' 2>/dev/null |
    while read -r pid exe; do
      pid=${pid#/proc/}
      exe=${exe% (deleted)}
      case $exe in
        "$cache"/*/bin/*) echo "$pid" ;;
        "$containerd" | "$shim")
          [[ $(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline") == *" $RUN/containerd/"* ]] && echo "$pid" ;;
      esac
    done
  return 0
}

# The host has one bridge, one set of ports and one cgroup root for the test cluster, so
# one checkout at a time may run it: up.sh writes OWNER_FILE (checkout, run directory,
# pid) with a flock on LOCK_FILE around the check and the write; down.sh removes it.
LOCK_FILE=/run/orchard-k8s.lock
OWNER_FILE=/run/orchard-k8s.owner
CHECKOUT=$(cd "$K8S_DIR/../.." && pwd -P)
# The sysctls the kubelet sets (kernel.*, vm.overcommit_memory), the CNI bridge turns on
# (net.ipv4.ip_forward, isGateway) and kube-router needs (bridge-nf-call-*): up.sh saves
# them here before anything starts, down.sh puts them back.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables)
SYSCTL_SAVED=$RUN/sysctl.saved

# owner_get FIELD: a field (checkout, run, pid) of the owner file, empty if none.
owner_get() {
  local v
  v=$(sed -n "s/^$1=//p" "$OWNER_FILE" 2>/dev/null) || true
  echo "${v%%$'\n'*}"
}
# owner_live RUN PID: the owner's cluster is starting (its up.sh, PID, is alive) or running
# (a component in its RUN/pids is alive, with RUN in its command line against reused pids).
owner_live() {
  local run=$1 pid=$2 f p
  [ -n "$run" ] && [ -d "$run" ] || return 1
  [ -n "$pid" ] && [[ $(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline") == *up.sh* ]] && return 0
  for f in "$run"/pids/*; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null)
    [[ -n "$p" && $(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline") == *"$run/"* ]] && return 0
  done
  return 1
}

log() { echo "k8s: $*" >&2; }
die() { echo "k8s: error: $*" >&2; exit 1; }

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "timed out after ${limit}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}
