# Shared by tests/k8s/*.sh: the pinned versions, the run directory and small helpers.
# shellcheck shell=bash
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
          [[ $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) == *" $RUN/containerd/"* ]] && echo "$pid" ;;
      esac
    done
  return 0
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
