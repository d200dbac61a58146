#!/usr/bin/env bash
# `make cluster`: starts the single-node test cluster (etcd, containerd on runc, the API
# server, controller manager, scheduler and kubelet, a CNI bridge) and prints
# `export KUBECONFIG=...`. Builds or reuses the cached binaries (build.sh), imports the
# pause image, the test images and Orchard's injector and orchestrator images into
# containerd (no registry), and waits until the
# node is Ready. Already running: prints the export line again. `down.sh` stops it.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || die "the test cluster needs root (kubelet, containerd, network)"
start=$(date +%s)
# The kubelet and containerd are configured for cgroup v1 (hybrid: v1 controllers under
# /sys/fs/cgroup, see README); a unified (v2 only) host needs another configuration.
if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] || [ ! -d /sys/fs/cgroup/memory ] ||
  [ ! -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
  die "this host is not cgroup v1 or hybrid (/sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup 2>/dev/null), no v1 memory and cpuset hierarchies): the cluster's kubelet and containerd configuration expects v1 controllers under /sys/fs/cgroup"
fi

if [ -f "$RUN/up.complete" ] && curl -sf --cacert "$RUN/pki/ca.crt" \
    --cert "$RUN/pki/admin.crt" --key "$RUN/pki/admin.key" \
    "https://$NODE_IP:$APISERVER_PORT/readyz" >/dev/null 2>&1; then
  log "already running"
  echo "export KUBECONFIG=$KUBECONFIG_FILE"
  exit 0
fi
# Leftovers of a crashed run go first (only this checkout's files if another one's
# cluster is running: the claim below then names it).
"$K8S_DIR/down.sh" --quiet
# One cluster per host: claim it in the owner file, under the lock. Another checkout's
# running (or starting) cluster stops this start; a stale claim (its run directory gone,
# its processes dead) is taken over, with the sysctls it saved.
exec 8>>"$LOCK_FILE"
flock -w 60 8 || die "could not take $LOCK_FILE in 60 s"
owner_run=$(owner_get run)
if [ -n "$owner_run" ] && [ "$owner_run" != "$RUN" ]; then
  if owner_live "$owner_run" "$(owner_get pid)"; then
    die "the host's test cluster belongs to $(owner_get checkout) (started by pid $(owner_get pid), run directory $owner_run; $OWNER_FILE): stop it there with tests/k8s/down.sh first"
  fi
  log "taking over from $(owner_get checkout): its cluster is not running (stale $OWNER_FILE)"
  mkdir -p "$RUN"
  [ -f "$owner_run/sysctl.saved" ] && [ ! -f "$SYSCTL_SAVED" ] && cp "$owner_run/sysctl.saved" "$SYSCTL_SAVED"
fi
printf 'checkout=%s\nrun=%s\npid=%s\nsince=%s\n' "$CHECKOUT" "$RUN" "$$" "$(date -u +%FT%TZ)" > "$OWNER_FILE.tmp"
mv "$OWNER_FILE.tmp" "$OWNER_FILE"
exec 8>&-
# A failed start leaves what it started, with its logs, for a look: say how to remove it.
trap 'rc=$?; [ "$rc" = 0 ] || log "the start failed: the logs are in $RUN/logs; make cluster-down removes what was started"' EXIT

"$K8S_DIR/../../scripts/deps.sh"
BIN=$("$K8S_DIR/build.sh")
IMAGES=$(cd "$K8S_DIR/../../images/out" 2>/dev/null && pwd) ||
  die "images/out is missing: run make images"
"$K8S_DIR/pki.sh"
PKI=$RUN/pki
mkdir -p "$RUN"/{logs,pids,etcd,containerd,cni/net.d,cni/ipam,kubelet,pod-logs,apiserver,kcm,scheduler}

# start NAME COMMAND...: runs a component in its own session, logging to logs/NAME.log.
start() {
  local name=$1
  shift
  setsid "$@" > "$RUN/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pids/$name"
}
# alive NAME: the component is still running (a crash fails fast with its log).
alive() {
  kill -0 "$(cat "$RUN/pids/$1")" 2>/dev/null || {
    tail -20 "$RUN/logs/$1.log" >&2
    die "$1 exited; its log: $RUN/logs/$1.log"
  }
}
# ready NAME SECONDS COMMAND...: waits for COMMAND while NAME stays alive.
ready() {
  local name=$1 limit=$2
  shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    alive "$name"
    [ "$(date +%s)" -lt "$deadline" ] || die "$name not ready after ${limit}s; log: $RUN/logs/$name.log"
    sleep 0.2
  done
}

# br_netfilter: kube-router filters the bridged pod traffic with iptables (built in here:
# then modprobe fails, and /proc/sys/net/bridge tells).
modprobe br_netfilter 2>/dev/null || true
[ -d /proc/sys/net/bridge ] ||
  die "br_netfilter is missing (no /proc/sys/net/bridge after modprobe br_netfilter): kube-router's NetworkPolicy needs it"
# The sysctls the cluster changes, saved before anything starts (unless already saved:
# a failed start's, or a stale owner's); down.sh restores them.
if [ ! -s "$SYSCTL_SAVED" ]; then
  for key in "${SYSCTLS[@]}"; do
    value=$(sysctl -n "$key" 2>/dev/null) && echo "$key $value"
  done > "$SYSCTL_SAVED.tmp"
  mv "$SYSCTL_SAVED.tmp" "$SYSCTL_SAVED"
fi

# The pods' bridge, with the node's address: the host reaches every pod IP on it
# directly. Nothing is masqueraded, so pods have no working route off the machine (see
# README: the CNI bridge's isGateway does turn on IP forwarding).
prefix=${POD_CIDR#*/}
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/$prefix" dev "$BRIDGE"
ip link set "$BRIDGE" up

start etcd "$BIN/etcd" --name orchard-test --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "orchard-test=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
  --quota-backend-bytes 1073741824 --log-level warn

# containerd: everything under $RUN (root, state, socket, runc root, network namespaces),
# CNI from Debian's plugins, no snapshotters but overlayfs, cgroupfs like the kubelet.
cat > "$RUN/containerd/config.toml" <<TOML
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.native",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$CONTAINERD_SOCK"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # Root here lacks CAP_SYS_RESOURCE (the VM's init drops it), so no process may lower its
  # oom_score_adj below 0; the kubelet asks -998 for every pod's pause container, which
  # runc then fails to set. Keep every container at or above containerd's own (0).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$RUNC_ROOT"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
TOML
cat > "$RUN/cni/net.d/10-orchard.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "orchard-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
JSON
start containerd containerd --config "$RUN/containerd/config.toml"

ready etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
svc_ip=${SERVICE_CIDR%.*}.1
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$APISERVER_PORT" \
  --cert-dir "$RUN/apiserver" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" --service-cluster-ip-range "$SERVICE_CIDR" \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
  --service-account-signing-key-file "$PKI/sa.key" --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction --allow-privileged=true \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$PKI/apiserver-kubelet-client.key" --kubelet-certificate-authority "$PKI/ca.crt" \
  --kubelet-preferred-address-types InternalIP --profiling=false --v=1

ready containerd 30 test -S "$CONTAINERD_SOCK"
ctr() { command ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
# import LAYOUT NAME: an OCI layout into containerd's k8s.io namespace (what CRI sees).
import() {
  local tarball=$RUN/import.tar base=${2%:*}
  tar -C "$1" -cf "$tarball" .
  ctr images import --base-name "$base" "$tarball" >/dev/null
  rm -f "$tarball"
  ctr images ls -q | grep -Fx "$2" >/dev/null || die "importing $1 did not make $2"
}
pause_layout=$(dirname "$BIN")/pause
import "$pause_layout" "$PAUSE_IMAGE"
import "$IMAGES/busybox" docker.io/library/busybox:latest
import "$IMAGES/python" docker.io/library/python:3.11-slim
# Orchard's own images (make k8s-images), under the names the Kubernetes backend and
# deploy/ use by default, and an image with no files at all; re-import a rebuilt one
# into a running cluster with import.sh.
ORCHARD_VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$K8S_DIR/../../Cargo.toml" | head -1)
for pair in injector=ghcr.io/orchard-env/orchard-injector:$ORCHARD_VERSION \
    orchestrator=ghcr.io/orchard-env/orchard:$ORCHARD_VERSION empty=docker.io/library/empty:latest; do
  if [ -f "$IMAGES/${pair%%=*}/index.json" ]; then
    import "$IMAGES/${pair%%=*}" "${pair#*=}"
  else
    log "images/out/${pair%%=*} is missing (make k8s-images): ${pair#*=} not imported"
  fi
done

admin_curl() { curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }
ready kube-apiserver 90 admin_curl "https://$NODE_IP:$APISERVER_PORT/readyz"

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --cert-dir "$RUN/kcm" --leader-elect=false \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --use-service-account-credentials --cluster-signing-cert-file "$PKI/ca.crt" \
  --cluster-signing-key-file "$PKI/ca.key" --profiling=false
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$PKI/scheduler.kubeconfig" \
  --authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false --profiling=false

# The kubelet: cgroup v1 allowed (failCgroupV1, see README), cgroupfs (no systemd here),
# every pod under one cgroup, files under $RUN, eviction only when the disk is nearly full.
cat > "$RUN/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $RUN/pod-logs
resolvConf: /etc/resolv.conf
evictionHard: {"nodefs.available": "1%", "imagefs.available": "1%", "memory.available": "100Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerNode: true
rotateCertificates: false
YAML
# The kubelet wants its cgroupRoot to exist in every hierarchy; a new v1 cpuset starts
# with no CPUs and no memory nodes, so it gets its parent's.
for hier in /sys/fs/cgroup/*/; do
  [ "$hier" = /sys/fs/cgroup/unified/ ] && continue
  mkdir -p "$hier$CGROUP_ROOT"
done
cp /sys/fs/cgroup/cpuset/cpuset.cpus "/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.cpus"
cp /sys/fs/cgroup/cpuset/cpuset.mems "/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.mems"
start kubelet "$BIN/kubelet" --config "$RUN/kubelet/config.yaml" \
  --kubeconfig "$PKI/kubelet.kubeconfig" --root-dir "$RUN/kubelet/root" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1

kubectl() { "$BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig" "$@"; }

node_ready() {
  [ "$(kubectl get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
ready kubelet 90 node_ready

# kube-router, firewall only (no routing, no service proxy, no CNI): it enforces
# NetworkPolicy with iptables and ipsets on the bridged pod traffic (br_netfilter).
# Its identity may read what it needs and nothing else. It needs the node registered.
kubectl apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: orchard-test:kube-router}
rules:
- apiGroups: [""]
  resources: [namespaces, pods, services, nodes, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: orchard-test:kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: orchard-test:kube-router}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-router}
YAML
start kube-router "$BIN/kube-router" --kubeconfig "$PKI/kube-router.kubeconfig" \
  --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
  --enable-ipv6=false --hostname-override "$NODE_NAME" --service-cluster-ip-range "$SERVICE_CIDR" \
  --health-port 0 --metrics-port 0
ready kube-router 30 iptables -S KUBE-ROUTER-FORWARD
# Pods are refused until the default service account exists (its controller makes it).
ready kube-controller-manager 60 kubectl get serviceaccount default
cp "$PKI/admin.kubeconfig" "$KUBECONFIG_FILE"
echo "$BIN" > "$RUN/bin"
touch "$RUN/up.complete"
log "cluster ready in $(( $(date +%s) - start )) s (node $NODE_NAME Ready; logs in $RUN/logs)"
echo "export KUBECONFIG=$KUBECONFIG_FILE"
echo "export PATH=$BIN:\$PATH   # kubectl $K8S_VERSION"
