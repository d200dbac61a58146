# Shared by tests/k8s/*.sh: the pinned versions, the run directory and small helpers.
# shellcheck shell=bash
K8S_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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
