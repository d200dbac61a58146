#!/usr/bin/env bash
# The test cluster's smoke test (in `make test`): starts the cluster (cached binaries
# make this the "< 60 s" start), then checks that the node is Ready; a busybox pod from
# the imported image runs, answers on its pod IP from the host, has its logs read and
# `kubectl exec` run in it; a NetworkPolicy denying its egress is enforced; deleting it
# leaves no container, veth or IP behind; and `down.sh` after a SIGKILL of every
# component leaves nothing on the host.
# Prints `k8s smoke: N passed, M failed` (the CI total counts it).
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
passed=0
failed=0
check() {
  local what=$1
  shift
  if "$@"; then
    passed=$((passed + 1)); echo "k8s smoke: ok: $what"
  else
    failed=$((failed + 1)); echo "k8s smoke: FAILED: $what"
    diagnose
  fi
}
# diagnose: after a failed check, what explains it, printed before down.sh removes the run
# directory (CI keeps only the output): the pods, their events, the node's conditions and
# taints, which components are still alive, and the tail of each component's log.
diagnose() {
  [ -n "${BIN:-}" ] || return 0
  echo "k8s smoke: --- diagnostics ---"
  k get pods -o wide 2>&1
  k get events --sort-by=.lastTimestamp 2>&1 | tail -30
  k get node "$NODE_NAME" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}{.spec.taints}{"\n"}' 2>&1
  local f name
  for f in "$RUN"/pids/*; do
    name=${f##*/}
    if kill -0 "$(cat "$f")" 2>/dev/null; then echo "k8s smoke: $name alive"; else echo "k8s smoke: $name EXITED"; fi
  done
  for name in kubelet containerd kube-scheduler kube-router; do
    echo "k8s smoke: --- last errors and warnings in $name.log ---"
    grep -E '^[EW][0-9]{4} |level=(error|warning)' "$RUN/logs/$name.log" 2>/dev/null | tail -20
  done
  echo "k8s smoke: --- end of diagnostics ---"
}
finish() {
  "$K8S_DIR/down.sh" --quiet >/dev/null 2>&1
  echo "k8s smoke: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}
trap 'finish; exit $?' EXIT

bin=$("$K8S_DIR/build.sh") || { failed=$((failed + 1)); exit 1; }
echo "k8s smoke: binaries in $(dirname "$bin"), built in $(cat "$(dirname "$bin")/build-seconds") s"
t0=$(date +%s%N)
if ! "$K8S_DIR/up.sh" > "$RUN.up.log" 2>&1; then
  cat "$RUN.up.log"
  failed=$((failed + 1))
  exit 1
fi
up_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "k8s smoke: cluster up in $((up_ms / 1000)).$(printf %03d $((up_ms % 1000))) s (cached binaries)"
BIN=$(cat "$RUN/bin")
k() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

node_ready() { [ "$(k get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
check "node $NODE_NAME is Ready" node_ready

# A pod from the imported busybox image: a line on stdout, then a web server.
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: smoke, labels: {app: smoke}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo smoke-log-line; mkdir -p /www; echo hello-from-pod > /www/index.html; exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
YAML
check "the busybox pod becomes Ready" k wait --for=condition=Ready pod/smoke --timeout=60s
ip=$(k get pod smoke -o 'jsonpath={.status.podIP}')
in_range() { python3 -c "import ipaddress,sys; sys.exit(ipaddress.ip_address('$ip') not in ipaddress.ip_network('$POD_CIDR'))"; }
check "the pod IP $ip is in $POD_CIDR" in_range
answers() { [ "$(curl -s --max-time 5 "http://$ip:8080/index.html")" = hello-from-pod ]; }
check "the pod IP answers from the host" answers
# (Output captured first: `grep -q` would exit at its match and, under pipefail, the
# writer's SIGPIPE would fail the check.)
logs() { grep -x smoke-log-line <<<"$(k logs smoke)" >/dev/null; }
check "kubectl logs reads the pod's stdout" logs
execs() { [ "$(k exec smoke -- cat /www/index.html)" = hello-from-pod ]; }
check "kubectl exec runs in the pod" execs
not_pulled() { [[ $(k get events --field-selector involvedObject.name=smoke,reason=Pulled -o 'jsonpath={.items[*].message}') == *'already present on machine'* ]]; }
check "the image came from the import (no pull)" not_pulled

# NetworkPolicy is enforced (kube-router): the smoke pod reaches a peer pod until a policy
# denies the smoke pod's egress; the host still reaches the smoke pod.
k run peer --labels=app=peer --image=busybox:latest --image-pull-policy=IfNotPresent --restart=Never -- \
  sh -c 'mkdir -p /www; echo hello-from-peer > /www/index.html; exec httpd -f -p 8080 -h /www' >/dev/null
k wait --for=condition=Ready pod/peer --timeout=60s >/dev/null
peer_ip=$(k get pod peer -o 'jsonpath={.status.podIP}')
reaches_peer() {
  [ "$(k exec smoke -- sh -c "printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 2 $peer_ip 8080 2>/dev/null | tail -1")" = hello-from-peer ]
}
check "a pod reaches another pod's IP" reaches_peer
k apply -f - >/dev/null <<YAML
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: smoke-deny-egress}
spec:
  podSelector: {matchLabels: {app: smoke}}
  policyTypes: [Egress]
YAML
blocked() { ! reaches_peer; }
check "a NetworkPolicy denying egress blocks it" wait_for 30 "the policy to take effect" blocked
check "the host still reaches the pod under the policy" answers
k delete networkpolicy smoke-deny-egress >/dev/null
check "deleting the policy lets it through again" wait_for 30 "the policy to go" reaches_peer
k delete pod peer --wait=true --timeout=60s >/dev/null

k delete pod smoke --wait=true --timeout=60s >/dev/null
no_containers() { [ -z "$(runc --root "$RUNC_ROOT/k8s.io" list -q 2>/dev/null)" ]; }
no_veths() { [ -z "$(ip -o link show master "$BRIDGE" 2>/dev/null)" ]; }
no_ips() { [ -z "$(find "$RUN/cni/ipam" -type f -name '198.*' 2>/dev/null)" ]; }
gone() { no_containers && no_veths && no_ips; }
check "deleting the pod leaves no container, veth or pod IP" wait_for 60 "the pod's sandbox to go" gone

# A second pod, then SIGKILL every component: down.sh still cleans up everything.
k run survivor --image=busybox:latest --image-pull-policy=IfNotPresent --restart=Never -- sleep 3600 >/dev/null
# (Up to 120 s: it passed here in seconds every time, and failed once in CI at 60 s with
# nothing to tell why; the diagnostics after a failed check say it next time.)
t_run=$(date +%s) failed_before=$failed
check "a second pod runs" k wait --for=condition=Ready pod/survivor --timeout=120s
[ "$failed" != "$failed_before" ] || echo "k8s smoke: the second pod was Ready after $(( $(date +%s) - t_run )) s"
# The pods' network namespaces (containerd keeps them under $RUN, not in /run/netns where
# `ip netns` looks): their inodes, from the cluster's processes, to look for afterwards.
shopt -s globstar
host_netns=$(readlink /proc/1/ns/net)
pod_netns=$(for f in /sys/fs/cgroup/pids/"$CGROUP_ROOT"/**/cgroup.procs; do cat "$f"; done 2>/dev/null |
  while read -r p; do readlink "/proc/$p/ns/net"; done 2>/dev/null | sort -u | grep -vxF "$host_netns")
has_pod_netns() { [ -n "$pod_netns" ]; }
check "the pod's network namespace is found (${pod_netns:-none})" has_pod_netns
# shellcheck disable=SC2046
kill -9 $(own_pids) 2>/dev/null
check "down.sh after kill -9 of every component leaves nothing behind" "$K8S_DIR/down.sh"
# A namespace outlives down.sh only held by a process or a mount (nsfs, as containerd
# pins them): neither may remain.
netns_left() {
  local ns held
  for ns in $pod_netns; do
    held=$(find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' -printf '%l %h\n' 2>/dev/null |
      grep -F "$ns " | cut -d' ' -f2 | tr '\n' ' ')
    [ -z "$held" ] || { echo "k8s smoke: $ns still held by $held"; return 1; }
    if grep -F " $ns " /proc/self/mountinfo >/dev/null; then echo "k8s smoke: $ns still mounted"; return 1; fi
  done
  if grep -F " $RUN/" /proc/self/mountinfo | grep -F nsfs >/dev/null; then echo "k8s smoke: nsfs mounts under $RUN"; return 1; fi
  return 0
}
check "no network namespace of the cluster's pods is left" netns_left
